"""The engine's effect budget: whatever the agent's rules return, the host sees a bounded stream.

A naive business rule that emits `notify` on every tick would send one each time an
effect's outcome wakes the tick. So the tick passes the effects of origin `engine` through
`admit()` before it commits them:

- identical effects (kind, target, params) within `engine_dedupe_s` are committed once, unless
  the last of them failed or expired: a retry of what failed (a task handed out again) passes;
- at most `engine_effects_per_min` engine effects are committed in any minute.

The rest are dropped: the tick records one coalesced `error` naming the rule, and survival tells
the operator once. Both limits count what was committed before, folded from events.db (the tick's
projections), so restarting the tick resets nothing. Pure functions: no I/O here.
"""

from __future__ import annotations

import json
from typing import Collection, Iterable, Sequence

from pulse.core.wire.enginerpc import Effect

WINDOW_S = 60.0      # engine_effects_per_min counts this window


def fingerprint(effect: Effect) -> str:
    """What makes two effects the same one: kind, target, params."""
    return json.dumps([effect.kind, effect.target, effect.params], sort_keys=True, default=str)


def admit(effects: Sequence[Effect], recent: Iterable[tuple[float, str]], now: float,
          dedupe_s: float, per_min: int, retryable: Collection[str] = ()) -> tuple[list[Effect], list[tuple[Effect, str]]]:
    """(effects to commit, [(effect, why) dropped]). `recent`: (ts, fingerprint) of the engine
    effects committed before; `retryable`: fingerprints whose last effect failed or expired.
    Effects of other origins always pass."""
    recent = list(recent)
    seen = {fp for ts, fp in recent if now - ts < dedupe_s} - set(retryable)
    spent = sum(1 for ts, _ in recent if now - ts < WINDOW_S)
    kept: list[Effect] = []
    dropped: list[tuple[Effect, str]] = []
    for effect in effects:
        if effect.origin != "engine":
            kept.append(effect)
            continue
        fp = fingerprint(effect)
        if fp in seen:
            dropped.append((effect, f"identical to one committed within {dedupe_s:g}s"))
        elif spent >= per_min:
            dropped.append((effect, f"over {per_min} engine effects a minute"))
        else:
            seen.add(fp)
            spent += 1
            kept.append(effect)
    return kept, dropped


def culprits(dropped: Sequence[tuple[Effect, str]]) -> dict[str, str]:
    """Each rule whose effects were dropped, with why its first one was (a rule's effects carry
    its name in params["rule"]: the engine tags them)."""
    out: dict[str, str] = {}
    for effect, why in dropped:
        out.setdefault(str(effect.params.get("rule") or "the engine's rules"), why)
    return out
