"""What a spend limit costs an agent-run's claim: the claim transaction folds the month's spend
ledger (pulse.agents.spend), so its time grows with the runs of the month. Prints the claim time
(reserve included) against a ledger of N runs this month, on a real events.db at synchronous FULL.

    python scripts/bench_spend.py [--runs 100 1000 10000] [--claims 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pulse.agents import agentrun
from pulse.core import clock, config
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import SpendEvent, now_event
from pulse.store import effectqueue, eventsdb

CONFIG = ('[budget]\nusd_per_month = 1e9\n[[agent]]\nname = "a"\nargv = ["x"]\nconcurrency = 1000\n'
          'budget = { usd_per_day = 1e9, runs_per_hour = 1000000 }\n')


def ledger_of(conn, runs: int) -> None:
    at = clock.now()
    events = []
    for i in range(runs):
        events.append(now_event(SpendEvent.RESERVED, "bench", "a", {"effect_id": f"r{i}", "agent": "a",
                                                                    "task": f"task-{i}", "usd": 1.0, "at": at}))
        events.append(now_event(SpendEvent.SETTLED, "bench", "a", {"effect_id": f"r{i}", "agent": "a", "usd": 1.5,
                                                                   "cost_reported": True}))
    eventsdb.append_events(conn, events)


def claim_times(db: Path, cfg, claims: int) -> list[float]:
    conn = eventsdb.open_events(db, "FULL")
    effects = [effectqueue.new_effect(Effect(kind="agent-run", target=f"task-{i}", params={"agent": "a"}), "bench", 600)
               for i in range(claims)]
    effectqueue.commit_effects(conn, effects, "bench")
    out = []
    for eff in effects:
        t0 = time.perf_counter()
        claimed = effectqueue.claim_effect(conn, eff.id, "bench", "bench",
                                           reserve=lambda c, e: agentrun.reserve_spend(c, e, cfg))
        out.append(time.perf_counter() - t0)
        assert isinstance(claimed, Effect), claimed
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args()
    cfg = config.slice_of(config.validate(config.decode(CONFIG, "bench"), "bench"), "executor")
    baseline = None
    for runs in [0, *args.runs]:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "events.db"
            ledger_of(eventsdb.open_events(db), runs)
            times = claim_times(db, cfg, args.claims)
            plain = []
            if baseline is None:
                conn = eventsdb.open_events(db, "FULL")
                effects = [effectqueue.new_effect(Effect(kind="noop"), "bench", 600) for _ in range(args.claims)]
                effectqueue.commit_effects(conn, effects, "bench")
                for eff in effects:
                    t0 = time.perf_counter()
                    effectqueue.claim_effect(conn, eff.id, "bench", "bench")
                    plain.append(time.perf_counter() - t0)
                baseline = statistics.median(plain) * 1000
                print(f"claim without a reservation: median {baseline:.2f} ms")
            print(f"claim with its reservation, {runs:>6} runs this month: median "
                  f"{statistics.median(times) * 1000:.2f} ms, max {max(times) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
