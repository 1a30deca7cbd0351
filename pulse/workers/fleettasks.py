"""Tasks across hosts, the fleet worker's third duty (pulse.workers.fleet runs it on its connection).

  - offering: every `fleet-task-offered` event of this host's events.db (`pulsectl task add --fleet`)
    goes to the work-queue stream PULSE_TASKS on `pulse.tasks.<agent>`, Nats-Msg-Id = its fleet id;
  - taking: for each of its [[agent]]s with a free slot, a host pulls one task from that agent's
    durable consumer (shared by every host that has the agent, so one message goes to one of them),
    claims it in the KV bucket `pulse-task-claims` with a create-only put (a redelivery landing on
    another host finds the claim and leaves the task alone), and creates it as a task of its own
    events.db, which its assignment rule hands to the agent as any task;
  - keeping: while the local task runs, the message is kept alive (in_progress) and the claim renewed
    every third of `task_lease_s`. A host that dies stops renewing: its claim lapses with the
    bucket's TTL, the message is redelivered after the consumer's ack wait (the same lease), and
    another host runs the task again: at least once across a host's death, at most once otherwise;
  - reporting: every change of the local task's status goes to `pulse.outcomes.<origin host>`
    (stream PULSE_TASK_OUTCOMES); when the task ends the message is acknowledged. The origin's worker
    records each report as a `fleet-task-update` event, which `pulsectl fleet tasks` folds.
"""

from __future__ import annotations

import asyncio
import json
import time

from pulse.agents import tasks
from pulse.core import fleetnames as names
from pulse.core import wire
from pulse.core.states import TaskStatus
from pulse.store import eventsdb, fleetcursor

TASKS_STREAM, OUTCOMES_STREAM, CLAIMS_BUCKET = "PULSE_TASKS", "PULSE_TASK_OUTCOMES", "pulse-task-claims"
ENDED = (TaskStatus.ACKED, TaskStatus.CLOSED, TaskStatus.GIVEN_UP)
LOOK_S = 0.2                      # how often offers, free slots and running tasks are looked at
OFFERS_CURSOR = "offers"          # fleet-cursor.db's key for the last offered event published


def task_subject(agent: str) -> str:
    return f"pulse.tasks.{names.host_token(agent)}"


def outcome_subject(origin: str) -> str:
    return f"pulse.outcomes.{names.host_token(origin)}"


class FleetTasks:
    def __init__(self, worker, nc, js):
        self.w, self.nc, self.js = worker, nc, js
        self.lease = worker.config.fleet.task_lease_s
        self.running: dict[str, dict] = {}     # fleet id → {msg, task, origin, agent, status, renewed}

    async def setup(self) -> None:
        from nats.js.api import RetentionPolicy
        from nats.js.errors import BadRequestError
        for name, subjects, retention in ((TASKS_STREAM, ["pulse.tasks.>"], RetentionPolicy.WORK_QUEUE),
                                          (OUTCOMES_STREAM, ["pulse.outcomes.>"], RetentionPolicy.WORK_QUEUE)):
            try:
                await self.js.add_stream(name=name, subjects=subjects, retention=retention,
                                         duplicate_window=names.DUPLICATE_WINDOW_S)
            except BadRequestError:
                await self.js.stream_info(name)
        try:
            self.claims = await self.js.create_key_value(bucket=CLAIMS_BUCKET, ttl=self.lease, history=1)
        except BadRequestError:
            self.claims = await self.js.key_value(CLAIMS_BUCKET)
        self.outcomes = await self.js.pull_subscribe(outcome_subject(self.w.host), durable=f"outcomes-{names.host_token(self.w.host)}",
                                                     stream=OUTCOMES_STREAM)
        self.queues = {}
        if self.w.config.fleet.take_tasks:
            from nats.js.api import ConsumerConfig
            for agent in self.w.config.agent:
                self.queues[agent.name] = await self.js.pull_subscribe(
                    task_subject(agent.name), durable=f"agent-{names.host_token(agent.name)}", stream=TASKS_STREAM,
                    config=ConsumerConfig(ack_wait=self.lease, max_ack_pending=-1))

    async def run(self) -> None:
        await self.setup()
        self.cursor = cursor = fleetcursor.open_cursor(self.w.paths.home / names.CURSOR_FILE)
        conn = eventsdb.open_events(self.w.paths.events_db)
        try:
            while True:
                await self.offer(conn, cursor)
                await self.take(conn)
                await self.keep(conn)
                await self.record_outcomes(conn)
                await asyncio.sleep(LOOK_S)
        finally:
            conn.close()
            cursor.close()

    # -- the origin's side --------------------------------------------------------------------------

    async def offer(self, conn, cursor) -> None:
        last = fleetcursor.read_cursor(cursor, OFFERS_CURSOR)
        for ev in eventsdb.read_events(conn, after_id=last, types=[wire.FLEET_TASK_OFFERED], limit=100):
            body = json.dumps({**ev.data, "fleet_id": ev.target, "origin": self.w.host}).encode()
            await self.js.publish(task_subject(ev.data["agent"]), body, headers={"Nats-Msg-Id": ev.target})
            fleetcursor.commit_cursor(cursor, OFFERS_CURSOR, ev.id)

    async def record_outcomes(self, conn) -> None:
        import nats
        try:
            msgs = await self.outcomes.fetch(50, timeout=0.05)
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            return
        for msg in msgs:
            report = json.loads(msg.data)
            eventsdb.append_events(conn, [wire.now_event(wire.FLEET_TASK_UPDATE, "fleet", report["fleet_id"], report)])
            await msg.ack()

    # -- the side that runs it ------------------------------------------------------------------------

    def busy(self, agent: str) -> int:
        return sum(1 for r in self.running.values() if r["agent"] == agent)

    async def take(self, conn) -> None:
        import nats
        from nats.js.errors import KeyWrongLastSequenceError
        for agent in self.w.config.agent:
            sub = self.queues.get(agent.name)
            if sub is None or self.busy(agent.name) >= agent.concurrency:
                continue
            try:
                msgs = await sub.fetch(1, timeout=0.05)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                offer = json.loads(msg.data)
                key = names.host_token(offer["fleet_id"])
                self.w.log.info("fleet task %s delivered (%d times)", offer["fleet_id"], msg.metadata.num_delivered)
                try:
                    await self.claims.create(key, self.w.host.encode())
                except KeyWrongLastSequenceError:
                    holder = await self.claims.get(key)
                    if holder.value.decode() != self.w.host:
                        await msg.nak(delay=self.lease / 2)   # another host runs it: try again after its lease
                        self.w.log.info("fleet task %s is %s's", offer["fleet_id"], holder.value.decode())
                        continue
                    # our own claim: this worker restarted while the task ran; take it up again
                local = fleetcursor.task_of(self.cursor, offer["fleet_id"])
                if local is None:
                    local = tasks.create(conn, offer["project"], offer["title"], offer["prompt"],
                                         offer.get("priority", 0), source="fleet").id
                    fleetcursor.remember_task(self.cursor, offer["fleet_id"], local)
                self.w.ring_tick(f"fleet task {offer['fleet_id']} is {local}")
                self.running[offer["fleet_id"]] = {"msg": msg, "task": local, "origin": offer["origin"],
                                                   "agent": agent.name, "status": None, "renewed": time.monotonic()}

    async def keep(self, conn) -> None:
        for fleet_id, run in list(self.running.items()):
            state = tasks.load(conn, run["task"])
            status = state.status if state is not None else None
            if status != run["status"]:
                run["status"] = status
                await self.report(fleet_id, run, state)
            if status in ENDED:
                await run["msg"].ack()
                del self.running[fleet_id]
            elif time.monotonic() - run["renewed"] >= self.lease / 3:
                await run["msg"].in_progress()
                await self.claims.put(names.host_token(fleet_id), self.w.host.encode())
                run["renewed"] = time.monotonic()

    async def report(self, fleet_id: str, run: dict, state) -> None:
        body = {"fleet_id": fleet_id, "host": self.w.host, "task": run["task"], "agent": run["agent"],
                "status": None if state is None else str(state.status),
                "result": None if state is None else state.result, "error": None if state is None else state.error}
        await self.js.publish(outcome_subject(run["origin"]), json.dumps(body, default=str).encode())

