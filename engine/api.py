"""The public API for engine authors: what the agent's rules, watchers and executors are.

An engine directory holds three folders of plain Python modules, loaded in file
name order, each exporting what it defines:

    rules/*.py      RULES = [rule, ...]          outermost first
    watchers/*.py   WATCHERS = [Watcher(), ...]
    executors/*.py  EXECUTORS = [Executor(), ...]

A rule is `rule(prev, curr, inner) -> (effects, tick_ms)`, plain or `async def`.
`inner(prev, curr)` is the rest of the chain; it is a coroutine function, so a
rule that calls it is `async def`:

    async def passthrough(prev, curr, inner):        # pass
        return await inner(prev, curr)

    def quiet(prev, curr, inner):                    # bypass
        return [], None

    async def decorate(prev, curr, inner):           # decorate
        effects, tick_ms = await inner(prev, curr)
        return effects + [Effect(kind="noop")], tick_ms

    async def transform(prev, curr, inner):          # transform the snapshot
        return await inner(prev, msgspec.structs.replace(curr, vitals={}))

`tick_ms` None means "no opinion"; the tick clamps what it gets. Nothing here
reaches survival rules or their configuration: they live in the tick process.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Union

from pulse.core.plugins import Executor, Watcher
from pulse.core.wire.enginerpc import AgentLoad, Effect, KnownGood, Outcome, Snapshot, Vital

__all__ = ["AgentLoad", "Effect", "Executor", "Inner", "KnownGood", "Outcome", "Rule", "RuleResult", "Snapshot", "Vital", "Watcher"]

RuleResult = tuple[list[Effect], Union[int, None]]
Inner = Callable[[Union[Snapshot, None], Snapshot], Awaitable[RuleResult]]
Rule = Callable[[Union[Snapshot, None], Snapshot, Inner], Union[RuleResult, Awaitable[RuleResult]]]
