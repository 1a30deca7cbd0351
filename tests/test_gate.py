"""The safety gate, tested directly (it is pure): the transition table, the closed gaps,
fail-closed classification, recoveries and their expiry, resets, and Pulse's own tool table."""

from __future__ import annotations

import json

import pytest

from pulse.gate import catalogue, policy
from pulse.gate.policy import FSM_BLOCKED, UNVERIFIED_WRITE, CallKind, Descriptor, State

# A small registry with one tool of each kind, on resources of class "x".
TEST_TOOLS = {d.name: d for d in (
    Descriptor("lookup", CallKind.RESOLVE, frozenset({"name"}), covers=("x:{name}",)),
    Descriptor("read_all", CallKind.READ, covers=("x:*",)),
    Descriptor("read_one", CallKind.READ, frozenset({"name"}), covers=("x:{name}",)),
    Descriptor("poke", CallKind.WRITE, frozenset({"name"}), touches=("x:{name}",), verified_by="read_one of it"),
    Descriptor("poke_two", CallKind.WRITE, frozenset({"a", "b"}), touches=("x:{a}", "x:{b}"), verified_by="reads"),
    Descriptor("ask", CallKind.USER_INPUT, frozenset({"question"})),
    Descriptor("docker", None, frozenset({"action", "name"}), discriminator="action",
               cases={"list": CallKind.READ, "inspect": CallKind.READ, "find": CallKind.RESOLVE}, covers=("x:{name}",),
               touches=("x:{name}",), verified_by="docker inspect of it"),
)}


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


def session(clock=None, tools=TEST_TOOLS) -> policy.GateSession:
    return policy.GateSession("s1", tools, clock=clock or Clock())


FOUND = {"found": "something"}   # what a read returns when it is about something (evidence)


def run(s: policy.GateSession, tool: str, args=None, ok: bool = True, result=FOUND, acted=None):
    """Begin and end one call; the Blocked, or the gate-call Record."""
    admitted = s.begin(tool, args if args is not None else {})
    if isinstance(admitted, policy.Blocked):
        return admitted
    return s.end(admitted, ok, result, acted)


def at(state: State) -> policy.GateSession:
    """A session brought to `state` by real calls (VERIFYING: after poke x:a)."""
    s = session()
    if state != State.RESOLVING:
        run(s, "lookup", {"name": "a"})
    if state == State.VERIFYING:
        run(s, "poke", {"name": "a"})
    assert s.state == state
    return s


# -- the transition table ---------------------------------------------------------------------------------

KIND_CALLS = {CallKind.RESOLVE: ("lookup", {"name": "a"}), CallKind.READ: ("read_one", {"name": "a"}),
              CallKind.WRITE: ("poke", {"name": "a"}), CallKind.USER_INPUT: ("ask", {"question": "?"})}

# (state, kind, outcome) → the state after, or "blocked". Reads here cover the written resource
# and start after the write returned (the gaps are tested separately below).
TABLE = {
    (State.RESOLVING, CallKind.RESOLVE, "ok"): State.READING,
    (State.RESOLVING, CallKind.READ, "ok"): State.READING,
    (State.RESOLVING, CallKind.USER_INPUT, "ok"): State.RESOLVING,
    (State.RESOLVING, CallKind.WRITE, "ok"): "blocked",
    (State.READING, CallKind.RESOLVE, "ok"): State.READING,
    (State.READING, CallKind.READ, "ok"): State.READING,
    (State.READING, CallKind.USER_INPUT, "ok"): State.READING,
    (State.READING, CallKind.WRITE, "ok"): State.VERIFYING,
    (State.VERIFYING, CallKind.RESOLVE, "ok"): State.READING,
    (State.VERIFYING, CallKind.READ, "ok"): State.READING,
    (State.VERIFYING, CallKind.USER_INPUT, "ok"): State.VERIFYING,
    (State.VERIFYING, CallKind.WRITE, "ok"): "blocked",
}
for (_state, _kind, _), _after in list(TABLE.items()):   # a failed call never moves the state
    TABLE[(_state, _kind, "error")] = "blocked" if _after == "blocked" else _state


@pytest.mark.parametrize("state, kind, outcome", list(TABLE))
def test_transition_table(state, kind, outcome):
    s = at(state)
    tool, args = KIND_CALLS[kind]
    result = run(s, tool, args, ok=outcome == "ok", acted=False if outcome == "error" else None)
    expected = TABLE[(state, kind, outcome)]
    if expected == "blocked":
        assert isinstance(result, policy.Blocked) and result.code == FSM_BLOCKED
        assert s.state == state
    else:
        assert isinstance(result, policy.Record) and result.type == "gate-call"
        assert s.state == expected and result.data["state"] == str(expected)
        assert result.data["state_before"] == str(state)


def test_a_write_that_acted_and_failed_must_still_be_verified():
    s = at(State.READING)
    run(s, "poke", {"name": "a"}, ok=False, acted=True)     # the effect ran and failed: the host may differ
    assert s.state == State.VERIFYING
    t = at(State.READING)
    run(t, "poke", {"name": "a"}, ok=False, acted=False)    # refused or expired before it ran
    assert t.state == State.READING


def test_a_write_whose_result_verifies_itself_needs_no_read():
    s = at(State.READING)
    record = run(s, "poke", {"name": "a"}, result={"verification": {"ok": True, "by": "probe"}})
    assert s.state == State.READING and record.data["self_verified"] is True
    for fake in ({"verification": {"ok": "yes"}}, {"verification": True}, {"ok": True}, "verified"):
        t = at(State.READING)
        run(t, "poke", {"name": "a"}, result=fake)
        assert t.state == State.VERIFYING, fake
    u = at(State.READING)
    run(u, "poke", {"name": "a"}, ok=False, acted=True, result={"verification": {"ok": True}})
    assert u.state == State.VERIFYING                        # a failed call's result proves nothing


# -- the closed gaps ------------------------------------------------------------------------------------------

def test_only_a_read_of_the_same_resource_verifies():
    s = at(State.VERIFYING)                                  # poke x:a
    run(s, "read_one", {"name": "b"})
    run(s, "lookup", {"name": "b"})
    assert s.state == State.VERIFYING
    assert isinstance(run(s, "poke", {"name": "b"}), policy.Blocked)
    record = run(s, "read_one", {"name": "a"})
    assert s.state == State.READING and record.data["verified"] == ["x:a"]


def test_a_class_wide_read_covers_every_resource_of_the_class():
    s = at(State.VERIFYING)
    run(s, "read_all")
    assert s.state == State.READING


def test_a_write_of_two_resources_needs_both_looked_at_and_both_verified():
    s = at(State.READING)
    run(s, "lookup", {"name": "p"})
    assert isinstance(run(s, "poke_two", {"a": "p", "b": "q"}), policy.Blocked)     # q never looked at
    run(s, "lookup", {"name": "q"})
    run(s, "poke_two", {"a": "p", "b": "q"})
    run(s, "read_one", {"name": "p"})
    assert s.state == State.VERIFYING and s.summary()["unverified"] == ["x:q"]
    run(s, "lookup", {"name": "q"})
    assert s.state == State.READING


def test_a_read_that_started_before_the_write_returned_does_not_verify():
    s = at(State.READING)
    write = s.begin("poke", {"name": "a"})
    early = s.begin("read_one", {"name": "a"})               # same batch: runs alongside the write
    s.end(write, True, FOUND)
    assert s.state == State.VERIFYING
    record = s.end(early, True, FOUND)                        # finishes after, but saw the world before
    assert s.state == State.VERIFYING and "verified" not in record.data
    late = s.begin("read_one", {"name": "a"})
    s.end(late, True, FOUND)
    assert s.state == State.READING


def test_a_read_started_before_the_write_but_listed_after_it_is_not_verification():
    """The other project's gate ordered verification by call order; here only time order counts."""
    s = at(State.READING)
    read = s.begin("read_one", {"name": "a"})
    write = s.begin("poke", {"name": "a"})
    s.end(write, True, FOUND)
    s.end(read, True, FOUND)
    assert s.state == State.VERIFYING


def test_a_batch_holds_at_most_one_write():
    s = at(State.READING)
    first = s.begin("poke", {"name": "a"})
    second = s.begin("poke", {"name": "b"})
    assert isinstance(first, policy.Admitted)
    assert isinstance(second, policy.Blocked) and "in flight" in second.error["error"]["reason"]
    read_b = s.begin("read_one", {"name": "b"})
    assert isinstance(read_b, policy.Admitted)                                 # reads still go alongside
    s.end(read_b, True, FOUND)
    s.end(first, True, FOUND)
    assert isinstance(s.begin("poke", {"name": "b"}), policy.Blocked)         # now: unverified
    run(s, "read_one", {"name": "a"})
    assert isinstance(s.begin("poke", {"name": "b"}), policy.Admitted)


def test_finish_is_refused_while_a_write_is_unverified_or_in_flight():
    assert isinstance(session().finish(), policy.Record)                      # nothing written: fine
    s = at(State.VERIFYING)
    refused = s.finish({"summary": "done"})
    assert isinstance(refused, policy.Blocked) and refused.code == UNVERIFIED_WRITE
    assert refused.error["error"]["tool"] == "finish" and refused.record.type == "gate-blocked"
    run(s, "read_one", {"name": "a"})
    run(s, "read_one", {"name": "b"})
    write = s.begin("poke", {"name": "b"})
    in_flight = s.finish({"summary": "done"})
    assert isinstance(in_flight, policy.Blocked) and "in flight" in in_flight.error["error"]["reason"]
    s.end(write, True, FOUND)
    run(s, "read_one", {"name": "b"})
    done = s.finish({"summary": "done"})
    assert isinstance(done, policy.Record) and done.data["state"] == "READING"
    assert done.data["recovered"]["code"] == UNVERIFIED_WRITE                # the same finish, now through


def test_user_input_never_advances_or_verifies():
    s = session()
    for _ in range(3):
        run(s, "ask", {"question": "which one?"})
    assert s.state == State.RESOLVING and isinstance(s.begin("poke", {"name": "a"}), policy.Blocked)
    v = at(State.VERIFYING)
    run(v, "ask", {"question": "did it work?"})
    assert v.state == State.VERIFYING


def test_reads_are_never_blocked_and_blocks_never_wear_the_gate_down():
    s = at(State.VERIFYING)
    for _ in range(50):
        assert isinstance(s.begin("poke", {"name": "b"}), policy.Blocked)
        assert isinstance(s.finish(), policy.Blocked)
    assert s.blocked == 100 and s.state == State.VERIFYING
    assert s.recoveries[("poke", policy.args_hash({"name": "b"}))].attempts == 50
    for state in State:
        t = at(state)
        for tool, args in (("lookup", {"name": "z"}), ("read_all", {}), ("ask", {"question": "?"})):
            assert isinstance(t.begin(tool, args), policy.Admitted)
    for _ in range(1000):   # and reads of other resources never verify it either
        run(s, "read_one", {"name": "b"})
    assert s.state == State.VERIFYING and isinstance(s.begin("poke", {"name": "b"}), policy.Blocked)


def test_a_write_finishing_after_a_reset_still_leaves_a_debt():
    s = at(State.READING)
    write = s.begin("poke", {"name": "a"})
    s.reset()
    s.end(write, True, FOUND)
    assert s.state == State.VERIFYING


# -- fail-closed classification ------------------------------------------------------------------------------

@pytest.mark.parametrize("tool, args, why", [
    ("rm_rf", {}, "unknown tool"),
    ("read_all", {"force": True}, "unrecognised arguments ['force']"),
    ("lookup", {"name": "a", "action": "delete"}, "unrecognised arguments ['action']"),
    ("read_one", ["a"], "arguments are not an object"),
    ("docker", {"name": "a"}, "unrecognised action None"),
    ("docker", {"action": "restart", "name": "a"}, "unrecognised action 'restart'"),
    ("docker", {"action": 3, "name": "a"}, "unrecognised action 3"),
    ("docker", {"action": "", "name": "a"}, "unrecognised action ''"),
])
def test_anything_not_plainly_safe_is_a_write(tool, args, why):
    call = policy.classify(TEST_TOOLS, tool, args)
    assert call.kind == CallKind.WRITE and call.why == why and call.touches
    s = at(State.RESOLVING)
    blocked = s.begin(tool, args)
    assert isinstance(blocked, policy.Blocked) and blocked.record.data["classified"] == why


def test_discriminator_values_are_trimmed_and_case_insensitive():
    assert policy.classify(TEST_TOOLS, "docker", {"action": " Inspect ", "name": "a"}).kind == CallKind.READ
    assert policy.classify(TEST_TOOLS, "docker", {"action": "FIND", "name": "a"}).kind == CallKind.RESOLVE
    assert policy.classify(TEST_TOOLS, "ask", {"question": "?"}).kind == CallKind.USER_INPUT


def test_an_unknown_tool_is_refused_in_every_state():
    """It touches tool:<name>, which no read can look at: nothing ever validates it."""
    for state in State:
        s = at(state)
        run(s, "read_all")
        blocked = run(s, "rm_rf", {})
        assert isinstance(blocked, policy.Blocked) and blocked.code == FSM_BLOCKED


def test_argument_values_are_literal_never_wildcards():
    s = at(State.VERIFYING)                                    # poke x:a
    run(s, "read_one", {"name": "*"})
    run(s, "lookup", {"name": "a*"})
    assert s.state == State.VERIFYING
    assert policy.touched(("x:{name}",), {}) == frozenset({"x:*"})
    # a read of no particular one looks at the whole class; what it verifies depends on what it found
    assert policy.covered(("x:{name}",), {}) == frozenset({policy.Pattern("x:", prefix=True)})


@pytest.mark.parametrize("bad, message", [
    (Descriptor("t", CallKind.READ, discriminator="a", params=frozenset({"a"}), cases={"x": CallKind.READ}), "not both"),
    (Descriptor("t", None), "not both or neither"),
    (Descriptor("t", None, frozenset({"a"}), discriminator="action", cases={"x": CallKind.READ}), "must be a parameter"),
    (Descriptor("t", None, frozenset({"a"}), discriminator="a", cases={"List": CallKind.READ}, touches=("x",),
                verified_by="r"), "lower-case"),
    (Descriptor("t", CallKind.WRITE, verified_by="r"), "which resources it touches"),
    (Descriptor("t", CallKind.WRITE, touches=("x",)), "what verifies it"),
    (Descriptor("t", None, frozenset({"a"}), discriminator="a", cases={"x": CallKind.READ}, verified_by="r"),
     "which resources"),
    (Descriptor("t", CallKind.READ, covers=("x:{nope}",)), "unknown parameters"),
])
def test_ambiguous_registries_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        policy.check_registry({"t": bad})
    with pytest.raises(ValueError, match="another name"):
        policy.check_registry({"u": TEST_TOOLS["lookup"]})


# -- the block envelope and the records ------------------------------------------------------------------------

def test_blocks_return_the_stable_envelope_with_the_code_in_the_text():
    blocked = at(State.RESOLVING).begin("poke", {"name": "a"})
    assert blocked.error == {"ok": False, "error": {
        "code": "FSM_BLOCKED", "state": "RESOLVING", "tool": "poke", "kind": "write",
        "reason": blocked.error["error"]["reason"], "recoverable": True}}
    text = blocked.text()
    assert text.startswith("FSM_BLOCKED: ") and json.loads(text.split("\n", 1)[1]) == blocked.error
    as_call, record = blocked.records
    assert record.type == "gate-blocked" and record.data["code"] == FSM_BLOCKED and record.data["session"] == "s1"
    assert as_call.type == "gate-call" and as_call.data | {"args_hash": None} == {
        "phase": "blocked", "session": "s1", "tool": "poke", "kind": "write", "args_hash": None, "ok": False, "blocked": FSM_BLOCKED,
        "state_before": "RESOLVING", "state": "RESOLVING"}


def test_block_reasons_describe_the_constraint_and_never_name_a_tool_to_call():
    reasons = [at(State.RESOLVING).begin("poke", {"name": "a"}), at(State.VERIFYING).begin("poke", {"name": "b"}),
               at(State.VERIFYING).finish()]
    s = at(State.READING)
    s.begin("poke", {"name": "a"})
    reasons.append(s.begin("poke", {"name": "b"}))
    for blocked in reasons:
        reason = blocked.error["error"]["reason"].lower()
        assert not any(f"{name} " in reason or reason.endswith(name) for name in ("lookup", "read_one", "read_all"))
        assert "call " not in reason and "next tool" not in reason
        assert not any(name in reason for name in catalogue.TOOLS if catalogue.TOOLS[name].kind != CallKind.WRITE)


def test_every_call_is_recorded_with_what_it_did():
    s = session()
    resolve = run(s, "lookup", {"name": "a"})
    write = run(s, "poke", {"name": "a"})
    read = run(s, "read_one", {"name": "a"})
    assert [r.type for r in (resolve, write, read)] == ["gate-call"] * 3
    assert resolve.data["covers"] == ["x:a"] and resolve.data["state"] == "READING"
    assert write.data["touches"] == ["x:a"] and write.data["acted"] is True and write.data["state"] == "VERIFYING"
    assert read.data["verified"] == ["x:a"] and read.data["args_hash"] == policy.args_hash({"name": "a"})
    assert s.reset().data == {"phase": "reset", "agent": "s1", "task": "", "tool": "reset", "kind": "reset",
                              "keep_progress": False, "by": "operator", "state_before": "READING",
                              "state": "RESOLVING"}


# -- recoveries, expiry and resets ------------------------------------------------------------------------------

def test_recoveries_are_per_tool_and_argument_hash(clock):
    s = session(clock)
    s.begin("poke", {"name": "a"})                              # blocked: RESOLVING
    clock.t += 5
    s.begin("poke", {"name": "a"})
    run(s, "lookup", {"name": "a"})
    run(s, "lookup", {"name": "b"})
    other = run(s, "poke", {"name": "b"})                        # same tool, other arguments
    assert "recovered" not in other.data
    run(s, "read_one", {"name": "b"})
    clock.t += 1
    same = run(s, "poke", {"name": "a"})                         # a: looked at, changed by nobody since
    assert same.data["recovered"] == {"code": FSM_BLOCKED, "attempts": 2, "after_s": 6.0}
    assert s.recoveries == {}


def test_recoveries_expire_after_ten_minutes(clock):
    s = session(clock)
    s.begin("poke", {"name": "a"})
    clock.t += policy.RECOVERY_TTL_S - 1
    assert s.summary()["recoveries"] == 1
    clock.t += 1
    assert s.summary()["recoveries"] == 0
    s.begin("poke", {"name": "a"})                              # a fresh entry, attempts from 1
    assert s.recoveries[("poke", policy.args_hash({"name": "a"}))].attempts == 1
    clock.t += policy.RECOVERY_TTL_S
    run(s, "lookup", {"name": "a"})
    assert "recovered" not in run(s, "poke", {"name": "a"}).data


def test_reset_returns_to_resolving_and_clears_recoveries():
    s = at(State.VERIFYING)
    s.begin("poke", {"name": "b"})
    s.reset()
    assert s.state == State.RESOLVING and s.recoveries == {} and s.summary()["unverified"] == []
    assert isinstance(s.begin("poke", {"name": "b"}), policy.Blocked)        # the target is gone too


def test_reset_keep_progress_drops_verification_but_keeps_what_was_looked_at():
    s = at(State.READING)
    run(s, "lookup", {"name": "b"})
    run(s, "poke", {"name": "a"})
    s.begin("poke", {"name": "b"})                              # blocked: a is unverified
    record = s.reset(keep_progress=True)
    assert record.data["state_before"] == "VERIFYING" and s.state == State.READING
    assert len(s.recoveries) == 1 and isinstance(s.begin("poke", {"name": "b"}), policy.Admitted)
    fresh = session()
    fresh.reset(keep_progress=True)
    assert fresh.state == State.RESOLVING


# -- Pulse's own tools ----------------------------------------------------------------------------------------

def test_pulse_tools_registry_is_well_formed_and_complete():
    policy.check_registry(catalogue.TOOLS)
    kinds = {name: d.kind for name, d in catalogue.TOOLS.items()}
    assert {n for n, k in kinds.items() if k == CallKind.RESOLVE} == {"find_process", "list_workers", "list_tasks"}
    assert {n for n, k in kinds.items() if k == CallKind.READ} == {"status", "vitals", "events", "log_tail", "effect"}
    assert {n for n, k in kinds.items() if k == CallKind.WRITE} == {
        "restart_process", "restart_worker", "signal_process", "emit_effect", "promote", "rollback", "create_task"}
    assert {n for n, k in kinds.items() if k == CallKind.USER_INPUT} == {"ask_operator"}


def pulse_result(tool: str, args: dict):
    """What Pulse's read returns when it found what it was asked about."""
    if tool == "events":
        return {"events": [{"id": 10**9, "type": "effect-acked", "target": args.get("target", "x")}]}
    if tool == "find_process":
        return {"name": args["name"], "alive": True, "processes": []}
    if tool == "vitals":
        return {"vitals": {args.get("key", "cpu"): {"ts": 1, "data": {}}}}
    return FOUND


@pytest.mark.parametrize("write, args, not_enough, enough", [
    ("restart_process", {"name": "gw"}, [("status", {}), ("find_process", {"name": "db"}), ("vitals", {})],
     ("find_process", {"name": "gw"})),
    ("signal_process", {"name": "gw", "signal": "SIGHUP"}, [("list_workers", {})], ("find_process", {"name": "gw"})),
    ("restart_worker", {"name": "tick"}, [("find_process", {"name": "tick"}), ("log_tail", {"worker": "tick"})],
     ("status", {})),
    ("promote", {}, [("events", {"type": "promote"}), ("vitals", {"key": "engine:*"})], ("list_workers", {})),
    ("rollback", {}, [("log_tail", {"worker": "engine"})], ("status", {})),
    ("emit_effect", {"kind": "restart-process", "target": "gw"}, [("status", {})], ("find_process", {"name": "gw"})),
    ("emit_effect", {"kind": "engine-rollback", "target": "engine"}, [("find_process", {"name": "engine"})],
     ("status", {})),
    ("emit_effect", {"kind": "restart-worker", "target": "tick"}, [("events", {"target": "tick"})], ("status", {})),
    ("emit_effect", {"kind": "exec", "target": "backup"}, [("events", {}), ("status", {})],
     ("events", {"target": "backup"})),
    ("create_task", {"project": "p", "title": "t", "prompt": "x"}, [("status", {})], ("list_tasks", {})),
])
def test_what_verifies_each_pulse_write(write, args, not_enough, enough):
    s = policy.GateSession("p", catalogue.TOOLS, clock=Clock())
    assert isinstance(run(s, write, args), policy.Blocked)            # its resource not looked at yet
    run(s, enough[0], enough[1], result=pulse_result(*enough))
    assert isinstance(run(s, write, args), policy.Record)
    for tool, targs in not_enough:
        run(s, tool, targs, result=pulse_result(tool, targs))
        assert s.state == State.VERIFYING, f"{tool} {targs} must not verify {write}"
    run(s, enough[0], enough[1], result=pulse_result(*enough))
    assert s.state == State.READING


def test_pulse_tools_fail_closed_on_extra_arguments():
    assert policy.classify(catalogue.TOOLS, "status", {"restart": "tick"}).kind == CallKind.WRITE
    assert policy.classify(catalogue.TOOLS, "find_process", {"name": "gw", "kill": True}).kind == CallKind.WRITE
    assert policy.classify(catalogue.TOOLS, "pulse_exec", {"argv": ["rm"]}).kind == CallKind.WRITE



def test_an_empty_read_never_verifies():
    s = at(State.VERIFYING)
    for empty in (None, [], {}, {"events": []}):
        run(s, "lookup", {"name": "a"}, result=empty)
        assert s.state == State.VERIFYING, empty
    run(s, "lookup", {"name": "a"})
    assert s.state == State.READING


def test_a_literal_star_is_no_wildcard_for_a_write_that_named_no_target():
    assert not policy.Pattern("target:*").covers("target:*")       # `events {"target": "*"}` is about "*"
    assert policy.Pattern("target:", prefix=True).covers("target:*")
    assert policy.Pattern("target:x").covers("target:x") and not policy.Pattern("target:x").covers("target:*")


def test_finish_is_terminal():
    s = at(State.READING)
    assert isinstance(s.finish({"summary": "done"}), policy.Record)
    for tool, args in (("lookup", {"name": "a"}), ("poke", {"name": "a"})):
        blocked = run(s, tool, args)
        assert isinstance(blocked, policy.Blocked) and blocked.code == policy.SESSION_FINISHED
    assert s.finish({"summary": "again"}).code == policy.SESSION_FINISHED


# -- the ledger: host-wide, across sessions -------------------------------------------------------------------

def sessions_on_one_ledger(*who: tuple[str, str, str]) -> list[policy.GateSession]:
    """Sessions (id, agent, task) deciding on one store, as every `pulsectl mcp` on a host does."""
    store = policy.MemoryStore(Clock())
    return [policy.GateSession(sid, TEST_TOOLS, clock=Clock(), agent=agent, task=task, store=store)
            for sid, agent, task in who]


def test_one_change_at_a_time_per_resource_host_wide():
    a, b = sessions_on_one_ledger(("s1", "alice", ""), ("s2", "bob", ""))
    run(a, "lookup", {"name": "r"})
    run(b, "lookup", {"name": "r"})
    write = a.begin("poke", {"name": "r"})
    refused = b.begin("poke", {"name": "r"})
    assert isinstance(refused, policy.Blocked) and "being changed by alice" in refused.error["error"]["reason"]
    assert isinstance(b.begin("poke", {"name": "other"}), policy.Blocked)    # other: never looked at
    a.end(write, True, FOUND)
    again = b.begin("poke", {"name": "r"})                                  # bob looked before alice's change
    assert isinstance(again, policy.Blocked) and "was changed by alice" in again.error["error"]["reason"]
    run(b, "read_one", {"name": "r"})
    assert isinstance(b.begin("poke", {"name": "r"}), policy.Admitted)


def test_a_new_session_of_the_same_agent_and_task_inherits_its_unverified_write():
    first, second, other_task = sessions_on_one_ledger(("s1", "alice", "task-1"), ("s2", "alice", "task-1"),
                                                       ("s3", "alice", "task-2"))
    run(first, "lookup", {"name": "r"})
    run(first, "poke", {"name": "r"})
    assert second.state == State.VERIFYING and isinstance(second.finish({"summary": "x"}), policy.Blocked)
    assert other_task.state == State.RESOLVING
    run(second, "read_one", {"name": "r"})
    assert first.state == second.state == State.READING


def test_an_event_older_than_the_write_verifies_nothing():
    s = policy.GateSession("p", catalogue.TOOLS, clock=Clock())
    run(s, "events", {"target": "backup"}, result={"events": [{"id": 1, "target": "backup"}]})
    run(s, "emit_effect", {"kind": "exec", "target": "backup"})
    run(s, "events", {"target": "backup"}, result={"events": [{"id": 1, "target": "backup"}]})
    assert s.state == State.VERIFYING
    run(s, "events", {"target": "backup"}, result={"events": [{"id": 10**9, "target": "other"}]})
    assert s.state == State.VERIFYING
    run(s, "events", {"target": "backup"}, result={"events": [{"id": 10**9, "target": "backup"}]})
    assert s.state == State.READING


def test_a_cancelled_write_is_settled_by_its_effect():
    s = at(State.READING)
    write = s.begin("poke", {"name": "a"})
    s.store.transact(lambda: policy.Record("gate-call", {"phase": "acting", "session": "s1", "call": write.ticket,
                                                       "effect": "e1"}))
    s.end(write, False, None, cancelled=True)
    assert s.summary()["in_flight"] == 1 and isinstance(s.finish({"summary": "x"}), policy.Blocked)
    s.store.transact(lambda: policy.Record("gate-call", {"phase": "settle", "session": "s1", "call": write.ticket,
                                                       "acted": True}))
    assert s.summary()["in_flight"] == 0 and s.state == State.VERIFYING
    unlinked = at(State.READING)
    write = unlinked.begin("poke", {"name": "a"})
    unlinked.end(write, False, None, cancelled=True)                       # cancelled before any effect
    assert unlinked.state == State.READING and unlinked.summary()["in_flight"] == 0


def test_the_durable_store_commits_each_fact_with_its_decision_and_refolds_after_a_failure(tmp_path):
    """Facts in a real events.db: a decision that raises leaves nothing behind, and the next one
    is taken on the ledger folded again from the file."""
    from pulse.gate.durable import DurableStore
    from pulse.store import eventsdb
    conn = eventsdb.open_events(tmp_path / "events.db")
    store = DurableStore(conn, alive=lambda pid, started: True)
    s = policy.GateSession("s1", TEST_TOOLS, clock=Clock(), agent="alice", store=store)
    s.open()
    run(s, "lookup", {"name": "a"})
    before = eventsdb.last_event_id(conn)

    def failing():
        store.ledger.apply(before + 1, 0.0, {"phase": "reset", "agent": "alice", "task": None})   # folded, then undone
        raise RuntimeError("the decision failed")
    with pytest.raises(RuntimeError):
        store.transact(failing)
    assert eventsdb.last_event_id(conn) == before and s.state == State.READING      # nothing written, nothing forgotten
    run(s, "poke", {"name": "a"})
    other = policy.GateSession("s2", TEST_TOOLS, clock=Clock(), agent="alice", store=DurableStore(conn))
    other.open()                                                               # its first decision folds them
    assert other.state == State.VERIFYING                                      # the same agent: the same debt
    conn.close()


def test_blocked_calls_past_the_budget_are_counted_not_recorded():
    """A model retrying a refused write cannot fill events.db: per agent and task, at most
    block_budget blocks a minute are recorded (two facts each); the rest are counted, and the count
    rides on the session's next fact; a minute later, blocks are recorded again."""
    clock = Clock()
    s = policy.GateSession("s1", catalogue.TOOLS, clock=clock, agent="a", task="t", block_budget=5)
    recorded = []
    for _ in range(50):
        blocked = s.begin("restart_process", {"name": "gw"})
        assert blocked.code == FSM_BLOCKED            # every call is still refused, recorded or not
        recorded += blocked.records
    assert len([r for r in recorded if r.type == "gate-blocked"]) == 5 and len(recorded) == 10
    other = policy.GateSession("s2", catalogue.TOOLS, clock=clock, agent="a", task="t", store=s.store, block_budget=5)
    assert other.begin("restart_process", {"name": "gw"}).records == ()    # the budget is the agent's, host-wide
    admitted = s.begin("find_process", {"name": "gw"})
    assert admitted.record.data["blocks_not_recorded"] == 45              # told once, on the next fact
    s.end(admitted, True, {"name": "gw", "alive": True})
    clock.t += policy.BLOCK_WINDOW_S + 1
    assert len(other.begin("poke", {}).records) == 2 and other.uncounted_blocks == 0
    assert other.begin("poke", {}).records[1].data.get("blocks_not_recorded") is None


# -- a write whose effect was interrupted: it may have acted ----------------------------------------------

def process(pid: int | None) -> dict:
    """find_process's result: one process with this pid, or none running."""
    return {"name": "gw", "alive": pid is not None, "processes": [{"pid": pid, "started": 100.0 + pid}] if pid else []}


def interrupted_restart(*who: tuple[str, str, str]) -> list[policy.GateSession]:
    """Sessions on one ledger; the first found gw as pid 1 and restarted it, and the executor died
    while the restart's effect ran (settled: acted, outcome unknown)."""
    store = policy.MemoryStore(Clock())
    sessions = [policy.GateSession(sid, catalogue.TOOLS, clock=Clock(), agent=agent, task=task, store=store)
                for sid, agent, task in who]
    first = sessions[0]
    run(first, "find_process", {"name": "gw"}, result=process(1))
    write = first.begin("restart_process", {"name": "gw"})
    store.transact(lambda: policy.Record("gate-call", {"phase": "acting", "session": first.id, "call": write.ticket,
                                                     "effect": "e1"}))
    store.transact(lambda: policy.Record("gate-call", {"phase": "settle", "session": first.id, "call": write.ticket,
                                                     "acted": True, "effect": "e1", "uncertain": True}))
    return sessions


def test_an_interrupted_write_is_repeated_only_after_a_look_shows_it_still_needed():
    _, retry = interrupted_restart(("s1", "claude", "task-1"), ("s2", "claude", "task-1"))
    assert isinstance(retry.begin("restart_process", {"name": "gw"}), policy.Blocked)    # it owes a look
    run(retry, "find_process", {"name": "gw"}, result=process(1))       # unchanged: the restart never acted
    assert not isinstance(run(retry, "restart_process", {"name": "gw"}), policy.Blocked)
    assert retry.ledger.actors[("claude", "task-1")].verified == 0        # its look showed no change made

    _, gone = interrupted_restart(("s1", "claude", "task-2"), ("s2", "claude", "task-2"))
    run(gone, "find_process", {"name": "gw"}, result=process(None))    # gone: a restart is needed
    assert not isinstance(run(gone, "restart_process", {"name": "gw"}), policy.Blocked)


def test_an_interrupted_write_a_look_shows_acted_is_not_repeated_by_its_task():
    _, retry, other = interrupted_restart(("s1", "claude", "task-1"), ("s2", "claude", "task-1"),
                                          ("s3", "bob", "task-9"))
    assert "may have acted" in other.begin("restart_process", {"name": "gw"}).error["error"]["reason"]
    run(retry, "find_process", {"name": "gw"}, result=process(2))      # replaced since: the restart acted
    assert retry.state == State.READING and retry.ledger.actors[("claude", "task-1")].verified == 1
    blocked = retry.begin("restart_process", {"name": "gw"})
    assert isinstance(blocked, policy.Blocked) and "acted" in blocked.error["error"]["reason"]
    assert retry.finish({"summary": "the last run's restart took effect"}).data["phase"] == "finish"
    run(other, "find_process", {"name": "gw"}, result=process(2))      # another task's own look: as usual
    assert not isinstance(run(other, "restart_process", {"name": "gw"}), policy.Blocked)


def test_an_interrupted_write_leaves_idempotent_writes_alone():
    s = policy.GateSession("s", catalogue.TOOLS, clock=Clock(), agent="a", task="t")
    run(s, "list_workers", {})
    write = s.begin("restart_worker", {"name": "tick"})
    s.store.transact(lambda: policy.Record("gate-call", {"phase": "settle", "session": "s", "call": write.ticket,
                                                       "acted": True, "uncertain": True}))
    run(s, "status", {}, result={"workers": [{"name": "tick"}]})
    assert not isinstance(run(s, "restart_worker", {"name": "tick"}), policy.Blocked)
