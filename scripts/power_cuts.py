#!/usr/bin/env python3
"""Power cuts: many random power cuts under a running pulsed on powerfs, each outcome printed.

The longer run of tests/test_power_loss.py (same harness, tests/powercuts.py): the home on powerfs
(tests/powerfs.py, a FUSE file system that drops every unsynced write at a cut), pulsed started,
exec effects (non-idempotent) committed every 100 ms and git commits made in staging, every process
of Pulse frozen and SIGKILLed at a random moment (every --load-every-th just after an effect was
acked, while an operator stops and starts the watcher), unsynced data dropped, the checks run on
what survived (tests/powercuts.py, check_survivors), pulsed started again.
Needs root, /dev/fuse and the mfusepy package (the test extra).

    python scripts/power_cuts.py --cuts 200
    python scripts/power_cuts.py --cuts 100 --max-up-s 5 --seed 7
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import powercuts  # noqa: E402

import support  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=200, help="power cuts to make (200)")
    parser.add_argument("--max-up-s", type=float, default=3.0,
                        help="most cuts fall at a random moment up to this long after pulsed starts (3 s)")
    parser.add_argument("--load-every", type=int, default=3,
                        help="every Nth cut falls just after the executor acked an effect (3)")
    parser.add_argument("--seed", type=int, default=None, help="the random moments' seed (random)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    tracker = support.Tracker()
    work = Path(tempfile.mkdtemp(prefix="pulse-power-cuts-"))
    support.runtime_dirs_in(work)      # a pulsed killed at a cut cannot remove its own
    pulsed = support.Pulsed(work / "disk", tracker)
    started = time.monotonic()
    print(f"seed {seed}, work in {work}")

    def report(outcome):
        said = "; ".join(outcome.problems) or "lost nothing"
        print(f"{time.monotonic() - started:7.1f}s  cut {outcome.cut_after_s:5.2f}s after start  "
              f"pulsed {outcome.pulsed_was:<9}  acked before {outcome.acked_before:5d}  {said}", flush=True)

    try:
        outcomes = powercuts.run_cuts(args.cuts, work, pulsed, tracker.add, random.Random(seed),
                                      max_up_s=args.max_up_s, load_every=args.load_every,
                                      report=report)
    finally:
        tracker.kill_all()
    broken = [o for o in outcomes if o.problems]
    refused = [o for o in outcomes if o.pulsed_was.startswith("exit")]
    by_state = {s: sum(o.pulsed_was == s for o in outcomes) for s in ("starting", "running")}
    print(f"{len(outcomes)} cuts in {time.monotonic() - started:.0f} s: {by_state['starting']} while pulsed "
          f"was starting, {by_state['running']} while it ran; {len(refused)} refused, {len(broken)} with "
          f"problems; the side effects: {len(powercuts.runs_twice(work / 'side-effects.log'))} ran twice, "
          f"{len((work / 'side-effects.log').read_text().split()) if (work / 'side-effects.log').exists() else 0} ran")
    if broken or len(outcomes) < args.cuts:
        print(f"kept for a post-mortem: {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
