"""How fast one agent may call the gate: every call and session open of one agent and task takes
a token from its bucket ([gate] calls_per_min, call_burst); past it a call is answered RATE_LIMITED
with retry_after_s and records nothing. That bounds what an agent adds to events.db per minute."""

from __future__ import annotations

import json
import socket
import sqlite3
import time

from pulse.gate.server import Bucket, CallRates, take
from support import init_home, wait_for

PER_MIN, BURST = 120, 10
# What one admitted `status` read adds to events.db (its begin and end facts, measured about 460
# bytes), with room to spare; the session's open fact is smaller.
READ_BYTES = 700
DRIVE_S = 3.0


def test_a_bucket_lets_a_burst_through_then_the_rate():
    bucket = Bucket(2.0, 0.0)
    assert take(bucket, 0.0, 60, 2) == 0.0 and take(bucket, 0.0, 60, 2) == 0.0
    assert take(bucket, 0.0, 60, 2) == 1.0             # 60 a minute: the next token in a second
    assert take(bucket, 0.5, 60, 2) == 0.5
    assert take(bucket, 1.0, 60, 2) == 0.0
    assert take(bucket, 100.0, 60, 2) == 0.0 and take(bucket, 100.0, 60, 2) == 0.0   # never more than the burst
    assert take(bucket, 100.0, 60, 2) > 0


def test_rates_are_per_agent_and_task():
    now = [0.0]
    rates = CallRates(60, 1, clock=lambda: now[0])
    assert rates.retry_after("alice", "task-1") == 0.0
    assert rates.retry_after("alice", "task-1") > 0
    assert rates.retry_after("alice", "task-2") == 0.0 and rates.retry_after("bob", "task-1") == 0.0
    now[0] = 1.0
    assert rates.retry_after("alice", "task-1") == 0.0


def logical_bytes(home) -> int:
    conn = sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COALESCE(SUM(LENGTH(type) + LENGTH(source) + COALESCE(LENGTH(target), 0)"
                            " + LENGTH(data) + 24), 0) FROM events").fetchone()[0]
    finally:
        conn.close()


class Raw:
    """A session on the gate's socket, as the operator's shell, one call at a time."""

    def __init__(self, path: str, agent: str):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.lines = self.sock.makefile("rb")
        self.sock.sendall(json.dumps({"op": "hello", "token": None, "agent": agent}).encode() + b"\n")
        self.welcome = json.loads(self.lines.readline())
        self.n = 0

    def call(self, name: str, args: dict) -> dict:
        self.n += 1
        self.sock.sendall(json.dumps({"id": self.n, "op": "call", "name": name, "args": args}).encode() + b"\n")
        return json.loads(self.lines.readline())["envelope"]

    def close(self) -> None:
        self.sock.close()


def test_an_agent_reading_as_fast_as_it_can_is_held_to_its_rate(pulsed):
    """A session reads as fast as the gate answers for DRIVE_S: past the burst it is answered
    RATE_LIMITED (retry_after_s), events.db grows by no more than the admitted calls' facts, a
    second session of the same agent is refused at its hello while another agent's opens, and once
    the wait has passed the agent's calls go through again."""
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(f"[gate]\ncalls_per_min = {PER_MIN}\ncall_burst = {BURST}\n")
    pulsed.start()
    path = str(pulsed.paths.gate_socket)
    before = logical_bytes(pulsed.home)
    session = Raw(path, "reader")
    assert session.welcome["op"] == "welcome", session.welcome
    began = time.monotonic()
    answers = []
    while time.monotonic() - began < DRIVE_S:
        answers.append(session.call("status", {}))
    took = time.monotonic() - began
    grown = logical_bytes(pulsed.home) - before
    admitted = [a for a in answers if a["ok"]]
    limited = [a["error"] for a in answers if not a["ok"] and a["error"]["code"] == "RATE_LIMITED"]
    allowed = BURST + PER_MIN * (took + 1) / 60          # the open takes a token too; +1 s of slack for the clock
    print(f"\n{len(answers)} reads in {took:.1f} s: {len(admitted)} admitted, {len(limited)} RATE_LIMITED; "
          f"events.db grew {grown} bytes ({grown / max(1, len(admitted)):.0f} per admitted read)")
    assert len(admitted) + len(limited) == len(answers), [a for a in answers if not a["ok"]][:3]
    assert len(limited) > len(admitted), "the session was never held to its rate: the test drove it too slowly"
    assert len(admitted) <= allowed
    assert grown <= allowed * READ_BYTES
    assert all(0 < e["details"]["retry_after_s"] <= 60 / PER_MIN + 0.01 for e in limited), limited[:3]
    assert "calls_per_min" in limited[0]["message"]

    again = Raw(path, "reader")             # the same agent's next session: its bucket is the same
    other = Raw(path, "someone-else")
    assert again.welcome["op"] == "refused" and again.welcome["code"] == "RATE_LIMITED", again.welcome
    assert again.welcome["retry"] is True
    assert other.welcome["op"] == "welcome", other.welcome
    passed = wait_for(lambda: session.call("status", {})["ok"] or None, 10, what="a call once the wait has passed")
    assert passed
    for s in (session, again, other):
        s.close()
