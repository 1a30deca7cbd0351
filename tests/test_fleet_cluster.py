"""The fleet through the loss of its parts: a server of a real three-server NATS JetStream cluster
(tests/natscluster.py, as docs/fleet.md's "Running NATS for real" has it: `[fleet] replicas = 3`,
every server in `url`), and a host's fleet worker mid-task. scripts/fleet_chaos.py's random kills of all of these, with the
whole fleet's accounting, run here for 15 s (a seed of their own); its 10-minute run is by hand."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pulse.core import config as configmod
from pulse.core import fleetnames as names
from support import wait_for
from tests.natscluster import NatsCluster
from tests.test_fleet import (
    Nats,
    fleet_account,
    fleet_host,
    fleet_task,
    history_ids,
    offer,
    start_all,
    stream_count,
    stream_events,
    tasks_created,
    view_hosts,
)

STREAMS = ("PULSE_EVENTS", "PULSE_TASKS", "PULSE_TASK_OUTCOMES")
BUCKETS = (names.HOSTS_BUCKET, names.SEEN_BUCKET, "pulse-task-claims", "pulse-task-attempts", "pulse-task-dead")


def test_replicas_is_a_fleet_key_from_1_to_5(tmp_path):
    assert configmod.Config().fleet.replicas == 1
    assert "# replicas = 1" in configmod.default_toml()
    bad = tmp_path / "config.toml"
    bad.write_text("[fleet]\nreplicas = 7\n")
    with pytest.raises(configmod.ConfigError, match=r"\$\.fleet\.replicas must lie within 1 … 5, got 7"):
        configmod.load(bad, {})


def test_a_report_heard_again_after_its_runs_end_does_not_undo_the_end():
    """The origin's worker died holding b's `executing` report: the stream hands it out again after
    its ack wait, behind b's `acked`. The task stays acked (scripts/fleet_chaos.py found it showing
    `executing` for ever)."""
    from pulse.agents.taskview import fleet_task_view
    from pulse.core.wire import eventmsgs

    def ev(type_, **data):
        return eventmsgs.now_event(type_, "fleet", "a-0123456789ab", data)
    report = {"host": "b@h", "task": "task-4", "attempt": 1}
    events = [ev(eventmsgs.FLEET_TASK_OFFERED, agent=None, project="p", title="t", prompt="x"),
              ev(eventmsgs.FLEET_TASK_UPDATE, **report, status="acked", result={"code": 0}),
              ev(eventmsgs.FLEET_TASK_UPDATE, **report, status="executing")]
    view = fleet_task_view(events)
    assert (view["status"], view["result"], view["runs"][0]["status"]) == ("acked", {"code": 0}, "acked"), view
    # another taking's reports (c's, after b's run was given up) still count
    events += [ev(eventmsgs.FLEET_TASK_UPDATE, host="c@h", task="task-9", attempt=2, status="executing")]
    assert fleet_task_view(events)["status"] == "executing"


def replicas_of(url: str) -> dict[str, int] | None:
    """Each fleet stream's and bucket's number of copies, as the cluster reports it (None: not all made
    yet, or the cluster did not answer within 5 s, as it may not while it places a new stream's
    copies on a loaded machine)."""
    async def read() -> dict[str, int] | None:
        import nats
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.errors import NotFoundError
        nc = await nats.connect(url)
        try:
            js = nc.jetstream(timeout=5)
            return {s: (await js.stream_info(s)).config.num_replicas for s in STREAMS + tuple(f"KV_{b}" for b in BUCKETS)}
        except (NotFoundError, NatsTimeout):
            return None
        finally:
            await nc.close()
    return asyncio.run(read())


def consumers_on(url: str, stream: str) -> int:
    async def count() -> int:
        import nats
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream(timeout=5).stream_info(stream)).state.consumer_count
        finally:
            await nc.close()
    return asyncio.run(count())


def executing_at(host, task: str) -> list[float]:
    return [e["ts"] for e in host.events("task-executing", target=task, written=False)]


@pytest.mark.daemon
def test_the_fleet_rides_out_the_loss_of_the_cluster_server_a_host_is_connected_to(tmp_path, tracker):
    """a offers, b runs. While b runs the first task, the server b is connected to is SIGKILLed: b
    and a connect to the other two, the first task's end still reaches a (renewed and acknowledged on
    the new connection, not after the 30 s lease), a second task offered with that server down runs,
    each task runs once, and every event of both hosts is in the stream once and in order."""
    cluster = NatsCluster(tmp_path, tracker.add).start()
    try:
        settings = {"replicas": 3, "reconnect_max_s": 1}
        a = fleet_host(tmp_path, tracker, "a", cluster.urls, **settings)
        b = fleet_host(tmp_path, tracker, "b", cluster.urls, agent="2", **settings)
        start_all([a, b])
        wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b)), 30, what="both connected")
        made = wait_for(lambda: replicas_of(cluster.urls[0]), 30, interval=0.2, what="the fleet's streams made")
        assert set(made.values()) == {3}, made
        wait_for(lambda: view_hosts(a).get("b@test") == "up", 20, what="a's view has b")
        # the hosts' looks at the presence buckets leave no consumer behind (each one nats-py's keys()
        # made stayed 5 minutes: thousands on a cluster, until the server refused more)
        assert [consumers_on(cluster.urls[0], f"KV_{b}") for b in (names.HOSTS_BUCKET, names.SEEN_BUCKET)] == [0, 0]
        first = offer(a, "--title", "one", "--agent", "builder")
        wait_for(lambda: fleet_task(a, first)["status"] == "executing", 30, what="the first task runs on b")
        server = fleet_account(b)["server"]
        assert server in cluster.urls and f"fleet: connected as b@test to {server}" in b.ctl("status").stdout
        cluster.kill(cluster.index_of(server))
        killed = time.monotonic()

        def on_another(host) -> bool:
            account = fleet_account(host)
            return account.get("state") == "connected" and account.get("server") not in (None, server)
        wait_for(lambda: on_another(a) and on_another(b), 20, what="both hosts on the other servers")
        reconnected_s = time.monotonic() - killed
        # well inside the 30 s lease: b kept the run across its connections and reported its end
        wait_for(lambda: fleet_task(a, first)["status"] == "acked", 20, what="the first task acked")
        second = offer(a, "--title", "two", "--agent", "builder")
        wait_for(lambda: fleet_task(a, second)["status"] == "acked", 45, what="the second task acked, a server down")
        for fleet_id in (first, second):
            view = fleet_task(a, fleet_id)
            assert [(r["host"], r["status"]) for r in view["runs"]] == [("b@test", "acked")], view
        local = {e["target"] for e in tasks_created(b)}
        assert len(local) == 2 and all(len(executing_at(b, t)) == 1 for t in local)
        offered = next(e["ts"] for e in a.events("fleet-task-offered", target=second, written=False))
        started = executing_at(b, fleet_task(a, second)["task"])[0]
        # every event of both hosts, once and in order, in the stream the two live servers keep
        last = {h: history_ids(h)[-1] for h in (a, b)}
        wait_for(lambda: all(fleet_account(h).get("published_through", 0) >= last[h] for h in (a, b)), 30,
                 what="both outboxes drained")
        alive = cluster.urls[cluster.running()[0]]
        stream = stream_events(alive)
        for host in (a, b):
            ids = [m["id"] for m in stream if m["host"] == f"{host.home.parent.name}@test"]
            assert ids == history_ids(host)[:len(ids)] and ids[-1] >= last[host], host.home
        pairs = [(m["host"], m["id"]) for m in stream]
        assert len(pairs) == len(set(pairs)), "an event was stored twice"
        print(f"server killed -> both hosts on another: {reconnected_s:.2f}s; "
              f"offer -> executing on b with a server down: {(started - offered) * 1000:.0f} ms")
    finally:
        cluster.stop()


@pytest.mark.daemon
def test_a_fleet_worker_killed_mid_task_takes_it_up_again_and_it_runs_once(tmp_path, tracker, nats_server):
    """b's fleet worker dies while b's agent runs a fleet task: the new worker takes the taking up from
    fleet-cursor.db (its claim still names b), reports the end and acknowledges the message. Before,
    nothing did until the message came back after the lease, to b if b's claim still held, else to
    any host, which ran the task a second time (scripts/fleet_chaos.py found it)."""
    lease = 20
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, task_lease_s=lease)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="3", task_lease_s=lease)
    start_all([a, b])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b)), 20, what="both connected")
    fleet_id = offer(a, "--title", "once", "--agent", "builder")
    [created] = wait_for(lambda: tasks_created(b), 30, what="b took it")
    wait_for(lambda: b.events("task-executing", target=created["target"], written=False), 20, what="it runs on b")
    worker = b.worker("fleet").pid
    tracker.add(worker)
    os.kill(worker, signal.SIGKILL)
    killed = time.time()
    # reported by the new worker, not after the lease (when the message would come back to some host)
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "acked", lease / 2, what="acked on a within half the lease")
    [acked] = b.events("task-acked", target=created["target"], written=False)
    assert acked["ts"] > killed, "the run had ended before the kill: the test proved nothing"
    # off the queue: acknowledged, so never delivered again (not merely not yet)
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 0, 10, what="the message acknowledged")
    assert len(tasks_created(b)) == 1
    assert len(b.events("task-executing", target=created["target"], written=False)) == 1
    assert [r["status"] for r in fleet_task(a, fleet_id)["runs"]] == ["acked"]
    assert "taken up again after this worker's restart" in b.log_text()


@pytest.mark.daemon
def test_a_taking_whose_claim_lapsed_while_the_fleet_worker_was_down_is_given_up_there(tmp_path, tracker, nats_server):
    """b takes a task while its executor is stopped (so its run has not begun), then b's fleet worker
    is stopped past the lease: c takes the task and runs it. When b's fleet worker comes back, its
    claim has lapsed, so it gives its own copy up instead of letting its executor run it a second time."""
    lease = {"task_lease_s": 2}
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, **lease)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="1", **lease)
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, agent="1", **lease)
    start_all([a, b, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
    for host, worker in ((b, "executor"), (c, "fleet")):
        assert host.ctl("stop", worker).returncode == 0
    fleet_id = offer(a, "--title", "once", "--agent", "builder")
    [mine] = wait_for(lambda: tasks_created(b), 30, what="b took it")
    assert b.ctl("stop", "fleet").returncode == 0
    assert c.ctl("start", "fleet").returncode == 0
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "acked", 30, what="c ran it after b's claim lapsed")
    assert b.ctl("start", "fleet").returncode == 0
    given_up = wait_for(lambda: b.events("task-given-up", target=mine["target"], written=False), 20,
                        what="b gave its copy up")
    assert "claim lapsed" in given_up[0]["data"]["reason"], given_up
    assert b.ctl("start", "executor").returncode == 0
    assert b.events("task-executing", target=mine["target"]) == []
    view = fleet_task(a, fleet_id)
    assert (view["status"], view["host"]) == ("acked", "c@test"), view


@pytest.mark.daemon
def test_a_claim_is_renewed_while_the_rest_of_the_link_keeps_failing(tmp_path, tracker):
    """b runs a task it may not report on (its NATS user may not publish to pulse.outcomes.>): each
    report times out and takes b's link down, again and again. Its claim is renewed apart from the
    link's loops, so c, handed the task again and again past many leases, leaves it to b: it is not
    run twice. Before, the renewal came after the report in the same loop, never ran, and c ran the
    task as soon as the claim lapsed."""
    lease = 3
    users = {"a": "", "b": 'permissions: {publish: {deny: ["pulse.outcomes.>"]}}', "c": ""}
    server = Nats(tmp_path, tracker, authorization="users: [\n" + "\n".join(
        f'{{user: {name}, password: {name}-pw, {rules}}}' for name, rules in users.items()) + "\n]").start()
    try:
        def url(name: str) -> str:
            return f"nats://{name}:{name}-pw@127.0.0.1:{server.port}"
        a = fleet_host(tmp_path, tracker, "a", url("a"), task_lease_s=lease)
        b = fleet_host(tmp_path, tracker, "b", url("b"), agent="60", task_lease_s=lease)
        c = fleet_host(tmp_path, tracker, "c", url("c"), agent="1", task_lease_s=lease)
        start_all([a, b, c])
        wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
        assert c.ctl("stop", "fleet").returncode == 0              # b takes it
        fleet_id = offer(a, "--title", "once", "--agent", "builder")
        [mine] = wait_for(lambda: tasks_created(b), 30, what="b took it")
        wait_for(lambda: b.events("task-executing", target=mine["target"], written=False), 20, what="it runs on b")
        wait_for(lambda: "fleet link failed" in b.log_text(), 20, what="b's report failing its link")
        assert c.ctl("start", "fleet").returncode == 0
        wait_for(lambda: f"fleet task {fleet_id} left to other hosts: claimed by b@test" in c.log_text(), 30,
                 what="c handed the task and leaving it to b")
        left = time.monotonic()

        def settled() -> bool:     # c took it, or was handed it again and again past the lease
            return bool(tasks_created(c)) or (time.monotonic() - left > 3 * lease
                                              and c.log_text().count(f"fleet task {fleet_id} delivered") >= 3)
        wait_for(settled, 60, what="c handed the task three times over three leases")
        assert tasks_created(c) == [], "c ran the task b holds"
        assert b.log_text().count("fleet link failed") >= 3, "b's link did not keep failing: the test proved nothing"
    finally:
        server.kill()


@pytest.mark.daemon
def test_a_short_fleet_chaos_run_loses_nothing_and_runs_nothing_twice():
    """scripts/fleet_chaos.py for 15 s: three hosts on a three-server cluster, a random kill every 4 s
    of a worker, a pulsed or a NATS server; every task acked or dead-lettered once, every event of
    every host in the stream once and in order, nothing left claimed or queued. The script kills
    what it started by pid and exits 1 on any of those."""
    script = Path(__file__).parent.parent / "scripts" / "fleet_chaos.py"
    # its hosts' runtime directories go under its work directory, in TMPDIR: a test worker's is nested
    # two runs deep, too long a path for their sockets, so the run gets a short one of its own
    short = tempfile.mkdtemp(prefix="pfc-", dir="/tmp")
    run = subprocess.Popen([sys.executable, str(script), "--seconds", "15", "--seed", "7", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": short})
    try:
        out, err = run.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)      # its finally kills, by pid, the hosts and servers it started
        out, err = run.communicate(timeout=60)
        pytest.fail(f"fleet_chaos.py did not end within 400 s: {err[-4000:]}")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        shutil.rmtree(short, ignore_errors=True)
    assert run.returncode == 0, out + err[-4000:]
    figures = json.loads(out)
    assert figures["offered"] > 0 and figures["offered"] == figures["acked"] + len(figures["dead"]), figures
    assert sum(figures["kills"].values()) >= 2 and figures["events_in_stream"] > 0, figures
