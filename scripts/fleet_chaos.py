#!/usr/bin/env python3
"""Fleet chaos: tasks flow through a fleet of Pulse hosts on a three-server NATS JetStream cluster
(tests/natscluster.py, `[fleet] replicas = 3`) while, at random, a host's worker (fleet, executor,
tick, eventlog), a host's pulsed itself (its workers follow it: PR_SET_PDEATHSIG) or one NATS server
is SIGKILLed and started again a moment later. Every host offers tasks (`fleet-task-offered`, as
`pulsectl task add --fleet` writes it) and every host's agent may take them.

At the end everything is started again, every task is waited for, and the whole fleet is audited:
  - lost: offered, and neither acked nor dead-lettered on its origin;
  - doubled: acked by more than one run across the fleet. The guarantee is at most once while the
    host running a task is alive, at least once across its death: a double whose first run's host
    had its pulsed or fleet worker killed between that run's end and the next run is the guarantee's
    "across a death" and counted apart; any other is a defect;
  - acked-not-run: acked on its origin with no run acked on any host;
  - dead-lettered: each with the reason its record gives;
  - the events: every event of every host in PULSE_EVENTS exactly once, in events.db's order;
  - left over: messages left in PULSE_TASKS, fleet tasks of a host left neither acked nor given up.
It prints figures (offer → executing latency, runs again after a cut, kills by kind) and exits 1 on
anything lost, doubled without a death, acked-not-run, out of order or left over.

    python scripts/fleet_chaos.py --minutes 10
    python scripts/fleet_chaos.py --seconds 15 --json      # the short version tests/test_fleet_cluster.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bench_fleet  # noqa: E402  (beside this script)
from natscluster import NatsCluster  # noqa: E402

import support  # noqa: E402
from pulse.agents.taskview import fleet_task_view  # noqa: E402
from pulse.core import config as configmod  # noqa: E402
from pulse.core import fleetnames as names  # noqa: E402
from pulse.core.wire import eventmsgs  # noqa: E402
from pulse.store import connection, eventsdb  # noqa: E402

WORKERS = ("fleet", "executor", "tick", "eventlog")   # the workers a worker kill picks from
# the kinds of kill, drawn from a shuffled bag refilled when empty: random, yet every kind comes in a
# short run too (a NATS kill that must wait, a server being still behind, goes back in the bag)
KINDS = ("worker", "worker", "pulsed", "nats")
HOST_ENV = {"PULSE_READY_TIMEOUT_MS": "15000",          # several pulseds start at once on 2 loaded cores
            "PULSE_INTENSITY_RESTARTS": "100000"}       # the kills are the point: no worker may be given up on
TERMINAL = ("acked", "dead")


def host_toml(name: str, urls: list[str], lease_s: float, run_s: float) -> str:
    fleet = {"enabled": True, "url": urls, "host": f"{name}@chaos", "replicas": 3, "presence_interval_s": 0.5,
             "presence_ttl_s": 3, "reconnect_max_s": 1, "task_lease_s": lease_s, "max_deliver": 10,
             "failed_host_wait_s": 1}
    table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in fleet.items())
    return (f"\n[fleet]\n{table}\n[[agent]]\nname = \"builder\"\nadapter = \"command\"\nmcp = false\nconcurrency = 2\n"
            f"argv = [\"sh\", \"-c\", \"sleep {run_s:g}; echo ran {{task_id}}\"]\n")


def make_host(work: Path, name: str, urls: list[str], tracker, lease_s: float, run_s: float) -> support.Pulsed:
    (work / name).mkdir()
    host = support.Pulsed(work / name / "home", tracker)
    support.init_home(host.home)
    config = host.home / "config.toml"
    # a fresh config.toml declares no table (its headers are comments): these are added at its end
    config.write_text(config.read_text() + host_toml(name, urls, lease_s, run_s))
    return host


def host_name(host: support.Pulsed) -> str:
    return f"{host.home.parent.name}@chaos"


def offer(host: support.Pulsed, title: str) -> str:
    """A fleet task offered from `host`: the event `pulsectl task add --fleet` appends (pulsed need not be up)."""
    fleet_id = f"{names.host_token(host_name(host))}-{secrets.token_hex(6)}"
    conn = eventsdb.open_events(host.paths.events_db)
    try:
        eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.FLEET_TASK_OFFERED, "pulsectl", fleet_id, {
            "agent": "builder", "project": "chaos", "title": title, "prompt": "x", "priority": 0})])
    finally:
        conn.close()
    return fleet_id


def read_all(host: support.Pulsed, types=()) -> list[eventmsgs.Event]:
    conn = connection.open_readonly(host.paths.events_db)
    try:
        return eventsdb.read_events(conn, types=types, limit=10_000_000)
    finally:
        conn.close()


def origin_views(host: support.Pulsed) -> dict[str, dict]:
    """Every fleet task `host` offered, as `pulsectl fleet tasks` folds it."""
    by_task: dict[str, list] = {}
    for ev in read_all(host, eventmsgs.FLEET_TASK_EVENTS):
        by_task.setdefault(ev.target, []).append(ev)
    return {fid: view for fid, evs in by_task.items() if (view := fleet_task_view(evs)) is not None}


def alive(host: support.Pulsed) -> bool:
    return host.proc is not None and host.proc.poll() is None


def fleet_account(host: support.Pulsed) -> dict:
    status = host.try_status() if alive(host) else None
    return (status.fleet or {}) if status is not None else {}


class Chaos:
    def __init__(self, hosts: list[support.Pulsed], cluster: NatsCluster, tracker, rng: random.Random, log):
        self.hosts, self.cluster, self.tracker, self.rng, self.log = hosts, cluster, tracker, rng, log
        self.kills: list[dict] = []                      # {kind, host/server, what, at (wall clock)}
        self.down_until: dict[object, float] = {}        # a host or a server index → when to start it again
        self.bag: list[str] = []

    def draw(self) -> str:
        if not self.bag:
            self.bag = list(KINDS)
            self.rng.shuffle(self.bag)
        return self.bag.pop()

    def kill_one(self) -> None:
        kind = self.draw()
        up = [h for h in self.hosts if alive(h) and h not in self.down_until]
        if kind == "nats":
            # one server down at a time, and only once the last one back has caught up: the quorum holds
            if any(isinstance(k, int) for k in self.down_until) or not self.cluster.all_healthy():
                self.bag.append(kind)       # drawn again next time
                kind = "worker"
            else:
                server = self.rng.choice(self.cluster.running())
                self.cluster.kill(server)
                self.down_until[server] = time.monotonic() + self.rng.uniform(1, 4)
                self.note("nats", f"nats-{server}")
                return
        if not up:
            return
        host = self.rng.choice(up)
        status = host.try_status()
        if kind == "pulsed" or status is None:
            self.tracker.add(*(p.pid for p in host.tree()))   # its workers die with it; killed at the end if not
            os.kill(host.proc.pid, signal.SIGKILL)
            host.proc.wait(10)
            self.down_until[host] = time.monotonic() + self.rng.uniform(0.5, 3)
            self.note("pulsed", host_name(host))
            return
        workers = [w for w in status.workers if w.name in WORKERS and w.pid]
        if not workers:                # a pulsed still starting its workers: next time
            return
        victim = self.rng.choice(workers)
        self.tracker.add(victim.pid)
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.note("worker", host_name(host), victim.name)

    def note(self, kind: str, who: str, what: str | None = None) -> None:
        self.kills.append({"kind": kind, "who": who, "what": what, "at": time.time()})
        self.log(f"killed {kind} {who}{' ' + what if what else ''}")

    def revive_due(self, everything: bool = False) -> None:
        for host in self.hosts:        # a start that failed (a lock its killed tree still held): again
            if host not in self.down_until and not alive(host):
                self.log(f"{host_name(host)}'s pulsed had exited ({host.proc.returncode}): started again")
                host.start(env=HOST_ENV, wait=False)
        now = time.monotonic()
        for key, when in list(self.down_until.items()):
            if not everything and when > now:
                continue
            if isinstance(key, int):
                self.cluster.start(key)
            else:
                key.start(env=HOST_ENV, wait=False)
            del self.down_until[key]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def queue_left(url: str) -> int:
    async def read() -> int:
        import nats
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream(timeout=10).stream_info("PULSE_TASKS")).state.messages
        finally:
            await nc.close()
    return asyncio.run(read())


def audit(hosts: list[support.Pulsed], offered: dict[str, dict], kills: list[dict], url: str,
          last: dict) -> dict:
    """The whole fleet's accounting of every offered task and every event (see the module's doc)."""
    views: dict[str, dict] = {}
    for host in hosts:
        views.update(origin_views(host))
    runs: dict[str, list[dict]] = {}       # title → every run of it on any host: {host, task, executing, acked}
    left_open = []
    for host in hosts:
        events = read_all(host)
        created = {e.target: e for e in events if e.type == eventmsgs.TaskEvent.CREATED and e.source == "fleet"}
        titles = {task: e.data.get("title") for task, e in created.items()}
        ends: dict[str, str] = {}
        for e in events:
            if e.target in titles and e.type == eventmsgs.TaskEvent.EXECUTING:
                runs.setdefault(titles[e.target], []).append({"host": host_name(host), "task": e.target,
                                                               "taken": created[e.target].ts, "executing": e.ts,
                                                               "acked": None})
            if e.target in titles and e.type in (eventmsgs.TaskEvent.ACKED, eventmsgs.TaskEvent.GIVEN_UP, eventmsgs.TaskEvent.CLOSED):
                ends[e.target] = e.type
                if e.type == eventmsgs.TaskEvent.ACKED:
                    for run in runs.get(titles[e.target], []):
                        if run["task"] == e.target and run["host"] == host_name(host):
                            run["acked"] = e.ts
        left_open += [f"{host_name(host)} {task} ({title})" for task, title in titles.items() if task not in ends]
    lost, doubled, across_death, not_run, dead, latency, reruns = [], [], [], [], [], [], 0
    for fleet_id, offer in offered.items():
        view = views.get(fleet_id) or {"status": "missing"}
        mine = sorted(runs.get(offer["title"], []), key=lambda r: r["executing"])
        acked = [r for r in mine if r["acked"] is not None]
        reruns += max(0, len(mine) - 1)
        if mine:
            latency.append(mine[0]["executing"] - offer["at"])
        if view["status"] not in TERMINAL:
            lost.append(f"{fleet_id}: {view['status']}")
        if view["status"] == "dead":
            dead.append(f"{fleet_id}: {(view.get('dead') or {}).get('why')}")
        if view["status"] == "acked" and not acked:
            not_run.append(fleet_id)
        if len(acked) > 1:
            first, again = acked[0], acked[1]
            # the guarantee's own double: the first run's host lost its pulsed or fleet worker between
            # taking the task and its end reaching NATS, so the task was offered again
            died = [k for k in kills if k["who"] == first["host"] and (k["kind"] == "pulsed" or k["what"] == "fleet")
                    and first["taken"] <= k["at"] <= again["executing"]]
            (across_death if died else doubled).append(
                f"{fleet_id}: acked on {', '.join(r['host'] + ' ' + r['task'] for r in acked)}")
    stream = bench_fleet.stream(url, idle_s=2, api_timeout_s=10)
    events_problems = []
    pairs = [(m["host"], m["id"]) for m in stream]
    if len(pairs) != len(set(pairs)):
        events_problems.append(f"{len(pairs) - len(set(pairs))} events stored twice")
    for host in hosts:
        every = [e.id for e in read_all(host)]
        got = [m["id"] for m in stream if m["host"] == host_name(host)]
        # all up to the last the outbox acknowledged before the hosts stopped (their stop's own events may
        # have gone out or not), none twice, none out of order
        want = [i for i in every if i <= last[host]]
        if got[:len(want)] != want or got != every[:len(got)]:
            events_problems.append(f"{host_name(host)}: {len(got)} in the stream, {len(want)} wanted of {len(every)} "
                                   "in events.db, or not in its order")
    kinds = {kind: sum(1 for k in kills if k["kind"] == kind) for kind in dict.fromkeys(KINDS)}
    return {
        "offered": len(offered), "acked": sum(1 for f in offered if (views.get(f) or {}).get("status") == "acked"),
        "dead": dead, "lost": lost, "doubled": doubled, "doubled_across_a_death": across_death,
        "acked_not_run": not_run, "runs_again_after_a_cut": reruns, "left_open": left_open,
        "left_in_queue": queue_left(url), "events_in_stream": len(stream), "events_problems": events_problems,
        "kills": kinds, "offer_to_executing_median_ms": round(statistics.median(latency) * 1000) if latency else None,
        "offer_to_executing_p95_ms": round(percentile(latency, 0.95) * 1000) if latency else None,
    }


def broken(figures: dict) -> list[str]:
    return [key for key in ("lost", "doubled", "acked_not_run", "events_problems", "left_open") if figures[key]] + (
        ["left_in_queue"] if figures["left_in_queue"] else [])


def run(args, work: Path, tracker, log) -> dict:
    rng = random.Random(args.seed)
    cluster = NatsCluster(work, tracker.add).start()
    hosts = [make_host(work, chr(ord("a") + i), cluster.urls, tracker, args.lease, args.run_s) for i in range(args.hosts)]
    chaos = Chaos(hosts, cluster, tracker, rng, log)
    offered: dict[str, dict] = {}
    try:
        for host in hosts:
            host.start(env=HOST_ENV, wait=False)
        for host in hosts:
            host.wait_running(timeout=60)     # a pulsed that cannot start says why
        support.wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in hosts), 60,
                         interval=0.2, what="every host connected")
        log(f"{len(hosts)} hosts connected to the cluster; chaos for {args.seconds:g}s")
        stop = threading.Event()

        def offering() -> None:
            n, pick = 0, random.Random(args.seed + 1)     # its own: the kills' draws stay the seed's
            while not stop.wait(1 / args.tasks_per_s):
                host = pick.choice(hosts)
                title = f"chaos-{n}"
                offered[offer(host, title)] = {"title": title, "origin": host_name(host), "at": time.time()}
                n += 1
        offerer = threading.Thread(target=offering, daemon=True)
        offerer.start()
        started = time.monotonic()
        next_kill = started + rng.uniform(0.5, 1.5) * args.kill_every_s
        while time.monotonic() - started < args.seconds:
            chaos.revive_due()
            if time.monotonic() >= next_kill:
                chaos.kill_one()
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every_s
            time.sleep(0.05)
        stop.set()
        offerer.join()
        log(f"chaos over: {len(offered)} tasks offered, {len(chaos.kills)} kills; everything started again")
        chaos.revive_due(everything=True)
        settled = time.monotonic()

        def every_task_ended() -> bool:
            views: dict[str, dict] = {}
            for host in hosts:
                views.update(origin_views(host))
            return all((views.get(f) or {}).get("status") in TERMINAL for f in offered)
        import nats
        deadline = time.monotonic() + args.settle_s
        while not (all(alive(h) for h in hosts) and every_task_ended()) and time.monotonic() < deadline:
            time.sleep(0.5)   # past the deadline the audit says which were lost
        # a task whose end reached its origin may still have its message pending (its host's worker died
        # before the acknowledgement): it is taken again after the lease, and must then be acked, not run
        while time.monotonic() < deadline:
            try:
                if queue_left(cluster.urls[cluster.running()[0]]) == 0:
                    break
            except (nats.errors.Error, OSError, TimeoutError) as err:   # a server still electing a leader
                log(f"queue not read: {err!r}")
            time.sleep(0.5)

        last = {h: read_all(h)[-1].id for h in hosts}
        deadline = time.monotonic() + args.settle_s   # past it, the audit says whose events are missing
        while not all(fleet_account(h).get("published_through", 0) >= last[h] for h in hosts):
            if time.monotonic() > deadline:
                log("not every outbox drained within --settle-s")
                break
            time.sleep(0.2)
        figures = {"seconds": args.seconds, "hosts": len(hosts), "seed": args.seed,
                   "settle_s": round(time.monotonic() - settled, 1)}
        # the hosts stop before the audit, so nothing is appended while it reads
        for host in hosts:
            host.terminate(30)
        figures.update(audit(hosts, offered, chaos.kills, cluster.urls[cluster.running()[0]], last))
        return figures
    finally:
        for host in hosts:
            if alive(host):
                tracker.add(*(p.pid for p in host.tree()))
                host.proc.kill()
                host.proc.wait(10)
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=None, help="how long the chaos lasts (10)")
    parser.add_argument("--seconds", type=float, default=None, help="... in seconds (for a short run)")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--tasks-per-s", type=float, default=2.0, help="tasks offered a second, over all hosts")
    parser.add_argument("--kill-every-s", type=float, default=4.0, help="a kill every this long on average")
    # The product's own lease by default. A host cut off from JetStream longer than the lease (two
    # servers killed in a row leave streams without a leader for 16 s and more) may have its task run
    # again elsewhere: the lease's at-least-once across a loss, which a shorter one makes common.
    parser.add_argument("--lease", type=float, default=configmod.Fleet().task_lease_s,
                        help="[fleet] task_lease_s of every host (default: the product's, %(default)g)")
    parser.add_argument("--run-s", type=float, default=0.5, help="how long the agent's run takes")
    parser.add_argument("--settle-s", type=float, default=120.0, help="the bound on the end's waits")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.seconds = args.seconds if args.seconds is not None else 60 * (args.minutes if args.minutes is not None else 10)
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    support.DAEMON_TEST = True
    tracker = support.Tracker()

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
    work = Path(tempfile.mkdtemp(prefix="pulse-fleet-chaos-"))
    log(f"seed {args.seed}, work in {work}")
    support.runtime_dirs_in(work)      # and their registry: a killed host's would outlive the run
    try:
        figures = run(args, work, tracker, log)
    finally:
        tracker.kill_all()
    bad = broken(figures)
    if not bad:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
        print("OK: every task once, every event once and in order" if not bad else f"BROKEN: {', '.join(bad)} "
              f"(the homes and NATS logs are in {work})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
