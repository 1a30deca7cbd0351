"""The telemetry receiver under load: OTLP requests a second, a 100 MB flood, and what a run's start pays.

    python scripts/bench_telemetry.py [--seconds 10] [--threads 4]

Starts a pulsed of its own on a temporary home with [telemetry] enabled (rate limit raised so the
throughput is the receiver's, not the bucket's), then:
  1. throughput: --threads keep-alive clients post small OTLP/protobuf log batches (10 Claude Code
     api_request events each, one run) for --seconds; prints requests/s and the facts written;
  2. flood: 100 MB of OTLP at the default limits' shape (4 MiB bodies, valid protobuf, as fast as
     the receiver answers, plus 100 MB declared in one request), sampling the worker's RSS;
     prints what was accepted and refused and the RSS before, at its peak and after;
  3. a run's start: the time the executor spends finding the receiver and setting a run's
     environment (pulse.agents.otel + the claude-code adapter's report_to), median of 1000.
Everything it starts is stopped by pid; its home is removed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent


def logs_body(records: int, pad: int = 0) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.append(KeyValue(key="pulse.run.id", value=AnyValue(string_value="bench-run")))
    sl = rl.scope_logs.add()
    for i in range(records):
        rec = sl.log_records.add()
        rec.body.string_value = "claude_code.api_request" + " " * pad
        for key, value in (("event.name", AnyValue(string_value="api_request")),
                           ("input_tokens", AnyValue(int_value=100 + i)), ("cost_usd", AnyValue(double_value=0.001))):
            rec.attributes.append(KeyValue(key=key, value=value))
    return req.SerializeToString()


def post(conn: http.client.HTTPConnection, body: bytes) -> int:
    conn.request("POST", "/v1/logs", body=body, headers={"Content-Type": "application/x-protobuf"})
    response = conn.getresponse()
    response.read()
    return response.status


def throughput(host: str, port: int, seconds: float, threads: int) -> tuple[float, dict]:
    body = logs_body(10)
    counts: dict = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        mine: dict = {}
        while time.monotonic() < stop:
            status = post(conn, body)
            mine[status] = mine.get(status, 0) + 1
        conn.close()
        with lock:
            for k, v in mine.items():
                counts[k] = counts.get(k, 0) + v
    began = time.monotonic()
    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts.values()) / (time.monotonic() - began), counts


def flood(host: str, port: int, worker: psutil.Process) -> dict:
    per_record = len(logs_body(1000, pad=150)) / 1000
    body = logs_body(int((4 * 1024 * 1024 - 4096) / per_record), pad=150)     # valid, just under max_body_kb
    sent, counts, peak = 0, {}, worker.memory_info().rss
    before = peak
    stop_sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop_sampling.wait(0.02):
            peak = max(peak, worker.memory_info().rss)
    sampler = threading.Thread(target=sample)
    sampler.start()
    conns = [http.client.HTTPConnection(host, port, timeout=30) for _ in range(4)]
    lock = threading.Lock()

    def client(conn) -> None:
        nonlocal sent
        while True:
            with lock:
                if sent >= 100 * 1024 * 1024:
                    return
                sent += len(body)
            status = post(conn, body)
            with lock:
                counts[status] = counts.get(status, 0) + 1
    workers = [threading.Thread(target=client, args=(c,)) for c in conns]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    raw = http.client.HTTPConnection(host, port, timeout=10)
    raw.putrequest("POST", "/v1/logs")
    raw.putheader("Content-Type", "application/x-protobuf")
    raw.putheader("Content-Length", str(100 * 1024 * 1024))
    raw.endheaders()
    declared = raw.getresponse().status
    time.sleep(2)            # the main loop folds what was queued
    stop_sampling.set()
    sampler.join()
    return {"body_bytes": len(body), "sent_mb": round(sent / 2**20), "statuses": counts, "declared_100mb": declared,
            "rss_before_mb": round(before / 2**20, 1), "rss_peak_mb": round(peak / 2**20, 1),
            "rss_after_mb": round(worker.memory_info().rss / 2**20, 1)}


def start_cost(home: Path) -> float:
    from pulse.agents import adapters, agentrun
    from pulse.core.config import Agent
    agent = Agent(name="claude", adapter="claude-code", mcp=False)
    adapter = adapters.load_adapter("claude-code")
    times = []
    for i in range(1000):
        inv = adapter.invocation(agent, adapters.Task("task-1", "hi"), "/tmp")
        began = time.perf_counter()
        receiver = agentrun.telemetry_receiver(home, True, f"run-{i}", "task-1", "claude")
        adapter.report_to(inv, receiver, agent.env)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="pulse-bench-telemetry-"))
    home = top / "home"
    subprocess.run([BIN / "pulsectl", "--home", str(home), "init"], check=True, capture_output=True)
    with open(home / "config.toml", "a") as f:
        f.write('\n[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nrequests_per_s = 100000\nburst = 100000\n')
    pulsed = subprocess.Popen([BIN / "pulsed", "--home", str(home)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        info = None
        while time.monotonic() < deadline and not info:
            out = subprocess.run([BIN / "pulsectl", "--home", str(home), "status", "--json"], capture_output=True, text=True)
            info = json.loads(out.stdout).get("telemetry") if out.stdout.strip() else None
            time.sleep(0.2)
        if not info:
            sys.exit("the telemetry worker did not come up")
        host, port = info["url"].removeprefix("http://").rsplit(":", 1)
        worker = next(p for p in psutil.Process(pulsed.pid).children(recursive=True) if "telemetry" in " ".join(p.cmdline())
                      or p.name() == "pulse: telemetry")
        rate, counts = throughput(host, int(port), args.seconds, args.threads)
        print(f"throughput: {rate:.0f} requests/s ({args.threads} clients, 10 events each, {args.seconds:g} s): {counts}")
        print("flood:", json.dumps(flood(host, int(port), worker)))
        print(f"a run's start: {start_cost(home):.3f} ms (median of 1000) to find the receiver and set the env")
        time.sleep(6)     # one flush
        out = subprocess.run([BIN / "pulsectl", "--home", str(home), "status", "--json"], capture_output=True, text=True)
        print("receiver:", json.dumps(json.loads(out.stdout)["telemetry"]))
    finally:
        os.killpg(pulsed.pid, signal.SIGTERM)
        try:
            pulsed.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(pulsed.pid, signal.SIGKILL)
            pulsed.wait()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
