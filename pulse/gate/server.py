"""The gate's side of `pulsectl mcp`: a unix socket served inside Pulse (the executor's gate role),
on which every tool call of every agent session is decided, run and recorded.

The agent's process runs only a thin proxy (pulse.gate.proxy): MCP over stdio on one side,
this socket on the other. Identity is decided here, never taken from the client:

- A session that presents a run token (PULSE_RUN_TOKEN, put in the run's environment by the
  agent-run effect through this server's RunGate: registered before the run starts and revoked
  when it ends; pulse.gate.runs) IS that run's agent and task, whatever `--agent`, PULSE_AGENT or
  PULSE_TASK say. Once the run is revoked, its sessions' calls answer RUN_ENDED.
- A session without one is the operator's shell only when its peer (SO_PEERCRED) has the uid
  this process runs as; it may name an agent (`--agent`), but never a task: a tokenless session
  can never act as, verify for or finish for a run. Any other peer is refused, NOT_OPERATOR.

One client connection is one gate session (pulse.gate.tools.ToolSession); its facts name the
proxy's pid, so a proxy that dies leaves its writes to be settled from their effects' outcomes,
and its calls in flight are cancelled (recorded; a write's effect settles it). What goes over the
connection is pulse.gate.protocol's messages, one JSON object per line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from pulse.agents import runcgroup
from pulse.core.wire.eventmsgs import EventType
from pulse.gate import policy, protocol, sockets
from pulse.gate.durable import DurableStore
from pulse.gate.protocol import Answer, Call, Cancel, Hello, Question, Reset, ToolError
from pulse.gate.runs import RunGate, RunIdentity, RunTokens
from pulse.store import eventsdb, projection

MAX_LINE = 16 * 1024 * 1024          # a call's line longer than this closes the connection (calls are bounded far below)
HELLO_MAX_BYTES = 4 * 1024           # a hello is a few hundred bytes: longer, refused before it is parsed
READ_CHUNK = 64 * 1024               # the stream's limit: what one connection holds buffered before it is read
LISTEN_BACKLOG = 100                 # asyncio's own default: connections that wait while the loop starts


# -- who is on the other end ------------------------------------------------------------------------------

def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a unix socket's peer, as the kernel recorded them at connect."""
    fmt = "3i"
    return struct.unpack(fmt, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt)))


class Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def check_run_cgroup(identity: RunIdentity, peer_pid: int | None) -> None:
    """Refused unless the peer is a process inside the run's cgroup (when the run has one): a token
    read from another run's /proc/<pid>/environ, or kept by a process that outlived its run, is
    worth nothing outside it. Checked at the hello and again at every call."""
    if identity.cgroup is not None and not runcgroup.holds(identity.cgroup, peer_pid):
        raise Refused("NOT_YOUR_RUN", f"process {peer_pid} is not one of run {identity.run}'s (not in its cgroup): "
                                      "a run's token is honoured only from that run's own processes")


def identify(hello: Hello, peer_uid: int, operator_uid: int, tokens: RunTokens,
             peer_pid: int | None = None) -> tuple[str, str, RunIdentity | None]:
    """(agent, task, the run or None) a session is, from its hello and its peer's uid and pid;
    Refused if none."""
    token = hello.token
    if token:
        identity = tokens.lookup(token)
        if identity is None and (ended := tokens.ended_run(token)) is not None:
            raise Refused("RUN_ENDED", f"run {ended} has ended: its token is revoked and no session can act for it")
        if identity is None:
            raise Refused("RUN_UNKNOWN", "this run token is not one of a live run (it ended, or was never "
                                         "issued): the session cannot act for any run")
        if identity.uid is not None and peer_uid not in (identity.uid, operator_uid):
            raise Refused("NOT_YOUR_RUN", f"uid {peer_uid} presented the token of a run of uid {identity.uid}")
        check_run_cgroup(identity, peer_pid)
        return identity.agent, identity.task, identity
    if peer_uid != operator_uid:
        raise Refused("NOT_OPERATOR", f"uid {peer_uid} is not the operator's ({operator_uid}) and presented no "
                                      "run token: only an agent run started by Pulse or the operator may use the gate")
    if (inside := runcgroup.run_of(peer_pid)) is not None:     # a run that drops its token is still that run
        raise Refused("NOT_OPERATOR", f"process {peer_pid} is one of run {inside}'s (in its cgroup) and presented "
                                      "no run token: a run's processes are never the operator")
    return hello.agent or policy.OPERATOR_SHELL, "", None


# -- framing: one line, bounded, read a chunk at a time ------------------------------------------------------
# Nothing of a caller is read whole before it is known: its hello may be HELLO_MAX_BYTES, and the
# stream holds at most READ_CHUNK of it (asyncio pauses the socket past twice that), so a flood of
# huge "hellos" costs the gate a chunk each, not their size, and its loop never parses them.

class FrameTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"a line of more than {limit} bytes")
        self.limit = limit


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One line (with its newline) of at most max_bytes, b"" at the end of the stream; FrameTooLarge,
    having read no more than a chunk past max_bytes, when it is longer."""
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as over:      # no newline in the chunk buffered: take it, go on
            chunk = await reader.readexactly(over.consumed)
            size += len(chunk)
            if size > max_bytes:
                raise FrameTooLarge(max_bytes) from None
            parts.append(chunk)
            continue
        except asyncio.IncompleteReadError as eof:
            if not parts and not eof.partial:
                return b""
            raise
        size += len(chunk)
        if size > max_bytes + 1:
            raise FrameTooLarge(max_bytes)
        parts.append(chunk)
        return b"".join(parts)


async def read_hello(reader: asyncio.StreamReader, timeout_s: float) -> Hello | Reset:
    """The connection's first line, bounded (HELLO_MAX_BYTES) and timed ([gate] hello_timeout_s)."""
    try:
        line = await asyncio.wait_for(read_frame(reader, HELLO_MAX_BYTES), timeout_s)
    except FrameTooLarge as err:
        raise Refused("BAD_REQUEST", f"a hello is at most {err.limit} bytes: this one is longer") from None
    try:
        return protocol.opening_decoder.decode(line or b"null")
    except msgspec.DecodeError as err:     # ValidationError included: it names the field
        raise Refused("BAD_REQUEST", f"a session opens with a hello (one JSON object on a line): {err}") from None


# -- how many connections at once -------------------------------------------------------------------------

@dataclass
class Connections:
    """The gate's open connections, counted in total, per peer uid and per peer pid (the gate's
    loop alone touches them)."""
    total: int = 0
    per_uid: dict[int, int] = field(default_factory=dict)
    per_pid: dict[int, int] = field(default_factory=dict)

    def add(self, pid: int, uid: int) -> None:
        self.total += 1
        self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
        self.per_pid[pid] = self.per_pid.get(pid, 0) + 1

    def remove(self, pid: int, uid: int) -> None:
        self.total -= 1
        for counts, key in ((self.per_uid, uid), (self.per_pid, pid)):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]


def over_limit(open_: Connections, pid: int, uid: int, limits) -> str | None:
    """Why one more connection from (pid, uid) would be one too many ([gate] max_sessions,
    max_sessions_per_uid, max_sessions_per_pid), the narrowest first, or None when it may open."""
    if open_.per_pid.get(pid, 0) >= limits.max_sessions_per_pid:
        return f"process {pid} holds {open_.per_pid[pid]} sessions, its limit ([gate] max_sessions_per_pid)"
    if open_.per_uid.get(uid, 0) >= limits.max_sessions_per_uid:
        return f"uid {uid} holds {open_.per_uid[uid]} sessions, its limit ([gate] max_sessions_per_uid)"
    if open_.total >= limits.max_sessions:
        return f"the gate holds {open_.total} sessions, its limit ([gate] max_sessions)"
    return None


# -- how fast one agent may call --------------------------------------------------------------------------
# Every call and every session open of one agent and task (host-wide: all its sessions together) takes
# a token from its bucket ([gate] calls_per_min, refilled continuously, holding at most call_burst);
# with none left it is answered RATE_LIMITED with retry_after_s before the gate sees it, so it records
# nothing and changes no gate state. This is what bounds the bytes an agent adds to events.db per
# minute: admitted calls are two facts each and must stay durable one by one.

@dataclass
class Bucket:
    tokens: float
    at: float           # monotonic time of the last refill


def take(bucket: Bucket, now: float, per_min: float, burst: float) -> float:
    """Take a token: 0.0 when the call may go, else the seconds until a token will be there."""
    bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * per_min / 60.0)
    bucket.at = now
    if bucket.tokens >= 1.0:
        bucket.tokens -= 1.0
        return 0.0
    return (1.0 - bucket.tokens) * 60.0 / per_min


BUCKETS_KEPT = 4096     # past this, buckets that have refilled to full (they hold no debt) are dropped


class CallRates:
    """One bucket per (agent, task), for the gate's loop alone."""

    def __init__(self, per_min: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.per_min, self.burst, self.clock = per_min, burst, clock
        self.buckets: dict[tuple[str, str], Bucket] = {}

    def retry_after(self, agent: str, task: str) -> float:
        now = self.clock()
        if len(self.buckets) >= BUCKETS_KEPT:
            full_after = self.burst * 60.0 / self.per_min
            self.buckets = {k: b for k, b in self.buckets.items() if now - b.at < full_after}
        bucket = self.buckets.setdefault((agent, task), Bucket(self.burst, now))
        return take(bucket, now, self.per_min, self.burst)


def rate_limited(agent: str, wait_s: float, per_min: int) -> dict:
    return {"code": "RATE_LIMITED", "retry_after_s": max(0.001, round(wait_s, 3)),   # never 0: that reads as "now"
            "message": f"{agent} calls faster than [gate] calls_per_min ({per_min}) allows: nothing was done or "
                       f"recorded; retry in {wait_s:.2f} s"}


# -- the server -------------------------------------------------------------------------------------------

def listen_unix(path: str, mode: int) -> socket.socket:
    """A listening unix socket at `path`, born 0600 (the umask is the process's: never wider, even for
    a moment), then opened as far as `mode` says."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(LISTEN_BACKLOG)
    return sock


class GateServer:
    """Serves the gate on a unix socket from an asyncio loop of its own thread (start/stop from the
    owning worker). `config`: anything with the fields PulseTools reads (process, allow, timings,
    gate)."""

    def __init__(self, paths, config, path: str, tokens: RunTokens | None = None, mode: int = 0o600,
                 accounts: dict[int, int] | None = None):
        """`accounts`: uid → gid of each agent account ([[agent]] user) that gets a socket of its own,
        in [gate] socket_dir (pulse.gate.sockets); the main socket is `mode` (pulsed's account's).
        `tokens`: the live runs' (a registry of its own when None); `runs` hands them to the runs
        this process starts."""
        self.paths, self.config, self.path, self.mode = paths, config, path, mode
        self.tokens = tokens if tokens is not None else RunTokens()
        self.run_gate = RunGate(self.tokens, self.run_socket)
        self.accounts = dict(accounts or {})
        self.account_paths: dict[int, str] = {}
        self.account_errors: list[str] = []
        self.operator_uid = os.getuid()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.listening: list[socket.socket | None] = []   # bound by `bind`, served by the loop once started
        self.turned = time.monotonic()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.connections = Connections()
        self.open_by_run: dict[str, set[Callable[[], None]]] = {}   # run id → how to end each of its open sessions
        self.ending: set[asyncio.Future] = set()

    # -- lifecycle (the owner's thread) ----------------------------------------------------------

    def bind(self) -> None:
        """Make the sockets (the main one, and each agent account's): before the owner says Ready, so a
        client that connects at once waits in the listen backlog until `start` serves it."""
        try:
            os.unlink(self.path)           # a predecessor's, dead with it
        except FileNotFoundError:
            pass
        try:
            self.listening = [listen_unix(self.path, self.mode)]
        except OSError as err:
            raise RuntimeError(f"the gate did not start on {self.path}: {err!r}") from None
        self.listening += [self._account_socket(uid, gid) for uid, gid in sorted(self.accounts.items())]

    def start(self, timeout_s: float = 10.0) -> None:
        """Serve the bound sockets from the loop's thread; returns once it serves (`bind` first)."""
        self.tokens.listeners.append(self._run_ended)
        self.thread = threading.Thread(target=self._serve, name="gate-server", daemon=True)
        self.thread.start()
        if not self.ready.wait(timeout_s) or self.error is not None:
            raise RuntimeError(f"the gate did not start on {self.path}: {self.error!r}")

    def alive(self, within_s: float) -> bool:
        return self.thread is not None and self.thread.is_alive() and time.monotonic() - self.turned < within_s

    def stop(self, timeout_s: float = 3.0) -> None:
        if self._run_ended in self.tokens.listeners:
            self.tokens.listeners.remove(self._run_ended)
        if self.loop is not None and self.thread is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopping.set)
            self.thread.join(timeout_s)
        for sock in self.listening:    # those a loop served are closed already; those it never did, here
            if sock is not None:
                sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        for uid, path in self.account_paths.items():
            sockets.remove_account_dir(os.path.dirname(path), uid, self.operator_uid)

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:    # seen by the owner through alive()/start()
            self.error = err
            self.ready.set()

    async def _main(self) -> None:
        from pulse.gate.tools import PulseTools  # ~100-200 ms: in the gate's thread, once it runs
        self.loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        self.events = eventsdb.open_events(self.paths.events_db)     # used from this loop's thread only
        self.tools = PulseTools(self.paths, self.config, self.events, asyncio.to_thread, asyncio.sleep)
        # One ledger for every session this process serves (each decision still catches up on what
        # others committed first): a session that made its own folded every gate fact in events.db
        # again at its hello, a cost that grew with the history.
        self.store = DurableStore(self.events, checkpoints=self.paths.home / projection.DIRECTORY)
        self.rates = CallRates(self.config.gate.calls_per_min, self.config.gate.call_burst)
        servers = [await asyncio.start_unix_server(self._client, sock=sock, limit=READ_CHUNK)
                   for sock in self.listening if sock is not None]
        self.ready.set()
        try:
            while not self.stopping.is_set():
                self.turned = time.monotonic()
                try:
                    await asyncio.wait_for(self.stopping.wait(), 0.25)
                except asyncio.TimeoutError:
                    pass
        finally:
            for each in servers:
                each.close()
            self.events.close()

    def _account_socket(self, uid: int, gid: int) -> socket.socket | None:
        """The socket of one agent account, in a directory only it can enter; None (said in the log,
        and its runs' sessions answer GATE_UNAVAILABLE) when its place is not safe to make it in."""
        shared = self.config.gate.socket_dir
        try:
            if not shared:
                raise sockets.SocketDirError(f"uid {uid} runs an agent: [gate] socket_dir must name a directory "
                                                 "its account can traverse")
            sockets.check_socket_dir(shared, self.operator_uid)
            path = sockets.account_socket(shared, self.paths.runtime, uid)
            sockets.make_account_dir(os.path.dirname(path), uid, self.operator_uid)
            sock = listen_unix(path, 0o666)   # while only root can enter its directory; then only the account
            sockets.hand_over(os.path.dirname(path), uid, gid)
        except (OSError, sockets.SocketDirError) as err:
            self.account_errors.append(str(err))
            logging.getLogger("pulse.executor").error("gate: no socket for uid %d: %s", uid, err)
            return None
        self.account_paths[uid] = path
        return sock

    def run_socket(self, uid: int | None) -> str:
        """The socket a run under `uid` is handed: its account's own, else the main one."""
        return self.account_paths.get(uid, self.path) if uid is not None else self.path

    # -- a run that ended: its sessions end with it -----------------------------------------------------

    def _run_ended(self, run: str) -> None:
        """(A runner thread, as the run's token is revoked.) Its open sessions are told RUN_ENDED and
        closed, their calls in flight answered so: a lingering `pulsectl mcp` of an ended run holds
        no connection and acts for nobody."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._end_sessions, run)
            except RuntimeError:        # the loop closed meanwhile: so did every session
                pass

    def _end_sessions(self, run: str) -> None:
        for end in list(self.open_by_run.pop(run, ())):
            end()

    # -- one connection: one session ----------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid, uid, _ = peer_credentials(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        busy = over_limit(self.connections, pid, uid, self.config.gate)
        if busy is not None:    # refused before a byte is read: it costs the gate no session and no fact
            try:
                writer.write(protocol.encode(protocol.Refused("GATE_BUSY", f"{busy}: retry once one ends", retry=True)))
                await writer.drain()
            except (ConnectionError, RuntimeError):
                pass
            writer.close()
            return
        self.connections.add(pid, uid)
        try:
            await self._serve_connection(reader, writer, pid, uid)
        finally:
            self.connections.remove(pid, uid)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int,
                                uid: int) -> None:
        """One client connection: a reset, or one session's calls until the proxy goes (or its run ends)."""
        from pulse.gate.tools import ToolSession, instructions, tool_list  # as in _main
        lock = asyncio.Lock()

        async def send(message: protocol.Message) -> None:
            async with lock:
                writer.write(protocol.encode(message))
                await writer.drain()

        calls: dict[int, asyncio.Task] = {}
        run: RunIdentity | None = None
        ended = asyncio.Event()

        def end_of_run() -> None:
            ended.set()
            ending = asyncio.ensure_future(self._refuse_ended(run, calls, send, writer))
            self.ending.add(ending)             # held until done: the loop keeps only weak references
            ending.add_done_callback(self.ending.discard)
        try:
            try:
                opening = await read_hello(reader, self.config.gate.hello_timeout_s)
                if isinstance(opening, Reset):      # `pulsectl gate-reset`: the operator's alone
                    _, _, run = identify(Hello(), uid, self.operator_uid, self.tokens, pid)
                    store = DurableStore(self.events, "gate", checkpoints=self.paths.home / projection.DIRECTORY)
                    await send(operator_reset(store, opening.session, opening.agent, opening.keep_progress))
                    return
                agent, task, run = identify(opening, uid, self.operator_uid, self.tokens, pid)
            except Refused as refused:
                await send(protocol.Refused(refused.code, refused.message))
                return
            if run is not None:
                if not self.tokens.is_live(run.run):      # revoked between its hello and now
                    await send(protocol.Refused("RUN_ENDED", f"run {run.run} has ended: its token is revoked"))
                    return
                self.open_by_run.setdefault(run.run, set()).add(end_of_run)
            wait_s = self.rates.retry_after(agent, task)     # an open is one fact: it takes a token too
            if wait_s:
                await send(protocol.Refused(retry=True, **rate_limited(agent, wait_s, self.config.gate.calls_per_min)))
                return
            session = ToolSession(self.tools, agent=agent, task=task, pid=pid, store=self.store)
            claimed = opening.agent
            await send(protocol.Welcome(
                session.gate.id, agent, task, run.run if run else None, protocol.VERSION, tool_list(self.config.allow),
                instructions(self.config.allow),
                ignored=f"--agent {claimed!r}: a run's session is its run's agent" if run and claimed and claimed != agent
                else None))
            while not ended.is_set() and (line := await read_frame(reader, MAX_LINE)):
                try:
                    request = protocol.request_decoder.decode(line)
                except msgspec.DecodeError as err:     # ValidationError included: it names the field
                    await send(protocol.answer_error(request_id(line), ToolError("BAD_REQUEST", str(err))))
                    continue
                if isinstance(request, Cancel):
                    task_ = calls.get(request.of)
                    if task_ is not None:
                        task_.cancel()
                    continue
                calls[request.id] = asyncio.create_task(self._call(session, run, request, send, pid))
                calls[request.id].add_done_callback(lambda _t, i=request.id: calls.pop(i, None))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                asyncio.TimeoutError, FrameTooLarge):
            pass        # the proxy went away, said nothing, or sent what no proxy sends: the session ends
        finally:
            if run is not None:
                self.open_by_run.get(run.run, set()).discard(end_of_run)
                if not self.open_by_run.get(run.run, True):
                    self.open_by_run.pop(run.run, None)
            for task_ in list(calls.values()):    # the proxy is gone: nobody waits for these answers
                task_.cancel()
            if not ended.is_set():               # else _refuse_ended closes it once it has said why
                writer.close()

    async def _refuse_ended(self, run: RunIdentity, calls: dict, send, writer) -> None:
        """A run's session as its run ends: each call in flight is cancelled (the gate records it; a
        write's effect settles it) and answered RUN_ENDED, then the session is refused RUN_ENDED,
        which the proxy keeps answering, and closed."""
        err = ToolError("RUN_ENDED", f"run {run.run} has ended: its token is revoked and its session can no "
                                     "longer act")
        try:
            for ident, task_ in list(calls.items()):
                task_.cancel()
                await send(protocol.answer_error(ident, err))
            await send(protocol.Refused(err.code, err.message))
        except (ConnectionError, RuntimeError):
            pass
        finally:
            writer.close()

    async def _call(self, session, run: RunIdentity | None, request: Call | Question, send,
                    pid: int | None = None) -> None:
        ident = request.id
        if run is not None and not self.tokens.is_live(run.run):
            err = ToolError("RUN_ENDED", f"run {run.run} has ended: its token is revoked and its session can "
                                         "no longer act")
            await send(protocol.answer_error(ident, err))
            return
        if run is not None:
            try:
                check_run_cgroup(run, pid)      # the peer may have died and its pid been reused
            except Refused as refused:
                await send(protocol.answer_error(ident, ToolError(refused.code, refused.message)))
                return
        wait_s = self.rates.retry_after(session.gate.agent, session.gate.task)
        if wait_s:
            await send(protocol.answer_error(ident, ToolError(**rate_limited(session.gate.agent, wait_s,
                                                                             self.config.gate.calls_per_min))))
            return
        if isinstance(request, Question):
            session.record(policy.Record(EventType.GATE_CALL, {"session": session.gate.id, "tool": "ask_operator",
                                                       "kind": "user_input", "ok": True, "round": "question"}))
            await send(Answer(ident, {"ok": True, "data": {}}, ""))
            return
        envelope, text = await session.call(request.name, request.args, operator_of(request.operator))
        try:
            await send(Answer(ident, envelope, text))
        except (ConnectionError, RuntimeError):
            pass


def request_id(line: bytes) -> int | None:
    """The id of a request the gate could not read, when it has one: its answer names it."""
    try:
        ident = msgspec.json.decode(line).get("id")
    except (msgspec.DecodeError, AttributeError):
        return None
    return ident if isinstance(ident, int) and not isinstance(ident, bool) else None


def operator_of(answer: protocol.OperatorAnswer | None):
    """How ask_operator reaches a person in this call: the proxy asked its client first and sends
    the answer or why there is none; None when its client has nobody to ask."""
    if answer is None:
        return None

    async def answered(_question: str) -> str:
        if answer.answer is not None:
            return answer.answer
        code, text = answer.error or ("NO_ANSWER", "the operator did not answer")
        raise ToolError(code, text)
    return answered


# -- the operator's reset -----------------------------------------------------------------------------------

def operator_reset(store, session: str | None, agent: str | None, keep_progress: bool) -> protocol.ResetDone:
    """Reset the gate of a session (by its full id) or of every session of an agent: forget its
    unverified writes and, unless keep_progress, what it has looked at."""
    store.catch_up()
    ledger = store.ledger
    if session is not None:
        facts = ledger.sessions.get(session)
        if facts is None:
            return protocol.ResetDone(1, [], f"no gate session {session!r} (`pulsectl gate sessions` lists them)")
        agent, task = facts.agent, facts.task
    else:
        if agent not in {s.agent for s in ledger.sessions.values()}:
            return protocol.ResetDone(1, [], f"agent {agent!r} has no gate session (`pulsectl gate sessions` lists them)")
        task = None
    principals = [p for p in ledger.actors if p[0] == agent and task in (None, p[1])]
    before = {p: (str(ledger.state(p)), sorted(ledger.actors[p].unverified)) for p in principals}
    store.transact(lambda: policy.reset_fact(agent, task, keep_progress))
    out = []
    for p in sorted(before):
        state, unverified = before[p]
        what = f"forgot unverified {', '.join(unverified)}" if unverified else "no unverified write"
        flying = [f for f in ledger.flights.values() if ledger.principal(f.session) == p and f.kind == policy.CallKind.WRITE]
        if flying:      # a reset cannot end an effect: its write holds the resource until the effect ends
            what += "; still in flight: " + ", ".join(
                f"{f.tool} on {', '.join(sorted(f.touches))} (effect {f.effect or 'not yet committed'}, released when it ends)"
                for f in flying)
        out.append(f"{p[0]}{f' task {p[1]}' if p[1] else ''}: {state} → {ledger.state(p)} ({what})")
    if not principals:
        out.append(f"{agent}: nothing to reset (it has made no call)")
    return protocol.ResetDone(0, out)
