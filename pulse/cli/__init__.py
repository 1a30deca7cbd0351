"""pulsectl: inspect and steer a running pulsed.

The click application is in `group`, each command in its own module, and heavy
imports stay inside the commands that need them. `pulsectl status` is what
health checks and operators run in loops, so a plain status invocation
(`[--home DIR | -i NAME] [--timeout S] status [--json]`) is served without importing
click at all, which alone costs more than the request, and so is every other command
that ends in a moment (pulse.cli.fastpath), and a plain `pulsectl mcp`
(`[--home DIR] [--timeout S] mcp [--agent NAME]`), which every agent run starts, and which goes
straight to the gate's proxy (pulse.gate.proxy). Anything they are not sure of goes through click.
"""

from __future__ import annotations

import gc
import os
import sys

from pulse.cli.launch import chosen_home, global_options
from pulse.core.leanimport import import_msgspec

# Imports inside functions: main() imports only the path it takes: a plain `pulsectl mcp` loads neither
# click nor the status view, a plain status no click (tests/test_cli_imports.py holds both).


def plain_status(argv: list[str]) -> tuple[str | None, float, bool] | None:
    """(home, timeout, as_json) when argv is a plain status invocation; None sends it to click."""
    parsed = global_options(argv)
    if parsed is None or parsed[3] not in (["status"], ["status", "--json"]):
        return None
    return chosen_home(parsed[0], parsed[1]), parsed[2], parsed[3][-1] == "--json"


def plain_mcp(argv: list[str]) -> tuple[str | None, str | None] | None:
    """(home, agent) when argv is a plain `mcp` invocation; None sends it to click."""
    parsed = global_options(argv)
    if parsed is None or not parsed[3] or parsed[3][0] != "mcp":
        return None
    args = parsed[3][1:]
    if not args:
        agent = None
    elif len(args) == 2 and args[0] == "--agent" and args[1] and not args[1].startswith("-"):
        agent = args[1]
    elif len(args) == 1 and args[0].startswith("--agent=") and len(args[0]) > len("--agent="):
        agent = args[0].removeprefix("--agent=")
    else:
        return None
    return chosen_home(parsed[0], parsed[1]), agent


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
        from pulse.cli import statusview  # loads no msgspec (it reads pulsed's reply as plain data)
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
            cli(prog_name="pulsectl")       # as pulse.cli.helptext names it, however the script is called
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
