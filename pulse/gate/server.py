"""The gate's side of `pulsectl mcp`: a unix socket served inside Pulse (the executor's gate role),
on which every tool call of every agent session is decided, run and recorded.

The agent's process runs only a thin proxy (pulse.agents.gateproxy): MCP over stdio on one side,
this socket on the other. Identity is decided here, never taken from the client:

- A session that presents a run token (PULSE_RUN_TOKEN, put in the run's environment by the
  agent-run effect, registered in RUN_TOKENS before the run starts and revoked when it ends) IS
  that run's agent and task, whatever `--agent`, PULSE_AGENT or PULSE_TASK say. Once the run is
  revoked, its sessions' calls answer RUN_ENDED.
- A session without one is the operator's shell only when its peer (SO_PEERCRED) has the uid
  this process runs as; it may name an agent (`--agent`), but never a task: a tokenless session
  can never act as, verify for or finish for a run. Any other peer is refused, NOT_OPERATOR.

One connection is one gate session (pulse.agents.toolserver.GatedSession); its facts name the
proxy's pid, so a proxy that dies leaves its writes to be settled from their effects' outcomes,
and its calls in flight are cancelled (recorded; a write's effect settles it).

Wire: one JSON object per line each way. The client opens with {"op": "hello", "token", "agent"},
answered {"op": "welcome", ...} or {"op": "refused", "code", "message"} (and the connection
closes; GATE_BUSY, "retry": true, when the gate holds as many connections as [gate] max_sessions,
max_sessions_per_uid or max_sessions_per_pid allow, before the hello is read). When a run ends,
its sessions' calls in flight are answered RUN_ENDED, then {"op": "refused", "code": "RUN_ENDED"}
comes unasked and the connection closes. Then {"id", "op": "call", "name", "args", "operator"} → {"id", "envelope", "text"};
{"id", "op": "question"} records an ask_operator question round; {"op": "cancel", "of": id}
cancels a call. Replies may come in any order (calls run concurrently, as the gate's batch
rule expects). `pulsectl gate-reset` opens with {"op": "reset", "session" | "agent",
"keep_progress"} instead (tokenless, the operator's uid only) and gets {"code", "out", "err"}.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pulse.agents import gate, runcgroup
from pulse.store import projection

TOKEN_ENV = "PULSE_RUN_TOKEN"       # the run's capability, in its environment only
# ... or in a file of the run's scratch directory (0600, the run's), named here: for a CLI that can
# hand its MCP server an environment only on its command line, which every account can read
SOCKET_ENV = "PULSE_GATE_SOCKET"    # where a run's proxy finds the gate (the home may be out of its reach)
MAX_LINE = 16 * 1024 * 1024          # a call's line longer than this closes the connection (calls are bounded far below)
HELLO_MAX_BYTES = 4 * 1024           # a hello is a few hundred bytes: longer, refused before it is parsed
READ_CHUNK = 64 * 1024               # the stream's limit: what one connection holds buffered before it is read
PROTOCOL = 1


# -- run tokens -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunIdentity:
    run: str          # the agent-run effect's id
    agent: str
    task: str
    uid: int | None = None   # the account the run's processes run as ([[agent]] user), if any
    # the run's cgroup, as /proc/<pid>/cgroup names it ((controller, path), ...; pulse.agents.runcgroup):
    # its token is honoured only from a process inside it. None: the host gave the run none.
    cgroup: tuple[tuple[str, str], ...] | None = None


ENDED_KEPT = 4096     # ended runs remembered (by token hash), so a late session hears RUN_ENDED, not RUN_UNKNOWN


class RunTokens:
    """The live runs' capabilities, kept in the process that serves the gate (the executor, which
    starts and ends the runs): registered before a run starts, revoked when it ends. Only a hash
    is kept, so nothing here can be read back into a token. Thread-safe (runner threads register
    and revoke, the gate's loop looks up). `listeners` hear each revoked run's id, in the revoking
    thread: the gate ends that run's open sessions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[str, RunIdentity] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()   # token hash → run id, the newest ENDED_KEPT
        self.ended_runs: set[str] = set()                    # their run ids: their sessions answer RUN_ENDED
        self.listeners: list[Callable[[str], None]] = []

    @staticmethod
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode(errors="replace")).hexdigest()

    def register(self, run: str, agent: str, task: str, uid: int | None = None,
                 cgroup: tuple[tuple[str, str], ...] | None = None) -> str:
        """A new unguessable token for `run` (256 bits)."""
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.live[self.digest(token)] = RunIdentity(run, agent, task, uid, cgroup)
            self.ended_runs.discard(run)
        return token

    def revoke(self, token: str) -> None:
        digest = self.digest(token)
        with self.lock:
            identity = self.live.pop(digest, None)
            if identity is None:
                return
            self.ended[digest] = identity.run
            self.ended_runs.add(identity.run)
            while len(self.ended) > ENDED_KEPT:
                self.ended_runs.discard(self.ended.popitem(last=False)[1])
            listeners = list(self.listeners)
        for listener in listeners:
            listener(identity.run)

    def lookup(self, token: str) -> RunIdentity | None:
        with self.lock:
            return self.live.get(self.digest(token))

    def ended_run(self, token: str) -> str | None:
        """The id of the ended run this token was (one of the last ENDED_KEPT), else None."""
        with self.lock:
            return self.ended.get(self.digest(token))

    def is_live(self, run: str) -> bool:
        with self.lock:
            return run not in self.ended_runs


RUN_TOKENS = RunTokens()


# -- where the socket is ----------------------------------------------------------------------------------

def socket_path(paths, socket_dir: str = "") -> str:
    """The gate's socket: in pulsed's private runtime directory, or in [gate] socket_dir (named for
    that runtime directory, so two homes never share one) when the runs' own accounts must reach it."""
    if not socket_dir:
        return str(paths.gate_socket)
    return os.path.join(socket_dir, f"{paths.runtime.name}.gate.sock")


SERVING: list[str] = []      # the socket this process serves (the executor's), for the runs it starts
SERVING_ACCOUNTS: dict[int, str] = {}   # uid → the socket it serves that account alone (pulse.agents.gatesockets)


def run_socket(uid: int | None) -> str | None:
    """The socket a run under `uid` is handed: its account's own, else the main one (None: not serving)."""
    if uid is not None and uid in SERVING_ACCOUNTS:
        return SERVING_ACCOUNTS[uid]
    return SERVING[0] if SERVING else None


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


def identify(hello: dict, peer_uid: int, operator_uid: int, tokens: RunTokens,
             peer_pid: int | None = None) -> tuple[str, str, RunIdentity | None]:
    """(agent, task, the run or None) a session is, from its hello and its peer's uid and pid;
    Refused if none."""
    token = hello.get("token")
    if token:
        identity = tokens.lookup(str(token))
        if identity is None and (ended := tokens.ended_run(str(token))) is not None:
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
    agent = hello.get("agent")
    return (agent if isinstance(agent, str) and agent else gate.OPERATOR_SHELL), "", None


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


async def read_hello(reader: asyncio.StreamReader, timeout_s: float) -> Any:
    """The session's first line, bounded (HELLO_MAX_BYTES) and timed ([gate] hello_timeout_s), as JSON."""
    try:
        line = await asyncio.wait_for(read_frame(reader, HELLO_MAX_BYTES), timeout_s)
    except FrameTooLarge as err:
        raise Refused("BAD_REQUEST", f"a hello is at most {err.limit} bytes: this one is longer") from None
    try:
        return json.loads(line or b"null")
    except ValueError:
        raise Refused("BAD_REQUEST", "a session opens with a hello (one JSON object on a line)") from None


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

class GateServer:
    """Serves the gate on a unix socket from an asyncio loop of its own thread (start/stop from the
    owning worker). `config`: anything with the fields PulseTools reads (process, allow, timings,
    gate)."""

    def __init__(self, paths, config, path: str, tokens: RunTokens = RUN_TOKENS, mode: int = 0o600,
                 accounts: dict[int, int] | None = None):
        """`accounts`: uid → gid of each agent account ([[agent]] user) that gets a socket of its own,
        in [gate] socket_dir (pulse.agents.gatesockets); the main socket is `mode` (pulsed's account's)."""
        self.paths, self.config, self.path, self.tokens, self.mode = paths, config, path, tokens, mode
        self.accounts = dict(accounts or {})
        self.account_paths: dict[int, str] = {}
        self.account_errors: list[str] = []
        self.operator_uid = os.getuid()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.turned = time.monotonic()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.connections = Connections()
        self.runs: dict[str, set[Callable[[], None]]] = {}    # run id → how to end each of its open sessions
        self.ending: set[asyncio.Future] = set()

    # -- lifecycle (the owner's thread) ----------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> None:
        SERVING[:] = [self.path]
        SERVING_ACCOUNTS.clear()
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
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        from pulse.agents import gatesockets
        for uid, path in self.account_paths.items():
            gatesockets.remove_account_dir(os.path.dirname(path), uid, self.operator_uid)

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:    # seen by the owner through alive()/start()
            self.error = err
            self.ready.set()

    async def _main(self) -> None:
        from pulse.agents.toolserver import PulseTools
        from pulse.store import eventsdb
        self.loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        self.events = eventsdb.open_events(self.paths.events_db)     # used from this loop's thread only
        self.tools = PulseTools(self.paths, self.config, self.events, asyncio.to_thread, asyncio.sleep)
        # One ledger for every session this process serves (each decision still catches up on what
        # others committed first): a session that made its own folded every gate fact in events.db
        # again at its hello, a cost that grew with the history.
        from pulse.agents.gatestore import DurableStore
        self.store = DurableStore(self.events, checkpoints=self.paths.home / projection.DIRECTORY)
        self.rates = CallRates(self.config.gate.calls_per_min, self.config.gate.call_burst)
        try:
            os.unlink(self.path)           # a predecessor's, dead with it
        except FileNotFoundError:
            pass
        old = os.umask(0o177)              # the socket is born 0600, then opened as far as `mode` says
        try:
            server = await asyncio.start_unix_server(self._client, self.path, limit=READ_CHUNK)
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)
        servers = [server, *[await self._account_server(uid, gid) for uid, gid in sorted(self.accounts.items())]]
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
                if each is not None:
                    each.close()
            self.events.close()

    async def _account_server(self, uid: int, gid: int):
        """The socket of one agent account, in a directory only it can enter; None (said in the log,
        and its runs' sessions answer GATE_UNAVAILABLE) when its place is not safe to make it in."""
        import logging

        from pulse.agents import gatesockets
        shared = self.config.gate.socket_dir
        try:
            if not shared:
                raise gatesockets.SocketDirError(f"uid {uid} runs an agent: [gate] socket_dir must name a directory "
                                                 "its account can traverse")
            gatesockets.check_socket_dir(shared, self.operator_uid)
            path = gatesockets.account_socket(shared, self.paths.runtime, uid)
            gatesockets.make_account_dir(os.path.dirname(path), uid, self.operator_uid)
            old = os.umask(0o177)          # the umask is the process's: never wider, even for a moment
            try:
                server = await asyncio.start_unix_server(self._client, path, limit=READ_CHUNK)
            finally:
                os.umask(old)
            os.chmod(path, 0o666)          # while only root can enter its directory; then only the account
            gatesockets.hand_over(os.path.dirname(path), uid, gid)
        except (OSError, gatesockets.SocketDirError) as err:
            self.account_errors.append(str(err))
            logging.getLogger("pulse.executor").error("gate: no socket for uid %d: %s", uid, err)
            return None
        self.account_paths[uid] = path
        SERVING_ACCOUNTS[uid] = path
        return server

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
        for end in list(self.runs.pop(run, ())):
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
                writer.write(json.dumps({"op": "refused", "code": "GATE_BUSY", "retry": True,
                                         "message": f"{busy}: retry once one ends"}).encode() + b"\n")
                await writer.drain()
            except (ConnectionError, RuntimeError):
                pass
            writer.close()
            return
        self.connections.add(pid, uid)
        try:
            await self._session(reader, writer, pid, uid)
        finally:
            self.connections.remove(pid, uid)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int, uid: int) -> None:
        from pulse.agents.toolserver import GatedSession, instructions, tool_list
        lock = asyncio.Lock()

        async def send(message: dict) -> None:
            async with lock:
                writer.write(json.dumps(message, default=str).encode() + b"\n")
                await writer.drain()

        calls: dict[Any, asyncio.Task] = {}
        run: RunIdentity | None = None
        ended = asyncio.Event()

        def end_of_run() -> None:
            ended.set()
            ending = asyncio.ensure_future(self._refuse_ended(run, calls, send, writer))
            self.ending.add(ending)             # held until done: the loop keeps only weak references
            ending.add_done_callback(self.ending.discard)
        try:
            try:
                hello = await read_hello(reader, self.config.gate.hello_timeout_s)
                if not isinstance(hello, dict) or hello.get("op") not in ("hello", "reset"):
                    raise Refused("BAD_REQUEST", "a session opens with a hello")
                agent, task, run = identify(hello, uid, self.operator_uid, self.tokens, pid)
                if hello["op"] == "reset":          # `pulsectl gate-reset`: the operator's alone
                    if run is not None:
                        raise Refused("NOT_OPERATOR", "a run cannot reset the gate")
                    from pulse.agents.gatestore import DurableStore
                    store = DurableStore(self.events, "gate", checkpoints=self.paths.home / projection.DIRECTORY)
                    await send(operator_reset(store, hello.get("session"),
                                              hello.get("agent"), bool(hello.get("keep_progress"))))
                    return
            except Refused as refused:
                await send({"op": "refused", "code": refused.code, "message": refused.message})
                return
            if run is not None:
                if not self.tokens.is_live(run.run):      # revoked between its hello and now
                    await send({"op": "refused", "code": "RUN_ENDED",
                                "message": f"run {run.run} has ended: its token is revoked"})
                    return
                self.runs.setdefault(run.run, set()).add(end_of_run)
            wait_s = self.rates.retry_after(agent, task)     # an open is one fact: it takes a token too
            if wait_s:
                await send({"op": "refused", "retry": True, **rate_limited(agent, wait_s, self.config.gate.calls_per_min)})
                return
            session = GatedSession(self.tools, agent=agent, task=task, pid=pid, store=self.store)
            claimed = hello.get("agent")
            await send({"op": "welcome", "session": session.gate.id, "agent": agent, "task": task,
                        "run": run.run if run else None, "protocol": PROTOCOL,
                        "tools": tool_list(self.config.allow), "instructions": instructions(self.config.allow),
                        **({"ignored": f"--agent {claimed!r}: a run's session is its run's agent"}
                           if run and claimed and claimed != agent else {})})
            while not ended.is_set() and (line := await read_frame(reader, MAX_LINE)):
                try:
                    message = json.loads(line)
                except ValueError:
                    await send({"id": None, "envelope": {"ok": False, "error": {"code": "BAD_REQUEST",
                                                                              "message": "not JSON"}}})
                    continue
                op = message.get("op") if isinstance(message, dict) else None
                if op == "cancel":
                    task_ = calls.get(message.get("of"))
                    if task_ is not None:
                        task_.cancel()
                elif op in ("call", "question"):
                    ident = message.get("id")
                    calls[ident] = asyncio.create_task(self._call(session, run, message, send, pid))
                    calls[ident].add_done_callback(lambda _t, i=ident: calls.pop(i, None))
                else:
                    await send({"id": message.get("id") if isinstance(message, dict) else None,
                                "envelope": {"ok": False, "error": {"code": "BAD_REQUEST",
                                                                    "message": f"no op {op!r}"}}})
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                asyncio.TimeoutError, FrameTooLarge):
            pass        # the proxy went away, said nothing, or sent what no proxy sends: the session ends
        finally:
            if run is not None:
                self.runs.get(run.run, set()).discard(end_of_run)
                if not self.runs.get(run.run, True):
                    self.runs.pop(run.run, None)
            for task_ in list(calls.values()):    # the proxy is gone: nobody waits for these answers
                task_.cancel()
            if not ended.is_set():               # else _refuse_ended closes it once it has said why
                writer.close()

    async def _refuse_ended(self, run: RunIdentity, calls: dict, send, writer) -> None:
        """A run's session as its run ends: each call in flight is cancelled (the gate records it; a
        write's effect settles it) and answered RUN_ENDED, then the session is refused RUN_ENDED,
        which the proxy keeps answering, and closed."""
        from pulse.agents.toolserver import ToolError
        err = ToolError("RUN_ENDED", f"run {run.run} has ended: its token is revoked and its session can no "
                                     "longer act")
        try:
            for ident, task_ in list(calls.items()):
                task_.cancel()
                await send({"id": ident, "envelope": err.envelope(), "text": f"{err.code}: {err.message}"})
            await send({"op": "refused", "code": err.code, "message": err.message})
        except (ConnectionError, RuntimeError):
            pass
        finally:
            writer.close()

    async def _call(self, session, run: RunIdentity | None, message: dict, send, pid: int | None = None) -> None:
        from pulse.agents.toolserver import ToolError
        ident = message.get("id")
        if run is not None and not self.tokens.is_live(run.run):
            err = ToolError("RUN_ENDED", f"run {run.run} has ended: its token is revoked and its session can "
                                         "no longer act")
            await send({"id": ident, "envelope": err.envelope(), "text": f"{err.code}: {err.message}"})
            return
        if run is not None:
            try:
                check_run_cgroup(run, pid)      # the peer may have died and its pid been reused
            except Refused as refused:
                err = ToolError(refused.code, refused.message)
                await send({"id": ident, "envelope": err.envelope(), "text": f"{err.code}: {err.message}"})
                return
        wait_s = self.rates.retry_after(session.gate.agent, session.gate.task)
        if wait_s:
            err = ToolError(**{k: v for k, v in rate_limited(session.gate.agent, wait_s,
                                                            self.config.gate.calls_per_min).items()})
            await send({"id": ident, "envelope": err.envelope(), "text": f"{err.code}: {err.message}"})
            return
        if message.get("op") == "question":
            session.record(gate.Record("gate-call", {"session": session.gate.id, "tool": "ask_operator",
                                                     "kind": "user_input", "ok": True, "round": "question"}))
            await send({"id": ident, "envelope": {"ok": True, "data": {}}, "text": ""})
            return
        operator = operator_of(message.get("operator"))
        envelope, text = await session.call(message.get("name"), message.get("args"), operator)
        try:
            await send({"id": ident, "envelope": envelope, "text": text})
        except (ConnectionError, RuntimeError):
            pass


def operator_of(answer: Any):
    """How ask_operator reaches a person in this call: the proxy asked its client first and sends
    {"answer": text} or {"error": [code, message]}; None when its client has nobody to ask."""
    from pulse.agents.toolserver import ToolError
    if not isinstance(answer, dict):
        return None

    async def answered(_question: str) -> str:
        if isinstance(answer.get("answer"), str):
            return answer["answer"]
        code, text = (answer.get("error") or ["NO_ANSWER", "the operator did not answer"])[:2]
        raise ToolError(str(code), str(text))
    return answered


# -- the operator's reset -----------------------------------------------------------------------------------

def operator_reset(store, session: str | None, agent: str | None, keep_progress: bool) -> dict:
    """Reset the gate of a session (by its full id) or of every session of an agent: forget its
    unverified writes and, unless keep_progress, what it has looked at. {"code", "out": lines, "err"}."""
    store.catch_up()
    ledger = store.ledger
    if session is not None:
        facts = ledger.sessions.get(session)
        if facts is None:
            return {"code": 1, "out": [], "err": f"no gate session {session!r} (`pulsectl gate sessions` lists them)"}
        agent, task = facts.agent, facts.task
    else:
        if agent not in {s.agent for s in ledger.sessions.values()}:
            return {"code": 1, "out": [],
                    "err": f"agent {agent!r} has no gate session (`pulsectl gate sessions` lists them)"}
        task = None
    principals = [p for p in ledger.actors if p[0] == agent and task in (None, p[1])]
    before = {p: (str(ledger.state(p)), sorted(ledger.actors[p].unverified)) for p in principals}
    store.transact(lambda: gate.reset_fact(agent, task, keep_progress))
    out = []
    for p in sorted(before):
        state, unverified = before[p]
        what = f"forgot unverified {', '.join(unverified)}" if unverified else "no unverified write"
        flying = [f for f in ledger.flights.values() if ledger.principal(f.session) == p and f.kind == gate.CallKind.WRITE]
        if flying:      # a reset cannot end an effect: its write holds the resource until the effect ends
            what += "; still in flight: " + ", ".join(
                f"{f.tool} on {', '.join(sorted(f.touches))} (effect {f.effect or 'not yet committed'}, released when it ends)"
                for f in flying)
        out.append(f"{p[0]}{f' task {p[1]}' if p[1] else ''}: {state} → {ledger.state(p)} ({what})")
    if not principals:
        out.append(f"{agent}: nothing to reset (it has made no call)")
    return {"code": 0, "out": out, "err": None}
