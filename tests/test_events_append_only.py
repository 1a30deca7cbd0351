"""events.db is append-only (DESIGN §3): no event row ever changes or goes away (but by retention's
recorded move of the oldest, pulse.store.retention), and what is
counted from the rows (the metrics, the report) counts every occurrence of an error that keeps
recurring, though the history holds only a bounded number of events for it."""

from __future__ import annotations

import re
import sqlite3
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from support import engine_rule, wait_for

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pulse", "supervisor", "engine", "scripts")
# A statement that would change or remove a row of the events table, however it is spelled.
CHANGES_EVENTS = re.compile(r"\b(?:UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM|REPLACE\s+INTO|INSERT\s+OR\s+REPLACE\s+INTO|"
                            r"DROP\s+TABLE(?:\s+IF\s+EXISTS)?)\s+[\"'`\[]?events\b", re.IGNORECASE)
REPEAT_S = 1.0
RAISING = "def broken(prev, curr, inner):\n    raise RuntimeError('the same bug, every tick')\nRULES = [broken]\n"


def statements_that_change_events(text: str) -> list[str]:
    return [m.group(0) for m in CHANGES_EVENTS.finditer(text)]


def test_the_guard_sees_what_it_guards_against():
    for sql in ("UPDATE events SET data = ?", "update  events set", "DELETE FROM events WHERE id = 1",
                'INSERT OR REPLACE INTO "events" VALUES (1)', "DROP TABLE IF EXISTS events", "UPDATE OR IGNORE events"):
        assert statements_that_change_events(sql), sql
    for sql in ("UPDATE effects SET state = ?", "DELETE FROM vitals WHERE ts < ?", "INSERT INTO events (seq) VALUES (1)",
                "UPDATE error_runs SET total = ?", "DELETE FROM error_runs"):
        assert not statements_that_change_events(sql), sql


# The one path that removes events: retention's move, in the transaction that records where they went
# (the events_never_go trigger refuses any delete the manifest does not cover; tests/test_history_retention.py).
MOVER = ["pulse/store/retention.py: DELETE FROM events"]


def test_no_source_changes_or_deletes_an_event():
    """No event ever changes; events leave only by retention's recorded move, so that one place alone."""
    found = [f"{path.relative_to(ROOT)}: {hit}" for root in SOURCES for path in sorted((ROOT / root).rglob("*.py"))
             for hit in statements_that_change_events(path.read_text())]
    assert found == MOVER


# -- a rule that keeps raising, end to end --------------------------------------------------------------------------

def all_rows(home: Path) -> dict[int, tuple]:
    conn = sqlite3.connect(home / "events.db", timeout=5)
    try:
        return {r[0]: r for r in conn.execute("SELECT id, seq, ts, mono, type, source, target, data FROM events")}
    finally:
        conn.close()


def rule_errors(base: str, token: str) -> float:
    request = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "pulse_rule_errors")
    return family.samples[0].value


def raised_ticks(pulsed) -> int:
    """Ticks whose engine call raised: each one is an occurrence of the error."""
    return sum(1 for t in pulsed.ticks() if str(t["data"].get("inner", "")).startswith("engine rules raised"))


def the_bug(pulsed) -> list[dict]:
    return [e for e in pulsed.events("error") if "the same bug" in e["data"]["message"]]


def test_a_rule_that_keeps_raising_keeps_the_metric_rising_and_changes_no_event(pulsed):
    engine_rule(pulsed, "broken", RAISING)
    (pulsed.home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n\n'
                                             f"[store]\nerror_repeat_s = {REPEAT_S}\n")
    pulsed.start(env={"PULSE_TICK_MS": "50", "PULSE_TICK_MS_MIN": "50"})
    pulsed.wait_running(("watcher", "tick", "executor", "engine", "web"))
    url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 10, what="pulsectl web url")
    base, _, token = url.partition("/?token=")

    wait_for(lambda: the_bug(pulsed), 20, what="the rule's first error")
    early = all_rows(pulsed.home)
    readings = [rule_errors(base, token)]
    assert readings[0] >= 1

    def rises() -> None:
        wait_for(lambda: rule_errors(base, token) > readings[-1], 10, what=f"pulse_rule_errors above {readings[-1]}")
        readings.append(rule_errors(base, token))
    rises()                # within the first coalescing window: the repeats its run counts so far
    for n in (1, 2):       # past it, and past the next: each window's repeats appended as one event
        wait_for(lambda: len([e for e in the_bug(pulsed) if e["data"].get("repeat")]) >= n, 10 * REPEAT_S,
                 what=f"repeat event {n} of the error")
        rises()
    assert readings == sorted(readings) and len(set(readings)) == 4, readings

    # every occurrence counts: no fewer than the ticks that raised before the scrape
    before = raised_ticks(pulsed)
    assert rule_errors(base, token) >= before
    # and the history holds a bounded number of events for it, whose counts add up
    events = the_bug(pulsed)
    assert [e["data"]["count"] for e in events if not e["data"].get("repeat")] == [1]
    assert len(events) < sum(e["data"]["count"] for e in events) == events[-1]["data"]["total"]

    # no row read early has changed since, the first error's row included
    later = all_rows(pulsed.home)
    assert {i: later.get(i) for i in early} == early
