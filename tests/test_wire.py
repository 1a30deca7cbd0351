"""ZeroMQ sockets: malformed frames are dropped and the next valid message works;
a restarted worker is reachable again without restarting its peers."""

from __future__ import annotations

import ast
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from pulse.core.wire import codec, controlmsgs, doorbells, enginerpc, eventmsgs
from support import wait_for

GARBAGE = [b"", b"\x00\xff garbage", codec.encode(doorbells.Wake("x"))[:-1], b"\x81\xa4type\xa3bad"]


def engine_ping(sock: zmq.Socket, request_id: int, timeout: float = 1.0) -> enginerpc.Pong | None:
    sock.send(codec.encode(enginerpc.Ping(request_id, time.time() + timeout)))
    if sock.poll(timeout * 1000):
        return codec.decode(sock.recv(), enginerpc.EngineReply)
    return None


def test_malformed_frames_on_every_socket(pulsed):
    pulsed.home.mkdir()
    (pulsed.home / "config.toml").write_text('[log]\nlevel = "debug"\n')
    pulsed.start()
    ctx = zmq.Context()
    try:
        # control (ROUTER): garbage gets an error reply; the next request works
        ctl = ctx.socket(zmq.DEALER)
        ctl.setsockopt(zmq.LINGER, 0)
        ctl.connect(pulsed.paths.endpoint("control"))
        for frame in GARBAGE:
            ctl.send(frame)
            assert ctl.poll(3000)
            reply = codec.decode(ctl.recv(), controlmsgs.Reply)
            assert not reply.ok and "malformed request" in reply.error
        ctl.send_multipart([b"two", b"frames"])
        assert ctl.poll(3000) and not codec.decode(ctl.recv(), controlmsgs.Reply).ok
        ctl.send(codec.encode(controlmsgs.GetStatus()))
        assert ctl.poll(3000) and codec.decode(ctl.recv(), controlmsgs.Reply).status.version == 1

        # one-way sockets: garbage, then a valid message that must still be handled
        for name, valid, handled in (
                ("heartbeat", None, None),
                ("eventlog", None, None),
                ("wake", doorbells.Wake("test", "after garbage"), "woken by test (after garbage)"),
                ("doorbell", doorbells.Doorbell("test"), "doorbell from test")):
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(pulsed.paths.endpoint(name))
            for frame in GARBAGE:
                push.send(frame)
            if valid is not None:
                push.send(codec.encode(valid))
            push.close()
            wait_for(lambda: f"dropped a malformed frame on the {name} socket" in pulsed.log_text(), 5,
                     what=f"the {name} socket's complaint")
            if handled:
                wait_for(lambda: handled in pulsed.log_text(), 5, what=f"the valid {name} message handled")

        # engine RPC (ROUTER): garbage, then a ping answered
        rpc = ctx.socket(zmq.DEALER)
        rpc.setsockopt(zmq.LINGER, 0)
        rpc.connect(pulsed.paths.endpoint("engine"))
        for frame in GARBAGE:
            rpc.send(frame)
        pong = engine_ping(rpc, 7, timeout=3)
        assert pong is not None and pong.id == 7 and pong.pid == pulsed.worker("engine").pid
        # an expired request is dropped, not answered
        rpc.send(codec.encode(enginerpc.Ping(8, time.time() - 1)))
        assert engine_ping(rpc, 9, timeout=3).id == 9
        assert not rpc.poll(100)

        assert pulsed.ctl("restart", "engine").returncode == 0   # lifecycle events still get written
        pulsed.wait_replaced("engine", pong.pid, heartbeat=False)
        pulsed.events_written()

        # and every worker is still running and heartbeating
        for w in pulsed.wait_running().workers:
            pulsed.wait_heartbeat(w.name, w.pid)
        assert all(w.restarts == (w.name == "engine") for w in pulsed.status().workers)
    finally:
        ctx.destroy(linger=0)


def test_restarted_engine_is_reachable_without_restarting_peers(pulsed):
    status = pulsed.start().status()
    old = {w.name: w.pid for w in status.workers}
    ctx = zmq.Context()
    try:
        rpc = ctx.socket(zmq.DEALER)
        rpc.setsockopt(zmq.LINGER, 0)
        rpc.connect(pulsed.paths.endpoint("engine"))
        assert engine_ping(rpc, 1, timeout=3).pid == old["engine"]
        os.kill(old["engine"], signal.SIGKILL)
        new = pulsed.wait_replaced("engine", old["engine"])
        ids = iter(range(2, 1000))
        pong = wait_for(lambda: engine_ping(rpc, next(ids), timeout=0.2), 5, what="the new engine answering")
        assert pong.pid == new.pid
        assert {w.name: w.pid for w in pulsed.status().workers if w.name != "engine"} == \
            {n: p for n, p in old.items() if n != "engine"}
    finally:
        ctx.destroy(linger=0)


def test_every_event_type_the_source_writes_is_a_known_one():
    import re
    from pathlib import Path

    from pulse.core.wire.eventmsgs import EVENT_TYPES
    root = Path(__file__).resolve().parents[1]
    written = set()
    for path in [*root.glob("pulse/**/*.py"), *root.glob("supervisor/*.py"), *root.glob("engine/*.py")]:
        text = path.read_text()
        written |= set(re.findall(r'(?:now_event|self\.record|_record\(paths,|_append\(ctx,)\(?\s*"([a-z-]+)"', text))
    # none is written as a string any more (test_event_types_and_effect_kinds_are_named_by_their_enums);
    # one that is must at least be a known type
    assert written <= EVENT_TYPES, written - EVENT_TYPES


# The event names no other word reads like (every hyphenated one): spelled out in pulse/core/wire/ alone
# (task-* and effect-*, named there as TaskEvent and EffectEvent), and never gathered into a set
# anywhere else (a group of them is written once, beside EVENT_TYPES).
HYPHENATED = {t for t in eventmsgs.EVENT_TYPES if "-" in t}
NAMED = {*eventmsgs.TaskEvent, *eventmsgs.EffectEvent} & HYPHENATED


def retyped_event_names(source: str) -> tuple[list[str], list[list[str]]]:
    """(task and effect event names written as string literals, sets or sequences of two or more
    hyphenated event names written out) in `source`."""
    names, groups = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in NAMED:
            names.append(node.value)
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            group = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in HYPHENATED]
            if len(group) >= 2:
                groups.append(group)
    return names, groups


NAMES_DEFINED_IN = {"pulse/core/wire/eventmsgs.py", "pulse/core/wire/eventtypes.py", "pulse/core/wire/effectkinds.py"}


def test_event_names_are_spelled_out_once_in_wire():
    # the check finds what it is for
    assert retyped_event_names('if ev.type == "task-given-up": pass') == (["task-given-up"], [])
    assert retyped_event_names('ENDS = ("worker-exited", "worker-failed")') == ([], [["worker-exited", "worker-failed"]])
    assert retyped_event_names('"SELECT 1 WHERE type = \'task-acked\'"; EffectEvent.ACKED') == ([], [])
    root = Path(__file__).resolve().parents[1]
    found = {}
    for path in [*root.glob("pulse/**/*.py"), *root.glob("supervisor/*.py"), *root.glob("engine/*.py")]:
        names, groups = retyped_event_names(path.read_text())
        if path.relative_to(root).as_posix() not in NAMES_DEFINED_IN and (names or groups):
            found[path.relative_to(root).as_posix()] = names + groups
    assert found == {}


# Every event type and effect kind, as the strings they stand for; the enums that name them.
NAMES = set(eventmsgs.EVENT_TYPES) | set(eventmsgs.EffectKind)
ENUMS = {"EventType", "EffectKind", "EffectEvent", "TaskEvent", "SpendEvent", "ScheduleEvent"}
# Where a string reads as an event type or effect kind: what is compared with it, the keyword it is
# passed as, the call it is the first argument of.
TYPED = {"type", "kind", "type_", "kind_", "t"}
TYPED_KEYWORDS = {"type", "kind", "types", "kinds"}
EVENT_CALLS = {"now_event", "Event", "Record", "record"}
# (file, string): why it is a string there.
BARE_NAME_ALLOWED = {
    ("pulse/agents/adapters/codex.py", "error"): "codex's own JSON event type, not one of Pulse's",
    ("pulse/cli/commandtable.py", "gate-reset"): "the pulsectl command's name",
    ("pulse/cli/helptext.py", "gate-reset"): "the pulsectl command's name, in its help",
    ("pulse/cli/mcp.py", "gate-reset"): "the pulsectl command's name",
    ("pulse/cli/fastpath.py", "gate-reset"): "the pulsectl command's name",
    ("pulse/core/config/safety.py", "*"): "[allow]'s default kinds: configuration, as the operator writes it; the enum "
                                          "would import the wire's events module into every config load (~1.4 ms)",
}


def _typed(node: ast.AST) -> bool:
    """`node` holds an event type or effect kind: x.type, kind, ev["type"], data.get("kind")."""
    if isinstance(node, ast.Attribute):
        return node.attr in TYPED
    if isinstance(node, ast.Name):
        return node.id in TYPED
    key = node.slice if isinstance(node, ast.Subscript) else \
        node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
        and node.args else None
    return isinstance(key, ast.Constant) and key.value in TYPED


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants `node` is, or holds as a tuple, list or set."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def bare_names(source: str) -> list[tuple[int, str]]:
    """(line, string) of each event type or effect kind written as a string literal in `source` where
    one is meant: any hyphenated one outside a docstring (no other word reads like it), and a plain
    word (tick, notify, error...) where it is compared with a type or kind, passed as type=/kind=, as
    an event's type (now_event, Event, Record, record, the types of a *_events read), or as a key
    beside enum-named ones. SQL text is one longer string and is not seen."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    # the parameters of the module's own functions, by position: a call passes a type where one is named so
    params = {node.name: [a.arg for a in node.args.args] for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    meant: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "-" in node.value \
                and node.value in NAMES and id(node) not in docstrings:
            meant.append(node)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_typed(side) for side in sides):
                meant += [c for side in sides for c in _strings(side)]
        elif isinstance(node, ast.Call):
            meant += [c for kw in node.keywords if kw.arg in TYPED_KEYWORDS for c in _strings(kw.value)]
            name = _call_name(node)
            if name in EVENT_CALLS and node.args:
                meant += _strings(node.args[0])
            if isinstance(node.func, ast.Name):
                meant += [c for arg, param in zip(node.args, params.get(name, [])) if param in TYPED for c in _strings(arg)]
            if name.endswith("_events"):
                meant += [c for arg in node.args if isinstance(arg, (ast.Tuple, ast.List, ast.Set)) for c in _strings(arg)]
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name)
                                                and k.value.id in ENUMS for k in node.keys):
            meant += [k for k in node.keys if isinstance(k, ast.Constant)]
    return sorted({(c.lineno, c.value) for c in meant if c.value in NAMES})


def test_event_types_and_effect_kinds_are_named_by_their_enums():
    """Product code names an event type or effect kind as EventType.X, EffectKind.X or its family's
    member (a misspelt one fails when the module loads), never as the string it stands for."""
    # the check finds what it is for, and leaves alone what only looks like it
    assert bare_names('if ev.type == "worker-exited": pass\nrecord("tick", None)\nx = {"k": "trim-dir"}') == \
        [(1, "worker-exited"), (2, "tick"), (3, "trim-dir")]
    assert bare_names('Effect(kind="notify")\nlast_events(c, 1, ["promote"])\nif t in ("error", "x"): pass') == \
        [(1, "notify"), (2, "promote"), (3, "error")]
    assert bare_names('def add(ctx, type_, target): pass\nadd(c, "resume", "gw")') == [(2, "resume")]
    assert bare_names('F = {EventType.RELOAD: f, "pause": g}\ne = now_event(EventType.TICK, "tick")') == [(1, "pause")]
    assert bare_names('"""Runs on a restart-process."""\nq = "SELECT 1 WHERE type = \'worker-exited\'"\n'
                      'source = "tick"\nif kind == EffectKind.NOTIFY: pass') == []
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in [*root.glob("pulse/**/*.py"), *root.glob("supervisor/*.py"), *root.glob("engine/*.py")]:
        rel = path.relative_to(root).as_posix()
        if rel not in NAMES_DEFINED_IN and "template" not in path.parts:
            found += [f"{rel}:{line}: {value!r}" for line, value in bare_names(path.read_text())
                      if (rel, value) not in BARE_NAME_ALLOWED and (rel, "*") not in BARE_NAME_ALLOWED]
    assert found == []

def test_a_misspelt_kind_or_event_type_fails_at_once():
    with pytest.raises(AttributeError):
        eventmsgs.EffectKind.RESTART_PROCES  # noqa: B018
    with pytest.raises(AttributeError):
        eventmsgs.EventType.WORKER_STARTD  # noqa: B018


def test_the_effect_kinds_are_every_kind_the_registry_runs():
    from pulse.effects import registry
    assert set(eventmsgs.EffectKind) == set(registry.all_kinds())


def test_the_event_types_are_the_enums_of_every_family():
    families = (eventmsgs.EventType, eventmsgs.EffectEvent, eventmsgs.TaskEvent, eventmsgs.SpendEvent, eventmsgs.ScheduleEvent)
    assert eventmsgs.EVENT_TYPES == {t for family in families for t in family}
    assert sum(len(family) for family in families) == len(eventmsgs.EVENT_TYPES)      # no type in two families


def store_rows(path: Path, effect: enginerpc.Effect, event: eventmsgs.Event) -> list[tuple]:
    """What events.db holds after committing `effect` and `event`, the clocks left out."""
    from pulse.store import effectqueue, eventsdb
    conn = eventsdb.open_events(path)
    effectqueue.commit_effects(conn, [effect], "tick", events=[event])
    rows = conn.execute("SELECT id, seq, type, source, target, data FROM events ORDER BY id").fetchall()
    rows += conn.execute("SELECT id, event_id, kind, target, origin, idempotent, created, deadline, state, body "
                         "FROM effects").fetchall()
    conn.close()
    return rows


def test_enum_kinds_and_types_are_sent_and_stored_as_their_strings_byte_for_byte(tmp_path):
    """An EffectKind or EventType is the str it stands for on the wire (msgpack, JSON) and in
    events.db: the same bytes as the plain string, so frames and stores from before read the same."""
    def effect(kind, inner):
        return enginerpc.Effect(kind=kind, target="gateway", params={"kind": inner, "why": "dead"}, idempotent=True,
                           id="e" * 32, created=1.0, deadline=2.0, origin="survival")

    def event(type_, kind):
        return eventmsgs.Event(type=type_, source="keeper", target="gateway", data={"kind": kind, type_: [kind]},
                          ts=1.0, mono=1.0, seq=7)

    typed = effect(eventmsgs.EffectKind.RESTART_PROCESS, eventmsgs.EffectKind.TRIM_DIR), \
        event(eventmsgs.EventType.PROCESS_EXITED, eventmsgs.EffectKind.NOTIFY)
    plain = effect("restart-process", "trim-dir"), event("process-exited", "notify")
    assert type(plain[0].kind) is str and type(typed[0].kind) is eventmsgs.EffectKind
    for a, b in zip(typed, plain):
        assert codec.encode(a) == codec.encode(b)
        assert msgspec.json.encode(a) == msgspec.json.encode(b)
    assert codec.encode(enginerpc.ChainResult(1, [typed[0]])) == codec.encode(enginerpc.ChainResult(1, [plain[0]]))
    assert store_rows(tmp_path / "typed.db", *typed) == store_rows(tmp_path / "plain.db", *plain)
    # ... and in what Pulse says: an error quoting one (`{kind!r}`, a list of them) reads as before
    assert (repr(typed[0].kind), str(typed[0].kind), f"{typed[0].kind}") == ("'restart-process'",) + ("restart-process",) * 2
    assert str([eventmsgs.EventType.TICK, eventmsgs.EffectKind.EXEC]) == "['tick', 'exec']"


def test_an_engine_written_before_the_families_still_imports_the_snapshot_types_from_pulse_core_wire():
    """An operator's engine directory is their code, and a promote runs its tests: those made from the
    template before the split say `from pulse.core.wire import AgentLoad`."""
    import pulse.core.wire as wire
    assert wire.AgentLoad is enginerpc.AgentLoad and wire.Snapshot is enginerpc.Snapshot
    # only the engine's family: anything else is imported from its module
    assert not hasattr(wire, "Malformed") and hasattr(codec, "Malformed")


# -- pulsectl status reads pulsed's reply without msgspec (pulse.core.wire.plainmsgpack) --------------

def every_kind_of_status() -> controlmsgs.Status:
    """A status with a row of each kind, a field of each msgpack type, long strings and large numbers."""
    cm = controlmsgs
    return cm.Status(
        version=1, supervisor=cm.SupervisorStatus(pid=4_000_000, uptime_s=86_400 * 3 + 0.25, home="/h" * 40),
        workers=[cm.WorkerStatus("tick", 70_000, "running", 2, 12.5, 0.3, cm.LastExit(None, 9, "2026-12-06T10:00:00Z"),
                                 crashes=1, operator_restarts=1),
                 cm.WorkerStatus("engine", None, "failed", 300, None, None, cm.LastExit(3, None, "t", "hung"))],
        engine_commit="a" * 40,
        processes=[cm.ProcessStatus("gw", True, pid=12, paused_until=1.5e9, matches=2, rss_mb=812.4, max_mb=4096,
                                    config=cm.ConfigStatus(files=[cm.ConfigFileStatus("/etc/gw.json", "changed")],
                                                           kept_at=1.7e9, pinned=True),
                                    state="fatal", why="é" * 300, restarts=70_000,
                                    last_exit=cm.ProcessExitView(at=1.7e9, code=-1, output=["x" * 70_000, ""]),
                                    health=cm.HealthView(ok=False, at=1.7e9, latency_ms=3.25, failing=-200, error="no"))],
        files=[cm.FileWatchStatus(name="log", path="/var/*.log", action="rotate", max_mb=0.5, files=3, bytes=2**40,
                                  largest="/var/a.log", largest_bytes=2**33, over=1)],
        fleet={"state": "connected", "servers": ["nats://a", "nats://b"], "published_through": 2**63 - 1,
               "nested": {"k": [1.0, -1, None, True]}},
        fresh=[cm.FreshWatchStatus(name="p", what="http://x", within_s=60.0, stale=False, value="")],
        dirs=[cm.DirWatchStatus(name="d", path="/d/*", oldest="delete", dirs=2, files=-129, refused=1)],
        telemetry={"port": 65535, "spans": -(2**63)})


def test_status_reads_pulseds_reply_without_msgspec_as_msgspec_wrote_it():
    from pulse.cli import statusview
    from pulse.core.wire import plainmsgpack
    assert statusview.GET_STATUS == codec.encode(controlmsgs.GetStatus())
    status = every_kind_of_status()
    frame = codec.encode(controlmsgs.Reply(ok=True, status=status, events_recorded=5))
    reply = plainmsgpack.unpack(frame)
    assert reply == msgspec.to_builtins(controlmsgs.Reply(ok=True, status=status, events_recorded=5))
    assert reply["status"] == msgspec.json.decode(controlmsgs.status_json(status))     # the document status --json starts from
    # the views read its maps as they read the Structs: the same table, the same exit
    assert statusview.table(reply.status, reply.get("engine_commit"), 3) == statusview.table(status, None, 3)
    assert statusview.exit_of(reply.status) == statusview.exit_of(status)
    # no field of the document is hidden by a method of dict, which a Record is
    structs = {controlmsgs.Reply, controlmsgs.Status, controlmsgs.SupervisorStatus, controlmsgs.WorkerStatus,
               controlmsgs.LastExit, controlmsgs.ProcessStatus, controlmsgs.ConfigStatus, controlmsgs.ConfigFileStatus,
               controlmsgs.ProcessExitView, controlmsgs.HealthView, controlmsgs.FileWatchStatus,
               controlmsgs.FreshWatchStatus, controlmsgs.DirWatchStatus}
    assert {f.encode_name for s in structs for f in msgspec.structs.fields(s)} & set(dir(dict)) == set()


@pytest.mark.parametrize("frame", [b"", b"\x81\xa4type", b"\x92\x01", b"\xc1", b"\xd9\x05abc", b"\x01\x02",
                                   b"\xa2\xff\xfe", b"\xc7\x01\x00\x00"])
def test_a_reply_that_is_not_one_msgpack_value_is_malformed(frame):
    from pulse.core.wire import plainmsgpack
    with pytest.raises(plainmsgpack.Malformed):
        plainmsgpack.unpack(frame)
