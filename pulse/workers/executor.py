"""The executor process: claims effects from events.db and carries them out (Execute).

The main loop (the harness's: it heartbeats, so nothing here may block it):
  scan      on the doorbell, every executor_scan_interval_ms (the doorbell's fallback: a lost
            doorbell costs latency, never an effect), and soon after an effect is put back.
            Read the open effects; settle orphans (executing under a dead claimer); expire
            pending effects past their deadline (unless their kind keeps them: an idempotent
            notification waits for a channel to take it, however long); dispatch the rest,
            oldest first, keeping up to executor_concurrency in flight so a slow effect blocks
            nothing.
  built-in  kinds (pulse.effects.registry) go to a runner thread: claim (a transaction that fails if
            someone claimed first), run with the effect's timeout, record acked or failed.
  engine    any other kind goes to the engine's executors (RunExecutor over the engine RPC,
            with an absolute deadline; replies matched by id, late ones dropped). It is claimed
            only once a Pong shows the engine can take it: while the engine is down such an
            effect stays pending, unclaimed, until its deadline expires it.
  results   threads hand back what became of each effect through a pipe the loop polls; an
            ended effect rings the tick's wake socket, so rules see outcomes at once.

Threads: executor_concurrency runners and one bookkeeper (orphans, expiry, the claims and results
of engine effects), each with its own events.db connection at synchronous FULL: the claim of a
non-idempotent effect must survive power loss, or the effect could run twice. The loop's own
connection only reads. Threads live as long as the process, because PR_SET_PDEATHSIG of the
processes effects start fires when the thread that started them exits. A database error in a
thread crashes the executor on purpose: pulsed restarts it and the successor settles what was in flight.

Claimer ids are "pid:start-ticks@boot-id", so a successor can tell a claimer is dead even across
pid reuse or a reboot. An orphan (its claimer dead) is settled by first killing what is left of
its recorded process group (and awaiting it; still alive: left for the next scan), then: idempotent
→ put back to pending (it runs again: at least once); not idempotent → failed, reason "interrupted"
(at most once; never silently twice). That happens at startup and at every scan.

Stopping (SIGTERM): the loop ends and the process exits. Effects still running die with it
(PDEATHSIG) and the next executor settles them as orphans. Processes restart-process started
under their keepers are the exception by design: they are the restarted services, not leftovers,
and must outlive Pulse (see pulse.effects.kinds and pulse.effects.keeper).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import os
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import zmq

from pulse.agents.agentrun import run_account
from pulse.core import client, clock
from pulse.core.states import EFFECT_ENDED, EffectState
from pulse.core.wakepipe import drain, poke
from pulse.core.wire import codec, doorbells, enginerpc, eventmsgs
from pulse.effects import kinds, registry
from pulse.effects.kinds import EffectFailed
from pulse.store import ballast, connection, effectqueue, eventsdb
from pulse.workers.harness import Worker

# The kinds that higher layers plug in (entry points: ~50 ms to scan the installed distributions)
# are looked up here, at import: the forkserver preloads this module, so every executor and tick it
# forks starts with them known instead of scanning at each start.
registry.all_kinds()

SOURCE = "executor"
SCAN_LIMIT = 1_000               # open effects read per scan; more are picked up by the next ones
RESCAN_SOON_S = 0.05             # after an effect is put back, or a scan did not hold every pending effect
ENGINE_TRUST_S = 2.0             # any reply from the engine vouches for it this long
PING_RETRY_S = 0.2               # an unreachable engine is asked again no sooner than this
CLOCK_SLACK_S = 2.0              # process start times are known to about a second (btime is whole seconds)
MAX_ENGINE_REPLY = 1024 * 1024   # what the engine can send back

log = logging.getLogger("pulse.executor")


# -- claimers ----------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process, or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[19])


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def claimer_id(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    if stat is None:
        raise ProcessLookupError(pid)
    return f"{pid}:{stat[1]}@{boot_id()}"


def claimer_alive(claimer: str | None, boot: str) -> bool:
    """Is the process that made this claim still running? An id in another form can never be shown alive."""
    pid, _, rest = (claimer or "").partition(":")
    ticks, _, claimer_boot = rest.partition("@")
    if claimer_boot != boot or not pid.isdigit() or not ticks.isdigit():
        return False
    stat = _stat(int(pid))
    return stat is not None and stat[1] == int(ticks) and stat[0] not in ("Z", "X")


# -- threads -----------------------------------------------------------------------------------------

def retry_later(effect: enginerpc.Effect, data: dict, first_retry_s: float) -> bool:
    """A failure its kind puts back in the queue (a notification that could not get out), with
    time left before its deadline, or whatever its deadline if the kind never expires it (an
    idempotent notification no channel took: kept until one does)."""
    kind = registry.get(effect.kind)
    if kind is None or kind.retry_failed is None or not kind.retry_failed(effect, data):
        return False
    return not registry.expires(effect) or effect.deadline - time.time() > first_retry_s


@dataclass
class Done:
    """A thread's word to the loop about one effect.

    outcome: acked | failed | expired (ended) · requeued (pending again) · held (left pending by its
    kind's reserve: asked again at a later scan) · lost (someone else
    has it, or it already ended) · kept (an orphan whose processes are not gone yet) ·
    claimed (an engine effect, ours to send) · crashed (the thread hit an error: stop) ·
    disk-full (a write could not commit: nothing of it was written; retried)."""
    effect_id: str
    outcome: str
    effect: enginerpc.Effect | None = None


Job = Callable[[sqlite3.Connection], Done]


DISK_FULL = "disk-full"
DISK_FULL_RETRY_S = 1.0   # a write the full disk refused is tried again this long after


class Pool:
    """Long-lived threads running jobs, each thread with its own events.db connection (FULL)."""

    def __init__(self, size: int, name: str, db_path: Path, deliver: Callable[[Done], None]):
        self.jobs: queue.SimpleQueue[tuple[str, Job]] = queue.SimpleQueue()
        self.size, self.name, self.db_path, self.deliver = size, name, db_path, deliver

    def start(self) -> None:
        """Start its threads (jobs submitted before wait in the queue). Each Thread.start() waits
        for the new thread to take the GIL once: milliseconds apiece, after Ready, not before."""
        for i in range(self.size):
            threading.Thread(target=self._loop, name=f"{self.name}-{i}", daemon=True).start()

    def submit(self, effect_id: str, job: Job) -> None:
        self.jobs.put((effect_id, job))

    def _loop(self) -> None:
        conn = None
        while True:
            effect_id, job = self.jobs.get()
            try:
                conn = conn or eventsdb.open_events(self.db_path, "FULL")
                done = job(conn)
            except sqlite3.OperationalError as err:
                if not ballast.is_full_disk(err):
                    log.exception("effect %s: the executor cannot go on", effect_id)
                    done = Done(effect_id, "crashed")
                else:
                    done = Done(effect_id, DISK_FULL)
            except Exception:
                log.exception("effect %s: the executor cannot go on", effect_id)
                done = Done(effect_id, "crashed")
            self.deliver(done)


@dataclass
class EngineCall:
    effect: enginerpc.Effect
    expires: float               # time.monotonic(): no answer by then, and it is settled without one


# -- the worker --------------------------------------------------------------------------------------

class ExecutorWorker(Worker):
    name = "executor"

    def open(self) -> None:
        t = self.config.timings
        self.concurrency = t.executor_concurrency
        self.scan_s = t.executor_scan_interval_ms / 1000
        self.rpc_deadline_s = t.engine_rpc_deadline_ms / 1000
        self.retry_base_s, self.retry_max_s = t.effect_retry_base_ms / 1000, t.effect_retry_max_ms / 1000
        self.boot = boot_id()
        self.claimer = claimer_id()
        self.objects = getattr(self.paths, "objects", self.paths.home / "objects")
        self.process_names = {p.name for p in self.config.process}
        for problem in registry.unknown_kinds(self.config.allow.kinds):
            self.log.warning("[allow] %s; fine only if the engine declares it (pulsectl check-config asks it)",
                             problem)
        self.db = eventsdb.open_events(self.paths.events_db, "FULL")   # the loop only reads with it

        self.results: collections.deque[Done] = collections.deque()
        self.results_r, self.results_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.handlers[self.results_r] = self.on_results
        self.runners = Pool(self.concurrency, "runner", self.paths.events_db, self.deliver)
        self.bookkeeper = Pool(1, "bookkeeper", self.paths.events_db, self.deliver)

        self.doorbell = self.socket(zmq.PULL, self.paths.endpoint("doorbell"), bind=True, handler=self.on_doorbell)
        self.engine = self.socket(zmq.DEALER, self.paths.endpoint("engine"), bind=False,
                                  handler=self.on_engine_reply, IMMEDIATE=1, MAXMSGSIZE=MAX_ENGINE_REPLY)
        self.wake = self.socket(zmq.PUSH, self.paths.endpoint("wake"), bind=False, **client.DOORBELL)

        self.in_flight: dict[str, enginerpc.Effect] = {}         # dispatched, not yet over
        self.booked: set[str] = set()                       # effect ids with a bookkeeping job queued
        # Effects a full disk stopped midway: maybe claimed by us and run, the end unwritten. The scan
        # settles them as it settles a dead claimer's (an idempotent one runs again, another fails
        # "interrupted"): never twice, never left executing.
        self.disk_full: set[str] = set()
        self.candidates: dict[str, enginerpc.Effect] = {}        # pending at the last scan, not yet dispatched
        self.retries: dict[str, int] = {}                   # notification id → failed attempts (runner threads write)
        self.retry_at: dict[str, float] = {}                # notification id → monotonic time of its next try
        self.more_pending = False                           # the last scan did not hold them all
        self.engine_calls: dict[int, EngineCall] = {}
        self.rpc_ids = itertools.count(1)
        self.ping: tuple[int, float] | None = None          # (request id, monotonic deadline)
        self.next_ping = 0.0
        self.engine_trusted_until = 0.0
        self.next_scan = time.monotonic()                   # the first scan settles orphans at once
        self.log.info("claimer %s, %d effects at once", self.claimer, self.concurrency)
        self.open_gate()

    def on_ready(self) -> None:
        self.gate.start()          # before the runners: no run starts before its gate serves
        self.runners.start()
        self.bookkeeper.start()

    # -- the gate role: the agents' tool calls are decided here (pulse.gate.server) --------------
    # Here, not in a worker of its own: the executor starts and ends the agent runs, so a run's token
    # is registered with the gate and revoked in the very process that serves it (no registry to
    # share or to lose: the server's RunGate is handed to each effect it runs, EffectContext.gate),
    # and a gate without an executor could decide writes that nothing carries out.

    def open_gate(self) -> None:
        from pulse.gate.server import GateServer  # ~100 ms: on the way to Ready
        from pulse.gate.sockets import socket_path
        path = socket_path(self.paths, self.config.gate.socket_dir)
        # pulsed's account's alone; each agent account gets a socket of its own (pulse.gate.sockets)
        self.gate = GateServer(self.paths, self.config, path, mode=0o600, accounts=self.agent_accounts())
        # Bound now, served from on_ready: its thread's start (a loop, a connection to events.db, the
        # ledger) need not hold Ready up; a session that connects meanwhile waits in the listen backlog.
        self.gate.bind()
        self.log.info("gate on %s%s", path, "".join(f"; uid {uid} on {p}" for uid, p in self.gate.account_paths.items()))

    def agent_accounts(self) -> dict[int, int]:
        """uid → gid of every [[agent]] that runs under an account of its own (an unknown one is said
        once here, and its runs fail as they start)."""
        if not any(agent.user or agent.group for agent in self.config.agent):
            return {}                   # and agentrun (a third of a second to import) stays unimported
        accounts = {}
        for agent in self.config.agent:
            try:
                account = run_account(agent)
            except EffectFailed as err:
                self.log.error("gate: %s", err)
                continue
            if account is not None and account[0] != os.getuid():
                accounts[account[0]] = account[1]
        return accounts

    def healthy(self) -> bool:
        # a gate loop that stopped turning withholds the heartbeat: pulsed replaces the executor
        return self.gate.alive(max(2 * self.config.timings.heartbeat_ms / 1000, 2.0))

    def close(self) -> None:
        # Runner threads are left as they are: the process exits next, and the processes they
        # started die with it (PDEATHSIG); the next executor settles those effects.
        self.gate.stop()
        for sock in (self.doorbell, self.engine, self.wake):
            sock.close()
        self.db.close()

    # -- timers and inputs -------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        times = [self.next_scan, *(call.expires for call in self.engine_calls.values())]
        if self.ping is not None:
            times.append(self.ping[1])
        return min(times)

    def on_timer(self, now: float) -> None:
        if self.ping is not None and now >= self.ping[1]:
            self.ping = None                 # unanswered: asked again when an engine effect waits
        for request_id in [r for r, call in self.engine_calls.items() if call.expires <= now]:
            effect = self.engine_calls.pop(request_id).effect
            self.book(effect.id, functools.partial(self.after_no_answer, effect))
        if now >= self.next_scan:
            self.scan(now)

    def on_doorbell(self) -> None:
        rang = False
        for message in self.messages(self.doorbell, doorbells.Doorbell, "doorbell"):
            self.log.debug("doorbell from %s", message.source)
            rang = True
        if rang:
            self.scan(time.monotonic())

    def deliver(self, done: Done) -> None:
        """From any thread: queue a result and wake the loop."""
        self.results.append(done)
        poke(self.results_w)

    def on_results(self) -> None:
        drain(self.results_r)
        now, ended, engine_only = time.monotonic(), False, True
        while self.results:
            done = self.results.popleft()
            self.booked.discard(done.effect_id)
            if done.outcome == "crashed":
                raise RuntimeError(f"a database error while handling effect {done.effect_id} (logged above)")
            if done.outcome == "claimed":
                self.call_engine(done.effect, now)
                continue
            if done.outcome == DISK_FULL:
                self.on_disk_full(done.effect_id, now)
            effect = self.in_flight.pop(done.effect_id, None)
            kind = registry.get(effect.kind) if effect is not None else None
            if kind is not None and kind.release is not None:
                kind.release(done.effect_id)
            if done.outcome in EFFECT_ENDED:
                ended, engine_only = True, engine_only and effect is not None and effect.origin == "engine"
                self.retries.pop(done.effect_id, None)
                self.retry_at.pop(done.effect_id, None)
            if done.outcome == "held":
                self.next_scan = min(self.next_scan, self.retry_at.get(done.effect_id, now + self.scan_s))
            if done.outcome == "requeued":
                self.next_scan = min(self.next_scan, self.retry_at.get(done.effect_id, now + RESCAN_SOON_S))
        if ended:
            # The tick paces wakes that only the engine's own effects' outcomes caused (a rule that
            # answers every outcome must not spin it); any other outcome wakes it at once.
            self.ring_tick("engine-effect-ended" if engine_only else "effect-ended")
        self.dispatch(now)

    def on_disk_full(self, effect_id: str, now: float) -> None:
        if ballast.release(self.paths.home / "ballast"):
            self.log.error("disk full: released the ballast so the effects that free space can commit")
        if effect_id not in self.disk_full:
            self.log.error("effect %s: disk full, its write did not commit; retried in %.0f s", effect_id,
                           DISK_FULL_RETRY_S)
        self.disk_full.add(effect_id)
        self.retry_at[effect_id] = now + DISK_FULL_RETRY_S
        self.next_scan = min(self.next_scan, now + DISK_FULL_RETRY_S)

    def ring_tick(self, reason: str) -> None:
        try:
            self.wake.send(codec.encode(doorbells.Wake(SOURCE, reason)), zmq.NOBLOCK)
        except zmq.Again:
            pass             # no tick right now: it reads the outcomes when it runs

    # -- scan and dispatch -------------------------------------------------------------------------

    def book(self, effect_id: str, job: Job) -> None:
        self.booked.add(effect_id)
        self.bookkeeper.submit(effect_id, job)

    def scan(self, now: float) -> None:
        self.next_scan = now + self.scan_s
        try:
            executing = effectqueue.open_effects(self.db, EffectState.EXECUTING, limit=SCAN_LIMIT)
            pending = effectqueue.open_effects(self.db, EffectState.PENDING, limit=SCAN_LIMIT)
        except sqlite3.OperationalError as err:     # e.g. busy while another process recovers the WAL
            self.log.warning("scan of events.db failed (%s); again at the next scan", err)
            return
        for effect, _, claimer, pgid in executing:
            ours_unsettled = claimer == self.claimer and effect.id in self.disk_full and effect.id not in self.in_flight
            if effect.id not in self.booked and (ours_unsettled or claimer != self.claimer and
                                                 not claimer_alive(claimer, self.boot)):
                self.book(effect.id, functools.partial(self.settle_orphan, effect, claimer, pgid))
        self.disk_full &= {effect.id for effect, *_ in executing} | {effect.id for effect, *_ in pending}
        self.more_pending = len(pending) == SCAN_LIMIT
        wall = time.time()
        self.candidates = {}
        for effect, *_ in pending:
            if effect.id in self.in_flight or effect.id in self.booked or self.retry_at.get(effect.id, 0) > now:
                continue
            if effect.deadline <= wall and registry.expires(effect):
                self.book(effect.id, functools.partial(self.expire, effect))
            else:
                self.candidates[effect.id] = effect
        self.dispatch(now)

    def dispatch(self, now: float) -> None:
        """Start pending effects, oldest first, while fewer than executor_concurrency are in flight."""
        slots = self.concurrency - len(self.in_flight)
        engine_ready = now < self.engine_trusted_until
        for effect in list(self.candidates.values()):
            if slots <= 0:
                break
            kind = registry.get(effect.kind)
            if kind is not None:
                if kind.admit is not None and not kind.admit(effect, self.config):
                    continue                  # e.g. its agent runs at its concurrency: it stays pending
                pool, job = self.runners, functools.partial(self.run_builtin, effect)
            elif engine_ready:
                pool, job = self.bookkeeper, functools.partial(self.claim_for_engine, effect)
            else:
                self.ask_engine(now)          # it stays pending (unclaimed) until the engine answers
                continue
            del self.candidates[effect.id]
            self.in_flight[effect.id] = effect
            pool.submit(effect.id, job)
            slots -= 1
        if slots > 0 and self.more_pending and not self.candidates:
            self.next_scan = min(self.next_scan, now + RESCAN_SOON_S)

    # -- the engine's executors --------------------------------------------------------------------

    def send_engine(self, message) -> bool:
        try:
            self.engine.send(codec.encode(message), zmq.NOBLOCK)
            return True
        except zmq.Again:    # IMMEDIATE: no engine connected
            self.engine_trusted_until = 0.0
            return False

    def ask_engine(self, now: float) -> None:
        if self.ping is not None or now < self.next_ping:
            return
        self.next_ping = now + PING_RETRY_S
        request_id = next(self.rpc_ids)
        if self.send_engine(enginerpc.Ping(request_id, time.time() + self.rpc_deadline_s)):
            self.ping = (request_id, now + self.rpc_deadline_s)

    def call_engine(self, effect: enginerpc.Effect, now: float) -> None:
        timeout = kinds.effect_timeout(effect, self.config.timings.effect_timeout_s)
        request_id = next(self.rpc_ids)
        if not self.send_engine(enginerpc.RunExecutor(request_id, time.time() + timeout, effect)):
            # Nothing reached the engine, so nothing ran: the claim is undone, whatever the effect.
            self.book(effect.id, functools.partial(self.unclaim, effect, "engine-unreachable"))
            return
        self.engine_calls[request_id] = EngineCall(effect, now + timeout + self.rpc_deadline_s)

    def on_engine_reply(self) -> None:
        now = time.monotonic()
        for reply in self.messages(self.engine, enginerpc.EngineReply, "engine"):
            self.engine_trusted_until = now + ENGINE_TRUST_S
            if self.ping is not None and reply.id == self.ping[0]:
                self.ping = None
            call = self.engine_calls.pop(reply.id, None)
            if call is not None:
                self.book(call.effect.id, functools.partial(self.finish_engine, call.effect, reply))
            elif not isinstance(reply, enginerpc.Pong):
                self.log.info("dropped a late reply from the engine (request %d)", reply.id)
        self.dispatch(now)

    # -- jobs (in threads; each gets that thread's connection) -------------------------------------

    def finish(self, conn: sqlite3.Connection, effect: enginerpc.Effect, state: str, data: dict) -> Done:
        if state == EffectState.FAILED and retry_later(effect, data, self.retry_base_s):
            # A notification that could not get out (the network may be what is down) waits in the
            # queue and is tried again, with backoff: queued, not lost. What each channel said is in
            # the requeue's event.
            attempt = self.retries.get(effect.id, 0) + 1
            wait_s = clock.backoff(attempt, self.retry_base_s, self.retry_max_s)
            if effectqueue.requeue_claimed_effect(conn, effect.id, self.claimer, SOURCE,
                                                  reason=f"retry later ({data.get('error')})", attempt=attempt,
                                                  retry_in_s=wait_s, channels=data.get("channels")):
                self.retries[effect.id] = attempt
                self.retry_at[effect.id] = time.monotonic() + wait_s
                return Done(effect.id, "requeued")
        ended = effectqueue.finish_claimed_effect(conn, effect.id, self.claimer, state, SOURCE, **data)
        if ended and state == EffectState.FAILED:
            self.log.warning("%s effect %s failed: %s", effect.kind, effect.id, data.get("error"))
        return Done(effect.id, state if ended else "lost")

    def expire(self, effect: enginerpc.Effect, conn: sqlite3.Connection) -> Done:
        ended = effectqueue.finish_effect(conn, effect.id, EffectState.EXPIRED, SOURCE, from_states=(EffectState.PENDING,),
                                    reason="deadline", deadline=effect.deadline)
        return Done(effect.id, EffectState.EXPIRED if ended else "lost")

    def run_builtin(self, effect: enginerpc.Effect, conn: sqlite3.Connection) -> Done:
        if effect.deadline <= time.time() and registry.expires(effect):
            return self.expire(effect, conn)
        refused = registry.refusal(effect, self.config.allow, self.process_names)
        reason = "not-allowed" if refused else "bad-params"
        refused = refused or registry.params_problem(effect)
        if refused is not None:      # never claimed: it never ran
            ended = effectqueue.finish_effect(conn, effect.id, EffectState.FAILED, SOURCE, from_states=(EffectState.PENDING,),
                                        reason=reason, error=refused, origin=effect.origin)
            if ended:
                self.log.warning("%s effect %s from %s refused: %s", effect.kind, effect.id, effect.origin, refused)
            return Done(effect.id, EffectState.FAILED if ended else "lost")
        kind = registry.all_kinds()[effect.kind]
        reserve = functools.partial(kind.reserve, config=self.config) if kind.reserve is not None else None
        claimed = effectqueue.claim_effect(conn, effect.id, self.claimer, SOURCE, reserve=reserve)
        if isinstance(claimed, effectqueue.Held):
            # e.g. a spend limit: it stays pending, unclaimed, and is asked again at a later scan
            self.retry_at[effect.id] = time.monotonic() + self.scan_s
            return Done(effect.id, "held")
        if claimed is None:
            return Done(effect.id, "lost")
        ctx = kinds.EffectContext(self.config, self.objects,
                                kinds.effect_timeout(effect, self.config.timings.effect_timeout_s),
                                paths=self.paths, effect_id=effect.id,
                                starting=lambda: effectqueue.record_pgid(conn, effect.id, effectqueue.SPAWNING),
                                started=lambda pgid: effectqueue.record_pgid(conn, effect.id, pgid),
                                record=functools.partial(self.record_fact, conn, effect),
                                recorded=lambda type_: eventsdb.effect_facts(conn, effect.id, type_),
                                gate=self.gate.run_gate)
        began = time.monotonic()
        try:
            state, data = EffectState.ACKED, kind.run(effect, ctx)
        except kinds.EffectFailed as failure:
            state, data = EffectState.FAILED, {**failure.data, "reason": failure.reason, "error": failure.error}
        except (sqlite3.Error, connection.StoreError):
            raise
        except Exception as err:     # a bug in an executor fails its effect, not the executor
            self.log.exception("%s effect %s raised", effect.kind, effect.id)
            state, data = EffectState.FAILED, {"reason": "error", "error": f"{type(err).__name__}: {err}"}
        data["duration_s"] = round(time.monotonic() - began, 3)
        return self.finish(conn, effect, state, data)

    def record_fact(self, conn: sqlite3.Connection, effect: enginerpc.Effect, type_: str, data: dict) -> None:
        """A step of a running effect, done: committed before the effect goes on (ctx.record)."""
        eventsdb.append_events(conn, [eventmsgs.now_event(type_, SOURCE, effect.target,
                                                     {**data, "effect_id": effect.id, "kind": effect.kind})])

    def claim_for_engine(self, effect: enginerpc.Effect, conn: sqlite3.Connection) -> Done:
        if effect.deadline <= time.time():
            return self.expire(effect, conn)
        claimed = effectqueue.claim_effect(conn, effect.id, self.claimer, SOURCE)
        return Done(effect.id, "claimed", claimed) if claimed is not None else Done(effect.id, "lost")

    def finish_engine(self, effect: enginerpc.Effect, reply, conn: sqlite3.Connection) -> Done:
        if not isinstance(reply, enginerpc.ExecutorResult):
            return self.finish(conn, effect, EffectState.FAILED, {
                "reason": "engine", "error": f"the engine answered run-executor with {type(reply).__name__}"})
        if reply.ok:
            return self.finish(conn, effect, EffectState.ACKED, {"result": reply.result})
        if reply.unknown_kind:
            return self.finish(conn, effect, EffectState.FAILED, {
                "reason": "unknown-kind", "error": f"unknown kind {effect.kind!r}: no executor knows it"})
        return self.finish(conn, effect, EffectState.FAILED, {
            "reason": "engine", "error": reply.error or "the engine's executor failed", "result": reply.result})

    def after_no_answer(self, effect: enginerpc.Effect, conn: sqlite3.Connection) -> Done:
        """The engine did not answer in time: it may or may not have run the effect."""
        if effect.idempotent:
            return self.unclaim(effect, "engine-no-answer", conn)
        return self.finish(conn, effect, EffectState.FAILED, {
            "reason": "engine-no-answer", "error": "no answer from the engine in time; not idempotent, not retried"})

    def unclaim(self, effect: enginerpc.Effect, reason: str, conn: sqlite3.Connection) -> Done:
        requeued = effectqueue.requeue_claimed_effect(conn, effect.id, self.claimer, SOURCE, reason)
        return Done(effect.id, "requeued" if requeued else "lost")

    def settle_orphan(self, effect: enginerpc.Effect, claimer: str | None, pgid: int | None,
                      conn: sqlite3.Connection) -> Done:
        if pgid and not kinds.end_group(pgid, not_before=effect.created - CLOCK_SLACK_S):
            self.log.warning("effect %s: process group %d of dead claimer %s is still alive; settled later",
                             effect.id, pgid, claimer)
            return Done(effect.id, "kept")
        if pgid == effectqueue.SPAWNING:    # its group never recorded: what it started, by the effect's mark
            try:
                kinds.stop_marked(effect.id, mark=kinds.EFFECT_MARK)
            except kinds.EffectFailed as err:
                self.log.warning("effect %s of dead claimer %s: %s; settled later", effect.id, claimer, err.error)
                return Done(effect.id, "kept")
        kind = registry.get(effect.kind)
        if kind is not None and kind.settle_orphan is not None:
            kind.settle_orphan(effect, conn, self.config)   # e.g. agent-run: its task back to pending
        if effect.idempotent:
            requeued = effectqueue.requeue_claimed_effect(conn, effect.id, claimer, SOURCE, "interrupted")
            if requeued:
                self.log.info("%s effect %s interrupted (claimer %s died): runs again", effect.kind, effect.id,
                              claimer)
            return Done(effect.id, "requeued" if requeued else "lost")
        # Whether it may have acted: a kind that acts through a process had started one only if the
        # claim recorded its group or that it was starting one (SPAWNING); any other kind's code may
        # have run once it was claimed.
        started = pgid is not None or kind is None or not kind.starts_process
        reason = "interrupted-after-start" if started else "interrupted-before-start"
        what = "while it ran; it may have acted" if started else "before its process started"
        ended = effectqueue.finish_claimed_effect(
            conn, effect.id, claimer, EffectState.FAILED, SOURCE, reason=reason, dead_claimer=claimer,
            may_have_acted=started, error=f"{reason}: its executor died {what}; not idempotent, so not run again")
        if ended:
            self.log.warning("%s effect %s interrupted (claimer %s died): failed", effect.kind, effect.id, claimer)
        return Done(effect.id, EffectState.FAILED if ended else "lost")
