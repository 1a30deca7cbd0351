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

from typing import Any, Awaitable, Callable, Union

from pulse.core.wire import Effect, Outcome, Snapshot, Vital

__all__ = ["Effect", "Executor", "Inner", "Outcome", "Rule", "RuleResult", "Snapshot", "Vital", "Watcher"]

RuleResult = tuple[list[Effect], Union[int, None]]
Inner = Callable[[Union[Snapshot, None], Snapshot], Awaitable[RuleResult]]
Rule = Callable[[Union[Snapshot, None], Snapshot, Inner], Union[RuleResult, Awaitable[RuleResult]]]


class Watcher:
    """Senses one thing. `collect()` returns the sample's data (a JSON-able dict), written to
    vitals.db under `key` every `interval_ms`; `should_wake(window)` sees the key's last
    minute of vitals (oldest first) and returns True to ring the tick at once."""

    name: str = "watcher"
    key: str = "watcher"
    interval_ms: int = 5_000
    timeout_s: float = 5.0       # a collect() slower than this is an error; the others carry on

    def collect(self) -> dict[str, Any]:
        raise NotImplementedError

    def should_wake(self, window: list[Vital]) -> bool:
        return False


class Executor:
    """Carries out effects of one `kind`. `run(effect)` returns a JSON-able result dict,
    or raises to fail the effect."""

    kind: str = "executor"

    def run(self, effect: Effect) -> dict[str, Any]:
        raise NotImplementedError
