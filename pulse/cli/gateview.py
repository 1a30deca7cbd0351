"""`pulsectl gate sessions` and `pulsectl gate-reset` themselves, click-free: pulse.cli.mcp declares
them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from pulse.cli.context import Context, echo, fail
from pulse.core.home import GATE_SOCKET_ENV

if TYPE_CHECKING:
    from pulse.gate import protocol

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def gate_store(ctx: Context, source: str = "pulsectl"):
    """The gate's durable store on this home, caught up with every session's facts."""
    from pulse.gate.durable import DurableStore
    from pulse.store import eventsdb
    if not ctx.paths.events_db.exists():
        fail(f"no events.db in {ctx.home} (run `pulsectl init`, or start pulsed)")
    from pulse.store import projection
    store = DurableStore(eventsdb.open_events(ctx.paths.events_db), source,
                         checkpoints=ctx.paths.home / projection.DIRECTORY)
    store.catch_up()
    return store


def reset(ctx: Context, session: str | None, agent: str | None, keep_progress: bool) -> None:
    """The gate of `session`, or of every session of `agent` (exactly one of them given), reset: by
    the gate when it runs, else the fact written here."""
    from pulse.gate import protocol  # the gate's wire messages, ~1-2 ms: `gate sessions` sends none
    done = reset_through_gate(ctx, protocol.Reset(session, agent, keep_progress))
    if done is None:     # no gate running (pulsed down): nothing else decides now; the operator writes the fact
        from pulse.gate.server import operator_reset
        done = operator_reset(gate_store(ctx), session, agent, keep_progress)
    for line in done.out:
        echo(line)
    if done.err:
        echo(f"pulsectl: {done.err}", err=True)
    sys.exit(done.code)


def reset_through_gate(ctx: Context, request: protocol.Reset) -> protocol.ResetDone | None:
    """The gate's answer to a reset (it alone writes gate facts while it runs), or None when no gate
    listens. Only the operator's uid, with no run token, may reset."""
    import socket as socketmod

    from pulse.core import config as configmod
    from pulse.gate import protocol
    from pulse.gate.sockets import socket_path
    path = os.environ.get(GATE_SOCKET_ENV)      # where a run was told the gate is: it decides who may reset
    if not path:
        try:
            shared = configmod.load(ctx.paths.config).gate.socket_dir
        except (configmod.ConfigError, OSError):
            shared = ""
        path = socket_path(ctx.paths, shared)
    sock = socketmod.socket(socketmod.AF_UNIX)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    with sock, sock.makefile("rwb") as f:
        f.write(protocol.encode(request))
        f.flush()
        line = f.readline()
    try:
        reply = protocol.reply_decoder.decode(line) if line else None
    except ValueError as err:
        reply = protocol.Refused("BAD_REPLY", f"not a reply of the gate's ({err})")
    if not isinstance(reply, protocol.ResetDone):
        why = reply.message if isinstance(reply, protocol.Refused) else "the gate closed the connection"
        return protocol.ResetDone(1, [], f"the gate refused the reset: {why}")
    return reply


def sessions(ctx: Context, as_json: bool) -> None:
    """Every gate session: its agent, task, state, unverified writes and counts."""
    from pulse.cli.statusview import columns
    from pulse.core import clock
    ledger = gate_store(ctx).ledger
    rows = [ledger.summary(sid) for sid in sorted(ledger.sessions, key=lambda s: ledger.sessions[s].opened)]
    if as_json:
        import json
        for row in rows:
            echo(json.dumps(row))
        return
    if not rows:
        echo("no gate sessions yet (`pulsectl mcp` starts one)")
        return
    table = [("SESSION", "AGENT", "TASK", "STATE", "CALLS", "BLOCKED", "LAST", "UNVERIFIED")]
    table += [(r["session"], r["agent"], r["task"] or "-", r["state"], str(r["calls"]), str(r["blocked"]),
               clock.iso(r["last"], ms=False), ", ".join(r["unverified"]) or "-") for r in rows]
    for line in columns(table):
        echo(line)
