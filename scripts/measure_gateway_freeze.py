#!/usr/bin/env python3
"""SIGSTOP → one healthy copy again, for OpenClaw's gateway and LiteLLM's proxy, with docs/gateways.md's
"Watching OpenClaw, Hermes and LiteLLM" block as pasted: its health probes and [survival.llm], and
pulsed's own intervals (none of the tests' faster ones). Only paths and ports are changed.

tests/test_realcli_gateways.py probes every second to stay short; its figures are not the block's.
Per trial: a fresh home and a real pulsed that starts the gateway; once it is healthy, SIGSTOP;
the time until Pulse sees another pid alive, its endpoint answers and it is the only copy.

    PULSE_REALCLI_DIR=.realcli python scripts/measure_gateway_freeze.py [--trials 3] [--only openclaw]

Needs the tools of scripts/install_realcli.sh. Every process it causes is killed by pid at the end
of its trial, and the trial's directory removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import support  # noqa: E402
from realgateways import (  # noqa: E402
    OpenClaw,
    Proxy,
    gone,
    kill_all,
    readme_process,
    stop_pulsed,
    toml_argv,
    toml_inline,
)

support.FAST = {}               # pulsed's own intervals, as a user's pulsed runs
READY_S = 90                    # a start on a loaded machine
FROZEN_S = 180


def openclaw_config(gw: OpenClaw) -> str:
    doc = readme_process("openclaw-gateway")
    return f"""
        [[process]]
        name = "openclaw-gateway"
        pidfile = {{ path = "{gw.lock}", key = "pid" }}
        restart = {toml_argv(gw.argv())}
        start_grace_s = {doc["start_grace_s"]}
        health = {toml_inline({**doc["health"], "url": gw.url})}
    """


def litellm_config(llm: Proxy) -> str:
    doc = readme_process("litellm")
    return f"""
        [[process]]
        name = "litellm"
        match = '{llm.match}'
        restart = {toml_argv(llm.argv())}
        health = {toml_inline({**doc["health"], "url": llm.url})}

        [[watch.network]]
        name = "llm-api"
        url = "{llm.url}"

        [survival.llm]
        target = "llm-api"
        process = "litellm"
    """


def one_healthy(pulsed, gw, name: str, exclude: set[int], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        vital = pulsed.vital(f"process-alive:{name}", lambda d: d.get("alive"))
        pid = vital and vital.get("pid")
        if pid and pid not in exclude and gw.ready() and [p.pid for p in gw.copies()] == [pid]:
            return pid
        time.sleep(0.1)
    raise TimeoutError(f"no one healthy {name} (other than {sorted(exclude)}) within {timeout}s: Pulse sees "
                       f"{pulsed.vital(f'process-alive:{name}')}; copies {[p.pid for p in gw.copies()]}; "
                       f"its endpoint answers {gw.ready()}; pulse.log ends:\n{pulsed.log_text()[-3000:]}")


def trial(which: str, root: Path, node_tmp: Path) -> dict:
    tag = str(root)
    tracker = support.Tracker()
    pulsed = support.Pulsed(root / "home", tracker)
    cleanups = []
    if which == "openclaw":
        gw, name = OpenClaw(root / "openclaw", tag, node_tmp), "openclaw-gateway"
        cleanups.append(gw.cleanup)
        config = openclaw_config(gw)
    else:
        gw, name = Proxy(root / "litellm", tag), "litellm"
        config = litellm_config(gw)
    try:
        support.init_home(pulsed.home)
        (pulsed.home / "config.toml").write_text(textwrap.dedent(config))
        checked = pulsed.ctl("check-config")
        if checked.returncode != 0:
            raise RuntimeError(f"Pulse refuses the config: {checked.stdout}{checked.stderr}")
        t = time.monotonic()
        pulsed.start()
        first = one_healthy(pulsed, gw, name, set(), READY_S)
        started = time.monotonic() - t
        t = time.monotonic()
        os.kill(first, signal.SIGSTOP)
        again = one_healthy(pulsed, gw, name, {first}, FROZEN_S)
        frozen = time.monotonic() - t
        if not gone(first):
            raise RuntimeError(f"the frozen {name} {first} is still there beside {again}")
        return {"start_to_healthy": round(started, 1), "sigstop_to_healthy": round(frozen, 1)}
    finally:
        stop_pulsed(pulsed)
        kill_all(tag, pulsed.home)
        tracker.kill_all()
        for cleanup in cleanups:
            cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", choices=("openclaw", "litellm"))
    args = parser.parse_args()
    which = [args.only] if args.only else ["openclaw", "litellm"]
    figures: dict[str, list[float]] = {w: [] for w in which}
    # OpenClaw's TMPDIR, kept across trials: node's compile cache lives there, warm on a host that
    # has run the gateway before (a cold one adds seconds to every start).
    node_tmp = Path(tempfile.mkdtemp(prefix="pulse-freeze-node-"))
    for w in which:
        for i in range(args.trials):
            root = Path(tempfile.mkdtemp(prefix=f"pulse-freeze-{w}-"))
            got = trial(w, root, node_tmp)          # a failed trial's directory is kept, to be read
            shutil.rmtree(root, ignore_errors=True)
            figures[w].append(got["sigstop_to_healthy"])
            print(f"{w} trial {i + 1}: {got}", flush=True)
    shutil.rmtree(node_tmp, ignore_errors=True)
    for w, values in figures.items():
        print(f"{w}: SIGSTOP → one healthy copy {min(values):.1f}-{max(values):.1f} s, "
              f"median {statistics.median(values):.1f} s ({len(values)} trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
