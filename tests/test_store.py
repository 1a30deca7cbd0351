"""The stores, on real SQLite files: events, effects queue, coalesced errors, vitals, objects."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import connection, effectqueue, errorruns, eventsdb, objects, vitalsdb


@pytest.fixture
def events(tmp_path):
    conn = eventsdb.open_events(tmp_path / "events.db")
    yield conn
    conn.close()


def test_schema_is_versioned_and_reopening_keeps_data(tmp_path, events):
    eventsdb.append_events(events, [eventmsgs.now_event("wake", "test", "tick", reason="x")])
    assert events.execute("PRAGMA user_version").fetchone()[0] == eventsdb.EVENTS_SCHEMA
    assert events.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again = eventsdb.open_events(tmp_path / "events.db")
    assert [e.type for e in eventsdb.read_events(again)] == ["wake"]


def test_an_older_store_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statement in eventsdb._MIGRATIONS[1]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO events (seq, ts, mono, type, source, data) VALUES (0, 1, 1, 'wake', 'old', '{}')")
    conn.commit()
    conn.close()
    migrated = eventsdb.open_events(path)
    assert migrated.execute("PRAGMA user_version").fetchone()[0] == eventsdb.EVENTS_SCHEMA
    assert eventsdb.read_events(migrated)[0].source == "old"
    assert effectqueue.open_effects(migrated) == []


def test_a_newer_store_is_refused(tmp_path):
    path = tmp_path / "new.db"
    sqlite3.connect(path).execute(f"PRAGMA user_version = {eventsdb.EVENTS_SCHEMA + 1}")
    with pytest.raises(connection.StoreError, match="schema"):
        eventsdb.open_events(path)


def test_append_assigns_consecutive_ids_and_since_bisects(events):
    batch = [eventmsgs.now_event("collect", "t", None, n=i) for i in range(100)]
    for i, ev in enumerate(batch):
        ev.ts = 1000.0 + i
    eventsdb.append_events(events, batch)
    assert [e.id for e in batch] == list(range(1, 101))
    assert [e.data["n"] for e in eventsdb.read_events(events, since_ts=1090.0)] == list(range(90, 100))
    assert eventsdb.first_id_since(events, 0) == 1 and eventsdb.first_id_since(events, 5000) == 101
    row = events.execute("SELECT json_extract(data, '$.n') FROM events WHERE id = 42").fetchone()
    assert row == (41,)


def rows(conn) -> dict[int, tuple]:
    return {r[0]: r for r in conn.execute("SELECT id, seq, ts, mono, type, source, target, data FROM events")}


def errors_of(conn) -> list[tuple]:
    return [(e.data["message"], e.data["count"], e.data["total"]) for e in eventsdb.read_events(conn, types=["error"])]


def test_identical_errors_coalesce_into_a_run_of_events_that_never_change(events):
    t0, seen = 1000.0, {}

    def unchanged() -> bool:                      # every row read before is the same row now
        now = rows(events)
        ok = all(now.get(i) == row for i, row in seen.items())
        seen.update(now)
        return ok

    totals = [errorruns.record_error(events, "tick", "engine", "engine did not answer", now=t0 + i / 10) for i in range(50)]
    assert totals == list(range(1, 51))          # what the engine logs by: the first, then powers of ten
    errorruns.record_error(events, "tick", "engine", "something else", now=t0 + 5)
    assert errors_of(events) == [("engine did not answer", 1, 1), ("something else", 1, 1)]
    assert errorruns.engine_errors_since(events, 0) == 51 and unchanged()     # 49 repeats, counted in the run
    # a repeat_s after the run's first event, the next occurrence appends the count since
    assert errorruns.record_error(events, "tick", "engine", "engine did not answer", now=t0 + 61) == 51
    assert errors_of(events)[2:] == [("engine did not answer", 50, 51)]
    assert errorruns.engine_errors_since(events, 0) == 52 and unchanged()
    # an error that stopped: the tick settles its last repeats once they are due, not before
    for i in range(3):
        errorruns.record_error(events, "tick", "engine", "engine did not answer", now=t0 + 70 + i)
    assert errorruns.settle_error_runs(events, now=t0 + 100) == 0 and len(errors_of(events)) == 3
    assert errorruns.settle_error_runs(events, now=t0 + 122) == 1
    assert errors_of(events)[3:] == [("engine did not answer", 3, 54)]
    assert sum(count for _, count, _ in errors_of(events)) == errorruns.engine_errors_since(events, 0) == 55
    first = eventsdb.read_events(events, types=["error"])[0]
    assert eventsdb.read_events(events, types=["error"])[-1].data["first_id"] == first.id and unchanged()
    # a gap longer than coalesce_s ends the run: the next one is a first occurrence again
    assert errorruns.record_error(events, "tick", "engine", "engine did not answer", now=t0 + 122 + 3601) == 1
    assert errors_of(events)[4:] == [("engine did not answer", 1, 1)] and unchanged()
    # a run that ended with nothing left to append is forgotten
    errorruns.settle_error_runs(events, now=t0 + 10_000)
    assert errorruns.error_runs(events) == []


def test_the_history_refuses_to_change(events):
    ev, = eventsdb.append_events(events, [eventmsgs.now_event("noop", "test", None, {"n": 1})])
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        events.execute("UPDATE events SET data = '{}' WHERE id = ?", (ev.id,))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        events.execute("DELETE FROM events WHERE id = ?", (ev.id,))
    assert eventsdb.event_by_id(events, ev.id).data == {"n": 1}


def test_effect_claim_is_atomic_and_terminal_once(events):
    effect = effectqueue.new_effect(enginerpc.Effect(kind="noop", target="t"), "operator", 60)
    effectqueue.commit_effects(events, [effect], "test")
    assert effectqueue.claim_effect(events, effect.id, "1:1", "a") is not None
    assert effectqueue.claim_effect(events, effect.id, "2:2", "b") is None
    assert effectqueue.finish_effect(events, effect.id, "acked", "a")
    assert not effectqueue.finish_effect(events, effect.id, "failed", "a")
    types = [e.type for e in eventsdb.read_events(events)]
    assert types == ["effect", "effect-executing", "effect-acked"]


CLOSE_ELSEWHERE = """
import sys
from pathlib import Path
from pulse.store import eventsdb
eventsdb.open_events(Path(sys.argv[1])).close()
"""
CLAIM_ELSEWHERE = """
import sys
from pathlib import Path
from pulse.store import effectqueue, eventsdb
print(effectqueue.claim_effect(eventsdb.open_events(Path(sys.argv[1]), "FULL"), sys.argv[2], "2:2", "other") is not None)
"""


def test_a_second_connection_in_a_process_keeps_the_wal_of_the_first_from_being_deleted(tmp_path):
    """An executor opens a connection per thread. Opening one must not drop the fcntl locks its
    others hold on events.db: a connection closing in another process would then take itself for the
    last one and delete the -wal and -shm under them, and a claim they commit next goes to a deleted
    file that no other process reads: a non-idempotent effect claimed, and run, twice."""
    db = tmp_path / "events.db"
    first = eventsdb.open_events(db, "FULL")
    effect = effectqueue.new_effect(enginerpc.Effect(kind="exec", params={"argv": ["true"]}, idempotent=False),
                                    "operator", 60)
    effectqueue.commit_effects(first, [effect], "test")
    second = eventsdb.open_events(db, "FULL")
    subprocess.run([sys.executable, "-c", CLOSE_ELSEWHERE, str(db)], check=True, timeout=30)
    assert (tmp_path / "events.db-wal").exists()
    assert effectqueue.claim_effect(first, effect.id, "1:1", "executor") is not None
    other = subprocess.run([sys.executable, "-c", CLAIM_ELSEWHERE, str(db), effect.id], check=True, timeout=30,
                           capture_output=True, text=True)
    assert other.stdout.strip() == "False"      # it sees the claim: no second run
    second.close()
    first.close()


def test_vitals_latest_window_and_gc_without_blocking(tmp_path):
    conn = vitalsdb.open_vitals(tmp_path / "vitals.db")
    now = time.time()
    vitalsdb.append_vitals(conn, [enginerpc.Vital("system-resource", now - age, {"cpu_pct": age}) for age in range(100)])
    vitalsdb.append_vitals(conn, [enginerpc.Vital("process-alive:gw", now - 90000, {"alive": True})])
    latest = vitalsdb.latest_vitals(conn, ["system-resource", "process-alive:*"])
    assert latest["system-resource"].data == {"cpu_pct": 0} and "process-alive:gw" in latest
    assert len(vitalsdb.vitals_window(conn, "system-resource", now - 59.5)) == 60
    writer = vitalsdb.open_vitals(tmp_path / "vitals.db")     # a writer between gc batches never waits long
    assert vitalsdb.gc_vitals(conn, now - 50, batch=7) == 50
    vitalsdb.append_vitals(writer, [enginerpc.Vital("system-resource", now, {"cpu_pct": 1})])
    assert set(vitalsdb.latest_vitals(conn, ["*"])) == {"system-resource"}


def test_objects_are_content_addressed_and_gc_keeps_referenced(tmp_path, events):
    root = tmp_path / "objects"
    snapshot = objects.put(root, b"engine tree snapshot")
    output = objects.put(root, b"some output")
    assert objects.put(root, b"some output") == output                 # deduplicated
    assert objects.get(root, snapshot) == b"engine tree snapshot"
    assert len(list(root.glob("??/*"))) == 2
    eventsdb.append_events(events, [eventmsgs.now_event("promote", "pulsectl", "engine", snapshot=snapshot)])
    old = time.time() - 10 * 86400
    for path in root.glob("??/*"):
        os.utime(path, (old, old))
    removed = objects.gc(root, eventsdb.referenced_objects(events), older_than_s=86400)
    assert removed == [output.removeprefix("sha256:")]
    assert objects.get(root, snapshot) == b"engine tree snapshot"      # promote snapshots are kept
    with pytest.raises(FileNotFoundError):
        objects.get(root, output)


def test_a_large_store_cut_short_is_found_without_reading_every_page(tmp_path, monkeypatch):
    """Past FULL_CHECK_MAX_BYTES a start reads every table's first and last rows, not every page
    (quick_check took 8 s on 1 GiB); a file cut short still shows, as does a damaged header."""
    monkeypatch.setattr(connection, "FULL_CHECK_MAX_BYTES", 0)
    path = tmp_path / "events.db"
    conn = eventsdb.open_events(path)
    for _ in range(20):
        eventsdb.append_events(conn, [eventmsgs.now_event("note", "test", None, {"pad": "x" * 500}) for _ in range(200)])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert connection.store_problem(path) is None
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "is damaged" in connection.store_problem(path)
