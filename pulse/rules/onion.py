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

import msgspec

from pulse.core.wire.enginerpc import Effect, Snapshot

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


def _layer(rule, inner: Inner, tag: bool) -> Inner:
    where = getattr(rule, "__qualname__", repr(rule))

    async def call(prev: Snapshot | None, curr: Snapshot) -> RuleResult:
        passed: list[Effect] = []

        async def seen(p: Snapshot | None, c: Snapshot) -> RuleResult:
            result = await inner(p, c)
            passed.extend(result[0])
            return result
        result = rule(prev, curr, seen if tag else inner)
        if inspect.isawaitable(result):
            result = await result
        effects, tick_ms = check_result(result, where)
        if tag:
            effects = [_tagged(e, where, passed) for e in effects]
        return effects, tick_ms
    return call


def _tagged(effect: Effect, rule: str, passed: list[Effect]) -> Effect:
    """An effect this layer added (not one its inner layers returned) names it in params["rule"],
    unless the rule named itself: so the budget can say which rule floods, and curr.notified
    remembers per rule."""
    if "rule" in effect.params or any(effect is e for e in passed):
        return effect
    return msgspec.structs.replace(effect, params={**effect.params, "rule": rule})


def compose(rules: Sequence, innermost: Inner, tag: bool = False) -> Inner:
    """rules[0] is the outermost layer; innermost is called by the last rule that passes.
    tag: each effect is marked with the rule that added it (the engine's business rules)."""
    chain = innermost
    for rule in reversed(rules):
        chain = _layer(rule, chain, tag)
    return chain


async def nothing(prev: Snapshot | None, curr: Snapshot) -> RuleResult:
    return [], None


def handled(effects: Sequence[Effect], kind: str, target: str | None) -> bool:
    return any(e.kind == kind and e.target == target for e in effects)
