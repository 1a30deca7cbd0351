"""The agent's safety gate: every tool call classified, and a state machine per agent that
enforces in code what a prompt cannot, host-wide and across sessions. Which tools there
are, and what each reads or changes, is the caller's catalogue (Pulse's: pulse.gate.catalogue).

    RESOLVING ──resolve/read ok──▶ READING ──write returned──▶ VERIFYING
                                      ▲                            │
                                      └─ resolve/read ok: started after the write returned,
                                         about every resource it changed ◀┘

- A write on resource R needs R itself resolved or read by this agent, in a look that started
  after the last write on R by anyone returned ("R was changed by <agent> after you last looked").
- One change at a time per resource, host-wide: no write on R while any session's write on R is
  in flight; and calls in flight at once in one agent's sessions hold at most one write.
- No second write until the last one is verified: only a read or resolve that *started after
  the write returned*, *covers the resource* and *returned evidence about it* verifies it (a
  write whose own result carries `verification.ok` is verified); evidence that is an event
  counts if it was written after the write began. An empty result is about
  nothing; a literal "*" argument is no wildcard: a write that named no target touches its whole
  class ("target:*"), which only a look at the whole class that found one of it verifies.
- `finish` is refused with UNVERIFIED_WRITE while a write is unverified or in flight, and ends
  the session: every call after it answers SESSION_FINISHED.
- A write whose effect may have acted without anyone knowing (its effect was interrupted: the
  executor died while it ran) leaves its resource *uncertain*: no non-idempotent write on it
  passes until the writer's own look, started after that effect ended, shows it is still
  needed (the resource as it was found before that write, or gone). A look that finds it
  changed since settles that the write acted: the same task does not repeat it (unless a later
  look finds the resource gone); others write it as usual.
- Reads, resolves and user_input are never blocked; user_input never changes state.
- A blocked attempt only counts (telemetry, and a recovery entry per tool + argument hash
  that expires after RECOVERY_TTL_S); no number of them waives the gate.

The state is a fold of facts (the HostLedger): a session's begin and end of each call, the effect
a write committed, finish, the operator's reset. The durable store (pulse.gate.durable)
commits each fact to events.db in the transaction that decided it, so a new session of the same
agent and task inherits what the last one left unverified, and two sessions cannot both pass.

Classification fails closed: an unknown tool, an argument a tool does not declare, or a
discriminator value it does not list is a write. This is the descendant of the gate of
another agent-ops project also called Pulse (rcourtman's), with its known gaps closed: there,
any read verified any write, concurrent writes in one turn both passed, and recoveries
matched on tool name alone.

Pure: no I/O and no clock but the one passed in.
"""

from __future__ import annotations

import collections
import enum
import time
from typing import Any, Callable, Mapping, NamedTuple

import msgspec

from pulse.core.digest import sha256
from pulse.core.wire.eventmsgs import EventType

RECOVERY_TTL_S = 600.0
BLOCK_WINDOW_S = 60.0       # blocked calls are recorded one by one up to a budget per agent and task in this window
FSM_BLOCKED = "FSM_BLOCKED"
UNVERIFIED_WRITE = "UNVERIFIED_WRITE"
SESSION_FINISHED = "SESSION_FINISHED"
OPERATOR_SHELL = "operator-shell"   # who acts when nobody says (`pulsectl mcp` without --agent or PULSE_AGENT)


class CallKind(enum.StrEnum):
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

class Pattern(msgspec.Struct, frozen=True):
    text: str
    prefix: bool = False       # True: covers every key starting with `text`

    def covers(self, key: str) -> bool:
        if key.endswith("*"):      # a whole class ("target:*", a write that named none): only a prefix covers it
            return self.prefix and key[:-1].startswith(self.text)
        return key.startswith(self.text) if self.prefix else key == self.text

    def __str__(self) -> str:
        return self.text + ("*" if self.prefix else "")


def _fields(template: str) -> list[str]:
    import string  # ~1 ms (its Template compiles a pattern): the ledger's readers (pulsectl) fill no template
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
    """Patterns a read or resolve covers. A template ending in '*' is a prefix, and so is one whose
    argument is missing: a read of no particular one looks at the whole class (what it verifies
    still depends on what it returned)."""
    out = set()
    for t in templates:
        if t.endswith("*") and not _fields(t):
            out.add(Pattern(t[:-1], prefix=True))
            continue
        key = _fill(t, args)
        out.add(Pattern(key) if key is not None else Pattern(t.split("{", 1)[0], prefix=True))
    return frozenset(out)


def is_covered(key: str, patterns: frozenset[Pattern]) -> bool:
    return any(p.covers(key) for p in patterns)


# -- descriptors and classification --------------------------------------------------------------------

class Arg(NamedTuple):
    """One argument of a tool: its JSON type, what it means (the model reads it), whether required."""
    type: str                          # string | integer | boolean | object
    description: str
    required: bool = False


class Descriptor(msgspec.Struct, frozen=True):
    """One tool: its kind (static, or chosen by a discriminator argument), the arguments it
    takes, and the resources it touches (as a write) or covers (as a read or resolve)."""
    name: str
    kind: CallKind | None = None
    params: Mapping[str, Arg] = msgspec.field(default_factory=dict)   # the arguments it takes, by name
    touches: tuple[str, ...] = ()      # templates, e.g. "process:{name}"
    covers: tuple[str, ...] = ()       # templates, e.g. "worker:*"
    discriminator: str | None = None   # the argument naming the action, e.g. "action"
    cases: Mapping[str, CallKind] = msgspec.field(default_factory=dict)   # its values; any other value is a write
    touches_fn: Callable[[Mapping[str, Any]], frozenset[str]] | None = None   # when templates cannot say
    verified_by: str = ""              # for writes: what verifies it, in words the model reads
    idempotent: bool = False           # for writes: running it twice does no harm (a write on an
    #                                    uncertain resource is refused unless this says so)
    found: Callable[[Call, Any], Mapping[str, str]] | None = None
    # for reads: what each resource the result is about was found to be, as an opaque identity
    # ("" when it is gone): what tells whether an interrupted write acted
    evidence: Callable[[Call, Any], list[tuple[Pattern, int | None]]] | None = None
    # for reads: what a result is about (a resource, and the event id it was seen at, if it says);
    # default: everything it covers, if the result is not empty
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
        kinds = {d.kind} if d.kind else set(d.cases.values()) | {CallKind.WRITE}
        if CallKind.WRITE in kinds and not (d.touches or d.touches_fn):
            raise ValueError(f"{where}: a write must say which resources it touches")
        if CallKind.WRITE in kinds and not d.verified_by:
            raise ValueError(f"{where}: a write must say what verifies it")
        for t in d.touches + d.covers:
            unknown = [f for f in _fields(t) if f not in d.params]
            if unknown:
                raise ValueError(f"{where}: template {t!r} names unknown parameters {unknown}")


class Call(msgspec.Struct, frozen=True):
    """One classified call."""
    tool: str
    kind: CallKind
    args_hash: str
    touches: frozenset[str] = frozenset()       # writes
    covers: frozenset[Pattern] = frozenset()    # reads and resolves
    why: str = ""                               # how it was classified, when not plainly
    idempotent: bool = False                    # writes: its descriptor says it may run twice


def args_hash(args: Any) -> str:
    import json  # here: the ledger's readers (`pulsectl gate sessions`, the page) hash no call
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)
    return sha256(text.encode()).hexdigest()[:16]


def classify(tools: Mapping[str, Descriptor], name: str, args: Any) -> Call:
    """The call's kind and resources. Fails closed: anything not plainly a read, resolve or
    user_input by its descriptor is a write."""
    digest = args_hash(args)
    d = tools.get(name)
    if d is None:
        return Call(name, CallKind.WRITE, digest, frozenset({f"tool:{name}"}), why="unknown tool")
    if not isinstance(args, Mapping):
        return Call(name, CallKind.WRITE, digest, _write_keys(d, {}), why="arguments are not an object")
    unknown = sorted(set(args) - set(d.params))
    if unknown:
        return Call(name, CallKind.WRITE, digest, _write_keys(d, args), why=f"unrecognised arguments {unknown}")
    kind, why = d.kind, ""
    if d.discriminator is not None:
        value = args.get(d.discriminator)
        case = value.strip().lower() if isinstance(value, str) else None
        kind = d.cases.get(case) if case is not None else None
        if kind is None:
            kind, why = CallKind.WRITE, f"unrecognised {d.discriminator} {value!r}"
    if kind == CallKind.WRITE:
        return Call(name, kind, digest, _write_keys(d, args), why=why, idempotent=d.idempotent and not why)
    if kind in (CallKind.READ, CallKind.RESOLVE):
        return Call(name, kind, digest, covers=covered(d.covers, args))
    return Call(name, kind, digest)


def _write_keys(d: Descriptor, args: Mapping[str, Any]) -> frozenset[str]:
    if d.touches_fn is not None:
        return d.touches_fn(args)
    return touched(d.touches, args) or frozenset({f"tool:{d.name}"})


# -- what the caller records ----------------------------------------------------------------------------

class Record(msgspec.Struct, frozen=True):
    type: str                   # gate-call | gate-blocked
    data: dict


class Blocked(msgspec.Struct, frozen=True):
    """A refused call: `error` is what the model gets back. It is still a call, so it is
    recorded twice: a gate-call (ok false, blocked) and the gate-blocked with the reason; past
    the agent's budget of recorded blocks (GateSession.block_budget), only counted (no record)."""
    error: dict
    call_record: Record | None
    record: Record | None          # the gate-blocked

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(r for r in (self.call_record, self.record) if r is not None)

    @property
    def code(self) -> str:
        return self.error["error"]["code"]

    def text(self) -> str:
        """The text the model sees: the stable code first, then the whole envelope."""
        import json  # here: as in args_hash
        return f"{self.code}: {self.error['error']['reason']}\n{json.dumps(self.error, sort_keys=True)}"


class Admitted(msgspec.Struct, frozen=True):
    ticket: str                 # the call's id, unique on the host
    call: Call
    record: Record | None       # its begin fact (none for user_input, which changes nothing)

    @property
    def records(self) -> tuple[Record, ...]:
        return (self.record,) if self.record else ()


class Recovery(msgspec.Struct):
    """A blocked call the model may yet make right: same tool, same arguments."""
    code: str
    tool: str
    args_hash: str
    created: float
    attempts: int = 1


# -- the ledger: every session's facts, folded ------------------------------------------------------------
# The gate decides on facts, each the data of a gate-call event, folded in events.db order; a fact's
# position is its event id, so "a read that started after the write returned" compares ids, host-wide.
#   open     a session began          {session, agent, task, pid, started}
#   begin    a call began             {session, call, tool, kind, touches, covers}
#   acting   a write's effect is committed (in the effect's own transaction)   {session, call, effect}
#   end      a call returned          {session, call, ok, acted, self_verified, evidence, cancelled}
#   settle   a write whose caller is gone, or that was cancelled, settled from its effect's outcome
#   blocked  a refused call;  finish  the session is done;  reset  the operator's, by agent (and task)
# Who acts is the principal: (agent, task). A new session of the same principal inherits its
# unverified writes and what it looked at; restarting or killing the server forgets nothing.

Principal = tuple[str, str]


class Flight(msgspec.Struct):
    """A call that began and has not returned."""
    call: str
    session: str
    kind: CallKind
    tool: str
    touches: frozenset[str]
    covers: frozenset[Pattern]
    began: int
    effect: str | None = None       # the effect a write committed, once it did
    cancelled: bool = False         # the client gave up on it; its effect's outcome settles it
    before: dict[str, str | None] = msgspec.field(default_factory=dict)   # a write: what its actor last found each key to be


class Uncertain(msgspec.Struct):
    """A resource whose last write's effect may have acted, unknown (interrupted)."""
    tool: str
    agent: str
    task: str
    effect: str | None
    before: str | None              # what the writer had found it to be before the write (None: never looked)
    ended: int                      # where the effect ended
    acted_at: int | None = None     # a look found it changed since: the write acted (settled, for its task)


class Debt(msgspec.Struct):
    tool: str
    began: int
    returned: int


class Change(msgspec.Struct):
    returned: int
    agent: str
    ts: float


class Actor(msgspec.Struct):
    looked: dict[Pattern, int] = msgspec.field(default_factory=dict)   # pattern → where its latest good look began
    unverified: dict[str, Debt] = msgspec.field(default_factory=dict)   # resource → the write that left it so
    verified: int = 0            # its writes that acted and were verified: the changes it can claim
    found: dict[str, tuple[str, int]] = msgspec.field(default_factory=dict)   # resource → (identity, where that look began)


class SessionFacts(msgspec.Struct):
    agent: str
    task: str
    pid: int | None = None
    started: float | None = None    # its process's start time: a pid alone may be reused
    opened: float = 0.0
    last: float = 0.0
    calls: int = 0
    blocked: int = 0
    refused_writes: int = 0         # writes the gate blocked, or that returned without acting
    finished: bool = False


def conflicts(a: str, b: str) -> bool:
    """Two resource keys name overlapping things ("process:*" is every process)."""
    if a == b:
        return True
    if a.endswith("*"):
        return b.startswith(a[:-1])
    return b.endswith("*") and a.startswith(b[:-1])


def about(evidence: Pattern, key: str) -> bool:
    """A read's evidence is about `key`: that resource, or for a whole class, any of its members."""
    return evidence.text.startswith(key[:-1]) if key.endswith("*") else evidence.covers(key)


class HostLedger:
    """What every session on the host has done, folded from its facts. Pure."""

    def __init__(self):
        self.position = 0
        self.sessions: dict[str, SessionFacts] = {}
        self.actors: dict[Principal, Actor] = {}
        self.flights: dict[str, Flight] = {}
        self.changes: dict[str, Change] = {}
        self.uncertain: dict[str, Uncertain] = {}
        self.blocks: dict[Principal, collections.deque[float]] = {}   # when its recorded blocks were

    def recorded_blocks(self, principal: Principal, since: float) -> int:
        """How many of the principal's blocked calls were recorded since `since` (host-wide)."""
        times = self.blocks.get(principal)
        while times and times[0] < since:
            times.popleft()
        return len(times) if times else 0

    def principal(self, session: str) -> Principal:
        s = self.sessions.get(session)
        return (s.agent, s.task) if s else (session, "")

    def actor(self, principal: Principal) -> Actor:
        return self.actors.setdefault(principal, Actor())

    def state(self, principal: Principal) -> State:
        actor = self.actors.get(principal)
        if actor is not None and actor.unverified:
            return State.VERIFYING
        return State.READING if actor is not None and actor.looked else State.RESOLVING

    def apply(self, position: int, ts: float, fact: Mapping[str, Any]) -> list[str]:
        """Fold one fact; returns what it verified (a read's end)."""
        self.position = max(self.position, position)
        phase, sid = fact.get("phase"), fact.get("session")
        if phase == "open":
            self.sessions[sid] = SessionFacts(fact.get("agent") or sid, fact.get("task") or "", fact.get("pid"),
                                              fact.get("started"), opened=ts)
        session = self.sessions.get(sid) if sid else None
        if session is not None:
            session.last = ts
        if phase == "begin":
            touches = frozenset(fact.get("touches", ()))
            writer = self.actors.get(self.principal(sid))
            seen = writer.found if writer is not None else {}
            self.flights[fact["call"]] = Flight(
                fact["call"], sid, CallKind(fact["kind"]), fact["tool"], touches,
                frozenset(Pattern(t, bool(prefix)) for t, prefix in fact.get("covers", ())), position,
                before={k: seen[k][0] if k in seen else None for k in touches})
            if session is not None:
                session.calls += 1
        elif phase == "acting" and fact.get("call") in self.flights:
            self.flights[fact["call"]].effect = fact.get("effect")
        elif phase == "end" and fact.get("call") in self.flights:
            flight = self.flights[fact["call"]]
            if fact.get("cancelled") and flight.kind == CallKind.WRITE and flight.effect and fact.get("acted") is None:
                flight.cancelled = True          # its effect may still act: settled once it ends
                return []
            del self.flights[fact["call"]]
            return self._returned(flight, position, ts, fact)
        elif phase == "settle" and fact.get("call") in self.flights:
            # a settled write returned when its effect ended, not when the settling was written
            return self._returned(self.flights.pop(fact["call"]), fact.get("ended") or position, ts,
                                  {"acted": fact.get("acted"), "uncertain": fact.get("uncertain")})
        elif phase == "blocked" and session is not None:
            session.blocked += 1
            if fact.get("kind") == str(CallKind.WRITE):
                session.refused_writes += 1
            self.blocks.setdefault((session.agent, session.task), collections.deque()).append(ts)
        elif phase == "finish" and session is not None:
            session.finished = True
        elif phase == "reset":
            for (agent, task), actor in self.actors.items():
                if agent == fact.get("agent") and fact.get("task") in (None, task):
                    actor.unverified.clear()
                    if not fact.get("keep_progress"):
                        actor.looked.clear()
            if not fact.get("keep_progress"):       # the operator vouches for what its writes left uncertain
                for key, u in list(self.uncertain.items()):
                    if u.agent == fact.get("agent") and fact.get("task") in (None, u.task):
                        del self.uncertain[key]
        return []

    def _returned(self, flight: Flight, position: int, ts: float, fact: Mapping[str, Any]) -> list[str]:
        principal = self.principal(flight.session)
        actor = self.actor(principal)
        if flight.kind == CallKind.WRITE:
            if fact.get("acted"):
                for key in flight.touches:
                    self.changes[key] = Change(position, principal[0], ts)
                    self.uncertain.pop(key, None)            # a newer change: what it found is moot
                    if fact.get("uncertain"):
                        self.uncertain[key] = Uncertain(flight.tool, *principal, flight.effect,
                                                        flight.before.get(key), position)
                    if fact.get("self_verified"):
                        actor.looked[Pattern(key)] = position      # its own result is a look after it
                    else:
                        actor.unverified[key] = Debt(flight.tool, flight.began, position)
                actor.verified += bool(fact.get("self_verified"))
            elif (session := self.sessions.get(flight.session)) is not None:
                session.refused_writes += 1              # refused by [allow], or failed before it acted
            return []
        if flight.kind not in (CallKind.READ, CallKind.RESOLVE) or not fact.get("ok"):
            return []
        for p in flight.covers:
            actor.looked[p] = max(actor.looked.get(p, 0), flight.began)
        needed = self._found(actor, principal, flight, fact.get("found") or {})
        evidence = [(Pattern(t, bool(prefix)), at) for t, prefix, at in fact.get("evidence", ())]
        # evidence that names its event counts if that event came after the write began (the
        # write's own outcome is news about R); the look itself must start after it returned
        done = sorted(key for key, debt in actor.unverified.items()
                      if flight.began > debt.returned and is_covered(key, flight.covers)
                      and any(about(e, key) and (at is None or at > debt.began) for e, at in evidence))
        for key in done:
            del actor.unverified[key]
        actor.verified += bool(set(done) - needed)     # a write the look shows never acted is no change made
        return done

    def _found(self, actor: Actor, principal: Principal, flight: Flight, found: Mapping[str, str]) -> set[str]:
        """Fold what a look found each resource to be; the uncertain resources it shows still need
        their write (as found before it, or gone) are no longer uncertain: returned."""
        needed = set()
        for key, identity in found.items():
            if not isinstance(identity, str):
                continue
            actor.found[key] = (identity, flight.began)
            u = self.uncertain.get(key)
            if u is None or flight.began <= (u.acted_at or u.ended):
                continue
            if identity == "" or (u.acted_at is None and identity == u.before):
                needed.add(key)
                del self.uncertain[key]
            elif u.acted_at is None:
                u.acted_at = flight.began           # changed since: the write acted
        return needed

    # -- decisions ------------------------------------------------------------------------

    def writes_in_flight(self, principal: Principal) -> list[Flight]:
        return [f for f in self.flights.values() if f.kind == CallKind.WRITE and self.principal(f.session) == principal]

    def unverified(self, principal: Principal) -> str | None:
        """The principal's unverified writes, said as "tool on resources" (the latest write's tool)."""
        actor = self.actors.get(principal)
        if actor is None or not actor.unverified:
            return None
        debt = max(actor.unverified.values(), key=lambda d: d.returned)
        return f"{debt.tool} on {', '.join(sorted(actor.unverified))}"

    def pending(self, principal: Principal) -> list[str]:
        """Every resource the principal changed and has not verified, or is changing now."""
        actor = self.actors.get(principal)
        return sorted(actor.unverified if actor else ()) + sorted(
            k for f in self.writes_in_flight(principal) for k in f.touches)

    def write_refusal(self, session: str, call: Call) -> str | None:
        """Why `session` may not make this write now, or None. Reasons describe the constraint;
        they never name a tool to call."""
        principal = self.principal(session)
        actor = self.actors.get(principal) or Actor()
        if (owed := self.unverified(principal)) is not None:
            return (f"the last write ({owed}) is unverified: it needs a successful read or resolve of the same "
                    "resource that started after the write returned and found it")
        if self.writes_in_flight(principal):
            return "another write is in flight; calls running at once may hold at most one write"
        for flight in self.flights.values():
            if flight.kind != CallKind.WRITE:
                continue
            busy = sorted(j for j in flight.touches if any(conflicts(j, k) for k in call.touches))
            if busy:
                return (f"{busy[0]} is being changed by {self.principal(flight.session)[0]} right now; "
                        "one change at a time per resource")
        if not call.idempotent and (why := self.repeat_refusal(principal, call)) is not None:
            return why
        for key in sorted(call.touches):
            seen = max((at for p, at in actor.looked.items() if p.covers(key)), default=None)
            if seen is None:
                return (f"{key} has not been resolved or read by this agent; a write needs that very resource "
                        "looked at first")
            change = max((c for k, c in self.changes.items() if conflicts(k, key)), key=lambda c: c.returned,
                         default=None)
            if change is not None and seen < change.returned:
                when = time.strftime("%H:%M:%SZ", time.gmtime(change.ts))
                return f"{key} was changed by {change.agent} at {when} after you last looked; look again first"
        return None

    def repeat_refusal(self, principal: Principal, call: Call) -> str | None:
        """Why a non-idempotent write may not touch an uncertain resource now, or None."""
        for key in sorted(call.touches):
            u = self.uncertain.get(key)
            if u is None or (u.acted_at is not None and u.task != principal[1]):
                continue
            effect = f" (effect {u.effect})" if u.effect else ""
            if u.acted_at is None:
                return (f"{u.tool} on {key}{effect} may have acted: its effect was interrupted, outcome unknown; "
                        f"it is not repeated until a look at {key}, started after that, shows it still needed "
                        "(unchanged since before that write, or gone), or the operator resets the gate of "
                        f"{u.agent} (pulsectl gate-reset --agent {u.agent})")
            return (f"{u.tool} on {key}{effect} acted: a look after it found {key} changed since before it; "
                    "this task does not repeat it unless a later look finds it gone")
        return None

    def finish_refusal(self, session: str) -> str | None:
        principal = self.principal(session)
        owed = self.unverified(principal) or ("a write still in flight" if self.writes_in_flight(principal) else None)
        if owed is None:
            return None
        return f"a write is unverified ({owed}); the session cannot finish on an unverified change"

    def summary(self, session: str) -> dict:
        """One session as `pulsectl gate sessions` shows it."""
        s = self.sessions.get(session) or SessionFacts(session, "")
        principal = (s.agent, s.task)
        actor = self.actors.get(principal) or Actor()
        return {"session": session, "agent": s.agent, "task": s.task or None, "pid": s.pid,
                "state": "FINISHED" if s.finished else str(self.state(principal)),
                "unverified": sorted(actor.unverified), "calls": s.calls, "blocked": s.blocked,
                "in_flight": sum(1 for f in self.flights.values() if f.session == session),
                "opened": s.opened, "last": s.last}


def records_of(outcome: Any) -> tuple[Record, ...]:
    if outcome is None:
        return ()
    return (outcome,) if isinstance(outcome, Record) else outcome.records


def complete(ledger: HostLedger, record: Record, position: int, ts: float) -> None:
    """Fold a fact about to be committed at `position`, and add to it what the fold says (what it
    verified, the state after), so the event tells the whole step."""
    if record.type != EventType.GATE_CALL:
        return
    verified = ledger.apply(position, ts, record.data)
    if verified:
        record.data["verified"] = verified
    if record.data.get("phase") in ("begin", "end", "settle", "finish") and "session" in record.data:
        record.data["state"] = str(ledger.state(ledger.principal(record.data["session"])))


class MemoryStore:
    """Facts kept in memory, positioned as they come: the gate alone, for tests and a single process."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.ledger, self.clock = HostLedger(), clock

    def transact(self, decide: Callable[[], Any]) -> Any:
        """Decide on the ledger as it is; commit (here: fold) the records the outcome carries."""
        outcome = decide()
        for record in records_of(outcome):
            complete(self.ledger, record, self.ledger.position + 1, self.clock())
        return outcome


def reset_fact(agent: str, task: str | None, keep_progress: bool, by: str = "operator") -> Record:
    """The operator's reset of an agent (of one task, or None: all its tasks)."""
    return Record(EventType.GATE_CALL, {"phase": "reset", "tool": "reset", "kind": "reset", "agent": agent,
                                "task": task, "keep_progress": keep_progress, "by": by})


# -- the session ------------------------------------------------------------------------------------------

class GateSession:
    """One agent session's view of the gate. `begin` before a tool runs, `end` after it returns,
    `finish` when the agent says it is done; `reset` is the operator's. Each decision is taken on
    the store's ledger and committed as a fact before the call proceeds (`store.transact`)."""

    def __init__(self, session_id: str, tools: Mapping[str, Descriptor], clock: Callable[[], float] = time.time,
                 recovery_ttl_s: float = RECOVERY_TTL_S, agent: str | None = None, task: str = "",
                 store: Any = None, block_budget: int = 30):
        check_registry(tools)
        self.id = session_id
        self.tools = tools
        self.clock = clock
        self.recovery_ttl_s = recovery_ttl_s
        self.agent, self.task = agent or session_id, task
        self.store = store if store is not None else MemoryStore(clock)
        self.calls = 0
        self.blocked = 0                            # this process's count; the ledger keeps the session's
        # At most block_budget blocked calls of this agent and task are recorded per BLOCK_WINDOW_S,
        # host-wide; the rest are counted here and the count rides on this session's next fact, so a
        # model that keeps calling a refused tool cannot fill events.db.
        self.block_budget = block_budget
        self.uncounted_blocks = 0
        self.recoveries: dict[tuple[str, str], Recovery] = {}

    @property
    def ledger(self) -> HostLedger:
        return self.store.ledger

    @property
    def principal(self) -> Principal:
        return (self.agent, self.task)

    @property
    def state(self) -> State:
        return self.ledger.state(self.principal)

    @property
    def finished(self) -> bool:
        facts = self.ledger.sessions.get(self.id)
        return facts is not None and facts.finished

    def open(self, pid: int | None = None, started: float | None = None) -> Record:
        """The session's first fact: who acts, and its process (to settle what it leaves in flight)."""
        return self.store.transact(lambda: Record(EventType.GATE_CALL, {
            "phase": "open", "session": self.id, "agent": self.agent, "task": self.task or None,
            "pid": pid, "started": started}))

    def _opened(self) -> None:
        if self.id not in self.ledger.sessions:     # not opened (the gate alone): its first call does
            self.ledger.sessions[self.id] = SessionFacts(self.agent, self.task, opened=self.clock())

    # -- before a call ------------------------------------------------------------------

    def begin(self, tool: str, args: Any) -> Admitted | Blocked:
        call = classify(self.tools, tool, args)
        return self.store.transact(lambda: self._begin(call))

    def _begin(self, call: Call) -> Admitted | Blocked:
        self._opened()
        if self.finished:
            return self._block(SESSION_FINISHED, call, "the session called finish; it takes no more calls")
        reason = self.ledger.write_refusal(self.id, call) if call.kind == CallKind.WRITE else None
        if reason is not None:
            return self._block(FSM_BLOCKED, call, reason)
        self.calls += 1
        ticket = f"{self.id}#{self.calls}"
        if call.kind == CallKind.USER_INPUT:            # changes nothing: only its end is recorded
            return Admitted(ticket, call, None)
        data = {"phase": "begin", "session": self.id, "call": ticket, "tool": call.tool, "kind": str(call.kind),
                "args_hash": call.args_hash, "state_before": str(self.state), **self._coalesced()}
        if call.touches:
            data["touches"] = sorted(call.touches)
        if call.covers:
            data["covers"] = sorted([p.text, p.prefix] for p in call.covers)
        if call.why:
            data["classified"] = call.why
        return Admitted(ticket, call, Record(EventType.GATE_CALL, data))

    # -- after a call -------------------------------------------------------------------

    def end(self, admitted: Admitted, ok: bool, result: Any = None, acted: bool | None = None,
            cancelled: bool = False) -> Record:
        """The call returned. `ok`: it succeeded. For a write, `acted` says whether the host may have
        changed (default: ok); a write that acted, even if it failed, must be verified like one that
        succeeded. `cancelled`: the client gave up on it; if it committed an effect and `acted` is
        not known, the effect's outcome settles it."""
        return self.store.transact(lambda: self._end(admitted, ok, result, acted, cancelled))

    def _end(self, admitted: Admitted, ok: bool, result: Any, acted: bool | None, cancelled: bool) -> Record:
        call = admitted.call
        data: dict = {"phase": "end", "session": self.id, "call": admitted.ticket, "tool": call.tool,
                      "kind": str(call.kind), "args_hash": call.args_hash, "ok": ok, "state_before": str(self.state)}
        if call.kind == CallKind.WRITE:
            did = None if cancelled and acted is None else (ok if acted is None else acted)
            data.update(touches=sorted(call.touches), acted=did,
                        self_verified=bool(did) and ok and has_verification(result))
        elif ok and call.kind in (CallKind.READ, CallKind.RESOLVE):
            d = self.tools.get(call.tool)
            found = d.evidence(call, result) if d is not None and d.evidence is not None else \
                ([(p, None) for p in call.covers] if has_evidence(result) else [])
            data["evidence"] = [[p.text, p.prefix, at] for p, at in sorted(found, key=lambda f: str(f[0]))]
            if d is not None and d.found is not None:
                data["found"] = dict(d.found(call, result))
        if call.covers:
            data["covers"] = sorted(str(p) for p in call.covers)
        if cancelled:
            data["cancelled"] = True
        if call.why:
            data["classified"] = call.why
        if ok and (recovered := self._recovered(call)):
            data["recovered"] = recovered
        return Record(EventType.GATE_CALL, data)

    # -- the agent's "I'm done" ---------------------------------------------------------

    def finish(self, args: Any = None) -> Record | Blocked:
        call = Call("finish", CallKind.USER_INPUT, args_hash(args or {}))
        return self.store.transact(lambda: self._finish(call))

    def _finish(self, call: Call) -> Record | Blocked:
        self._opened()
        if self.finished:
            return self._block(SESSION_FINISHED, call, "the session already finished")
        reason = self.ledger.finish_refusal(self.id)
        if reason is not None:
            return self._block(UNVERIFIED_WRITE, call, reason)
        data = {"phase": "finish", "session": self.id, "tool": "finish", "kind": "finish", "ok": True,
                **self._coalesced()}
        if recovered := self._recovered(call):
            data["recovered"] = recovered
        return Record(EventType.GATE_CALL, data)

    # -- reset (the operator's, never a tool the agent holds) ------------------------------------------

    def reset(self, keep_progress: bool = False) -> Record:
        """Forget this principal's unverified writes; plain also forgets what it looked at (back to
        RESOLVING) and this session's recoveries."""
        before = self.state
        record = self.store.transact(lambda: reset_fact(self.agent, self.task, keep_progress))
        if not keep_progress:
            self.recoveries.clear()
        record.data.update(state_before=str(before), state=str(self.state))
        return record

    # -- blocks and recoveries ----------------------------------------------------------

    def _block(self, code: str, call: Call, reason: str) -> Blocked:
        self.blocked += 1
        recovery = self._track(code, call)
        kind = "finish" if call.tool == "finish" else str(call.kind)
        state = str(self.state)
        error = {"ok": False, "error": {"code": code, "state": state, "tool": call.tool, "kind": kind,
                                        "reason": reason, "recoverable": True}}
        data = {"session": self.id, "agent": self.agent, "tool": call.tool, "kind": kind,
                "args_hash": call.args_hash, "code": code, "state": state, "reason": reason,
                "blocked_total": self.blocked, "attempts": recovery.attempts}
        if call.why:
            data["classified"] = call.why
        if self._over_block_budget():
            self.uncounted_blocks += 1
            return Blocked(error, None, None)
        data.update(self._coalesced())
        as_call = {"phase": "blocked", "session": self.id, "tool": call.tool, "kind": kind,
                   "args_hash": call.args_hash, "ok": False, "blocked": code, "state_before": state, "state": state}
        return Blocked(error, Record(EventType.GATE_CALL, as_call), Record(EventType.GATE_BLOCKED, data))

    def oversized(self, tool: str, args_hash: str, size: int, preview: str) -> Record | None:
        """A call too large to classify (INVALID_INPUT): recorded by hash and a preview, within the
        budget of recorded blocks; past it, counted."""
        return self.store.transact(lambda: self._oversized(tool, args_hash, size, preview))

    def _oversized(self, tool: str, args_hash: str, size: int, preview: str) -> Record | None:
        self._opened()
        if self._over_block_budget():
            self.uncounted_blocks += 1
            return None
        return Record(EventType.GATE_CALL, {"phase": "blocked", "session": self.id, "tool": tool, "ok": False,
                                    "blocked": "INVALID_INPUT", "args_hash": args_hash, "args_bytes": size,
                                    "preview": preview, **self._coalesced()})

    def _over_block_budget(self) -> bool:
        return self.ledger.recorded_blocks(self.principal, self.clock() - BLOCK_WINDOW_S) >= self.block_budget

    def _coalesced(self) -> dict:
        """The blocked calls counted but not recorded since this session's last fact, once."""
        n, self.uncounted_blocks = self.uncounted_blocks, 0
        return {"blocks_not_recorded": n} if n else {}

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
        return {**self.ledger.summary(self.id), "recoveries": len(self.recoveries)}


def has_evidence(result: Any) -> bool:
    """A read's result is about something: not empty (no events, no samples, nothing found). In a
    mapping, its lists and mappings say; scalars beside them (a count, a time) are about nothing."""
    if isinstance(result, Mapping):
        containers = [v for v in result.values() if isinstance(v, (list, tuple, Mapping))]
        return any(containers) if containers else bool(result)
    return result not in (None, "", [], ())


def has_verification(result: Any) -> bool:
    """A write's result that verifies itself: {"verification": {"ok": true, ...}}, set by Pulse's
    own code (never by the model) when the result itself proves the change."""
    return isinstance(result, Mapping) and isinstance(result.get("verification"), Mapping) \
        and result["verification"].get("ok") is True
