"""Spend limits that fail closed: real pulsed, the template's assignment rule, and a fake
CLI that answers like `claude -p --output-format json` and reports a cost of $4 per run.

The pure part (windows, the fold, the decisions) is tested first; then pulsed:
two runs against usd_per_day = 10, the third waits with reason budget, one notification at 80 %
and one at 100 %; the day rolls over (the clock's test seam, across a restart); two tasks race for
the last dollars and only one starts; `pulsectl budget reset` lets a held task run.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

from pulse.agents import spend
from pulse.core import config
from pulse.core.config import Agent, ConfigError, SpendLimits
from pulse.core.wire.eventmsgs import Event, SpendEvent
from support import notifications, wait_for

PY = sys.executable

FAKE_CLI = r'''
import json, os, sys, time
log = os.environ["FAKE_LOG"]
def write(entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")
write({"event": "start", "t": time.time(), "task": os.environ.get("PULSE_TASK_ID"), "argv": sys.argv})
time.sleep(float(os.environ.get("FAKE_SLEEP_S", "0")))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done",
                  "session_id": "s", "num_turns": 1, "duration_ms": 5,
                  "total_cost_usd": float(os.environ.get("FAKE_COST", "4"))}))
write({"event": "end", "t": time.time(), "task": os.environ.get("PULSE_TASK_ID")})
'''


# -- pure --------------------------------------------------------------------------------------------

def test_windows_are_utc_days_and_months_and_the_last_hour():
    t = 1764779400.5                                     # 2025-12-03T16:30:00.5Z
    assert spend.window_start("day", t) == 1764720000     # 2025-12-03T00:00:00Z
    assert spend.window_start("month", t) == 1764547200   # 2025-12-01T00:00:00Z
    assert spend.window_start("hour", t) == t - 3600
    assert spend.window_key("day", t) == "2025-12-03" and spend.window_key("month", t) == "2025-12"


def _ev(type_, target, **data) -> Event:
    return Event(type=type_, source="test", target=target, data=data)


def test_the_ledger_forgets_what_no_window_reaches_so_its_checkpoint_stays_small():
    now = 1764779400.0
    ledger = spend.Ledger()
    spend.fold_ledger(ledger, [
        _ev(SpendEvent.RESERVED, "a", effect_id="old", agent="a", task="task-1", usd=4.0, at=now - spend.KEEP_S - 1),
        _ev(SpendEvent.RESERVED, "a", effect_id="new", agent="a", task="task-2", usd=1.0, at=now)])
    assert set(ledger.runs) == {"new"} and ledger.used("a", "usd_per_month", now) == 1.0


def test_a_run_whose_spend_events_moved_to_the_archive_still_counts(tmp_path):
    """The ledger is a checkpointed projection: a process that starts after retention moved this month's
    spend events into an archive segment folds them from there (a fold of the live rows since the month's
    start counted them no more, and the limit failed open)."""
    from pulse.core import clock
    from pulse.store import eventindex, eventsdb
    from support import pulsectl
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[store]\nkeep_days = 1e-9\n")
    now = clock.now()
    conn = eventsdb.open_events(home / "events.db")
    try:
        eventsdb.append_events(conn, [
            _ev(SpendEvent.RESERVED, "a", effect_id="e1", agent="a", task="task-1", usd=4.0, at=now),
            _ev(SpendEvent.SETTLED, "a", effect_id="e1", agent="a", usd=3.5, cost_reported=True),
            *[_ev("tick", None, i=i) for i in range(1200)]])
        moved = pulsectl(["--home", str(home), "store", "compact"], timeout=60)
        assert moved.returncode == 0 and "moved events 1-" in moved.stdout, moved.stdout + moved.stderr
        assert eventindex.first_live_id(conn) > 2                    # both spend events left the live rows
        spend.forget(conn)                                          # as a process that starts now
        assert spend.load(conn, now).used("a", "usd_per_day", now) == 3.5
        # and so does its reported cost, which the next run's reservation expects
        assert spend.recent_costs(spend.load(conn, now), "a") == [3.5]
        assert (home / "checkpoints" / "spend.ckpt").exists()
        spend.forget(conn)                                          # and from that checkpoint
        assert spend.load(conn, now).used("a", "runs_per_hour", now) == 1
    finally:
        spend.forget(conn)
        conn.close()


def test_the_tasks_waiting_on_a_limit_are_listed_in_number_order():
    ledger = spend.Ledger().fold([_ev(SpendEvent.HELD, t, agent="a") for t in ("task-10", "task-6", "task-11")])
    [row] = [r for r in spend.overview(ledger, [], SpendLimits(), 1764779400.0) if r["agent"] == spend.HOST]
    assert row["waiting_tasks"] == ["task-6", "task-10", "task-11"]     # not as text: task-10 before task-6


def test_the_ledger_counts_reservations_until_settled_and_forgets_what_was_reset():
    now = 1764779400.0
    ledger = spend.Ledger().fold([
        _ev(SpendEvent.RESERVED, "a", effect_id="e1", agent="a", task="task-1", usd=4.0, at=now - 100),
        _ev(SpendEvent.SETTLED, "a", effect_id="e1", usd=5.0, cost_reported=True),
        _ev(SpendEvent.RESERVED, "a", effect_id="e2", agent="a", task="task-2", usd=4.0, at=now - 50),
        _ev(SpendEvent.RESERVED, "b", effect_id="e3", agent="b", task="task-3", usd=1.0, at=now - 86400),
    ])
    assert ledger.used("a", "usd_per_day", now) == 9.0          # settled 5 + reserved 4
    assert ledger.used(spend.HOST, "usd_per_day", now) == 9.0   # b's run was yesterday
    assert ledger.used("a", "runs_per_hour", now) == 2
    ledger.fold([_ev(SpendEvent.RESET, "a", at=now - 10)])
    assert ledger.used("a", "usd_per_day", now) == 0.0


def test_a_run_that_would_cross_a_limit_is_held_and_alerts_are_once_per_window():
    now = 1764779400.0
    ledger = spend.Ledger().fold([
        _ev(SpendEvent.RESERVED, "a", effect_id=f"e{i}", agent="a", task=f"task-{i}", usd=4.0, at=now - i)
        for i in (1, 2)])
    [m] = spend.measures(ledger, [("a", SpendLimits(usd_per_day=10))], now)
    assert (m.used, m.of) == (8.0, 10.0)
    assert spend.crossing(m, 4.0) and not spend.crossing(m, 2.0)
    assert spend.crossing(m, 0.0) is False                      # $2 left, and nothing expected
    assert [lvl for _, lvl in spend.due_alerts(ledger, [m], lambda m: m.used)] == [80]
    ledger.fold([_ev(SpendEvent.ALERT, "a", scope="a", limit="usd_per_day", key=m.key, level=80, at=now)])
    assert spend.due_alerts(ledger, [m], lambda m: m.used) == []
    assert [lvl for _, lvl in spend.due_alerts(ledger, [m], lambda m: m.used, {("a", "usd_per_day")})] == [100]
    assert spend.remaining_usd([m]) == 2.0
    assert spend.expected_cost(None, [3.0, 5.0, 4.0]) == 4.0 and spend.expected_cost(6.0, [1.0]) == 6.0
    assert spend.expected_cost(None, []) == 0.0


def test_spend_limits_are_checked_naming_where():
    with pytest.raises(ConfigError, match=r"\$\.agent\[0\]\.budget\.usd_per_day must be greater than 0"):
        config.validate(config.decode('[[agent]]\nname = "a"\nargv = ["x"]\nbudget = { usd_per_day = 0 }\n',
                                      "c.toml"), "c.toml")
    with pytest.raises(ConfigError, match=r"\$\.budget\.runs_per_hour"):
        config.validate(config.decode("[budget]\nruns_per_hour = -1\n", "c.toml"), "c.toml")
    c = config.decode('[budget]\nusd_per_month = 300\n[[agent]]\nname = "a"\nargv = ["x"]\n'
                      'budget = { usd_per_day = 20, runs_per_hour = 30 }\nmax_run_usd = 2.5\n', "c.toml")
    assert c.agent[0].budget == SpendLimits(usd_per_day=20, runs_per_hour=30) and c.budget.usd_per_month == 300
    assert Agent(name="x").budget == SpendLimits()             # no limit unless set


def test_claude_code_takes_the_dollars_left_as_its_cap():
    from pulse.agents import adapters
    adapter = adapters.load_adapter("claude-code")
    inv = adapter.invocation(Agent(name="c", adapter="claude-code", mcp=False), adapters.Task("task-1", "hi"), "/tmp")
    adapter.cap_spend(inv, 2.349)
    at = inv.argv.index("--max-budget-usd")
    assert inv.argv[at + 1] == "2.34" and at < inv.argv.index("--")
    out = json.dumps({"type": "result", "subtype": "error_max_budget_usd", "is_error": False, "result": "",
                      "total_cost_usd": 2.41})
    result = adapter.parse(adapters.RunOutput(0, out.encode(), b"", False, inv))
    assert (result.ok, result.reason, result.cost_usd) == (False, "budget-cap", 2.41)


# -- with pulsed ---------------------------------------------------------------------------------------

def _start(pulsed, tmp_path: Path, agent_extra: str, env: dict | None = None, head: str = "", **fake_env) -> None:
    script = tmp_path / "fake_cli.py"
    script.write_text(FAKE_CLI)
    fenv = {"FAKE_LOG": str(tmp_path / "cli.log"), **fake_env}
    text = (f'{head}[[notify]]\nkind = "file"\npath = "{tmp_path / "notes.jsonl"}"\n\n'
            f'[[agent]]\nname = "fake"\nadapter = "claude-code"\nmcp = false\ntimeout_s = 60\n'
            f'argv = [{json.dumps(PY)}, {json.dumps(str(script))}, "-p", "{{prompt}}", "--output-format", "json"]\n'
            f'env = {{{", ".join(f"{k} = {json.dumps(v)}" for k, v in fenv.items())}}}\n{agent_extra}\n')
    pulsed.home.mkdir(exist_ok=True)
    (pulsed.home / "config.toml").write_text(text)
    pulsed.start(env={"PULSE_TICK_MS": "200", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "200", **(env or {})})


def _add(pulsed, n: int = 1) -> list[str]:
    out = []
    for _ in range(n):
        done = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "spend some")
        assert done.returncode == 0, done.stderr
        out.append(done.stdout.strip())
    return out


def _status(pulsed, task: str) -> str:
    return json.loads(pulsed.ctl("task", "show", task, "--json").stdout)["status"]


def _budget(pulsed, env: dict | None = None) -> dict:
    done = pulsed.ctl("budget", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {row["agent"]: row for row in json.loads(done.stdout)["agents"]}


def _metrics(pulsed, path: str = "/metrics") -> str:
    url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
    base, _, token = url.partition("/?token=")
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def _cli_log(tmp_path: Path) -> list[dict]:
    path = tmp_path / "cli.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_runs_then_the_third_waits_for_budget_told_once_at_80_and_100_a_reload_raises_it_and_the_day_rolls_over(
        pulsed, tmp_path):
    _start(pulsed, tmp_path, "budget = { usd_per_day = 10 }", env={"PULSE_EFFECT_DEADLINE_S": "2"},
           head='[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n')
    first, second, third = _add(pulsed, 3)
    wait_for(lambda: _status(pulsed, first) == "acked" and _status(pulsed, second) == "acked", 30, what="two runs")
    held = wait_for(lambda: pulsed.events("spend-held", target=third), 15, what="the third held")
    assert held[0]["data"]["reason"] == "budget" and "$8.00 of $10.00 usd_per_day" in held[0]["data"]["why"]
    notes = tmp_path / "notes.jsonl"
    wait_for(lambda: len(notifications(notes, spend.RULE)) >= 2, 15, what="two notifications")
    # The snapshot says the agent is over its limit, so no agent-run is handed out for the held task:
    # not one, where each held run used to expire (deadline 2 s) and be handed out again, an effect a
    # minute at the default deadline. Two effect deadlines' worth of ticks pass without one.
    pulsed.wait_ticks(25, timeout=30)
    runs = [e for e in pulsed.events("effect") if e["data"].get("kind") == "agent-run"]
    assert [r["data"]["params"]["task_id"] for r in runs] == [first, second], runs
    assert len(pulsed.events("spend-held", target=third)) == 1                 # said once, not per tick
    # the two notices are two notify effects, run at once by the executor: either may land first
    told = sorted(notifications(notes, spend.RULE), key=lambda n: n["percent"])
    assert [(n["percent"], n["limit"]) for n in told] == [(80, "usd_per_day"), (100, "usd_per_day")]
    assert [n["level"] for n in told] == ["warning", "warning"]   # a limit doing its job is no error
    assert _status(pulsed, third) == "pending" and len(_cli_log(tmp_path)) == 4     # two starts, two ends
    shown = pulsed.ctl("task", "show", third)
    assert "waiting:" in shown.stdout and "budget" in shown.stdout, shown.stdout
    # the page says the same, on the board's card and on the task's page
    board = json.loads(_metrics(pulsed, "/api/tasks"))["by_status"]["pending"]
    [card] = [t["waiting"] for t in board if t["id"] == third]
    assert card["reason"] == "budget" and "$8.00 of $10.00 usd_per_day" in card["why"]
    assert json.loads(_metrics(pulsed, f"/api/tasks/{third}"))["waiting"] == card
    row = _budget(pulsed)["fake"]
    assert (row["today_usd"], row["usd_per_day"], row["runs_last_hour"]) == (8.0, 10.0, 2)
    assert row["waiting_tasks"] == [third]
    metrics = _metrics(pulsed)
    assert 'pulse_agent_spend_usd{agent="fake",window="day"} 8.0' in metrics
    assert 'pulse_agent_spend_limit_usd{agent="fake",window="day"} 10.0' in metrics
    assert 'pulse_agent_tasks_waiting_budget{agent="fake"} 1.0' in metrics

    # The operator raises the limit ($12: room for exactly one more $4 run) and reloads.
    path = pulsed.home / "config.toml"
    path.write_text(path.read_text().replace("usd_per_day = 10", "usd_per_day = 12"))
    assert pulsed.ctl("reload").returncode == 0
    wait_for(lambda: _status(pulsed, third) == "acked", 30, what="the third run after the limit was raised")
    [fourth] = _add(pulsed)
    wait_for(lambda: pulsed.events("spend-held", target=fourth), 15, what="the fourth held at $12 of $12")

    # The next UTC day, through the clock's test seam (pulsed restarted with its windows a day on).
    assert pulsed.terminate() == 0
    tomorrow = {"PULSE_TEST_CLOCK_OFFSET_S": "86400"}
    pulsed.start(env={"PULSE_TICK_MS": "200", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "200", **tomorrow})
    wait_for(lambda: _status(pulsed, fourth) == "acked", 30, what="the fourth run, the next day")
    assert _budget(pulsed, env=tomorrow)["fake"]["today_usd"] == 4.0
    # one 80 % and one 100 % notice for each of the two days' windows that reached them: today's only so far
    assert sorted((n["percent"], n["window"]) for n in notifications(notes, spend.RULE)) == [
        (80, told[0]["window"]), (100, told[0]["window"])]


def test_two_tasks_racing_for_the_last_dollars_only_one_starts_and_a_reset_frees_the_agent(pulsed, tmp_path):
    # $6 expected per run (max_run_usd), $10 a day: two claims at once cannot both fit.
    _start(pulsed, tmp_path, "concurrency = 2\nmax_run_usd = 6\nbudget = { usd_per_day = 10 }",
           FAKE_SLEEP_S="1.5")
    a, b = _add(pulsed, 2)
    wait_for(lambda: _status(pulsed, a) == "acked" and _status(pulsed, b) == "acked", 40, what="both runs")
    log = _cli_log(tmp_path)
    starts = sorted(e["t"] for e in log if e["event"] == "start")
    ends = sorted(e["t"] for e in log if e["event"] == "end")
    assert len(starts) == 2 and starts[1] >= ends[0], "the second run started before the first ended"
    assert len(pulsed.events("spend-held")) >= 1
    # $8 spent: a third ($6 expected) waits, until the operator resets the agent's spend.
    [c] = _add(pulsed)
    wait_for(lambda: pulsed.events("spend-held", target=c), 15, what="the third held")
    reset = pulsed.ctl("budget", "reset", "fake")
    assert reset.returncode == 0, reset.stderr
    wait_for(lambda: _status(pulsed, c) == "acked", 30, what="the third run after the reset")
    [ev] = pulsed.events("spend-reset", target="fake")
    assert ev["source"] == "pulsectl"
    started = [e for e in _cli_log(tmp_path) if e["event"] == "start" and e["task"] == c]
    assert started and started[0]["argv"][-2:] == ["--max-budget-usd", "10.00"]   # all of the day's $10 is left


def test_the_report_names_who_spent_what_and_which_tasks_waited():
    from pulse.report import analyst
    now = 1764779400.0

    def ev(i, type_, target, **data):
        return Event(type=type_, source="executor", target=target, data=data, ts=now + i, id=i)
    events = [ev(1, SpendEvent.SETTLED, "cod", effect_id="e1", agent="cod", usd=0.0, cost_reported=False),
              ev(2, SpendEvent.SETTLED, "fake", effect_id="e2", agent="fake", usd=4.0, cost_reported=True),
              ev(3, SpendEvent.SETTLED, "fake", effect_id="e3", agent="fake", usd=4.0, cost_reported=True),
              ev(4, SpendEvent.HELD, "task-3", agent="fake", reason="budget", why="fake: $8.00 of $10.00 usd_per_day")]
    analysis = analyst.analyse(events, now, now + 10)
    [spent] = [h for h in analysis.highlights if h.text.startswith("spend:")]
    assert spent.text == "spend: fake $8.00 over 2 run(s); cod $0.00 over 1 run(s) (1 with no cost reported)"
    assert spent.event_ids == [2, 3, 1]
    assert [i.text for i in analysis.issues] == ["task-3 waited on a spend limit: fake: $8.00 of $10.00 usd_per_day"]


def test_two_claims_at_once_on_real_sqlite_reserve_one_and_hold_the_other(tmp_path):
    # The claim and the reservation are one BEGIN IMMEDIATE transaction: two executors' threads
    # claiming at the same instant cannot both fit $6 runs under $10 a day.
    import threading

    from pulse.agents import agentrun
    from pulse.core.wire.enginerpc import Effect
    from pulse.store import effectqueue, eventsdb
    cfg = config.slice_of(config.validate(config.decode(
        '[[agent]]\nname = "a"\nargv = ["x"]\nconcurrency = 2\nmax_run_usd = 6\nbudget = { usd_per_day = 10 }\n',
        "c.toml"), "c.toml"), "executor")
    db = tmp_path / "events.db"
    effects = [effectqueue.new_effect(Effect(kind="agent-run", target=f"task-{i}", params={"agent": "a"}), "test", 60)
               for i in (1, 2)]
    effectqueue.commit_effects(eventsdb.open_events(db, "FULL"), effects, "test")
    barrier, answers = threading.Barrier(2), {}

    def claim(effect):
        conn = eventsdb.open_events(db, "FULL")
        barrier.wait()
        answers[effect.target] = effectqueue.claim_effect(conn, effect.id, f"claimer-{effect.target}", "test",
                                                          reserve=lambda c, e: agentrun.reserve_spend(c, e, cfg))
    threads = [threading.Thread(target=claim, args=(e,)) for e in effects]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    held = [k for k, v in answers.items() if isinstance(v, effectqueue.Held)]
    claimed = [k for k, v in answers.items() if isinstance(v, Effect)]
    assert len(held) == 1 and len(claimed) == 1, answers
    assert "$6.00 of $10.00 usd_per_day" in answers[held[0]]
    conn = eventsdb.open_events(db)
    assert [e.target for e in eventsdb.read_events(conn, types=[SpendEvent.HELD])] == held
    assert [e.data["task"] for e in eventsdb.read_events(conn, types=[SpendEvent.RESERVED])] == claimed


def test_the_host_budget_holds_every_agent_and_a_cli_without_cost_counts_in_runs_only(tmp_path):
    from pulse.agents import agentrun
    from pulse.core.wire.enginerpc import Effect
    from pulse.store import effectqueue, eventsdb
    cfg = config.slice_of(config.validate(config.decode(
        '[budget]\nusd_per_day = 5\nruns_per_hour = 3\n'
        '[[agent]]\nname = "a"\nargv = ["x"]\nmax_run_usd = 3\n[[agent]]\nname = "b"\nargv = ["x"]\nmax_run_usd = 3\n',
        "c.toml"), "c.toml"), "executor")
    conn = eventsdb.open_events(tmp_path / "events.db", "FULL")

    def run(agent: str, task: int):
        eff = effectqueue.new_effect(Effect(kind="agent-run", target=f"task-{task}", params={"agent": agent}), "t", 60)
        effectqueue.commit_effects(conn, [eff], "test")
        return eff, effectqueue.claim_effect(conn, eff.id, "me", "test",
                                             reserve=lambda c, e: agentrun.reserve_spend(c, e, cfg))

    first, claimed = run("a", 1)
    assert isinstance(claimed, Effect)
    agentrun.settle_spend(conn, first, cfg, {"result": {"code": 0}})     # no cost reported: $0, one run
    [settled] = eventsdb.read_events(conn, types=[SpendEvent.SETTLED])
    assert settled.data["cost_reported"] is False and "runs_per_hour only" in settled.data["note"]
    second, claimed = run("b", 2)                                           # $3 reserved of the host's $5
    assert isinstance(claimed, Effect)
    _, held = run("a", 3)                                                   # $3 more would cross it
    assert isinstance(held, effectqueue.Held) and "the host: $3.00 of $5.00 usd_per_day" in held
    agentrun.settle_spend(conn, second, cfg, {"result": {"cost_usd": 0.5}})
    third, claimed = run("a", 4)                                            # $0.50 + $3 fits; the 3rd run
    assert isinstance(claimed, Effect)
    _, held = run("b", 5)
    assert isinstance(held, effectqueue.Held) and "3 of 3 runs in the last hour" in held


def test_a_run_settled_unrun_counts_against_no_limit():
    now = 1764779400.0
    ledger = spend.Ledger().fold([
        _ev(SpendEvent.RESERVED, "a", effect_id="e1", agent="a", task="task-1", usd=4.0, at=now - 5),
        _ev(SpendEvent.SETTLED, "a", effect_id="e1", usd=0.0, cost_reported=None, started=False)])
    assert ledger.used("a", "runs_per_hour", now) == 0 and ledger.used("a", "usd_per_day", now) == 0


# -- a task held by a limit costs no effect while it waits (the snapshot carries the holds) ----------

def _hold(why: str = "fake: $8.00 of $10.00 usd_per_day"):
    from pulse.core.wire.enginerpc import AgentLoad
    return {"fake": AgentLoad(agent="fake", concurrency=2, budget=why), "free": AgentLoad(agent="free")}


def test_the_holds_the_snapshot_carries_are_the_claims_words_for_each_agent_over_a_limit():
    now = 1764779400.0
    ledger = spend.Ledger().fold([
        _ev(SpendEvent.RESERVED, "a", effect_id=f"e{i}", agent="a", task=f"task-{i}", usd=4.0, at=now - i)
        for i in (1, 2)])
    agents = [Agent(name="a", budget=SpendLimits(usd_per_day=10)), Agent(name="b")]
    holds = spend.agent_holds(ledger, agents, SpendLimits(), now, {"a": 4.0, "b": 4.0})
    assert list(holds) == ["a"]               # b has no limit, the host none either
    assert holds["a"].why == "a: $8.00 of $10.00 usd_per_day; the next run is expected to cost $4.00"
    assert spend.agent_holds(ledger, agents, SpendLimits(), now, {"a": 2.0}) == {}      # $2 still fits
    on_host = spend.agent_holds(ledger, agents, SpendLimits(runs_per_hour=2), now, {})
    assert sorted(on_host) == ["a", "b"] and "the host: 2 of 2 runs in the last hour" in on_host["b"].why
    assert spend.limited(agents, SpendLimits()) == agents[:1]


def test_an_agent_over_a_limit_has_no_free_slot_and_its_runs_are_dropped_before_commit():
    from pulse.agents import routing
    from pulse.core.wire.enginerpc import Effect
    agents = _hold()
    assert (agents["fake"].free, agents["free"].free) == (0, 1)
    runs = [Effect(kind="agent-run", target="task-1", params={"task_id": "task-1", "agent": "fake"}),
            Effect(kind="agent-run", target="task-2", params={"task_id": "task-2", "agent": "free"}),
            Effect(kind="agent-run", target="task-3", params={"task_id": "task-3", "agent": ["odd"]}),
            Effect(kind="noop", params={"agent": "fake"})]
    kept, dropped = routing.over_budget_runs(runs, agents)
    assert [e.target for e in dropped] == ["task-1"] and len(kept) == 3


def test_a_task_whose_agents_are_all_over_a_limit_is_said_to_wait_once_not_while_a_run_is_queued():
    from pulse.agents import routing
    from pulse.core.wire.enginerpc import Effect, PendingTasks, TaskState
    listed = [TaskState(id=f"task-{n}", project="p", title="t", prompt="x") for n in (1, 2, 3, 4)]
    pending = PendingTasks(pending_count=4, tasks=listed, unassignable={"task-4": "nobody"},
                           eligible={"task-1": ["fake"], "task-2": ["fake", "free"], "task-3": ["fake"],
                                     "task-4": []})
    queued = [Effect(kind="agent-run", target="task-3", params={"task_id": "task-3", "agent": "fake"})]
    assert routing.budget_waits(pending, _hold(), queued) == {"task-1": "fake"}   # task-2: free may take it


def test_a_hundred_tasks_no_agent_may_take_cannot_crowd_out_one_that_may_run():
    from pulse.agents import routing, tasks
    from pulse.core.wire.enginerpc import TaskState
    agents = [Agent(name="fake", projects=["p"]), Agent(name="capped", projects=["q"])]
    states = {f"task-{n}": TaskState(id=f"task-{n}", project="elsewhere", title="t", prompt="x", priority=9,
                                     created=float(n)) for n in range(1, 101)}
    states.update({f"task-{n}": TaskState(id=f"task-{n}", project=project, title="t", prompt="x", created=float(n))
                   for n, project in ((101, "q"), (102, "p"))})
    plain = tasks.pending_tasks(states, 1000.0)
    assert "task-102" not in [t.id for t in plain.tasks]              # the old list: the 100 most urgent
    listed = tasks.pending_tasks(states, 1000.0, first=routing.takeable(agents, {"capped": "over"}))
    ids = [t.id for t in listed.tasks]
    assert len(ids) == 100 and listed.pending_count == 102
    assert "task-102" in ids and "task-101" not in ids               # q's agent is over its limit: it waits too
    assert ids == sorted(ids, key=lambda i: tasks.urgency(states[i]))   # still most urgent first


NAIVE_ASSIGN = """
    from pulse.engine.api import Effect

    async def assign(prev, curr, inner):
        # an engine directory's own rule, older than AgentLoad.budget: every pending task, every tick
        effects, tick_ms = await inner(prev, curr)
        busy = {e.params.get("task_id") for e in curr.pending if e.kind == "agent-run"}
        listed = curr.pending_tasks.tasks if curr.pending_tasks is not None else []
        return effects + [Effect(kind="agent-run", target=t.id, params={"task_id": t.id, "agent": "fake"})
                          for t in listed if t.id not in busy], tick_ms

    RULES = [assign]
"""


def test_an_old_engine_rule_that_ignores_limits_still_costs_no_effect_while_its_task_is_held(pulsed, tmp_path):
    from support import engine_rule
    engine_rule(pulsed, "assign", NAIVE_ASSIGN)                   # in place of the template's
    _start(pulsed, tmp_path, "max_run_usd = 2\nbudget = { usd_per_day = 1 }", env={"PULSE_EFFECT_DEADLINE_S": "2"})
    [task] = _add(pulsed)
    held = wait_for(lambda: pulsed.events("spend-held", target=task), 15, what="the task held")
    assert "fake: $0.00 of $1.00 usd_per_day; the next run is expected to cost $2.00" in held[0]["data"]["why"]
    pulsed.wait_ticks(25, timeout=30)                             # two effect deadlines and more
    assert [e for e in pulsed.events("effect") if e["data"].get("kind") == "agent-run"] == []
    shown = pulsed.ctl("task", "show", task).stdout
    assert "waiting:" in shown and "budget: fake: $0.00 of $1.00 usd_per_day" in shown, shown
    # The operator raises the limit: the next tick hands the task out, and it runs.
    path = pulsed.home / "config.toml"
    path.write_text(path.read_text().replace("usd_per_day = 1", "usd_per_day = 5"))
    assert pulsed.ctl("reload").returncode == 0
    wait_for(lambda: _status(pulsed, task) == "acked", 30, what="the task run once the limit allows")


def test_a_hundred_unassignable_tasks_do_not_starve_one_an_agent_may_take(pulsed, tmp_path):
    from pulse.agents import tasks
    from pulse.store import eventsdb
    _start(pulsed, tmp_path, 'projects = ["p"]')
    conn = eventsdb.open_events(pulsed.paths.events_db)
    try:
        for n in range(100):                                      # more urgent than any task of p
            tasks.create(conn, "elsewhere", f"t{n}", "nobody takes this", priority=9, source="test")
    finally:
        conn.close()
    [task] = _add(pulsed)
    wait_for(lambda: _status(pulsed, task) == "acked", 30, what="the one task an agent may take")


def test_the_tick_reads_an_agents_expected_cost_again_once_it_has_a_new_settlement(tmp_path):
    from pulse.core import clock
    from pulse.core.wire.eventmsgs import now_event
    from pulse.store import eventsdb
    conn = eventsdb.open_events(tmp_path / "events.db")
    agents = [Agent(name="a", budget=SpendLimits(usd_per_day=10))]

    def run(n: int, usd: float) -> None:
        eventsdb.append_events(conn, [
            now_event(SpendEvent.RESERVED, "test", "a", {"effect_id": f"e{n}", "agent": "a", "task": f"task-{n}",
                                                         "usd": 0.0, "at": clock.now()}),
            now_event(SpendEvent.SETTLED, "test", "a", {"effect_id": f"e{n}", "usd": usd, "cost_reported": True})])
    try:
        run(1, 4.0)
        assert spend.holds(conn, agents, SpendLimits()) == {}                 # $4 spent, $4 expected: fits
        run(2, 5.5)
        [(name, hold)] = spend.holds(conn, agents, SpendLimits()).items()
        assert hold.why == "a: $9.50 of $10.00 usd_per_day; the next run is expected to cost $4.75"
    finally:
        conn.close()
