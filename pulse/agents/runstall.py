"""Is a run still alive in any way that shows? ([[agent]] stall_s)

A run is silent while it prints nothing (stdout or stderr) and, when it reports to Pulse's telemetry
receiver, the receiver heard nothing of it either (its `telemetry` facts, whose `last_at` says when
the receiver last got a record of the run: pulse.agents.runfacts). A run silent for stall_s is
stalled: the run's watch (pulse.agents.runlimits.Watch) ends it at once, every process of it, reason
`stalled`, instead of waiting out timeout_s (a headless CLI hung on an API that accepts and never
answers).
"""

from __future__ import annotations

import time

from pulse.agents.runfacts import RunFacts


class Stall:
    def __init__(self, stall_s: float, facts: RunFacts | None):
        """`facts`: the run's telemetry facts (None: it reports to no receiver)."""
        self.stall_s, self.facts = stall_s, facts
        self.heard_mono = time.monotonic()      # output, or the run's start

    def output(self) -> None:
        """Called by the run's reader whenever output arrives."""
        self.heard_mono = time.monotonic()

    def silent_s(self) -> float:
        since_output = time.monotonic() - self.heard_mono
        if self.facts is None:
            return since_output
        self.facts.read()
        return min(since_output, time.time() - self.facts.heard_at) if self.facts.heard_at else since_output

    def check(self) -> tuple[str, str] | None:
        """(`stalled`, why) once the run is stalled, else None. Called from the watch's thread only."""
        silent = self.silent_s()
        if silent < self.stall_s:
            return None
        what = "no output and no telemetry" if self.facts is not None else "no output"
        return "stalled", f"the run was silent for {silent:.0f} s ({what}), past its stall_s ({self.stall_s:g} s)"
