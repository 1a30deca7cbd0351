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

def process_watchdog(config: Config):
    """A configured critical process is dead: restart it (decorates: the inner chain acts first).

    It acts only on a death newer than the last restart it knows of, so a restart
    that is done but not yet seen by the watcher is not issued twice, and never
    while a restart for that target is pending.
    """
    restartable = {p.name for p in config.process if p.restart}

    async def rule(prev: Snapshot | None, curr: Snapshot, inner: Inner) -> RuleResult:
        effects, tick_ms = await inner(prev, curr)
        for name in sorted(restartable):
            vital = curr.vitals.get(f"process-alive:{name}")
            if vital is None or vital.data.get("alive", True):
                continue
            if handled(effects, "restart-process", name) or handled(curr.pending, "restart-process", name):
                continue
            last = max((o.ts for o in curr.outcomes.get(name, ()) if o.kind == "restart-process"), default=0.0)
            if vital.ts <= last:
                continue   # this death was seen before the last restart ended: wait for a fresh sample
            effects = effects + [Effect(kind="restart-process", target=name, origin="survival")]
        return effects, tick_ms
    rule.__qualname__ = "process_watchdog"
    return rule


def survival_rules(config: Config) -> list:
    """Outermost first. The full set (panic rollback, auto rollback, …) grows here."""
    return [process_watchdog(config)]
