"""The onion: rules composed around an innermost layer, and the survival rules that ship with Pulse.

A rule is `rule(prev, curr, inner) -> (effects, tick_ms)`, plain or async (see
pulse.engine.api). `compose(rules, innermost)` nests them, outermost first, and
returns the chain as a coroutine function. Survival rules are built from config
(`survival_rules(config)`) and run in the tick process; their innermost layer is
the engine's business chain, reached over RPC.
"""

from __future__ import annotations

import inspect
from typing import Awaitable, Callable, Sequence

from pulse.config import Config
from pulse.wire import Effect, Snapshot

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


# -- survival rules ---------------------------------------------------------------------------------

def failure_streak(outcomes, kind: str) -> list:
    """The trailing failed outcomes of `kind` (oldest first): the current streak of failures."""
    streak = []
    for outcome in reversed([o for o in outcomes if o.kind == kind]):
        if outcome.state == "acked":
            break
        streak.append(outcome)
    return streak[::-1]


def backoff_s(streak: int, base_s: float, max_s: float) -> float:
    return 0.0 if streak == 0 else min(base_s * 2 ** (streak - 1), max_s)


def process_watchdog(config: Config):
    """A configured critical process is dead: restart it (decorates: the inner chain acts first).

    Its memory is the snapshot's, folded from events.db: a killed tick forgets nothing.
    - It acts only on a death newer than the last restart outcome, so a restart that
      is done but not yet seen by the watcher is not issued twice; never while one
      for that target is pending, nor where the inner chain already emitted one.
    - After a failed restart it waits (backoff doubling from process_backoff_base_s).
    - After process_notify_after failed restarts in a row it notifies, once per streak,
      and keeps trying slowly.
    """
    restartable = {p.name for p in config.process if p.restart}
    s = config.survival

    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for name in sorted(restartable):
            vital = curr.vitals.get(f"process-alive:{name}")
            if vital is None or vital.data.get("alive", True):
                continue
            if handled(effects, "restart-process", name) or handled(curr.pending, "restart-process", name):
                continue
            history = curr.outcomes.get(name, ())
            last = max((o.ts for o in history if o.kind == "restart-process"), default=0.0)
            if vital.ts <= last:
                continue   # this death was seen before the last restart ended: wait for a fresh sample
            streak = failure_streak(history, "restart-process")
            if streak and len(streak) >= s.process_notify_after and \
                    curr.notified.get(f"process-watchdog:{name}", 0.0) < streak[0].ts:
                effects = effects + [Effect(kind="notify", target=name, origin="survival", params={
                    "rule": "process-watchdog", "title": f"{name} does not come back",
                    "message": f"{len(streak)} restarts of {name} failed in a row; still trying",
                    "last_error": streak[-1].error})]
            wait = backoff_s(len(streak), s.process_backoff_base_s, s.process_backoff_max_s)
            if streak and curr.ts < streak[-1].ts + wait:
                due_ms = int((streak[-1].ts + wait - curr.ts) * 1000) + 1
                tick_ms = due_ms if tick_ms is None else min(tick_ms, due_ms)
                continue
            effects = effects + [Effect(kind="restart-process", target=name, origin="survival")]
        return effects, tick_ms
    rule.__qualname__ = "process_watchdog"
    return rule


def survival_rules(config: Config) -> list:
    """Outermost first. The full set (panic rollback, auto rollback, …) grows here."""
    return [process_watchdog(config)]
