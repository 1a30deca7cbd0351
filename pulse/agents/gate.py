"""The agent's safety gate: every tool call classified, and a per-session state machine that
enforces in code what a prompt cannot (DESIGN §6).

    RESOLVING ──resolve/read ok──▶ READING ──write returned──▶ VERIFYING
                                      ▲                            │
                                      └─ resolve/read ok: started after the write returned,
                                         covering every resource it changed ◀┘

- No write without a validated target: writes are blocked in RESOLVING.
- No second write until the last one is verified: writes are blocked in VERIFYING, and
  only a read or resolve that *started after the write returned* and *covers the same
  resource* verifies it (a write whose own result carries `verification.ok` is verified).
- Calls in flight at once form a batch; a batch holds at most one write.
- `finish` is refused with UNVERIFIED_WRITE while a write is unverified or in flight, and
  ends the session: every call after it answers SESSION_FINISHED.
- A read verifies only with evidence: an empty result (nothing found, no events) is about
  nothing. A write that named no target touches its whole class ("target:*"), which only a
  read of the whole class covers: a literal "*" argument is no wildcard.
- Reads, resolves and user_input are never blocked; user_input never changes state.
- A blocked attempt only counts (telemetry, and a recovery entry per tool + argument hash
  that expires after RECOVERY_TTL_S); no number of them waives the gate.

Classification fails closed: an unknown tool, an argument a tool does not declare, or a
discriminator value it does not list is a write. This is the descendant of another
project's gate (shared/research/rcourtman-pulse.md) with its known gaps closed: there,
any read verified any write, concurrent writes in one turn both passed, and recoveries
matched on tool name alone.

Pure: no I/O and no clock but the one passed in. Each step returns the Records the
caller writes as `gate-call` / `gate-blocked` events.
"""

from __future__ import annotations

import enum
import hashlib
import json
import string
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

RECOVERY_TTL_S = 600.0
FSM_BLOCKED = "FSM_BLOCKED"
UNVERIFIED_WRITE = "UNVERIFIED_WRITE"
SESSION_FINISHED = "SESSION_FINISHED"


class Kind(enum.StrEnum):
    RESOLVE = "resolve"        # find what to act on
    READ = "read"              # observe state
    WRITE = "write"            # change the host or Pulse
    USER_INPUT = "user_input"  # ask a person


class State(enum.StrEnum):
    RESOLVING = "RESOLVING"    # no target validated yet
    READING = "READING"        # a target is validated; a write may go
    VERIFYING = "VERIFYING"    # a write returned and is not yet verified


# -- resources ------------------------------------------------------------------------------------------
# A resource key is "<class>:<name>" (process:gateway, worker:tick, task:task-3, target:x).
# A write *touches* keys; a read or resolve *covers* patterns: a key, or a prefix (class:*).

@dataclass(frozen=True)
class Pattern:
    text: str
    prefix: bool = False       # True: covers every key starting with `text`

    def covers(self, key: str) -> bool:
        if key.endswith("*"):      # a whole class ("target:*", a write that named none): only a prefix covers it
            return self.prefix and key[:-1].startswith(self.text)
        return key.startswith(self.text) if self.prefix else key == self.text

    def __str__(self) -> str:
        return self.text + ("*" if self.prefix else "")


def _fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _fill(template: str, args: Mapping[str, Any]) -> str | None:
    """The template with arguments filled in; None when one is missing. Values are literal:
    a '*' inside an argument is just a character, never a wildcard."""
    if any(args.get(name) in (None, "") for name in _fields(template)):
        return None
    return template.format_map({name: str(args[name]) for name in _fields(template)})


def touched(templates: tuple[str, ...], args: Mapping[str, Any]) -> frozenset[str]:
    """Keys a write changes. A missing argument touches the whole class ("process:*"), which
    only a read covering that whole class verifies."""
    out = set()
    for t in templates:
        key = _fill(t, args)
        out.add(key if key is not None else t.split("{", 1)[0] + "*")
    return frozenset(out)


def covered(templates: tuple[str, ...], args: Mapping[str, Any]) -> frozenset[Pattern]:
    """Patterns a read or resolve covers. A template ending in '*' is a prefix; one whose
    argument is missing covers nothing (a read of no particular thing verifies nothing)."""
    out = set()
    for t in templates:
        if t.endswith("*") and not _fields(t):
            out.add(Pattern(t[:-1], prefix=True))
            continue
        key = _fill(t, args)
        if key is not None:
            out.add(Pattern(key))
    return frozenset(out)


def is_covered(key: str, patterns: frozenset[Pattern]) -> bool:
    return any(p.covers(key) for p in patterns)


# -- descriptors and classification --------------------------------------------------------------------

class Arg(NamedTuple):
    """One argument of a tool: its JSON type, what it means (the model reads it), whether required."""
    type: str                          # string | integer | boolean | object
    description: str
    required: bool = False


@dataclass(frozen=True)
class Descriptor:
    """One tool: its kind (static, or chosen by a discriminator argument), the arguments it
    takes, and the resources it touches (as a write) or covers (as a read or resolve)."""
    name: str
    kind: Kind | None = None
    params: Mapping[str, Arg] = field(default_factory=dict)   # the arguments it takes, by name
    touches: tuple[str, ...] = ()      # templates, e.g. "process:{name}"
    covers: tuple[str, ...] = ()       # templates, e.g. "worker:*"
    discriminator: str | None = None   # the argument naming the action, e.g. "action"
    cases: Mapping[str, Kind] = field(default_factory=dict)   # its values; any other value is a write
    touches_fn: Callable[[Mapping[str, Any]], frozenset[str]] | None = None   # when templates cannot say
    verified_by: str = ""              # for writes: what verifies it, in words the model reads
    description: str = ""


def check_registry(tools: Mapping[str, Descriptor]) -> None:
    """Refuse a registry that could classify ambiguously; raises ValueError."""
    for name, d in tools.items():
        where = f"tool {name!r}"
        if d.name != name:
            raise ValueError(f"{where}: registered under another name ({d.name!r})")
        if (d.kind is None) == (d.discriminator is None):
            raise ValueError(f"{where}: give either a static kind or a discriminator, not both or neither")
        if d.discriminator is not None:
            if d.discriminator not in d.params or not d.cases:
                raise ValueError(f"{where}: discriminator {d.discriminator!r} must be a parameter with cases")
            if any(c != c.strip().lower() for c in d.cases):
                raise ValueError(f"{where}: discriminator cases are matched lower-case and trimmed")
        kinds = {d.kind} if d.kind else set(d.cases.values()) | {Kind.WRITE}
        if Kind.WRITE in kinds and not (d.touches or d.touches_fn):
            raise ValueError(f"{where}: a write must say which resources it touches")
        if Kind.WRITE in kinds and not d.verified_by:
            raise ValueError(f"{where}: a write must say what verifies it")
        for t in d.touches + d.covers:
            unknown = [f for f in _fields(t) if f not in d.params]
            if unknown:
                raise ValueError(f"{where}: template {t!r} names unknown parameters {unknown}")


@dataclass(frozen=True)
class Call:
    """One classified call."""
    tool: str
    kind: Kind
    args_hash: str
    touches: frozenset[str] = frozenset()       # writes
    covers: frozenset[Pattern] = frozenset()    # reads and resolves
    why: str = ""                               # how it was classified, when not plainly


def args_hash(args: Any) -> str:
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def classify(tools: Mapping[str, Descriptor], name: str, args: Any) -> Call:
    """The call's kind and resources. Fails closed: anything not plainly a read, resolve or
    user_input by its descriptor is a write."""
    digest = args_hash(args)
    d = tools.get(name)
    if d is None:
        return Call(name, Kind.WRITE, digest, frozenset({f"tool:{name}"}), why="unknown tool")
    if not isinstance(args, Mapping):
        return Call(name, Kind.WRITE, digest, _write_keys(d, {}), why="arguments are not an object")
    unknown = sorted(set(args) - set(d.params))
    if unknown:
        return Call(name, Kind.WRITE, digest, _write_keys(d, args), why=f"unrecognised arguments {unknown}")
    kind, why = d.kind, ""
    if d.discriminator is not None:
        value = args.get(d.discriminator)
        case = value.strip().lower() if isinstance(value, str) else None
        kind = d.cases.get(case) if case is not None else None
        if kind is None:
            kind, why = Kind.WRITE, f"unrecognised {d.discriminator} {value!r}"
    if kind == Kind.WRITE:
        return Call(name, kind, digest, _write_keys(d, args), why=why)
    if kind in (Kind.READ, Kind.RESOLVE):
        return Call(name, kind, digest, covers=covered(d.covers, args))
    return Call(name, kind, digest)


def _write_keys(d: Descriptor, args: Mapping[str, Any]) -> frozenset[str]:
    if d.touches_fn is not None:
        return d.touches_fn(args)
    return touched(d.touches, args) or frozenset({f"tool:{d.name}"})


# -- what the caller records ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    type: str                   # gate-call | gate-blocked
    data: dict


@dataclass(frozen=True)
class Blocked:
    """A refused call: `error` is what the model gets back. It is still a call, so it is
    recorded twice: a gate-call (ok false, blocked) and the gate-blocked with the reason."""
    error: dict
    call_record: Record
    record: Record                 # the gate-blocked

    @property
    def records(self) -> tuple[Record, Record]:
        return self.call_record, self.record

    @property
    def code(self) -> str:
        return self.error["error"]["code"]

    def text(self) -> str:
        """The text the model sees: the stable code first, then the whole envelope."""
        return f"{self.code}: {self.error['error']['reason']}\n{json.dumps(self.error, sort_keys=True)}"


@dataclass(frozen=True)
class Admitted:
    ticket: int
    call: Call


@dataclass
class Recovery:
    """A blocked call the model may yet make right: same tool, same arguments."""
    code: str
    tool: str
    args_hash: str
    created: float
    attempts: int = 1


@dataclass
class _InFlight:
    call: Call
    started: int                # the session's step counter when it began


@dataclass
class _LastWrite:
    tool: str
    touches: frozenset[str]
    returned: int               # the step counter when it returned
    unverified: set[str]


# -- the session ------------------------------------------------------------------------------------------

class Session:
    """One agent session's gate. `begin` before a tool runs, `end` after it returns;
    `finish` when the agent says it is done; `reset` from the operator's side."""

    def __init__(self, session_id: str, tools: Mapping[str, Descriptor], clock: Callable[[], float] = time.time,
                 recovery_ttl_s: float = RECOVERY_TTL_S):
        check_registry(tools)
        self.id = session_id
        self.tools = tools
        self.clock = clock
        self.recovery_ttl_s = recovery_ttl_s
        self.state = State.RESOLVING
        self.step = 0                               # orders begins and ends: "started after it returned"
        self.in_flight: dict[int, _InFlight] = {}
        self.last_write: _LastWrite | None = None
        self.blocked = 0                            # telemetry only: never waives anything
        self.finished = False                       # after finish, every call is refused
        self.recoveries: dict[tuple[str, str], Recovery] = {}

    # -- before a call ------------------------------------------------------------------

    def begin(self, tool: str, args: Any) -> Admitted | Blocked:
        call = classify(self.tools, tool, args)
        if self.finished:
            return self._block(SESSION_FINISHED, call, "the session called finish; it takes no more calls")
        reason = self._write_refusal(call) if call.kind == Kind.WRITE else None
        if reason is not None:
            return self._block(FSM_BLOCKED, call, reason)
        self.step += 1
        self.in_flight[self.step] = _InFlight(call, self.step)
        return Admitted(self.step, call)

    def _write_refusal(self, call: Call) -> str | None:
        if self.state == State.RESOLVING:
            return "no target has been validated in this session yet; writes need a validated target"
        if any(f.call.kind == Kind.WRITE for f in self.in_flight.values()):
            return "another write is in flight; calls running at once may hold at most one write"
        if self.state == State.VERIFYING:
            w = self.last_write
            return (f"the last write ({w.tool} on {', '.join(sorted(w.unverified))}) is unverified: it needs a "
                    "successful read or resolve of the same resource that started after the write returned")
        return None

    # -- after a call -------------------------------------------------------------------

    def end(self, ticket: int, ok: bool, result: Any = None, acted: bool | None = None) -> Record:
        """The call `ticket` returned. `ok`: it succeeded. For a write, `acted` says whether the
        host may have changed (default: ok); a write that acted, even if it failed, must be
        verified like one that succeeded."""
        flight = self.in_flight.pop(ticket)
        self.step += 1
        call, before = flight.call, self.state
        verified: list[str] = []
        self_verified = False
        if call.kind == Kind.WRITE and (ok if acted is None else acted):
            self_verified = ok and has_verification(result)
            self._wrote(call, self_verified)
        elif ok and call.kind in (Kind.READ, Kind.RESOLVE):
            verified = self._observed(flight, has_evidence(result))
        recovered = self._recovered(call) if ok else None
        data = {"session": self.id, "ticket": ticket, "tool": call.tool, "kind": str(call.kind),
                "args_hash": call.args_hash, "ok": ok, "state_before": str(before), "state": str(self.state)}
        if call.kind == Kind.WRITE:
            data.update(touches=sorted(call.touches), acted=ok if acted is None else acted,
                        self_verified=self_verified)
        if call.covers:
            data["covers"] = sorted(str(p) for p in call.covers)
        if verified:
            data["verified"] = verified
        if call.why:
            data["classified"] = call.why
        if recovered:
            data["recovered"] = recovered
        return Record("gate-call", data)

    def _wrote(self, call: Call, self_verified: bool) -> None:
        if self_verified:
            return   # its own result verified it: no debt to pay
        unverified = set(call.touches)
        if self.state == State.VERIFYING and self.last_write is not None:
            unverified |= self.last_write.unverified   # never forget an older debt
        self.last_write = _LastWrite(call.tool, call.touches, self.step, unverified)
        self.state = State.VERIFYING

    def _observed(self, flight: _InFlight, evidence: bool) -> list[str]:
        """A read or resolve succeeded: the target is validated; if it returned something (an
        empty result is about nothing), maybe a write is verified."""
        if self.state == State.RESOLVING:
            self.state = State.READING
            return []
        w = self.last_write
        if self.state != State.VERIFYING or w is None or flight.started <= w.returned or not evidence:
            return []   # a read that began before the write returned saw the world before it
        done = sorted(k for k in w.unverified if is_covered(k, flight.call.covers))
        w.unverified.difference_update(done)
        if not w.unverified:
            self.state = State.READING
        return done

    # -- the agent's "I'm done" ---------------------------------------------------------

    def finish(self, args: Any = None) -> Record | Blocked:
        call = Call("finish", Kind.USER_INPUT, args_hash(args or {}))
        if self.finished:
            return self._block(SESSION_FINISHED, call, "the session already finished")
        if self.state == State.VERIFYING or any(f.call.kind == Kind.WRITE for f in self.in_flight.values()):
            w = self.last_write
            what = f"{w.tool} on {', '.join(sorted(w.unverified))}" if w and self.state == State.VERIFYING \
                else "a write still in flight"
            return self._block(UNVERIFIED_WRITE, call, f"a write is unverified ({what}); the session cannot "
                                                       "finish on an unverified change")
        recovered = self._recovered(call)
        self.finished = True       # terminal: every later call answers SESSION_FINISHED
        data = {"session": self.id, "tool": "finish", "kind": "finish", "ok": True, "state": str(self.state)}
        if recovered:
            data["recovered"] = recovered
        return Record("gate-call", data)

    # -- reset (the operator's, never a tool the agent holds) ------------------------------------------

    def reset(self, keep_progress: bool = False) -> Record:
        """Plain: back to RESOLVING, forgetting the target, any unverified write and the
        recoveries. keep_progress: drop verification tracking but keep the validated target
        (VERIFYING → READING; RESOLVING stays RESOLVING), and keep the recoveries."""
        before = self.state
        self.last_write = None
        if keep_progress:
            if self.state == State.VERIFYING:
                self.state = State.READING
        else:
            self.state = State.RESOLVING
            self.recoveries.clear()
        return Record("gate-call", {"session": self.id, "tool": "reset", "kind": "reset",
                                    "keep_progress": keep_progress, "state_before": str(before),
                                    "state": str(self.state)})

    # -- blocks and recoveries ----------------------------------------------------------

    def _block(self, code: str, call: Call, reason: str) -> Blocked:
        self.blocked += 1
        recovery = self._track(code, call)
        kind = "finish" if call.tool == "finish" else str(call.kind)
        error = {"ok": False, "error": {"code": code, "state": str(self.state), "tool": call.tool, "kind": kind,
                                        "reason": reason, "recoverable": True}}
        data = {"session": self.id, "tool": call.tool, "kind": kind, "args_hash": call.args_hash, "code": code,
                "state": str(self.state), "reason": reason, "blocked_total": self.blocked,
                "attempts": recovery.attempts}
        if call.why:
            data["classified"] = call.why
        as_call = {"session": self.id, "tool": call.tool, "kind": kind, "args_hash": call.args_hash, "ok": False,
                   "blocked": code, "state_before": str(self.state), "state": str(self.state)}
        return Blocked(error, Record("gate-call", as_call), Record("gate-blocked", data))

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, r in self.recoveries.items() if now - r.created >= self.recovery_ttl_s]:
            del self.recoveries[key]

    def _track(self, code: str, call: Call) -> Recovery:
        self._expire()
        key = (call.tool, call.args_hash)
        if key in self.recoveries:
            self.recoveries[key].attempts += 1
        else:
            self.recoveries[key] = Recovery(code, call.tool, call.args_hash, self.clock())
        return self.recoveries[key]

    def _recovered(self, call: Call) -> dict | None:
        """The same call (tool + arguments) that was blocked has now gone through."""
        self._expire()
        r = self.recoveries.pop((call.tool, call.args_hash), None)
        if r is None:
            return None
        return {"code": r.code, "attempts": r.attempts, "after_s": round(self.clock() - r.created, 3)}

    def summary(self) -> dict:
        """The session's gate as telemetry (for a status line or a test)."""
        self._expire()
        w = self.last_write
        return {"session": self.id, "state": str(self.state), "blocked": self.blocked,
                "in_flight": len(self.in_flight), "recoveries": len(self.recoveries),
                "unverified": sorted(w.unverified) if w and self.state == State.VERIFYING else []}


def has_evidence(result: Any) -> bool:
    """A read's result is about something: not empty (no events, no samples, nothing found)."""
    if isinstance(result, Mapping):
        lists = [v for v in result.values() if isinstance(v, (list, tuple))]
        return bool(result) and not (lists and len(lists) == len(result) and not any(lists))
    return result not in (None, "", [], ())


def has_verification(result: Any) -> bool:
    """A write's result that verifies itself: {"verification": {"ok": true, ...}}, set by Pulse's
    own code (never by the model) when the result itself proves the change."""
    return isinstance(result, Mapping) and isinstance(result.get("verification"), Mapping) \
        and result["verification"].get("ok") is True


# -- Pulse's tools ------------------------------------------------------------------------------------------
# What each write touches and what verifies it. A `status` or `list_workers` covers every
# worker it reports; `find_process` is a live lookup of one configured process; a task's
# creation is read back in the transaction that wrote it, so create_task verifies itself.

PROCESS_KINDS = {"restart-process", "signal"}   # effect kinds acting on a configured process
ENGINE_KINDS = {"engine-promote", "engine-rollback"}   # effect kinds that reload the engine worker
SELF_VERIFYING_KINDS = {"noop", "notify"}       # effects whose acknowledgement is the whole change


def effect_touches(args: Mapping[str, Any]) -> frozenset[str]:
    """emit_effect: the resource follows the kind; an opaque kind touches its target."""
    kind, target = str(args.get("kind") or ""), args.get("target")
    name = str(target) if target not in (None, "") else "*"
    if kind in PROCESS_KINDS:
        return frozenset({f"process:{name}"})
    if kind in ENGINE_KINDS:
        return frozenset({"worker:engine"})
    if kind == "restart-worker":
        return frozenset({f"worker:{name}"})
    return frozenset({f"target:{name}"})


def _tool(name: str, kind: Kind, params: Mapping[str, Arg] | None = None, **kw) -> Descriptor:
    return Descriptor(name=name, kind=kind, params=params or {}, **kw)


TOOLS: dict[str, Descriptor] = {d.name: d for d in (
    # resolve: find what to act on
    _tool("find_process", Kind.RESOLVE, {"name": Arg("string", "A configured [[process]] name.", required=True)},
          covers=("process:{name}",),
          description="Look up one configured critical process now: its pid, whether it is alive, its command."),
    _tool("list_workers", Kind.RESOLVE, covers=("worker:*",),
          description="Pulse's workers (watcher, tick, executor, engine) and their states, live from pulsed."),
    _tool("list_tasks", Kind.RESOLVE, {"status": Arg("string", "Only tasks in this status.")}, covers=("task:*",),
          description="Tasks and their states (optionally only one status)."),
    # read: observe
    _tool("status", Kind.READ, covers=("worker:*",),
          description="pulsectl status as JSON: the supervisor and every worker."),
    _tool("vitals", Kind.READ, {"key": Arg("string", "One vital key, or a prefix ending in *.")},
          covers=("vital:{key}",),
          description="The latest sample of each vital key (or of one key, or a prefix ending in *)."),
    _tool("events", Kind.READ, {
              "type": Arg("string", "Only events of this type."),
              "target": Arg("string", "Only events about this target."),
              "since": Arg("string", "An ISO time or a duration such as 10m."),
              "limit": Arg("integer", "At most this many, newest last (default 50, at most 500).")},
          covers=("target:{target}",),
          description="Recent events from events.db, optionally of one type, one target, since a time."),
    _tool("log_tail", Kind.READ, {
              "worker": Arg("string", "Only this process's lines (pulsed, watcher, tick, ...)."),
              "lines": Arg("integer", "How many lines (default 50, at most 500).")}, covers=("log:{worker}",),
          description="The last lines of pulse.log, optionally of one worker."),
    _tool("effect", Kind.READ, {"id": Arg("string", "The effect id.", required=True)}, covers=("effect:{id}",),
          description="One effect and its state."),
    # write: change the host, or Pulse; each waits for its effect's terminal event
    _tool("restart_process", Kind.WRITE, {"name": Arg("string", "A configured [[process]] name.", required=True)},
          touches=("process:{name}",),
          verified_by="find_process of the same name, started after the restart returned",
          description="Restart a configured critical process with its configured restart command."),
    _tool("restart_worker", Kind.WRITE, {"name": Arg("string", "watcher, tick, executor or engine.", required=True)},
          touches=("worker:{name}",),
          verified_by="status or list_workers, started after the restart returned",
          description="Restart one of Pulse's workers."),
    _tool("signal_process", Kind.WRITE, {
              "name": Arg("string", "A configured [[process]] name.", required=True),
              "signal": Arg("string", "A signal name such as SIGHUP.", required=True)},
          touches=("process:{name}",),
          verified_by="find_process of the same name, started after the signal returned",
          description="Send a signal to a configured critical process."),
    _tool("emit_effect", Kind.WRITE, {
              "kind": Arg("string", "The effect kind.", required=True),
              "target": Arg("string", "What it acts on."),
              "params": Arg("object", "The effect's parameters."),
              "idempotent": Arg("boolean", "Safe to run more than once.")}, touches_fn=effect_touches,
          verified_by="by kind: find_process for restart-process and signal, status for engine-promote, "
                      "engine-rollback and restart-worker, "
                      "events of the same target otherwise; noop and notify verify themselves when acked",
          description="Queue any effect (checked against the operator's allow-list) and wait for its outcome."),
    _tool("promote", Kind.WRITE, touches=("worker:engine",),
          verified_by="status or list_workers, started after the promote returned (the engine reloaded)",
          description="Merge staging into the engine, gate it, and reload the engine."),
    _tool("rollback", Kind.WRITE, {"to": Arg("string", "A commit of main to return to.")},
          touches=("worker:engine",),
          verified_by="status or list_workers, started after the rollback returned (the engine reloaded)",
          description="Revert the engine to the previous (or a given) commit and reload it."),
    _tool("create_task", Kind.WRITE, {
              "project": Arg("string", "What the task belongs to.", required=True),
              "title": Arg("string", "One line that says what to do.", required=True),
              "prompt": Arg("string", "The instructions for the agent that takes it.", required=True),
              "priority": Arg("integer", "Higher runs first (default 0).")}, touches=("task:*",),
          verified_by="itself: the task is read back in the transaction that created it (or list_tasks)",
          description="Add a pending task for an agent."),
    # user_input: ask a person
    _tool("ask_operator", Kind.USER_INPUT,
          {"question": Arg("string", "The question, complete in itself.", required=True)},
          description="Ask the operator a question and wait for the answer."),
)}
