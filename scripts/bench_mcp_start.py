#!/usr/bin/env python3
"""Benchmark how fast `pulsectl mcp` starts: what every agent run pays before its first tool call.

Against a real pulsed (its gate listening), each trial execs `pulsectl --home H mcp`, writes an MCP
`initialize` request to its stdin at once, and times exec → the `initialize` answer on its stdout
(the proxy connects to the gate and opens its session before it serves, so that is in the figure).
Two ways in, round-robin with `python -c pass` (the interpreter's floor):

  run       PULSE_GATE_SOCKET set, as the executor sets it for an agent run (no config is read)
  operator  only --home: the operator's shell, which finds the socket from the home's config
  no gate   PULSE_GATE_SOCKET naming no socket: the proxy's own start, without the gate's session
            open (its fact committed to events.db) in the figure

Then `python -X importtime` of the run's way in: the import total, the heaviest top-level imports,
and whether the store, the effect registry or click were loaded (none of them should be).

    python scripts/bench_mcp_start.py                 # 20 trials each
    python scripts/bench_mcp_start.py --trials 40 --json
    git archive BASE | tar -x -C /tmp/before && python scripts/bench_mcp_start.py --before /tmp/before

--before DIR adds the run's way in with an earlier tree's pulse/ (DIR/pulse, first on PYTHONPATH),
in the same round-robin, so that both face the same load on a shared machine.

Run it with the Python of the install to measure (pulsed and pulsectl are taken from beside it).
Everything it starts is tracked by pid and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, fmt, log, summary, table  # noqa: E402
from bench_pipeline import start_pulsed  # noqa: E402

BIN = Path(sys.executable).parent
TARGET_MEDIAN_MS = 150.0
# Loaded by `pulsectl mcp`, each is milliseconds of every agent run's start for nothing it uses.
UNWANTED = ("pulse.store", "pulse.effects.registry", "click")
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench-mcp-start", "version": "0"}}}) + "\n"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    return {**env, **extra}


def time_initialize(argv: list[str], env: dict[str, str], tracker: Tracker) -> float:
    """Milliseconds from exec to the answer to `initialize` (one line of JSON on stdout)."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    tracker.add_root(proc)
    try:
        proc.stdin.write(INITIALIZE.encode())
        proc.stdin.flush()
        line = proc.stdout.readline()
        took = (time.perf_counter() - began) * 1000
        answer = json.loads(line or b"null")
        if not isinstance(answer, dict) or answer.get("id") != 1 or "result" not in answer:
            raise SystemExit(f"{argv}: no initialize answer: {line[:300]!r}")
    finally:
        proc.stdin.close()          # end of the session: the proxy exits
        proc.wait(30)
        proc.stdout.close()
    return took


def time_floor(tracker: Tracker) -> float:
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    tracker.add_root(proc)
    proc.wait(30)
    return (time.perf_counter() - began) * 1000


IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def import_list(argv: list[str], env: dict[str, str]) -> list[tuple[str, int, int]]:
    """(module, cumulative µs, depth) of each import, in `python -X importtime` order."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, input=INITIALIZE,
                          capture_output=True, text=True, timeout=60)
    out = []
    for line in proc.stderr.splitlines():
        m = IMPORT_LINE.match(line)
        if m:
            out.append((m[4], int(m[2]), len(m[3]) // 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--before", metavar="DIR", help="also time an earlier tree's pulsectl mcp (DIR/pulse)")
    args = parser.parse_args()
    tracker = Tracker()
    pulsectl = str(BIN / "pulsectl")
    times: dict[str, list[float]] = {"run": [], "operator": [], "no gate": [], "python -c pass": []}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-mcp-") as tmp:
        home = Path(tmp) / "home"
        try:
            home.mkdir()
            start_pulsed(home, tracker, {})
            from pulse.core.home import Paths
            socket = str(Paths.for_client(home).gate_socket)
            ways = {"run": ([pulsectl, "--home", str(home), "mcp"], clean_env(PULSE_GATE_SOCKET=socket)),
                    "operator": ([pulsectl, "--home", str(home), "mcp"], clean_env()),
                    "no gate": ([pulsectl, "--home", str(home), "mcp"], clean_env(PULSE_GATE_SOCKET=f"{tmp}/none.sock"))}
            if args.before:
                ways["run (before)"] = ([pulsectl, "--home", str(home), "mcp"],
                                        clean_env(PULSE_GATE_SOCKET=socket, PYTHONPATH=os.path.abspath(args.before)))
                times = {**{w: [] for w in ways}, "python -c pass": []}
            for argv, env in ways.values():          # warm the page cache and the bytecode
                time_initialize(argv, env, tracker)
            log(f"{args.trials} trials of each way in, round-robin")
            for _ in range(args.trials):
                for way, (argv, env) in ways.items():
                    times[way].append(time_initialize(argv, env, tracker))
                times["python -c pass"].append(time_floor(tracker))
            imports = import_list(ways["run"][0], ways["run"][1])
        finally:
            tracker.cleanup()
    figures = {way: summary(values) for way, values in times.items()}
    top = sorted((i for i in imports if i[2] == 0), key=lambda i: -i[1])
    loaded = sorted({name for name, _, _ in imports})
    unwanted = {u: [m for m in loaded if m == u or m.startswith(u + ".")] for u in UNWANTED}
    result = {"trials": args.trials, "target_median_ms": TARGET_MEDIAN_MS,
              **{way: f for way, f in figures.items()},
              "imports": {"modules": len(loaded), "total_ms": round(sum(i[1] for i in top) / 1000, 1),
                          "heaviest": [[name, round(us / 1000, 1)] for name, us, _ in top[:12]],
                          "unwanted": {u: found for u, found in unwanted.items() if found}}}
    if args.json:
        print(json.dumps(result))
        return
    print(f"pulsectl mcp: exec → initialize answered (ms), {args.trials} trials, target median ≤ {TARGET_MEDIAN_MS:.0f}")
    print(table([["way in", "median", "p95", "min"],
                 *[[way, fmt(f["median"]), fmt(f["p95"]), fmt(f["min"])] for way, f in figures.items()]]))
    print(f"imports (python -X importtime, the run's way in): {len(loaded)} modules, "
          f"{result['imports']['total_ms']} ms; heaviest top-level:")
    print(table([[name, f"{us / 1000:.1f} ms"] for name, us, _ in top[:12]], indent="    "))
    print("  loaded and not wanted: " + (", ".join(f"{u} ({len(f)} modules)" for u, f in unwanted.items() if f)
                                         or "none"))


if __name__ == "__main__":
    main()
