"""msgspec, pathlib and tomllib imported without what their import drags in and no process of ours uses.

msgspec uses typing_extensions when it is installed (the MCP SDK brings it in), and importing it
costs ~11-16 ms (python -X importtime), inspect, ast and dis included, and their pages stay resident
for the life of the process; no type of ours needs it. Its import also runs `platform` (for uuid,
which asks only `platform.system()`: ~1.6 ms, nine regular expressions compiled) and `textwrap`
(for msgspec.json.schema, which we never call: ~0.8 ms), and msgspec.inspect, which it imports
for its users and never uses itself (~1.2 ms); pathlib imports urllib.parse, and with it
ipaddress (~3 ms), for `Path.as_uri()` alone; tomllib imports string (~0.8 ms: its Template compiles
a pattern) for three constants. pulsectl, pulsed and its forkserver import msgspec
(and pulsectl pathlib) through here before anything else does; each module stood in for is taken
out of sys.modules again at once, so a later `import platform` (or textwrap, urllib.parse) gets the
real one, and a module that needs typing_extensions itself (the MCP SDK, in `pulsectl mcp`)
imports it as usual.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def import_msgspec() -> None:
    if "msgspec" not in sys.modules:
        _import_standing_in("msgspec", {
            "typing_extensions": None,
            "platform": _module("platform", system=lambda: os.uname().sysname),
            "textwrap": _module("textwrap", dedent=_deferred("textwrap", "dedent")),
            "msgspec.inspect": _module("msgspec.inspect")})


def import_pathlib() -> None:
    if "pathlib" not in sys.modules:
        _import_standing_in("pathlib", {
            "urllib.parse": _module("urllib.parse", quote_from_bytes=_deferred("urllib.parse", "quote_from_bytes"))})


def import_tomllib() -> None:
    if "tomllib" not in sys.modules:
        _import_standing_in("tomllib", {
            "string": _module("string", ascii_letters="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                              digits="0123456789", hexdigits="0123456789abcdefABCDEF")})


def _import_standing_in(name: str, stand_ins: dict[str, ModuleType | None]) -> None:
    """Import `name` with `stand_ins` in sys.modules for those not imported already (None: not installed)."""
    missing = [m for m in stand_ins if m not in sys.modules]
    sys.modules.update({m: stand_ins[m] for m in missing})
    try:
        __import__(name)
    finally:
        for m in missing:
            if m in sys.modules and sys.modules[m] is stand_ins[m]:
                del sys.modules[m]


def _module(name: str, **attributes) -> ModuleType:
    """A stand-in for `name` with `attributes`; asked for anything else, it imports the real module
    (in its place, for good) and answers from it, so a Python whose imports ask more still works."""
    module = ModuleType(name, f"stands in for {name} while pulse.core.leanimport imports")

    def real_attribute(attribute: str):
        if attribute.startswith("__"):     # the import system asking what kind of module this is (__path__)
            raise AttributeError(attribute)
        if sys.modules.get(name) is module:
            del sys.modules[name]
        __import__(name)
        return getattr(sys.modules[name], attribute)
    module.__dict__.update(attributes, __getattr__=real_attribute)
    return module


def _deferred(module: str, function: str):
    """`module.function`, imported when first called."""
    def call(*args, **kwargs):
        __import__(module)
        return getattr(sys.modules[module], function)(*args, **kwargs)
    return call
