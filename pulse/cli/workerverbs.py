"""`pulsectl restart|start WORKER`, `pulsectl stop [WORKER]` themselves, click-free (pulse.cli.workercmd
declares them to click, pulse.cli.fastpath runs them without it).

Operator actions never count toward the restart intensity limit. A stopped worker stays stopped
across pulsed restarts until `pulsectl start`. Each waits (up to `wait` seconds, none with `no_wait`)
until the worker is where it was asked to be, and exits 1 naming where it is if it is not.
"""

from __future__ import annotations

import time

from pulse.cli.context import Context, echo, fail
from pulse.core.client import daemon_pid
from pulse.core.states import WorkerState
from pulse.core.wire import controlmsgs

POLL_S = 0.05


def listed(ctx: Context, name: str) -> controlmsgs.WorkerStatus | None:
    """The worker as status lists it; None when it is not listed (the web worker, not enabled)."""
    return next((w for w in ctx.request(controlmsgs.GetStatus()).status.workers if w.name == name), None)


def wait_for(ctx: Context, name: str, done, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        worker = listed(ctx, name)
        if worker is None:
            fail(f"{name} is no longer listed (its config table turned it off)")
        if done(worker):
            echo(f"{name}: {worker.state}" + (f" (pid {worker.pid})" if worker.pid else ""))
            return
        if time.monotonic() >= deadline:
            fail(f"{name} is {worker.state} after {seconds:g}s")
        time.sleep(POLL_S)


def restart(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    found = listed(ctx, worker)          # not listed (web, not enabled): pulsed's refusal says why
    old = found.pid if found else None
    echo(ctx.request(controlmsgs.RestartWorker(worker)).message)
    if wait and not no_wait:
        wait_for(ctx, worker, lambda w: w.state == WorkerState.RUNNING and w.pid != old, wait)


def start(ctx: Context, worker: str, wait: float, no_wait: bool) -> None:
    echo(ctx.request(controlmsgs.StartWorker(worker)).message)
    if wait and not no_wait:
        wait_for(ctx, worker, lambda w: w.state == WorkerState.RUNNING, wait)


def stop(ctx: Context, worker: str | None, wait: float, no_wait: bool) -> None:
    """`worker`, kept stopped; None: pulsed itself, returning once it has exited."""
    wait = 0 if no_wait else wait
    if worker is None:
        pid = daemon_pid(ctx.paths)
        echo(ctx.request(controlmsgs.Shutdown()).message)
        deadline = time.monotonic() + wait
        while wait and pid and daemon_pid(ctx.paths) == pid:
            if time.monotonic() >= deadline:
                fail(f"pulsed (pid {pid}) still running after {wait:g}s")
            time.sleep(POLL_S)
        if wait and pid:
            echo(f"pulsed (pid {pid}) stopped")
        return
    echo(ctx.request(controlmsgs.StopWorker(worker)).message)
    if wait:
        wait_for(ctx, worker, lambda w: w.state == "stopped", wait)
