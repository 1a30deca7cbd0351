"""What every path of pulsectl shares, with click or without (pulse.cli.main, pulse.cli.fastpath, the
click group): reaching a pulsed (which one: the registries, -i NAME; asking it; what to say when it
does not answer), and pulsectl's own options read from argv. Below every other module of
pulse.cli, importing none of them."""

from __future__ import annotations

import os
import sys

from pulse.core.leanimport import import_pathlib

import_pathlib()     # the first pathlib of pulsectl's process: without urllib.parse
from pathlib import Path  # noqa: E402

# Imports inside functions: the plain status path and pulsectl's fast path import this module; each
# function imports what only it needs when it runs (pulse.core.client: libzmq ~18 ms; instances only
# when pulsed does not answer or -i is given; msgspec under pulse.core.leanimport's terms).

DEFAULT_TIMEOUT_S = 3.0


def request_or_exit(paths, message, timeout: float):
    """Send a control request; exit 4 (LSB: unknown) when pulsed cannot be reached, 1 when it refuses.
    `message` is a Struct, and the reply a controlmsgs.Reply; or a frame already encoded, and the
    reply plain data (pulse.core.wire.plainmsgpack: no msgspec), without the fields Reply omits at
    their defaults."""
    from pulse.core import client
    from pulse.core.states import StatusExit
    try:
        if isinstance(message, bytes):
            # the module by name: `from pulse.core.wire import` asks the package's __getattr__ first, which loads msgspec
            from pulse.core.wire.plainmsgpack import unpack
            reply = unpack(client.exchange(paths, message, timeout))
            ok, error = reply["ok"], reply.get("error")
        else:
            reply = client.request(paths, message, timeout)
            ok, error = reply.ok, reply.error
    except client.Unreachable as err:
        print(f"pulsectl: {err}{elsewhere(paths.home)}", file=sys.stderr)
        sys.exit(StatusExit.UNKNOWN)
    if not ok:
        print(f"pulsectl: {error}", file=sys.stderr)
        sys.exit(1)
    return reply


def _instances():
    """pulse.core.instances, whose msgspec comes without typing_extensions (pulse.core.leanimport): a
    status that finds no pulsed loads it, and runs in loops all the same."""
    from pulse.core.leanimport import import_msgspec
    import_msgspec()
    from pulse.core import instances
    return instances


def registries() -> list:
    """This user's registry (where a pulsed of the default home registers) and the system one.
    (Here, not in pulse.cli.roster: the plain status path says `elsewhere` without click.)"""
    instances = _instances()
    from pulse.core.home import derived_runtime_dir, resolve_home
    mine = instances.registry_dir(derived_runtime_dir(resolve_home(None)))
    return [mine] + ([instances.SYSTEM_REGISTRY] if instances.SYSTEM_REGISTRY != mine else [])


def home_of(name: str) -> str:
    """The home of the running instance called `name` (`pulsectl -i NAME`); exits 1 naming what runs otherwise."""
    instances = _instances()
    try:
        return instances.find(registries(), name)["home"]
    except LookupError as err:
        print(f"pulsectl: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def elsewhere(home) -> str:
    """The Pulses that do run on this host (their names, for -i), when the one asked for does not."""
    instances = _instances()
    try:
        others = [e for e in instances.live_entries(registries()) if Path(e["home"]) != Path(home)]
    except OSError:
        return ""
    if not others:
        return ""
    names = ", ".join(f"{e['name']} (home {e['home']})" for e in others)
    return f"; running on this host: {names}: select one with pulsectl -i NAME"


def global_options(argv: list[str]) -> tuple[str | None, str | None, float, list[str]] | None:
    """(--home, -i, --timeout, the rest) from pulsectl's own options before the command; None when
    unsure, which sends argv to click (which says what is wrong with them). The instance's home is
    looked up (home_of) only once the command is known to be served: click looks it up after naming
    the command, and says an unknown command first."""
    home, instance, timeout, args = None, None, DEFAULT_TIMEOUT_S, list(argv)
    seen = set()
    while args and args[0].startswith("-") and args[0] not in ("--version", "--help", "-h"):
        option, eq, value = args.pop(0).partition("=")
        if option == "-i" and not eq:
            option = "--instance"     # (`-i=x` is click's: a short option's value would be "=x")
        if option not in ("--home", "--timeout", "--instance") or option in seen:
            return None
        seen.add(option)
        if not eq:
            if not args:
                return None
            value = args.pop(0)
        if value.startswith("-"):
            return None
        if option == "--home":
            if not value or os.path.isfile(value):
                return None          # click says what is wrong with it
            home = value
        elif option == "--instance":
            instance = value
        else:
            try:
                timeout = float(value)
            except ValueError:
                return None
    if home is None and (env := os.environ.get("PULSE_HOME")) and os.path.isfile(env):
        return None                  # click refuses a PULSE_HOME that names a file
    if instance is not None and (home is not None or {"--help", "-h", "--version"} & set(args)):
        return None                  # exclusive, or help (which click gives before looking the instance up)
    return home, instance, timeout, args


def chosen_home(home: str | None, instance: str | None) -> str | None:
    """The home global_options' choice names: the running instance's (exit 1 naming what runs when
    there is none of that name), else --home (None: $PULSE_HOME, else ~/.pulse)."""
    return home_of(instance) if instance is not None else home
