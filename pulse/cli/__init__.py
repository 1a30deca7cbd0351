"""pulsectl: inspect and steer a running pulsed.

The click application is in `group`, each command in its own module, and heavy
imports stay inside the commands that need them. `pulsectl status` is what
health checks and operators run in loops, so a plain status invocation
(`[--home DIR] [--timeout S] status [--json]`) is served without importing
click at all, which alone costs more than the request, and so are the other
commands run in loops (pulse.cli.fastpath) and a plain `pulsectl mcp`
(`[--home DIR] [--timeout S] mcp [--agent NAME]`), which every agent run starts, and which goes
straight to the gate's proxy (pulse.gate.proxy). Anything else, `--help` included, goes through click.
"""

from __future__ import annotations

import gc
import os
import sys

DEFAULT_TIMEOUT_S = 3.0


def request_or_exit(paths, message, timeout: float):
    """Send a control request; exit 4 (LSB: unknown) when pulsed cannot be reached, 1 when it refuses."""
    from pulse.core import client
    from pulse.core.states import StatusExit
    try:
        reply = client.request(paths, message, timeout)
    except client.Unreachable as err:
        print(f"pulsectl: {err}{elsewhere(paths.home)}", file=sys.stderr)
        sys.exit(StatusExit.UNKNOWN)
    if not reply.ok:
        print(f"pulsectl: {reply.error}", file=sys.stderr)
        sys.exit(1)
    return reply


def registries() -> list:
    """This user's registry (where a pulsed of the default home registers) and the system one.
    (Here, not in pulse.cli.roster: the plain status path says `elsewhere` without click.)"""
    from pulse.core import instances
    from pulse.core.home import derived_runtime_dir, resolve_home
    mine = instances.registry_dir(derived_runtime_dir(resolve_home(None)))
    return [mine] + ([instances.SYSTEM_REGISTRY] if instances.SYSTEM_REGISTRY != mine else [])


def elsewhere(home) -> str:
    """The Pulses that do run on this host (their names, for -i), when the one asked for does not."""
    from pathlib import Path

    from pulse.core import instances
    try:
        others = [e for e in instances.live_entries(registries()) if Path(e["home"]) != Path(home)]
    except OSError:
        return ""
    if not others:
        return ""
    names = ", ".join(f"{e['name']} (home {e['home']})" for e in others)
    return f"; running on this host: {names}: select one with pulsectl -i NAME"


def global_options(argv: list[str]) -> tuple[str | None, float, list[str]] | None:
    """(--home, --timeout, the rest) from pulsectl's own options before the command; None when unsure,
    which sends argv to click (which says what is wrong with them)."""
    home, timeout, args = None, DEFAULT_TIMEOUT_S, list(argv)
    seen = set()
    while args and args[0].startswith("-") and args[0] != "--version":
        option, eq, value = args.pop(0).partition("=")
        if option not in ("--home", "--timeout") or option in seen:
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
        else:
            try:
                timeout = float(value)
            except ValueError:
                return None
    if home is None and (env := os.environ.get("PULSE_HOME")) and os.path.isfile(env):
        return None                  # click refuses a PULSE_HOME that names a file
    return home, timeout, args


def plain_status(argv: list[str]) -> tuple[str | None, float, bool] | None:
    """(home, timeout, as_json) when argv is a plain status invocation; None sends it to click."""
    parsed = global_options(argv)
    if parsed is None or parsed[2] not in (["status"], ["status", "--json"]):
        return None
    return parsed[0], parsed[1], parsed[2][-1] == "--json"


def plain_mcp(argv: list[str]) -> tuple[str | None, str | None] | None:
    """(home, agent) when argv is a plain `mcp` invocation; None sends it to click."""
    parsed = global_options(argv)
    if parsed is None or not parsed[2] or parsed[2][0] != "mcp":
        return None
    args = parsed[2][1:]
    if not args:
        return parsed[0], None
    if len(args) == 2 and args[0] == "--agent" and args[1] and not args[1].startswith("-"):
        return parsed[0], args[1]
    if len(args) == 1 and args[0].startswith("--agent=") and len(args[0]) > len("--agent="):
        return parsed[0], args[0].removeprefix("--agent=")
    return None


def import_msgspec() -> None:
    """msgspec uses typing_extensions when it is installed (mcp brings it in), and importing it costs
    ~11 ms, inspect included; no type of ours needs it, so msgspec is imported without it. Only
    msgspec: a command that needs typing_extensions itself (mcp) imports it as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]


def main() -> None:
    argv = sys.argv[1:]
    mcp = plain_mcp(argv)
    if mcp is not None:
        import_msgspec()
        from pulse.gate import proxy
        sys.exit(proxy.run(*mcp))
    # The commands served below end in a moment, their garbage with the process: the collector's
    # passes over every object the imports made were ~4 ms of each (and objects they free are freed by
    # their reference counts all the same). Those that keep running (click's, `events --follow`)
    # turn it back on.
    gc.disable()
    plain = plain_status(argv)
    if plain is not None:
        import_msgspec()   # before the wire
        from pulse.cli import statusview
        from pulse.core.home import Paths, resolve_home
        home, timeout, as_json = plain
        try:
            code = statusview.show(Paths.for_client(resolve_home(home)), timeout, as_json)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BrokenPipeError:   # `pulsectl status | head -1`: the reader has what it wanted
            code = 1
    else:
        from pulse.cli import fastpath
        run = fastpath.resolve(argv)
        if run is None:
            gc.enable()
            from pulse.cli.group import cli
            cli()
            return
        code = fastpath.serve(run)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:   # a closed pipe: nobody is reading
            pass
    # Skip the interpreter's teardown, which frees every module one by one and costs more than
    # the request: the output is flushed and the sockets and databases closed or committed, so
    # nothing is left to finish.
    os._exit(code)
