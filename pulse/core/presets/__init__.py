"""Presets of [[process]] tables: the settings Pulse's realcli tests run the real tools with, as data.

`[[process]] preset = "openclaw-gateway"` takes the table of presets/openclaw-gateway.toml, and the
table's own keys win, key by key (inline tables such as `health` and `env` merged, so that
`health = { start_period_s = 30 }` keeps the preset's url; a list replaces the preset's whole). The
preset's `{home}` and `{uid}` are those of the account the process runs as: a `HOME` in the
table's own env, else the home of its `user`, else Pulse's own HOME; `{python}` is the Python Pulse
runs on (a preset's way out of a crash loop may be a module of this package). The merge happens on the
decoded TOML before it is typed and validated, so a preset's table is checked as a hand-written one,
and `pulsectl config --effective` shows it whole.

Each file also says the tool versions it was tested on (`tested`, the pins of
scripts/install_realcli.sh) and the keys a table must set itself (`requires`: a secret, say).
"""

from __future__ import annotations

import os
import pwd
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).parent

# Keys of which a table sets one: the table's choice drops the preset's other.
EXCLUSIVE = (("pidfile", "match"),)
EXCLUSIVE_HEALTH = (("url", "argv"),)


class PresetError(Exception):
    """A preset that does not exist, or a table that lacks what its preset requires: `key` is the
    table's key that is wrong (`preset`, `env.API_SERVER_KEY`)."""

    def __init__(self, key: str, why: str):
        super().__init__(f"{key}: {why}")
        self.key, self.why = key, why


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.toml"))


def read(name: str) -> dict:
    """The preset file's whole content (about, guard, tested, requires, process)."""
    if name not in names():
        raise PresetError("preset", f"no preset {name!r}; the presets are: {', '.join(names())}")
    return tomllib.loads((HERE / f"{name}.toml").read_text())


def account(table: dict) -> tuple[str, int]:
    """(home, uid) of the account the table's process runs as."""
    user = table.get("user")
    if isinstance(user, str):
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise PresetError("user", f"no account {user!r}") from None
        home, uid = entry.pw_dir, entry.pw_uid
    else:
        uid = os.getuid()
        home = os.environ.get("HOME") or pwd.getpwuid(uid).pw_dir
    env = table.get("env")
    if isinstance(env, dict) and isinstance(env.get("HOME"), str):
        home = env["HOME"]
    return home.rstrip("/") or "/", uid


def expand(value: object, home: str, uid: int) -> object:
    """{home}, {uid} and {python} in the preset's strings (never in the operator's: a regex may hold
    braces)."""
    if isinstance(value, str):
        return value.replace("{home}", home).replace("{uid}", str(uid)).replace("{python}", sys.executable)
    if isinstance(value, list):
        return [expand(v, home, uid) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, home, uid) for k, v in value.items()}
    return value


def layered(base: dict, over: dict, exclusive: tuple = ()) -> dict:
    """`over` on top of `base`: tables merged key by key, anything else replaced."""
    out = dict(base)
    for one, other in exclusive:
        if one in over:
            out.pop(other, None)
        if other in over:
            out.pop(one, None)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = layered(out[key], value, EXCLUSIVE_HEALTH if key == "health" else ())
        else:
            out[key] = value
    return out


def missing(table: dict, requires: dict) -> list[tuple[str, str]]:
    """(dotted key, why) of each key the preset requires that the merged table lacks."""
    out = []
    for dotted, why in requires.items():
        value: object = table
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value in (None, ""):
            out.append((dotted, why))
    return out


def applied(table: dict) -> dict:
    """The table with its preset merged under its own keys (a table without one: as it is)."""
    name = table.get("preset")
    if name is None:
        return table
    if not isinstance(name, str):
        raise PresetError("preset", f"expected a preset's name, one of: {', '.join(names())}")
    preset = read(name)
    home, uid = account(table)
    merged = layered(expand(preset["process"], home, uid), table, EXCLUSIVE)
    for dotted, why in missing(merged, preset.get("requires", {})):
        raise PresetError(dotted, f"required with preset {name!r}: {why}")
    return merged
