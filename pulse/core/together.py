"""Coroutines that run and end as one, like asyncio.TaskGroup, without its hang on Python 3.11.

Python 3.11's asyncio.wait_for drops a cancellation that arrives in the same turn as the result it
waits for: it returns the result, and the task goes on (bpo-42130, fixed in 3.12). nats-py waits
that way on every request. When one of the fleet link's loops failed on a reply the server sent to
several of them at once (a stream leader being elected answers each one at once, 503), TaskGroup
cancelled the others, one of them lost that cancel and looped on, and the group waited for it for
ever: the link neither worked (the failed loop was gone) nor ended ("connected", nothing logged,
the events outbox stalled). Here the cancel is sent again until each one has ended.
"""

from __future__ import annotations

import asyncio
from typing import Coroutine

RECANCEL_S = 0.1             # a task still running this long after its cancel is cancelled again


async def together(*coros: Coroutine) -> None:
    """Run `coros` until the first one ends (they are loops: one ending, failed or not, ends the
    others), then cancel the rest, again and again until each has ended; every failure is raised
    in an ExceptionGroup, as TaskGroup does. Cancelling the caller ends them all the same way."""
    tasks = [asyncio.create_task(coro) for coro in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await end_all(tasks)
    failures = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if failures:
        raise BaseExceptionGroup("tasks run together failed", failures)


async def end_all(tasks: list[asyncio.Task]) -> None:
    """Cancel every task of `tasks` not done until it is; a cancel of the caller meanwhile is kept
    for after (the tasks must not outlive it) and raised then."""
    cancelled = False
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
