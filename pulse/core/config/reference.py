"""What is written from the keys' descriptors: the commented config.toml a fresh home gets
(`pulsectl init`) and docs/config.md, the reference of every table and key (scripts/gen_docs.py
writes it; tests/test_config_reference.py fails while it is stale)."""

import json
import re
import textwrap
from typing import Any, NamedTuple

import msgspec

from pulse.core.config.keys import Key, bounds_phrase, keys_of, table_in, type_name
from pulse.core.config.slices import SLICES, SupervisorConfig

HELP_COLUMN = 40                               # where a sample line's help starts, as in the hand-written sample it replaced
WIDTH = 118


class TableDoc(NamedTuple):
    """A table of config.toml: `timings`, `process` (an array of tables), `process.health`."""
    path: str
    struct: type
    array: bool
    help: str


def tables(root: type, prefix: str = "") -> list[TableDoc]:
    """Every table under `root`, each before the tables nested in it, in declaration order."""
    out = []
    for field in msgspec.structs.fields(root):
        kind, array = table_in(field.type)
        if kind is not None:
            path = f"{prefix}{field.encode_name}"
            out.append(TableDoc(path, kind, array, " ".join((kind.__doc__ or "").split())))
            out += tables(kind, path + ".")
    return out


def values(root: type) -> list[Key]:
    """The keys of `root` that are values, not tables."""
    return [k for k in keys_of(root) if table_in(k.type)[0] is None]


def toml_value(value: Any) -> str:
    """`value` as TOML writes it, inline."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_bare(k)} = {toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _bare(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def shown_value(key: Key) -> Any:
    """What the sample shows for `key`: its default, or when it has none, its first example (None: nothing to show)."""
    if key.default is not msgspec.NODEFAULT and key.default is not None:
        return key.default
    return key.examples[0] if key.examples else None


# -- the sample: config.toml of a fresh home ----------------------------------------------------------

def sample(root: type, schema: int) -> str:
    """Every key of `root` at its default (or an example, for a key unset by default), commented,
    with its help beside it: an operator sees what is in force and uncomments what to change.
    Table headers are commented too: a table the docs say to add (`[web]`, `[survival.llm]`) pasted
    below must not declare it a second time, which TOML refuses."""
    lines = [
        "# Pulse configuration. Every key below shows its default (or an example, for one unset by default);",
        "# uncomment a table's header and a key to change it. docs/config.md says what each key does.",
        "# `pulsectl check-config` validates this file; `pulsectl reload` applies it.",
        "# Each [timings] key can also be overridden with PULSE_<KEY> in pulsed's environment.",
        f"schema = {schema}",
        "",
    ]
    lines += [line for key in values(root) if key.name != "schema" for line in _sample_key(key)]
    for table in tables(root):
        lines += ["", *_wrapped("# ", table.help),
                  f"# [[{table.path}]]" if table.array else f"# [{table.path}]"]
        lines += [line for key in values(table.struct) for line in _sample_key(key)]
    return "\n".join(lines) + "\n"


def _sample_key(key: Key) -> list[str]:
    """`# key = value` with its help beside it, wrapped onto lines of its own under the help column."""
    value = shown_value(key)
    if value is None:
        return []
    line = f"# {key.name} = {toml_value(value)}"
    help = textwrap.wrap(key.help, WIDTH - HELP_COLUMN - 2) or [""]
    under = ["#" + " " * (HELP_COLUMN - 1) + "# " + more for more in help]
    if len(line) >= HELP_COLUMN - 1:
        return [line, *under]
    return [line.ljust(HELP_COLUMN) + "# " + help[0], *under[1:]]


def _wrapped(lead: str, text: str) -> list[str]:
    return [lead + line for line in textwrap.wrap(text, WIDTH - len(lead))] if text else []


# -- docs/config.md ---------------------------------------------------------------------------------

def readers() -> dict[str, type]:
    """Each process and the Struct of what it reads: pulsed's own, then the workers' slices."""
    return {"pulsed": SupervisorConfig, **SLICES}


def key_paths(struct: type, prefix: str = "") -> set[str]:
    """Every key of a Struct as a dotted path (`timings.heartbeat_ms`, `process.health.url`)."""
    out = set()
    for field in msgspec.structs.fields(struct):
        kind, _ = table_in(field.type)
        out |= key_paths(kind, f"{prefix}{field.encode_name}.") if kind else {f"{prefix}{field.encode_name}"}
    return out


def reference(root: type) -> str:
    """docs/config.md: every table of `root` and every key, with its type, default, bounds, who reads
    it and what it does."""
    read = {name: key_paths(struct) for name, struct in readers().items()}
    out = [
        "# Configuration reference",
        "",
        "<!-- generated from the descriptors in pulse/core/config/ by scripts/gen_docs.py: edit a key there, "
        "then run it -->",
        "",
        "Every table and key of `config.toml`, generated from the keys' descriptors (pulse/core/config/: each key's",
        "type, default, bounds and help are written once, there). [configuration.md](configuration.md) shows how the",
        "keys work together, with examples. A value outside a key's bounds is refused when the file is read, naming",
        "the file, the key and the value. *Read by* is the process whose slice of the config holds the key: a reload",
        "restarts exactly the workers whose slice changed (pulsed applies its own in place).",
        "",
        "Tables: [top level](#top-level), " + ", ".join(f"[`{_header(t)}`](#{_anchor(t)})" for t in tables(root)),
        "",
    ]
    for table in [TableDoc("", root, False, "The top level of the file.")] + tables(root):
        out += [f"## {_header(table)}", "", _cell(table.help), ""]
        rows = values(table.struct)
        if not rows:
            out += ["(Its keys are the tables below it.)", ""]
            continue
        out += ["| key | type | default | bounds | read by | what it does |", "|---|---|---|---|---|---|"]
        for key in rows:
            path = f"{table.path}.{key.name}" if table.path else key.name
            who = ", ".join(name for name, paths in read.items() if path in paths) or "(the file's own)"
            out.append(f"| `{key.name}` | {_cell(type_name(key.type))} | {_cell(_default(key))} | "
                       f"{_cell(bounds_phrase(key.bounds))} | {who} | {_cell(key.help)} |")
        out.append("")
    return "\n".join(out)


def _header(table: TableDoc) -> str:
    if not table.path:
        return "top level"
    return f"[[{table.path}]]" if table.array else f"[{table.path}]"


def _anchor(table: TableDoc) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", _header(table).lower()).replace(" ", "-")


def _default(key: Key) -> str:
    example = f" (e.g. `{toml_value(key.examples[0])}`)" if key.examples else ""
    if key.default is msgspec.NODEFAULT:
        return "required" + example
    if key.default is None:
        return "unset" + example
    return f"`{toml_value(key.default)}`"


def _cell(text: str) -> str:
    """`text` fit for a table cell: its pipes escaped, and outside code spans its angle brackets
    (`<home>/reports` is a placeholder, not an HTML tag)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))
