"""What a msgspec ValidationError of config.toml means, said as a user reads the file: an unknown
key with the name meant or the table it belongs in, a value out of its key's bounds with the value
given, one bracket where two are meant, an enum's choices."""

import re
import typing
from typing import Any, Literal

import msgspec

from pulse.core.config.keys import BOUNDS, bounds_phrase, keys_of, metas, table_in

_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]+)`(?: - at `(?P<path>[^`]+)`)?$")
_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>[^`]+)`$")
_BOUND = re.compile(r"^Expected `\w+` (>|>=|<|<=) ")
_HEADER = re.compile(r"^\s*(?P<comment>#\s*)?(?P<open>\[\[?)\s*(?P<name>[\w.-]+)\s*\]\]?")


def explain(err: msgspec.ValidationError, root: type, raw: object, source: str = "") -> str:
    """The message for `err`, raised converting `raw` (the decoded file) to `root`; `source` is the
    file's text, for the line an unknown key is on."""
    text = str(err)
    m = _UNKNOWN.match(text)
    if m:
        path, key = m["path"] or "$", m["key"]
        return f"unknown key {path}.{key}" + (_misplaced(root, source, path, key) or _did_you_mean(root, path, key))
    m = _AT.match(text)
    if m and _BOUND.match(m["msg"]) and (bounds := _bounds_at(root, m["path"])):
        verb = "lie" if bounds_phrase(bounds).startswith("within") else "be"
        return f"{m['path']} must {verb} {bounds_phrase(bounds)}, got {_value_at(raw, m['path'])!r}"
    if m:
        choices = _choices(root, m["path"]) if m["msg"].startswith("Invalid enum value") else None
        hint = f"; one of: {', '.join(choices)}" if choices else _brackets(m["path"], m["msg"])
        return f"{m['path']}: {m['msg']}" + hint
    return text


def _steps(path: str) -> list[str | int]:
    """`$.process[0].health.url` → ["process", 0, "health", "url"]."""
    return [int(index) if index else name for name, index in re.findall(r"\.([^.\[\]]+)|\[(\d+)\]", path)]


def _value_at(raw: object, path: str) -> object:
    for step in _steps(path):
        try:
            raw = raw[step]                   # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _table_at(root: type, path: str) -> type | None:
    """The table Struct at `path` (`$`, `$.timings`, `$.process[0].health`), or None."""
    kind: Any = root
    for step in _steps(path):
        if isinstance(step, int):
            continue
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(kind)}
        if step not in fields:
            return None
        kind, _ = table_in(fields[step])
        if kind is None:
            return None
    return kind


def _key_at(root: type, path: str):
    """The Key (pulse.core.config.keys) at `path` (an element of an array: the array's), or None."""
    table, _, name = re.sub(r"(\[\d+\])+$", "", path).rpartition(".")
    kind = _table_at(root, table)
    return next((k for k in keys_of(kind) if k.name == name), None) if kind else None


def _bounds_at(root: type, path: str) -> dict:
    key = _key_at(root, path)
    if key is None:
        return {}
    if key.bounds:
        return key.bounds
    # an element of an array of bounded values (`restart_exit_codes = [0]`)
    return {b: v for m in _element_metas(key.type) for b, v in m.items()}


def _element_metas(kind: Any) -> list[dict]:
    if typing.get_origin(kind) is not list:
        return []
    return [{b: getattr(m, b) for b in BOUNDS if getattr(m, b) is not None} for m in metas(typing.get_args(kind)[0])]


def fields_at(root: type, path: str) -> list[str]:
    """The keys the table at `path` takes (none when `path` is no table)."""
    kind = _table_at(root, path)
    return [f.encode_name for f in msgspec.structs.fields(kind)] if kind else []


def _choices(root: type, path: str) -> list[str] | None:
    """The values a Literal key at `path` (`$.log.level`, `$.notify[0].kind`) takes."""
    key = _key_at(root, path)
    return [str(v) for v in typing.get_args(key.type)] if key and typing.get_origin(key.type) is Literal else None


def _brackets(path: str, msg: str) -> str:
    """`[process]` where `[[process]]` is meant (and the other way round): name the spelling."""
    name = path.removeprefix("$.")
    if "." in name or "[" in name:
        return ""
    if msg == "Expected `array`, got `object`":
        return f"; [[{name}]] is a list of tables: write [[{name}]] (two brackets) above each entry"
    if msg == "Expected `object`, got `array`":
        return f"; [{name}] is one table: write [{name}] (one bracket), once"
    return ""


def _owners(root: type, key: str) -> list[str]:
    """The top-level tables that have `key`."""
    return [f.encode_name for f in msgspec.structs.fields(root) if key in fields_at(root, f"$.{f.encode_name}")]


def _misplaced(root: type, source: str, path: str, key: str) -> str:
    """A known key in the wrong table, said by the line that put it there: TOML puts a key in the table
    whose header is above it, so a key under a header left commented lands in the table before, and one
    appended at the end of the file lands in the last table. Empty when the key is no other table's."""
    owners = _owners(root, key)
    if path != "$" and key in fields_at(root, "$"):
        owners = [""]          # a top-level key: above the first table's header
    if not owners or not source:
        return ""
    lines = source.splitlines()
    at = next((i for i, line in enumerate(lines) if re.match(rf"\s*{re.escape(key)}\s*=", line)), None)
    if at is None:
        return ""
    above = [(i, h) for i, h in ((i, _HEADER.match(lines[i])) for i in range(at - 1, -1, -1)) if h]
    comment = next(((i, h) for i, h in above if h["comment"]), None)
    live = next(((i, h) for i, h in above if not h["comment"]), None)
    table = f"[{owners[0]}]" if owners[0] else "the top level"
    where = f"line {at + 1}: `{key}` is a key of {table}"
    if comment and (live is None or comment[0] > live[0]) and comment[1]["name"] == owners[0]:
        return (f"; {where}, and the header above it, `{lines[comment[0]].strip()}` (line {comment[0] + 1}), "
                "is commented out: uncomment it")
    if path != "$" and live is not None:
        return (f"; {where}: TOML puts a key in the table whose header is above it (`{lines[live[0]].strip()}`, "
                f"line {live[0] + 1}), so move it " + (f"under [{owners[0]}]" if owners[0] else "above the first table header"))
    return ""


def _did_you_mean(root: type, path: str, key: str) -> str:
    """`; did you mean heartbeat_ms?` for a misspelt key, or the table a top-level key belongs in
    (`level` uncommented under a commented `# [log]` lands at the top level)."""
    import difflib  # only a misspelt key
    if path == "$":      # a table's own key first: a top-level name that merely looks like it is no help
        tables = _owners(root, key)
        if tables:
            return f"; it belongs in a table: [{tables[0]}] (uncomment that table's header too)"
    close = difflib.get_close_matches(key, fields_at(root, path), n=1)
    return f"; did you mean {close[0]}?" if close else ""
