"""`pulsectl promote|deploy|rollback|engine|engine log|dev` themselves, click-free: pulse.cli.enginecmd
declares them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import os

from pulse.cli.context import Context, echo, fail
from pulse.core import clock

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def reload_engine(ctx: Context) -> None:
    from pulse.core import client
    from pulse.core.wire import controlmsgs
    try:
        reply = client.request(ctx.paths, controlmsgs.RestartWorker("engine"), ctx.timeout)
    except client.Unreachable:
        echo("pulsed is not running: the engine loads the new tree when it starts")
        return
    echo(reply.message if reply.ok else f"pulsectl: engine reload refused: {reply.error}")


def promote_to_main(ctx: Context, *, deploy: bool, message: str | None = None, again: bool = False) -> None:
    from pulse.engine import repo
    verb, done = ("deploy", "deployed") if deploy else ("promote", "promoted")
    try:
        result = repo.promote(ctx.paths, deploy=deploy, typecheck=ctx.config().engine.typecheck,
                              message=message, again=again)
    except repo.EngineDirError as err:
        fail(f"{verb} refused, main untouched: {err}")
    echo(f"{done} {result.before[:12]} → {result.after[:12]} (snapshot {result.snapshot[:19]}…)")
    reload_engine(ctx)


def promote(ctx: Context, message: str | None, again: bool) -> None:
    """Merge staging into main behind the promote checks (compile, import, the engine's tests), then reload."""
    promote_to_main(ctx, deploy=False, message=message, again=again)


def deploy(ctx: Context, again: bool) -> None:
    """Promote a staging tree that is already committed."""
    promote_to_main(ctx, deploy=True, again=again)


def rollback(ctx: Context, ref: str | None) -> None:
    """Return main to an earlier tree (a new commit; or from a snapshot if git is damaged), then reload."""
    from pulse.engine import repo
    try:
        result = repo.rollback(ctx.paths, ref)
    except repo.EngineDirError as err:
        fail(str(err) if err.check == "rollback" else f"rollback failed: {err}")
    if result.before == result.after and not result.snapshot:
        echo(f"main is already at {result.after[:12]}'s tree: nothing rolled back")
        return
    how = f" from snapshot {result.snapshot[:19]}…" if result.snapshot else ""
    echo(f"rolled back {result.before[:12]} → {result.after[:12]}{how}")
    reload_engine(ctx)
    differs = repo.staging_differs(ctx.paths) if not result.snapshot else []
    if differs:
        echo("staging still has what was rolled back (a promote would bring it back):")
        for line in differs:
            echo(f"  {line}")
        echo(f"keep it: fix it in {ctx.paths.staging} and promote (as it is: promote --again); drop it: "
             f"git -C {ctx.paths.staging} reset --hard main")


def overview(ctx: Context) -> None:
    """`pulsectl engine`: what main runs and what staging holds."""
    from pulse.engine import repo
    try:
        echo(f"main at {repo.head(ctx.paths.engine)[:12]} ({ctx.paths.engine})")
        differs = repo.staging_differs(ctx.paths)
    except repo.EngineDirError as err:
        fail(str(err))
    echo(f"staging ({ctx.paths.staging}): " + (f"{len(differs)} files differ from main (a promote "
         "would ship them)" if differs else "its committed tree is main's"))
    for line in differs[:20]:
        echo(f"  {line}")
    say_what_staging_holds(ctx)


def engine_log(ctx: Context) -> None:
    """Promotes and rollbacks, oldest first."""
    from pulse.core.wire.eventmsgs import EventType
    from pulse.store import connection, eventsdb
    try:
        conn = connection.open_readonly(ctx.paths.events_db)
    except connection.StoreError as err:
        fail(str(err))
    changes = eventsdb.read_events(conn, types=[EventType.PROMOTE, EventType.ROLLBACK])
    for ev in changes:
        when = clock.iso(ev.ts, ms=False)
        d = ev.data
        detail = f"checks {','.join(d.get('checks', []))}" if ev.type == EventType.PROMOTE else f"reason {d.get('reason')}"
        echo(f"{when}  {ev.type:<8} {d.get('before', '')[:12]} → {d.get('after', '')[:12]}  "
             f"by {ev.source}  {detail}")
    if changes and changes[-1].type == EventType.ROLLBACK:    # else staging holds nothing rolled back: no git
        say_what_staging_holds(ctx, err=True)     # stdout stays one line per entry, for scripts


def say_what_staging_holds(ctx: Context, err: bool = False) -> None:
    """After a rollback (survival's own, most of all), say that staging still holds what was
    rolled back, and what a promote would do with it (err: on stderr)."""
    from pulse.engine import repo
    held = repo.rolled_back_in_staging(ctx.paths)
    if held is not None:
        echo(f"{repo.rolled_back_words(held)}; a promote refuses it without --again. Drop it: "
             f"git -C {ctx.paths.staging} reset --hard main", err=err)


def dev(ctx: Context) -> None:
    """Run the engine on the staging tree, reloading it on every change, until Ctrl-C.

    Survival keeps guarding meanwhile. Leaving dev mode returns the engine to main.
    """
    import signal

    import watchfiles

    from pulse.engine import repo
    staging = ctx.paths.staging
    if not staging.is_dir():
        fail(f"{staging} does not exist; run `pulsectl init`")
    repo.enter_dev(ctx.paths, os.getpid())
    stop = __import__("threading").Event()
    for signum in (signal.SIGTERM, signal.SIGHUP):      # a closed terminal ends dev mode cleanly too
        signal.signal(signum, lambda *_: stop.set())
    try:
        reload_engine(ctx)
        echo(f"dev mode: the engine runs {staging}; Ctrl-C returns it to main")
        for changes in watchfiles.watch(staging, stop_event=stop, watch_filter=repo.dev_filter,
                                        raise_interrupt=False, rust_timeout=500):
            echo(f"changed: {', '.join(sorted(os.path.relpath(p, staging) for _, p in changes))}")
            reload_engine(ctx)
    finally:
        repo.leave_dev(ctx.paths)
        echo("leaving dev mode: the engine returns to main")
        reload_engine(ctx)
