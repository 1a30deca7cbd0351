"""The onion: rules composed around an innermost layer.

A rule is `rule(prev, curr, inner) -> (effects, tick_ms)`, plain or async (see
pulse.engine.api). `compose(rules, innermost)` nests them, outermost first, and
returns the chain as a coroutine function. The tick composes the survival rules
(pulse.rules.survival) around the engine's business chain, reached over RPC; the
engine composes the agent's rules around `nothing`.
"""

from __future__ import annotations

import inspect
from typing import Awaitable, Callable, Sequence

from pulse.core.wire import Effect, Snapshot

RuleResult = tuple[list[Effect], int | None]
Inner = Callable[[Snapshot | None, Snapshot], Awaitable[RuleResult]]


class RuleError(Exception):
    """A rule returned something that is not (effects, tick_ms)."""


def check_result(result: object, where: str) -> RuleResult:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RuleError(f"{where} returned {type(result).__name__}, not (effects, tick_ms)")
    effects, tick_ms = result
    if not isinstance(effects, list) or not all(isinstance(e, Effect) for e in effects):
        raise RuleError(f"{where} returned effects that are not a list of Effect")
    if tick_ms is not None and (isinstance(tick_ms, bool) or not isinstance(tick_ms, int)):
        raise RuleError(f"{where} returned tick_ms {tick_ms!r}, not an int or None")
    return effects, tick_ms


def _layer(rule, inner: Inner) -> Inner:
    where = getattr(rule, "__qualname__", repr(rule))

    async def call(prev: Snapshot | None, curr: Snapshot) -> RuleResult:
        result = rule(prev, curr, inner)
        if inspect.isawaitable(result):
            result = await result
        return check_result(result, where)
    return call


def compose(rules: Sequence, innermost: Inner) -> Inner:
    """rules[0] is the outermost layer; innermost is called by the last rule that passes."""
    chain = innermost
    for rule in reversed(rules):
        chain = _layer(rule, chain)
    return chain


async def nothing(prev: Snapshot | None, curr: Snapshot) -> RuleResult:
    return [], None


def handled(effects: Sequence[Effect], kind: str, target: str | None) -> bool:
    return any(e.kind == kind and e.target == target for e in effects)
