"""A config key's descriptor, and reading it back.

A key is a field of a table's Struct: its type, its default, its bounds as msgspec constraints
(`Annotated[int, Meta(ge=1, le=20)]`: msgspec enforces them as the file is decoded), and its help as
the string right under it, one sentence with its unit, ending with "Example: `<TOML value>`" when
the key has no default to show. A table is a `Table` Struct; its docstring is its help. Everything
else that names a key (the bounds' error messages, `pulsectl init`'s sample, docs/config.md) reads
it from here, so a key is written once.

The help is read from the source (an attribute's docstring), not carried at run time: an
Annotated description for each of ~250 keys made every process that reads config.toml spend
~17 ms more CPU in typing and msgspec (import and first decode, measured on 2 cores).
"""

import functools
import re
import sys
import typing
from typing import Annotated, Any, Literal

import msgspec

from pulse.core.leanimport import import_tomllib

BOUNDS = ("gt", "ge", "lt", "le")              # the numeric constraints a key's Meta may carry


class ConfigError(Exception):
    """Bad configuration: names the file or variable, the key path, and the problem."""


def decode_toml(text: str | bytes) -> dict:
    """msgspec.toml.decode(text), its comment lines blanked first. tomllib is pure Python: it takes
    ~1.6 ms over the ~450 comment lines of the config.toml init writes, and ~0.02 ms over the rest. A
    line is blanked (kept, so an error's line number is the file's) only when it is certainly a
    comment: it starts with # after blanks and the text has no triple quote (so no multi-line string
    could hold it); one that is not printable (a control character, which TOML refuses in a comment
    too; a tab, which it allows) is left for the parser to judge."""
    import_tomllib()
    try:
        plain = text.decode() if isinstance(text, bytes) else text
    except UnicodeDecodeError:
        return msgspec.toml.decode(text)           # msgspec says where
    if '"""' not in plain and "'''" not in plain:
        plain = "\n".join("" if line.lstrip().startswith("#") and line.isprintable() else line
                           for line in plain.split("\n"))
    return msgspec.toml.decode(plain)


class Table(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A table of config.toml: an unknown key in it is an error, and every key is named."""


class Key(msgspec.Struct, frozen=True):    # not a NamedTuple: making one costs every process ~0.3 ms at import
    """One key of a table, as its annotation and default say."""
    name: str
    type: Any                                   # the annotation, every Annotated layer taken off
    default: Any                                # msgspec.NODEFAULT: required
    bounds: dict[str, float]                    # of BOUNDS, as its Meta says
    help: str
    examples: list


def unwrapped(annotation: Any) -> Any:
    """`annotation` without its Annotated layers, at any depth of a union (`Annotated[int, ...] | None` → `int | None`)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = annotation.__origin__
    if _is_union(annotation):
        return typing.Union[tuple(unwrapped(a) for a in typing.get_args(annotation))]
    return annotation


def metas(annotation: Any) -> list[msgspec.Meta]:
    """Every Meta of `annotation`: its own layers and its union members'."""
    out = []
    while typing.get_origin(annotation) is Annotated:
        out += [m for m in annotation.__metadata__ if isinstance(m, msgspec.Meta)]
        annotation = annotation.__origin__
    if _is_union(annotation):
        for member in typing.get_args(annotation):
            out += metas(member)
    return out


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) is typing.Union or type(annotation).__name__ == "UnionType"


def keys_of(table: type[msgspec.Struct]) -> list[Key]:
    """The keys of `table` in declaration order, each with what its descriptor says."""
    docs = {name: doc for cls in reversed(table.__mro__) for name, doc in _attribute_docs(cls).items()}
    out = []
    for field in msgspec.structs.fields(table):
        found = metas(field.type)
        bounds = {b: getattr(m, b) for m in found for b in BOUNDS if getattr(m, b) is not None}
        # a key made by code (a worker's retry key) carries its help in its Meta
        help, examples = _help_and_examples(docs.get(field.name) or next((m.description for m in found if m.description), ""))
        default = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
        out.append(Key(field.encode_name, unwrapped(field.type), default, bounds, help, examples))
    return out


_EXAMPLE = r"\s*Example:\s+`(?P<toml>[^`]+)`\s*$"   # compiled at first use: only help reads it


def _help_and_examples(doc: str) -> tuple[str, list]:
    """A key's docstring → its help (one line) and its example, read as TOML."""
    found = re.search(_EXAMPLE, doc)
    if not found:
        return " ".join(doc.split()), []
    import tomllib  # only the reference's examples
    return " ".join(doc[:found.start()].split()), [tomllib.loads(f"v = {found['toml']}")["v"]]


@functools.cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """{key: the string under it} of a class, read from its module's source (none for a class made by code)."""
    import ast  # the help is read by init, check-config and the docs, not as a config loads
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not file or not file.endswith(".py"):
        return {}
    body = next((node.body for node in _module_tree(file).body
                 if isinstance(node, ast.ClassDef) and node.name == cls.__qualname__), [])
    return {node.target.id: after.value.value for node, after in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}


@functools.cache
def _module_tree(file: str):
    import ast  # only when a key's help is read (the reference, the sample): not on a config load
    with open(file, encoding="utf-8") as f:
        return ast.parse(f.read())


def table_in(annotation: Any) -> tuple[type[msgspec.Struct] | None, bool]:
    """The table a key's value is (`health: Health | None`), and whether it is an array of them
    (`process: list[Process]`); (None, False) for a plain value."""
    kind = unwrapped(annotation)
    array = typing.get_origin(kind) is list
    if array:
        kind = typing.get_args(kind)[0]
    members = typing.get_args(kind) if _is_union(kind) else (kind,)
    tables = [m for m in members if isinstance(m, type) and issubclass(m, msgspec.Struct)]   # a slice's cut too
    # a key that takes a string or a table (`pidfile = "..."` or `{ path, key }`) is a value
    if len(tables) == 1 and all(m is type(None) or m is tables[0] for m in members):
        return tables[0], array
    return None, False


def bounds_phrase(bounds: dict[str, float]) -> str:
    """"greater than 0", "at least 1", "within 1 … 20": what a key's bounds say, as the errors say it."""
    if "ge" in bounds and "le" in bounds:
        return f"within {_num(bounds['ge'])} … {_num(bounds['le'])}"
    parts = [f"{word} {_num(bounds[b])}" for b, word in
             (("gt", "greater than"), ("ge", "at least"), ("lt", "below"), ("le", "at most")) if b in bounds]
    return " and ".join(parts)


def _num(value: float) -> str:
    return f"{value:,}".replace(",", " ") if isinstance(value, int) and abs(value) >= 10_000 else f"{value:g}"


def type_name(kind: Any) -> str:
    """A key's type as config.toml spells it: integer, float, string, boolean, "a" | "b", array of …"""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if _is_union(kind):
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"array of {type_name(args[0])}"
    if origin is dict:
        return f"table of {type_name(args[1])}"
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return "table"
    return {int: "integer", float: "float", str: "string", bool: "boolean", Any: "any"}.get(kind, str(kind))
