"""Tasks across hosts, the fleet worker's third duty (pulse.workers.fleet runs it on its connection).

  - offering: every `fleet-task-offered` event of this host's events.db (`pulsectl task add --fleet`)
    goes to the work-queue stream PULSE_TASKS on `pulse.tasks.<pinned agent>` (`pulse.tasks._any`
    when not pinned), Nats-Msg-Id = its fleet id;
  - taking: every host with [[agent]]s pulls from one durable consumer (`takers`, shared, so one
    message is with one host at a time). A host takes a task only if one of its agents may take it
    by the routing of one host (pulse.agents.routing: pin, projects, tags), has a free slot and is
    within its spend limits (pulse.agents.spend); otherwise it puts the message back at once for
    another host (or for itself, when a slot frees). Taking is a create-only put in the KV bucket
    `pulse-task-claims` (a redelivery landing on another host finds the claim and leaves the task
    alone), a count in `pulse-task-attempts`, and a task of its own events.db pinned to the agent
    chosen, which its assignment rule hands out as any task;
  - keeping: while the local task runs, the message is kept alive (in_progress, every third of the
    consumer's short ack wait, TAKE_ACK_WAIT_S). Apart from the link's loops, for the worker's life,
    the claim is renewed every third of `task_lease_s` until the task's end is acknowledged: a stream
    with no leader, a report that fails, or the link being set up again do not let it lapse under a
    host that is alive (`renewing`). A host that dies stops renewing: its message comes back to the
    others within the ack wait, who leave it while the claim stands; the claim lapses with the
    bucket's TTL (the lease), and the next delivery's host runs the task again: at least once across
    a host's death, at most once otherwise;
  - reporting: every change of the local task's status goes to `pulse.outcomes.<origin host>`
    (stream PULSE_TASK_OUTCOMES); when the task ends the message is acknowledged. The origin's worker
    records each report as a `fleet-task-update` event, which `pulsectl fleet tasks` and `pulsectl
    task show <fleet id>` fold;
  - withdrawing: a `fleet-task-withdrawn` event of the origin (`pulsectl task close <fleet id>`) is
    put in the KV bucket `pulse-task-withdrawn`; a host that pulls such a task acknowledges it
    untouched, and one that holds it gives its own task up unless its run has begun (that run ends as
    it will, and is not offered again);
  - dead-lettering: a task the host gave up goes back to the fleet, unless it was taken
    `max_deliver` times already; a task taken more often than that (its hosts died) or given up at
    the last taking is put in the KV bucket `pulse-task-dead` and reported to its origin, which
    records a `fleet-task-dead` event (counted in /metrics as pulse_events_total{type="fleet-task-dead"}).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import msgspec

from pulse.agents import routing, spend, tasks
from pulse.core import fleetnames as names
from pulse.core.states import TaskStatus
from pulse.core.together import together
from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import commitwatch, effectqueue, eventsdb, fleetcursor
from pulse.store.commitwatch import CommitWatch

# Imports inside functions: as pulse.workers.fleet: nats-py (~70 ms) loads in the fleet worker's own
# process, not in the forkserver that preloads every worker's module.

TASKS_STREAM, OUTCOMES_STREAM, CLAIMS_BUCKET = "PULSE_TASKS", "PULSE_TASK_OUTCOMES", "pulse-task-claims"
ATTEMPTS_BUCKET = "pulse-task-attempts"   # fleet id → how many times a host took it
DEAD_BUCKET = "pulse-task-dead"           # fleet id → its dead-letter record (kept until deleted)
PASSES_BUCKET = "pulse-task-passes"       # fleet id → {host: why it last left the task}, for a dead letter's why
WITHDRAWN_BUCKET = "pulse-task-withdrawn"  # fleet id → {origin, why}: its origin took it back
ATTEMPTS_TTL_S = 7 * 86400                # a count is forgotten a week after its last taking
TAKERS = "takers"                         # the one durable consumer every host pulls tasks from
ANY_AGENT = "_any"                        # the subject token of a task pinned to no agent
ENDED = (TaskStatus.ACKED, TaskStatus.CLOSED, TaskStatus.GIVEN_UP)
LOOK_S = 0.2                      # how often the tasks this host runs are looked at
OFFERS_LOOK_S = 2.0               # offers go out on the commit that holds them (commitwatch); looked for this often anyway
# A pull waits this long on the server for a message (a long poll: a task offered reaches a waiting
# host at once), its idle heartbeats telling a live server from a dead connection meanwhile.
LONG_POLL_S, POLL_HEARTBEAT_S = 5.0, 1.0
# The takers' ack wait: how long a task handed to a host waits for the host to say it holds it (a
# claim, then in_progress every third of this while it runs) before the server hands it out again.
# A handing the host never got (its pull request outlived its connection: the server it was on died,
# and the one leading the consumer still answered the request) comes back after this, not after the
# lease. The claim in pulse-task-claims, not the ack wait, keeps a task from running twice: a host
# that gets a task another one holds puts it back (at most once while its host is alive), and the
# claim lapses only with the lease (at least once across its death).
TAKE_ACK_WAIT_S = 3.0
# A task's end is acknowledged with the server's answer awaited (a double ack): a plain ack sent while
# the connection is failing sits in the client's buffer and is lost with it, the task forgotten here,
# and once its claim lapsed another host ran it again. Unanswered within this, the link is retried.
END_ACK_S = 2.0
OFFERS_CURSOR = "offers"          # fleet-cursor.db's key for the last offered event published
WITHDRAWN_CURSOR = "withdrawn"    # … and for the last withdrawal made known
# A task left by a host goes back at once for its first PUTBACK_FREE deliveries (another host whose
# agent may take it gets it on its next pull), then after a delay doubling from PUTBACK_FIRST_S up to
# PUTBACK_MAX_S: the server hands out put-back messages before new ones, so tasks nobody can take
# now (no agent fits, or every one is busy) must not keep the rest of the queue from every host.
PUTBACK_FREE, PUTBACK_FIRST_S, PUTBACK_MAX_S = 8, 0.25, 5.0
# a task left here comes back every PUTBACK_MAX_S at most while it waits; one not seen for this long
# was taken by another host or dead-lettered, and its last reason here is forgotten
PASSED_FORGET_S = 600.0


class OfferRecord(msgspec.Struct):
    """What a message of PULSE_TASKS must hold to be taken (its origin's offer, as published)."""
    fleet_id: str
    origin: str
    project: str
    title: str
    prompt: str
    agent: str | None = None
    tags: list[str] = []
    priority: int = 0
    offered_at: float | None = None


class OutcomeRecord(msgspec.Struct):
    """What a message of PULSE_TASK_OUTCOMES must hold to be recorded."""
    fleet_id: str
    status: str | None = None
    host: str | None = None


async def read_record(msg, shape: type, log) -> dict | None:
    """A message's JSON object if it has `shape`; else None, and the message is terminated (never
    delivered again) and said: anyone who can publish on the fleet's subjects could send it, and one
    bad message must neither stop this host nor be retried for ever."""
    try:
        record = json.loads(msg.data)
        msgspec.convert(record, shape)
    except (ValueError, msgspec.ValidationError) as err:
        log.warning("dropped a malformed message on %s (%s): %r", msg.subject, err, bytes(msg.data[:200]))
        await msg.term()
        return None
    return record


async def long_poll(subscription) -> list:
    """The next message of a pull `subscription`, waiting up to LONG_POLL_S on the server for one
    (batch 1: a message is handed on the moment it comes); [] when none came."""
    import nats
    try:
        return await subscription.fetch(1, timeout=LONG_POLL_S, heartbeat=POLL_HEARTBEAT_S)
    except (asyncio.TimeoutError, nats.errors.TimeoutError):
        return []


async def rung_or_after(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set, or `timeout_s` has passed."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass


def task_subject(agent: str | None) -> str:
    return f"pulse.tasks.{names.host_token(agent) if agent else ANY_AGENT}"


def outcome_subject(origin: str) -> str:
    return f"pulse.outcomes.{names.host_token(origin)}"


def putback_delay_s(delivered: int) -> float:
    """How long a task this host leaves waits before its next delivery, after `delivered` ones."""
    if delivered <= PUTBACK_FREE:
        return 0.0
    return min(PUTBACK_MAX_S, PUTBACK_FIRST_S * 2 ** (delivered - PUTBACK_FREE - 1))


def offer_state(offer: dict) -> enginerpc.TaskState:
    """A fleet task as routing reads a task: its project, pinned agent and tags."""
    return enginerpc.TaskState(id=offer["fleet_id"], project=offer["project"], title=offer["title"], prompt="",
                          pin=offer.get("agent"), tags=list(offer.get("tags") or []))


def offered_for_s(offer: dict, published_at: float, now: float) -> float:
    """How long a fleet task has been offered: since its offer (the origin's event time), else since
    the stream stored it."""
    return max(0.0, now - float(offer.get("offered_at") or published_at))


def no_taker_why(passes: dict[str, str], ttl_s: float) -> str:
    """A dead letter's why for a task nobody took within [fleet] offer_ttl_s, with each host's last reason."""
    said = "; ".join(f"{host}: {why}" for host, why in sorted(passes.items()) if why)
    return f"no host could take it within {ttl_s:g}s ([fleet] offer_ttl_s)" + (f": {said}" if said else "")


def wait_after_failing_s(failed_at: float | None, wait_s: float, now: float) -> float:
    """How much longer a host that gave the task up at `failed_at` leaves it to the others (0: may take it)."""
    return 0.0 if failed_at is None else max(0.0, failed_at + wait_s - now)


def dead_record(offer: dict, host: str, attempts: int, why: str, task: str | None = None) -> dict:
    """What the dead-letter bucket keeps of a task, and what its origin records (`task`: the host's
    task of the last taking, when it made one)."""
    return {"fleet_id": offer["fleet_id"], "origin": offer.get("origin"), "host": host, "task": task, "attempts": attempts,
            "why": why, "at": time.time(), "status": "dead", "agent": offer.get("agent"),
            "project": offer.get("project"), "title": offer.get("title"), "tags": offer.get("tags") or []}


class FleetTasks:
    """Made once per worker and run on each connection in turn: what it knows of the tasks this
    host runs outlives a connection lost with its server (their renewals and acknowledgements go on
    the next one), so a lost server neither stops their renewals until the lease lapses nor leaves
    their ends unreported."""

    def __init__(self, worker):
        self.w = worker
        self.nc = self.js = None
        self.lease = worker.config.fleet.task_lease_s
        self.max_deliver = worker.config.fleet.max_deliver
        self.running: dict[str, dict] = {}     # fleet id → {msg, task, origin, agent, status, renewed, attempts, offer}
        # fleet id → (why this host last left it, when it last did): logged on a change of reason only;
        # forgotten PASSED_FORGET_S after the last leaving (the task was taken elsewhere or dead-lettered)
        self.passed: dict[str, tuple[str, float]] = {}
        self.offer_ttl = worker.config.fleet.offer_ttl_s
        self.failed_wait = worker.config.fleet.failed_host_wait_s
        self.failed_here: dict[str, float] = {}   # fleet id → when this host gave it up (time.time())
        self.slot_freed = asyncio.Event()          # a run of a task taken here ended: a pull may take another
        self.tasks = None                          # the projection of every task, at the first load_now
        self.resumed = False                       # the takings a dead worker of this host left: taken up once
        self.claims = None                         # the claims bucket, on the connection there is (hold_claims)

    async def kv(self, name: str, ttl: float | None):
        from nats.js.errors import BadRequestError
        try:
            return await self.js.create_key_value(bucket=name, ttl=ttl, history=1,
                                                  replicas=self.w.config.fleet.replicas)
        except BadRequestError:
            return await self.js.key_value(name)   # made by another host with other settings

    async def hold_claims(self, js) -> None:
        """The claims bucket on this connection, first of all the link sets up: from here on `renewing`
        renews through it, whatever else of the link fails."""
        self.js = js
        self.claims = await self.kv(CLAIMS_BUCKET, self.lease)

    async def renewing(self) -> None:
        """Every claim this host holds, renewed once a third of the lease has passed since it last was:
        a task running here, or ended here with its end not yet acknowledged (until then another host
        would run it again). A put that fails (no connection, no leader) is tried again at the next look."""
        while True:
            for fleet_id, run in list(self.running.items()):
                now = time.monotonic()
                if self.claims is None or run.get("released") or now - run["renewed"] < self.lease / 3:
                    continue
                try:
                    await self.claims.put(names.host_token(fleet_id), self.w.host.encode())
                except self.w.link_errors as err:
                    self.w.log.debug("could not renew the claim of fleet task %s: %s", fleet_id, names.describe(err))
                    break
                run["renewed"] = now
            await asyncio.sleep(LOOK_S)

    async def setup(self) -> None:
        from nats.js.api import RetentionPolicy
        from nats.js.errors import BadRequestError
        for name, subjects, retention in ((TASKS_STREAM, ["pulse.tasks.>"], RetentionPolicy.WORK_QUEUE),
                                          (OUTCOMES_STREAM, ["pulse.outcomes.>"], RetentionPolicy.WORK_QUEUE)):
            try:
                await self.js.add_stream(name=name, subjects=subjects, retention=retention,
                                         duplicate_window=names.DUPLICATE_WINDOW_S,
                                         num_replicas=self.w.config.fleet.replicas)
            except BadRequestError:
                await self.js.stream_info(name)
        self.attempts = await self.kv(ATTEMPTS_BUCKET, ATTEMPTS_TTL_S)
        self.dead = await self.kv(DEAD_BUCKET, None)
        self.passes = await self.kv(PASSES_BUCKET, ATTEMPTS_TTL_S)
        self.withdrawals = await self.kv(WITHDRAWN_BUCKET, ATTEMPTS_TTL_S)
        self.outcomes = await self.js.pull_subscribe(outcome_subject(self.w.host), durable=f"outcomes-{names.host_token(self.w.host)}",
                                                     stream=OUTCOMES_STREAM)
        self.queue = None
        if self.w.config.fleet.take_tasks and self.w.config.agent:
            from nats.js.api import ConsumerConfig
            # one consumer for every host: a work-queue stream allows no two whose subjects overlap.
            # Made or updated first (a consumer an older version made had the lease as its ack wait)
            config = ConsumerConfig(durable_name=TAKERS, filter_subject="pulse.tasks.>",
                                    ack_wait=TAKE_ACK_WAIT_S, max_ack_pending=-1)
            await self.js.add_consumer(TASKS_STREAM, config=config)
            self.queue = await self.js.pull_subscribe("pulse.tasks.>", durable=TAKERS, stream=TASKS_STREAM, config=config)

    async def run(self, nc, js) -> None:
        """Four loops on one connection, none waiting on another: offering (on each commit),
        hearing outcomes and taking tasks (each a long poll on the server), keeping what runs here."""
        self.nc, self.js = nc, js
        for run in self.running.values():   # taken on an earlier connection: answered on this one
            run["msg"] = dataclasses.replace(run["msg"], _client=nc)
        await self.setup()
        self.cursor = cursor = fleetcursor.open_cursor(self.w.paths.home / names.CURSOR_FILE)
        conn = eventsdb.open_events(self.w.paths.events_db)
        try:
            if not self.resumed:
                await self.resume(conn)
                self.resumed = True
            loops = [self.offering(conn, cursor), self.hearing(conn), self.keeping(conn)]
            if self.queue is not None:
                loops.append(self.taking(conn))
            await together(*loops)
        finally:
            conn.close()
            cursor.close()

    async def offering(self, conn, cursor) -> None:
        commits = CommitWatch(self.w.paths.events_db, commitwatch.RECHECK_FIRST_S)   # an offer is looked for within 1 ms
        try:
            while True:
                await self.offer(conn, cursor)
                await self.withdraw(conn, cursor)
                await commits.wait(OFFERS_LOOK_S)
        finally:
            commits.close()

    async def hearing(self, conn) -> None:
        while True:
            await self.record_outcomes(conn)

    async def keeping(self, conn) -> None:
        while True:
            await self.keep(conn)
            await asyncio.sleep(LOOK_S)

    async def taking(self, conn) -> None:
        while True:
            if not self.may_pull():       # every slot busy: wait for one to free
                self.slot_freed.clear()
                await rung_or_after(self.slot_freed, LOOK_S)
                continue
            await self.take(conn)

    async def resume(self, conn) -> None:
        """The takings this host's last fleet worker left unended (it was killed, or pulsed was): each one
        whose claim still names this host is kept again, renewed at once and acknowledged at its end, as
        if this worker had taken it; a lapsed one is forgotten (its message comes back to some host), and
        its task here given up unless its run has begun. Without this a worker's restart let the lease
        lapse under a task its host ran, and another host ran it again."""
        from nats.aio.msg import Msg
        from nats.js.errors import KeyNotFoundError
        for fleet_id, (task, taking) in fleetcursor.open_takings(self.cursor).items():
            try:
                holder = (await self.claims.get(names.host_token(fleet_id))).value.decode()
            except KeyNotFoundError:
                holder = None
            if holder != self.w.host:
                self.w.log.info("fleet task %s: its claim lapsed while this worker was down; left to the fleet", fleet_id)
                state = tasks.load(conn, task)
                if state is not None and state.status in (TaskStatus.PENDING, TaskStatus.ASSIGNED):
                    try:
                        tasks.record(conn, task, eventmsgs.TaskEvent.GIVEN_UP, "fleet", by="fleet",
                                     reason="its fleet claim lapsed while the fleet worker was down: left to the fleet")
                    except tasks.IllegalTransition:
                        pass             # it began meanwhile: it ends as it will
                fleetcursor.end_taking(self.cursor, fleet_id)
                continue
            offer = taking["offer"]
            msg = Msg(_client=self.nc, subject=task_subject(offer.get("agent")), reply=taking["reply"],
                      data=json.dumps(offer).encode())
            self.running[fleet_id] = {"msg": msg, "task": task, "origin": taking["origin"], "agent": taking["agent"],
                                      "status": None, "renewed": 0.0, "attempts": taking["attempts"], "offer": offer}
            self.w.log.info("fleet task %s (%s) taken up again after this worker's restart", fleet_id, task)

    # -- the origin's side --------------------------------------------------------------------------

    async def offer(self, conn, cursor) -> None:
        last = fleetcursor.read_cursor(cursor, OFFERS_CURSOR)
        for ev in eventsdb.read_events(conn, after_id=last, types=[eventmsgs.FLEET_TASK_OFFERED], limit=100):
            body = json.dumps({**ev.data, "fleet_id": ev.target, "origin": self.w.host, "offered_at": ev.ts}).encode()
            await self.js.publish(task_subject(ev.data.get("agent")), body, headers={"Nats-Msg-Id": ev.target})
            fleetcursor.commit_cursor(cursor, OFFERS_CURSOR, ev.id)

    async def withdraw(self, conn, cursor) -> None:
        last = fleetcursor.read_cursor(cursor, WITHDRAWN_CURSOR)
        for ev in eventsdb.read_events(conn, after_id=last, types=[eventmsgs.FLEET_TASK_WITHDRAWN], limit=100):
            record = {"origin": self.w.host, "why": ev.data.get("why") or "withdrawn by its origin"}
            await self.withdrawals.put(names.host_token(ev.target), json.dumps(record).encode())
            self.w.log.info("fleet task %s withdrawn", ev.target)
            fleetcursor.commit_cursor(cursor, WITHDRAWN_CURSOR, ev.id)

    async def withdrawn(self, fleet_id: str) -> str | None:
        """Why its origin took the task back, or None while it stands."""
        from nats.js.errors import KeyNotFoundError
        try:
            entry = await self.withdrawals.get(names.host_token(fleet_id))
        except KeyNotFoundError:
            return None
        return json.loads(entry.value or b"{}").get("why") or "withdrawn by its origin"

    async def record_outcomes(self, conn) -> None:
        msgs = await long_poll(self.outcomes)
        for msg in msgs:
            report = await read_record(msg, OutcomeRecord, self.w.log)
            if report is None:
                continue
            kind = eventmsgs.FLEET_TASK_DEAD if report.get("status") == "dead" else eventmsgs.FLEET_TASK_UPDATE
            eventsdb.append_events(conn, [eventmsgs.now_event(kind, "fleet", report["fleet_id"], report)])
            await msg.ack()

    # -- the side that runs it ------------------------------------------------------------------------

    def claimed_pending(self, statuses=(None, TaskStatus.PENDING)) -> dict[str, int]:
        """Tasks this host took that its agents hold no run of yet, by the agent chosen for each: they
        count against its slots, or one free slot would take every task in one pull."""
        out: dict[str, int] = {}
        for run in self.running.values():
            if run["status"] in statuses:
                out[run["agent"]] = out.get(run["agent"], 0) + 1
        return out

    def load_now(self, conn) -> dict[str, enginerpc.AgentLoad]:
        agents = self.w.config.agent
        if self.tasks is None:        # kept: each pull folds only what came since the last
            from pulse.store import projection
            self.tasks = tasks.all_tasks(conn, self.w.paths.home / projection.DIRECTORY)
        load = routing.loads(agents, self.tasks.catch_up(conn).states.values(),
                             [e for e, _, _, _ in effectqueue.open_effects(conn)])
        for agent, n in self.claimed_pending().items():
            if agent in load:
                load[agent].running += n
        return load

    def may_pull(self) -> bool:
        """Cheap, before any read of events.db: no pull while the tasks this host took fill every slot."""
        taken: dict[str, int] = {}
        for run in self.running.values():
            taken[run["agent"]] = taken.get(run["agent"], 0) + 1
        return any(taken.get(a.name, 0) < a.concurrency for a in self.w.config.agent)

    def pick(self, conn, offer: dict, load: dict[str, enginerpc.AgentLoad]) -> tuple[str | None, str | None]:
        agents, task = self.w.config.agent, offer_state(offer)
        # taken and maybe not reserved yet (an assigned task's run may be just before its claim): as
        # if reserved, or two tasks of one pull would both pass a limit only one fits under
        queued = self.claimed_pending((None, TaskStatus.PENDING, TaskStatus.ASSIGNED))
        held = {}
        for agent in agents:
            if routing.refusal(agent, task) is None and load[agent.name].running < agent.concurrency:
                if (why := spend.hold_reason(conn, agent, self.w.config.budget, queued)) is not None:
                    held[agent.name] = why
        return routing.fleet_pick(agents, task, load, held)

    async def pass_on(self, fleet_id: str, why: str) -> None:
        """Logged, and kept in the passes bucket for a dead letter's why, on a change of reason only."""
        before = self.passed.get(fleet_id)
        self.passed[fleet_id] = (why, time.monotonic())
        if before is None or before[0] != why:
            self.w.log.info("fleet task %s left to other hosts: %s", fleet_id, why)
            await self.note_pass(names.host_token(fleet_id), why)

    async def note_pass(self, key: str, why: str) -> None:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
        while True:                              # compare-and-set: other hosts write their reasons too
            try:
                entry = await self.passes.get(key)
                passes, revision = json.loads(entry.value or b"{}"), entry.revision
            except KeyNotFoundError:
                passes, revision = {}, None
            passes[self.w.host] = why
            try:
                if revision is None:
                    await self.passes.create(key, json.dumps(passes).encode())
                else:
                    await self.passes.update(key, json.dumps(passes).encode(), last=revision)
                return
            except KeyWrongLastSequenceError:
                continue

    async def read_passes(self, key: str) -> dict[str, str]:
        from nats.js.errors import KeyNotFoundError
        try:
            return json.loads((await self.passes.get(key)).value or b"{}")
        except KeyNotFoundError:
            return {}

    async def never_taken(self, key: str) -> bool:
        from nats.js.errors import KeyNotFoundError
        try:
            await self.attempts.get(key)
            return False
        except KeyNotFoundError:
            return True

    async def expire_untaken(self, msg, offer: dict) -> bool:
        """Dead-letter a task offered longer than [fleet] offer_ttl_s that no host ever took; True if so.
        A task taken before is not: its hosts' givings-up are counted by max_deliver."""
        fleet_id, key = offer["fleet_id"], names.host_token(offer["fleet_id"])
        if offered_for_s(offer, msg.metadata.timestamp.timestamp(), time.time()) < self.offer_ttl:
            return False
        if not await self.never_taken(key):
            return False
        await self.dead_letter(msg, offer, 0, no_taker_why(await self.read_passes(key), self.offer_ttl))
        self.passed.pop(fleet_id, None)
        return True

    async def take(self, conn) -> None:
        msgs = await long_poll(self.queue)
        self.forget_stale()
        load = None
        for msg in msgs:
            offer = await read_record(msg, OfferRecord, self.w.log)
            if offer is None:
                continue
            fleet_id = offer["fleet_id"]
            if fleet_id in self.running:         # ours already (a redelivery while we renew): leave it be
                continue
            if await self.withdrawn(fleet_id):
                self.w.log.info("fleet task %s was withdrawn by its origin: off the queue, not run", fleet_id)
                await msg.ack()
                continue
            task = offer_state(offer)
            wait = wait_after_failing_s(self.failed_here.get(fleet_id), self.failed_wait, time.time())
            if wait > 0:                         # given up here: the other hosts get it first
                if not await self.expire_untaken(msg, offer):
                    await self.pass_on(fleet_id, f"given up here; left to other hosts for {self.failed_wait:g}s "
                                                 "([fleet] failed_host_wait_s)")
                    await msg.nak(delay=putback_delay_s(msg.metadata.num_delivered) or None)
                continue
            if not routing.eligible(self.w.config.agent, task):   # no agent here may: events.db is not read
                agent, why = None, routing.unassignable(self.w.config.agent, task)
            else:
                if load is None:
                    load = self.load_now(conn)
                agent, why = self.pick(conn, offer, load)
            if agent is None:
                await self.pass_on(fleet_id, why or "")
                if not await self.expire_untaken(msg, offer):
                    await msg.nak(delay=putback_delay_s(msg.metadata.num_delivered) or None)
                continue
            if await self.claim(msg, offer, agent, conn):
                load[agent].running += 1

    def forget_stale(self) -> None:
        """Once a pull: what this host keeps of tasks it no longer needs to, dropped, so neither
        dict grows with every task the fleet ever ran (a giving-up past its wait, a leaving not
        met again for PASSED_FORGET_S)."""
        now, mono = time.time(), time.monotonic()
        for gone in [f for f, at in self.failed_here.items() if not wait_after_failing_s(at, self.failed_wait, now)]:
            del self.failed_here[gone]
        for gone in [f for f, (_, at) in self.passed.items() if mono - at > PASSED_FORGET_S]:
            del self.passed[gone]

    async def claim(self, msg, offer: dict, agent: str, conn) -> bool:
        """Claim the task and make it a task of this host for `agent`; False when another host holds it."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
        fleet_id, key = offer["fleet_id"], names.host_token(offer["fleet_id"])
        self.w.log.info("fleet task %s delivered (%d times) for %s", fleet_id, msg.metadata.num_delivered, agent)
        fresh = True
        try:
            await self.claims.create(key, self.w.host.encode())
        except KeyWrongLastSequenceError:
            try:
                holder = (await self.claims.get(key)).value.decode()
            except KeyNotFoundError:
                holder = None                    # lapsed between the two: the next delivery claims it
            if holder != self.w.host:
                await msg.nak(delay=self.lease / 2)   # another host runs it: look again after its lease
                await self.pass_on(fleet_id, f"claimed by {holder}")
                return False
            fresh = False                        # our own claim: this worker restarted while the task ran
        attempts = await self.count_attempt(key, fresh)
        if attempts > self.max_deliver:
            await self.dead_letter(msg, offer, attempts - 1,
                                   f"taken {attempts - 1} times ([fleet] max_deliver = {self.max_deliver}) without an end")
            return False
        local = fleetcursor.task_of(self.cursor, fleet_id)
        before = tasks.load(conn, local) if local is not None else None
        # a new taking after this host gave it up: a new task. One this host ran to its end (its fleet
        # worker died before the acknowledgement reached NATS) is not run again: its end is reported
        if before is None or (fresh and before.status == TaskStatus.GIVEN_UP):
            local = tasks.create(conn, offer["project"], offer["title"], offer["prompt"], offer.get("priority", 0),
                                 source="fleet", pin=agent, tags=offer.get("tags") or ()).id
            fleetcursor.remember_task(self.cursor, fleet_id, local)
        self.w.ring_tick(f"fleet task {fleet_id} is {local}")
        self.passed.pop(fleet_id, None)
        self.running[fleet_id] = {"msg": msg, "task": local, "origin": offer["origin"], "agent": agent,
                                  "status": None, "renewed": time.monotonic(), "attempts": attempts, "offer": offer}
        fleetcursor.remember_taking(self.cursor, fleet_id, {"reply": msg.reply, "origin": offer["origin"], "agent": agent,
                                                            "attempts": attempts, "offer": offer})
        return True

    async def count_attempt(self, key: str, fresh: bool) -> int:
        """The takings of the task so far, this one included when `fresh` (a compare-and-set count)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
        while True:
            try:
                entry = await self.attempts.get(key)
                n, revision = int(entry.value or b"0"), entry.revision
            except KeyNotFoundError:
                n, revision = 0, None
            if not fresh:
                return max(n, 1)
            try:
                if revision is None:
                    await self.attempts.create(key, str(n + 1).encode())
                else:
                    await self.attempts.update(key, str(n + 1).encode(), last=revision)
                return n + 1
            except KeyWrongLastSequenceError:
                continue                         # another host counted at the same time: count again

    async def dead_letter(self, msg, offer: dict, attempts: int, why: str, task: str | None = None) -> None:
        record = dead_record(offer, self.w.host, attempts, why, task)
        await self.dead.put(names.host_token(offer["fleet_id"]), json.dumps(record).encode())
        await self.js.publish(outcome_subject(offer["origin"]), json.dumps(record).encode())
        await msg.ack_sync(timeout=END_ACK_S)    # off the queue: the dead-letter bucket has it
        self.w.log.warning("fleet task %s dead-lettered: %s", offer["fleet_id"], why)

    async def keep(self, conn) -> None:
        for fleet_id, run in list(self.running.items()):
            state = tasks.load(conn, run["task"])
            status = state.status if state is not None else None
            if not run.get("withdrawn"):
                run["withdrawn"] = await self.withdrawn(fleet_id)
            if run["withdrawn"] and status in (TaskStatus.PENDING, TaskStatus.ASSIGNED):   # not begun again: never
                try:
                    state = tasks.record(conn, run["task"], eventmsgs.TaskEvent.GIVEN_UP, "fleet", by="fleet",
                                         reason=run["withdrawn"])
                    status = state.status
                except tasks.IllegalTransition:
                    pass                 # it began or ended meanwhile: its end is reported below as any
            if status != run["status"]:   # the new status is kept once its report is out: a link lost sends it again
                await self.report(fleet_id, run, state)
                run["status"] = status
            if status in ENDED:
                # forgotten only once its end is acknowledged: a link lost meanwhile ends it on the next one
                await self.ended(fleet_id, run, status)
                del self.running[fleet_id]
                fleetcursor.end_taking(self.cursor, fleet_id)
                self.slot_freed.set()
            elif time.monotonic() - run.get("kept", 0.0) >= TAKE_ACK_WAIT_S / 3:
                await run["msg"].in_progress()
                run["kept"] = time.monotonic()

    async def ended(self, fleet_id: str, run: dict, status: str) -> None:
        """Done (acked, closed): off the queue. Given up here: back to the fleet for another taking,
        or dead-lettered when this was the last one max_deliver allows. Withdrawn: off the queue."""
        if status != TaskStatus.GIVEN_UP or run.get("withdrawn"):
            await run["msg"].ack_sync(timeout=END_ACK_S)
            return
        if run["attempts"] >= self.max_deliver:
            await self.dead_letter(run["msg"], run["offer"], run["attempts"],
                                   f"given up on {self.w.host} at taking {run['attempts']} of {self.max_deliver} "
                                   "([fleet] max_deliver)", run["task"])
            return
        run["released"] = True                     # renewing must not put the claim back
        await self.claims.delete(names.host_token(fleet_id))
        self.failed_here[fleet_id] = time.time()   # left to the other hosts for failed_host_wait_s
        await run["msg"].nak()
        back = {"fleet_id": fleet_id, "host": self.w.host, "task": run["task"], "agent": run["agent"],
                "attempt": run["attempts"], "status": "offered",
                "why": f"given up on {self.w.host}; offered again (taking {run['attempts']} of {self.max_deliver})"}
        await self.js.publish(outcome_subject(run["origin"]), json.dumps(back).encode())

    async def report(self, fleet_id: str, run: dict, state) -> None:
        body = {"fleet_id": fleet_id, "host": self.w.host, "task": run["task"], "agent": run["agent"],
                "attempt": run["attempts"],
                "status": None if state is None else str(state.status),
                "result": None if state is None else state.result, "error": None if state is None else state.error}
        await self.js.publish(outcome_subject(run["origin"]), json.dumps(body, default=str).encode())
