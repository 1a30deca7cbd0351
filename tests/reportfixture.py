"""A fixture history for the report's tests and benchmark, written into a real events.db.

Two agents: `good` acks every run, `bad` fails every run (task-3 is given up after 3); a survival
repair (restart-process gateway) that failed, one that worked (cleanup); a promote and its rollback.
"""

from __future__ import annotations

from pathlib import Path

from pulse.core.wire.eventmsgs import Event
from pulse.store import eventsdb

T0 = 1_790_000_000.0          # 2026-09-21T…Z: a fixed start, so the figures are the same every run


class History:
    def __init__(self, t0: float = T0):
        self.t = t0
        self.events: list[Event] = []

    def add(self, type: str, source: str, target: str | None, dt: float = 1.0, data: dict | None = None,
            **fields) -> Event:
        self.t += dt
        ev = Event(type=type, source=source, target=target, data={**(data or {}), **fields}, ts=self.t, mono=self.t)
        self.events.append(ev)
        return ev

    def effect(self, id: str, kind: str, target: str | None, origin: str, dt: float = 1.0, **params) -> Event:
        return self.add("effect", "tick" if origin != "operator" else "pulsectl", target, dt, data={
            "id": id, "kind": kind, "target": target, "params": params, "origin": origin, "idempotent": False,
            "created": self.t + dt, "deadline": self.t + dt + 60})

    def run(self, task: str, agent: str, run: str, ok: bool, seconds: float, error: str = "exit code 1",
            given_up: bool = False, failures: int = 0) -> None:
        self.effect(run, "agent-run", task, "engine", task_id=task, agent=agent)
        self.add("effect-executing", "executor", task, effect_id=run, kind="agent-run")
        self.add("task-assigned", "executor", task, 0.01, agent=agent, run=run)
        self.add("task-executing", "executor", task, 0.01, agent=agent, run=run)
        if ok:
            self.add("task-acked", "executor", task, seconds, agent=agent, run=run,
                     result={"code": 0, "total_cost_usd": 0.02})
            self.add("effect-acked", "executor", task, 0.01, effect_id=run, kind="agent-run", run_ms=seconds * 1000)
        else:
            self.add("task-failed", "executor", task, seconds, agent=agent, run=run, reason="agent", error=error)
            if given_up:
                self.add("task-given-up", "executor", task, 0.0, reason=f"failed {failures} times in a row",
                         by="executor", failures=failures)
            self.add("effect-failed", "executor", task, 0.01, effect_id=run, kind="agent-run", reason="agent",
                     error=error)


def fixture_history(title_of_task_1: str = "build the site") -> History:
    h = History()
    for n, (project, title) in enumerate([("web", title_of_task_1), ("web", "fix the css"), ("ops", "rotate keys")], 1):
        h.add("task-created", "pulsectl", f"task-{n}", project=project, title=title, prompt="do it", priority=0)
    h.run("task-1", "good", "run-g1", True, 10)
    h.run("task-2", "good", "run-g2", True, 12)
    for attempt in (1, 2, 3):
        h.run("task-3", "bad", f"run-b{attempt}", False, 5, error="exit code 2: cannot reach the vault",
              given_up=attempt == 3, failures=attempt)
    h.add("promote", "pulsectl", "engine", 5, before="a" * 40, after="b" * 40)
    h.effect("surv-1", "restart-process", "gateway", "survival")
    h.add("effect-executing", "executor", "gateway", effect_id="surv-1", kind="restart-process")
    h.add("effect-failed", "executor", "gateway", effect_id="surv-1", kind="restart-process", reason="exit",
          error="restart of 'gateway': exit code 1")
    h.effect("surv-2", "cleanup", "disk", "survival", patterns=[])
    h.add("effect-executing", "executor", "disk", effect_id="surv-2", kind="cleanup")
    h.add("effect-acked", "executor", "disk", effect_id="surv-2", kind="cleanup", removed=3)
    h.effect("surv-3", "engine-rollback", "engine", "survival", to="a" * 40, rule="auto-rollback")
    h.add("effect-executing", "executor", "engine", effect_id="surv-3", kind="engine-rollback")
    h.add("rollback", "executor", "engine", before="b" * 40, after="c" * 40, to="a" * 40, reason="auto-rollback")
    h.add("effect-acked", "executor", "engine", effect_id="surv-3", kind="engine-rollback")
    return h


def write(path: Path, events: list[Event]) -> list[Event]:
    conn = eventsdb.open_events(path)
    try:
        return eventsdb.append_events(conn, events)
    finally:
        conn.close()
