#!/usr/bin/env python3
"""Benchmark the gate's cost per call: a resolve, a read and a write round trip through the real
MCP client over stdio, against a real pulsed.

Each round is what an agent does to change one thing: `list_tasks` (resolve), `events` of the
target (read: the look a write on it needs), `emit_effect` noop on that target (write: committed,
executed and acked, so it includes the executor's round trip). Prints the median and p95 of each,
and how many events.db rows one round adds. Run it with the Python of the install to measure
(pulsed and pulsectl are taken from beside it), so two installs compare on one machine:

    python scripts/bench_gate.py --rounds 200
    /path/to/other/.venv/bin/python scripts/bench_gate.py --rounds 200 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import Tracker, fmt, log, summary, table  # noqa: E402
from bench_pipeline import start_pulsed  # noqa: E402

BIN = Path(sys.executable).parent
ROUND = (("resolve", "list_tasks", {}), ("read", "events", {"target": "bench", "limit": 5}),
         ("write", "emit_effect", {"kind": "noop", "target": "bench"}))


async def rounds(home: Path, n: int) -> dict[str, list[float]]:
    from mcp import Client, StdioServerParameters
    server = StdioServerParameters(command=str(BIN / "pulsectl"), args=["--home", str(home), "mcp"],
                                   env=dict(os.environ))
    times: dict[str, list[float]] = {kind: [] for kind, _, _ in ROUND}
    async with Client(server, read_timeout_seconds=60) as c:
        for i in range(n + 5):                      # the first five warm up (imports, caches)
            for kind, tool, args in ROUND:
                began = time.perf_counter()
                result = await c.call_tool(tool, args)
                took = (time.perf_counter() - began) * 1000
                if result.is_error:
                    raise SystemExit(f"{tool} failed: {result.content[0].text}")
                if i >= 5:
                    times[kind].append(took)
    return times


def session_opens(home: Path, n: int) -> list[float]:
    """Milliseconds from connect to welcome on the gate's socket (the hello path alone: peer
    credentials, identity, the session's open fact, the tool list), one fresh connection each."""
    import socket as socket_

    from pulse.core.home import Paths
    path = str(Paths.for_client(home).gate_socket)
    hello = json.dumps({"op": "hello", "agent": "bench-open"}).encode() + b"\n"
    times = []
    for i in range(n + 5):
        began = time.perf_counter()
        with socket_.socket(socket_.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(hello)
            reply = sock.makefile("rb").readline()
        took = (time.perf_counter() - began) * 1000
        if json.loads(reply).get("op") != "welcome":
            raise SystemExit(f"session open refused: {reply[:200]!r}")
        if i >= 5:
            times.append(took)
    return times


def rows_in(home: Path) -> int:
    import sqlite3
    conn = sqlite3.connect(home / "events.db")
    try:
        return conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--opens", type=int, default=50, help="sessions opened (hello → welcome) to time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tracker = Tracker()
    with tempfile.TemporaryDirectory(prefix="pulse-bench-gate-") as tmp:
        home = Path(tmp) / "home"
        try:
            home.mkdir()        # the rate limit out of the way: this measures what one call costs
            (home / "config.toml").write_text("[gate]\ncalls_per_min = 1000000\ncall_burst = 1000000\n")
            start_pulsed(home, tracker, {})
            before = rows_in(home)
            log(f"{args.rounds} rounds through {BIN / 'pulsectl'} mcp")
            times = asyncio.run(rounds(home, args.rounds))
            per_round = (rows_in(home) - before) / (args.rounds + 5)
            log(f"{args.opens} session opens on the gate's socket")
            times["session-open"] = session_opens(home, args.opens)
        finally:
            tracker.cleanup()
    figures = {kind: summary(values) for kind, values in times.items()}
    if args.json:
        print(json.dumps({"rounds": args.rounds, "events_per_round": per_round, **figures}))
        return
    print(table([["call", "median ms", "p95 ms"],
                 *[[kind, fmt(f["median"], 2), fmt(f["p95"], 2)] for kind, f in figures.items()]]))
    print(f"  events.db rows per round (3 calls and the write's effect): {per_round:.1f}")


if __name__ == "__main__":
    main()
