"""The report in plain words, and a verdict that weighs tasks by share and recency."""

from __future__ import annotations

import re

from pulse.core.wire.eventmsgs import Event
from pulse.report import analyst, render

FIGURE_KEY = re.compile(r"\b[a-z]+_[a-z_]+\b")      # success_rate_pct, repairs_acked, median_s ...


def ev(id, ts, type, target, source="executor", **data):
    return Event(id=id, ts=ts, type=type, source=source, target=target, data=data)


def four_of_five_then_one_built_to_fail() -> list[Event]:
    """Four tasks done, then a fifth that fails three times and is given up: the last runs fail."""
    events, n, t = [], 0, 100.0
    for task in ("t1", "t2", "t3", "t4"):
        n, t = n + 2, t + 60
        events += [ev(n - 1, t, "task-executing", task, agent="claude", run=f"r-{task}"),
                   ev(n, t + 30, "task-acked", task, agent="claude", run=f"r-{task}")]
    for attempt in (1, 2, 3):
        n, t = n + 2, t + 60
        events += [ev(n - 1, t, "task-executing", "t5", agent="claude", run=f"r-t5-{attempt}"),
                   ev(n, t + 5, "task-failed", "t5", agent="claude", run=f"r-t5-{attempt}", error="built to fail")]
    events.append(ev(n + 1, t + 6, "task-given-up", "t5", reason="failed 3 times in a row", failures=3))
    return events


def test_an_agent_with_four_of_five_tasks_done_is_not_a_failure():
    report = analyst.analyse(four_of_five_then_one_built_to_fail(), 0.0, 1000.0)
    card = next(c for c in report.role_analysis if c.name == "claude")
    assert card.verdict == "warn", card.summary
    assert card.summary.startswith("4 of 5 tasks done in 7 runs") and "most recent task failed" in card.summary


def test_recent_failures_weigh_more_than_old_ones():
    def agent(order):
        events, n = [], 0
        for i, ok in enumerate(order):
            n += 2
            events += [ev(n - 1, 100.0 + 1000 * i, "task-executing", f"t{i}", agent="a", run=f"r{i}"),
                       ev(n, 110.0 + 1000 * i, "task-acked" if ok else "task-failed", f"t{i}", agent="a", run=f"r{i}")]
        card = next(c for c in analyst.analyse(events, 0.0, 6000.0).role_analysis if c.name == "a")
        return card.figures["tasks_done_weighted_pct"]
    old_failures, recent_failures = agent([False, False, True, True, True]), agent([True, True, True, False, False])
    assert old_failures > 60 > recent_failures


def test_the_report_speaks_plain_words_and_labels_every_figure(tmp_path):
    events = four_of_five_then_one_built_to_fail()
    n = len(events) + 10
    for i in range(5):
        events += [ev(n + 3 * i, 900.0 + i, "operator", "tick", source="pulsectl", action="restart"),
                   ev(n + 3 * i + 1, 900.5 + i, "reload", None, source="pulsed", ok=True),
                   ev(n + 3 * i + 2, 901.0 + i, "task-created", f"x{i}", source="pulsectl", title="x", project="p")]
    report = analyst.analyse(events, 0.0, 1000.0)
    operator = next(c for c in report.role_analysis if c.role == "operator")
    assert "5 operator" not in operator.summary and "5 reload" not in operator.summary
    assert "restarted the tick worker 5 times" in operator.summary and "added 5 tasks" in operator.summary
    text = render.text(report)
    page = render.html(report, {e.id: e for e in events})
    for shown in (text, page):
        assert "(s)" not in shown
    cards = re.findall(r'<div class="card">.*?</div></div>', page, re.S)
    assert cards and not [key for card in cards for key in FIGURE_KEY.findall(re.sub(r"<[^>]+>", " ", card))]
    assert "runs that succeeded" in page and "tasks done, recent ones weighing more" in page


def test_loops_left_running_and_sessions_pulse_did_not_start_are_in_the_report():
    events = four_of_five_then_one_built_to_fail() + [
        ev(100, 900.0, "loop-noticed", "t1", run="r-t1", agent="claude", guard="loop",
           detail="the run reported 30 API requests and 0 tool calls in the last 60 s, over its loop_per_min (12)"),
        ev(101, 910.0, "spend-observed", "session:op-1", source="telemetry", usd=1.25, counted=True),
        ev(102, 920.0, "spend-observed", "session:x", source="telemetry", usd=3.0, counted=False)]
    report = analyst.analyse(events, 0.0, 1000.0)
    [loop] = [f for f in report.issues if "left running" in f.text]
    assert loop.severity == "warn" and loop.text.startswith("1 loop noticed and left running: t1") and loop.event_ids == [100]
    [spent] = [f for f in report.highlights if f.text.startswith("sessions Pulse did not start")]
    assert "$1.25 over 1 session, counted" in spent.text and "$3.00 more reported without the receiver's token" in spent.text
