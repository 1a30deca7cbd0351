"""Guards on what a running run reports of itself (its telemetry facts, pulse.agents.runfacts):
the run's watch (pulse.agents.runlimits.Watch) ends it at once, every process of it, when one says so.

- spend: the cost the run reported reaches the least of its agent's max_run_usd and what was left
  under its spend limits when it started (the reservation's cap_usd, pulse.agents.spend): reason
  `over-budget`. A CLI that stops itself at a cap (Claude Code's --max-budget-usd) does so only
  between turns; this ends a turn that spends past it.
- loop: more than [[agent]] loop_per_min API requests, or tool calls, reported in the last minute:
  reason `loop` (an auto-compact loop, a model that keeps calling the same tool). With [[agent]]
  on_loop = "notice" the run is not ended: the loop is said once (a `loop-noticed` fact and a
  notification, by the `notice` callback) and the run goes on; a loop that is only a busy stretch
  (a long build's many tool calls) is then the operator's call, not Pulse's.

Each reads only what the receiver was told: a run that reports nothing to it is guarded by its
spend limits at its start and its end (pulse.agents.spend), and by timeout_s and stall_s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pulse.agents.runfacts import WINDOW_S, RunFacts


def spend_cap(max_run_usd: float | None, cap_usd: float | None) -> tuple[float, str] | None:
    """(the dollars a run may report before it is ended, which limit that is), or None: no limit."""
    caps = [(float(max_run_usd), f"its agent's max_run_usd (${max_run_usd:g})")] if max_run_usd is not None else []
    if cap_usd is not None:
        caps.append((float(cap_usd), f"what was left under its spend limits when it started (${cap_usd:g})"))
    return min(caps, key=lambda c: c[0]) if caps else None


class SpendGuard:
    def __init__(self, facts: RunFacts, cap: tuple[float, str]):
        self.facts, (self.limit, self.what) = facts, cap

    def check(self) -> tuple[str, str] | None:
        self.facts.read()
        if self.facts.cost_usd <= 0 or self.facts.cost_usd < self.limit:     # a cap of 0: any spend
            return None
        return "over-budget", f"the run reported ${self.facts.cost_usd:.6g} spent, reaching {self.what}"


class LoopGuard:
    def __init__(self, facts: RunFacts, per_min: int, notice: Callable[[dict], None] | None = None):
        """`notice`: None ends a looping run; else it is called once, with what was seen (the
        run goes on), and the notice is kept in `noticed` for the run's end."""
        self.facts, self.per_min, self.notice = facts, per_min, notice
        self.noticed: dict | None = None

    def check(self) -> tuple[str, str] | None:
        if self.notice is not None and self.noticed is not None:
            return None                         # said once per run
        self.facts.read()
        requests, calls = self.facts.rate(time.time())
        if max(requests, calls) <= self.per_min:
            return None
        detail = loop_words(requests, calls, self.per_min, "the run")
        if self.notice is None:
            return "loop", detail
        self.noticed = {"guard": "loop", "detail": detail, "api_requests": requests, "tool_calls": calls,
                        "per_min": self.per_min, "at": time.time()}
        self.notice(self.noticed)
        return None


def loop_words(requests: int, calls: int, per_min: int, who: str) -> str:
    return (f"{who} reported {requests} API requests and {calls} tool calls in the last {WINDOW_S:.0f} s, "
            f"over its loop_per_min ({per_min})")
