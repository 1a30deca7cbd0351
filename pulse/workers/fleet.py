"""The fleet worker: this host among others, over NATS JetStream, when `[fleet] enabled = true`.

The only process that talks to NATS. Not core, like the web worker: survival never waits on it,
and with NATS unreachable the host runs as a single one while this worker keeps trying (0.5 s,
doubling up to `reconnect_max_s`) and says why in `pulsectl status`. nats-py is asyncio: its loop
runs in a thread of its own, and the harness heartbeats only while that loop still turns.

Two duties of its own on one connection, beside the fleet's tasks (pulse.workers.fleettasks):
  - presence: every `presence_interval_s` this host's summary (pulsed's status, open effects, agents,
    version) goes to the `pulse-hosts` bucket, whose TTL drops a host that stopped, and to
    `pulse-hosts-seen`, which keeps what a gone host was; the fleet as read back is written to
    <runtime>/fleet-view.json for `pulsectl fleet status`.
  - the events outbox (pulse.workers.fleetoutbox): every event of events.db after the cursor goes
    to the PULSE_EVENTS stream, in order, once (the stream drops a republished one by its id).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import threading
import time

import msgspec

from pulse import __version__
from pulse.core import client
from pulse.core import fleetnames as names
from pulse.core.instances import default_name
from pulse.core.together import together
from pulse.core.wire import controlmsgs, doorbells
from pulse.core.wire.eventmsgs import EffectKind
from pulse.store import connection, effectqueue
from pulse.workers.harness import Worker

# Imports inside functions: the forkserver preloads this module for every worker
# (supervisor/forkserver.py PRELOAD); nats-py (~70 ms, python -X importtime) and the fleet's task code
# load in the fleet worker's own process, only when [fleet] runs it.

STOP_WAIT_S = 3.0
EXIT_BUG = 70                # EX_SOFTWARE: the link's thread died of an error of our own


def link_errors() -> tuple[type[BaseException], ...]:
    """What a link to NATS can fail with (the server's, the network's, a timeout, a database a
    summary reads that is busy): retried. Anything else is a bug, and ends the worker, so pulsed's
    restart limits and its status see it instead of an endless "link failed"."""
    import nats
    return nats.errors.Error, OSError, sqlite3.OperationalError
PUBLISH_TIMEOUT_S = 2.0      # JetStream's calls (streams, buckets)
RETRY_S = 0.5                # after a failed put on a connection that is still open
STATUS_TIMEOUT_S = 1.0       # pulsed's status for the summary; unanswered: the summary says so


def agent_summary(agent, busy: int, held: dict[str, str] | None) -> dict:
    """One agent as the fleet sees it: its slots, what may route to it (pulse.agents.routing: tags,
    projects; None: every project) and its spend state: `budget` is why a run would be held now
    (None: within its limits), `budget_known` False when the ledger could not be read."""
    return {"name": agent.name, "slots": agent.concurrency, "busy": busy, "tags": list(agent.tags),
            "projects": list(agent.projects) if agent.projects is not None else None,
            "budget": (held or {}).get(agent.name), "budget_known": held is not None}


class FleetWorker(Worker):
    name = "fleet"

    def open(self) -> None:
        import nats  # noqa: F401  (here, never in the forkserver or pulsed: a missing client fails this worker only)
        f = self.config.fleet
        self.host = f.host or names.default_host(self.config.pulse.name or default_name(self.paths.home))
        self.account = {"state": "connecting", "host": self.host, "servers": [names.shown_url(u) for u in f.url],
                        "server": None, "reason": None, "since": time.time(), "published_through": 0, "published": 0}
        self.lock = threading.Lock()
        self.beat_s = self.config.timings.heartbeat_ms / 1000
        self.turned = time.monotonic()
        self.loop = asyncio.new_event_loop()
        self.main: asyncio.Task | None = None
        # here: the forkserver preloads this module, not the tasks' imports (nats-py among them)
        from pulse.workers.fleettasks import FleetTasks
        # one for the worker's life: the tasks this host runs outlive a connection (a server of the
        # cluster lost): their messages are renewed and acknowledged on the next one
        self.fleet_tasks = FleetTasks(self)
        self.link_server: str | None = None   # the server the current connection is to
        self.link_errors = link_errors()      # what the link retries: the outbox's and the tasks' too
        self.thread = threading.Thread(target=self.serve, name="fleet-link", daemon=True)
        self.thread.start()
        self.log.info("fleet host %s, servers %s", self.host, ", ".join(self.account["servers"]))

    # -- what pulsed sees -----------------------------------------------------------------------

    def note(self, state: str | None, reason: str | None) -> None:
        """Record the link's state (None: unchanged) and why; logged on a change of state only."""
        with self.lock:
            changed = state is not None and state != self.account["state"]
            if changed:
                self.account.update(state=state, since=time.time())
            # the server of the connection while there is one (presence failing on it is `disconnected`)
            self.account["server"] = self.link_server if self.account["state"] in ("connected", "disconnected") else None
            self.account["reason"] = reason
        if changed:
            self.log.info("fleet %s%s", state, f": {reason}" if reason else "")

    def status_extras(self) -> dict:
        with self.lock:
            return dict(self.account)

    def healthy(self) -> bool:
        return self.thread.is_alive() and time.monotonic() - self.turned < max(2 * self.beat_s, 1.0)

    def close(self) -> None:
        if self.main is not None:
            self.loop.call_soon_threadsafe(self.main.cancel)
        self.thread.join(STOP_WAIT_S)

    # -- the link, in its own thread ----------------------------------------------------------------

    def serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.main = self.loop.create_task(self.run())
        try:
            self.loop.run_until_complete(self.main)
        except asyncio.CancelledError:
            pass
        except BaseException:       # a bug, not the link: the worker ends, and pulsed restarts it (or stops trying)
            self.log.exception("the fleet link failed on an error that is not the link's; this worker exits")
            sys.stderr.flush()
            os._exit(EXIT_BUG)

    async def turning(self) -> None:
        while True:
            self.turned = time.monotonic()
            await asyncio.sleep(self.beat_s / 2)

    async def run(self) -> None:
        # the claims' renewals beside the link, not in it: a link failing or being set up again must
        # not let a claim lapse under a task this host still holds
        await together(self.turning(), self.linking(), self.fleet_tasks.renewing())

    async def linking(self) -> None:
        import nats
        f = self.config.fleet
        failures = 0
        retried = self.link_errors
        while True:
            try:
                errors: list[str] = []
                nc = await nats.connect(**names.connect_options(f, self.note, errors.append))
            except retried as err:   # refused, unresolvable, TLS, auth: all mean "not yet"
                failures += 1
                wait = names.backoff_s(failures, f.reconnect_max_s)
                why = errors[-1] if errors else names.describe(err)   # nats-py's own error says only "no servers"
                self.note("down", f"cannot connect: {why}; retrying in {wait:g}s")
                await asyncio.sleep(wait)
                continue
            failures = 0
            try:
                await self.linked(nc)
            except* retried as failed:   # the link's own tasks fail together (pulse.core.together)
                err = failed.exceptions[0]
                self.note("down", names.describe(err))
                self.log.warning("fleet link failed: %s", names.describe(err))
                await asyncio.sleep(names.backoff_s(1, f.reconnect_max_s))
            finally:
                self.link_server = None
                try:
                    await asyncio.wait_for(nc.close(), 2)
                except Exception:
                    pass

    async def linked(self, nc) -> None:
        # here: the forkserver preloads this module, not the tasks' and the outbox's imports
        from pulse.workers.fleetoutbox import Outbox
        js = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        await self.fleet_tasks.hold_claims(js)
        await self.ensure_stream(js)
        ttl = self.config.fleet.presence_ttl_s
        hosts = await self.bucket(js, names.HOSTS_BUCKET, ttl)
        seen = await self.bucket(js, names.SEEN_BUCKET, None)
        # which server of the cluster, for status (and for a test that kills that one)
        self.link_server = names.shown_url(nc.connected_url.geturl()) if nc.connected_url else None
        self.note("connected", None)
        await together(self.presence(nc, js, hosts, seen), Outbox(self).run(nc), self.fleet_tasks.run(nc, js))

    async def ensure_stream(self, js) -> None:
        from nats.js.errors import BadRequestError
        try:
            await js.add_stream(name=names.EVENTS_STREAM, subjects=[names.EVENTS_SUBJECTS],
                                duplicate_window=names.DUPLICATE_WINDOW_S, num_replicas=self.config.fleet.replicas)
        except BadRequestError:
            await js.stream_info(names.EVENTS_STREAM)   # made by another host with other limits: use it as it is

    async def bucket(self, js, name: str, ttl: float | None):
        from nats.js.errors import BadRequestError
        try:
            return await js.create_key_value(bucket=name, ttl=ttl, history=1, replicas=self.config.fleet.replicas)
        except BadRequestError:
            return await js.key_value(name)   # made by another host with other settings

    # -- presence -------------------------------------------------------------------------------

    def summary(self) -> dict:
        """This host, as the fleet sees it (blocking: run in a thread)."""
        out: dict = {"host": self.host, "version": __version__, "at": time.time(), "agents": []}
        try:
            status = client.request(self.paths, controlmsgs.GetStatus(), STATUS_TIMEOUT_S).status
            out.update(msgspec.to_builtins(status))
            out.pop("fleet", None)
        except client.Unreachable as err:
            out["status_error"] = str(err)
        conn = connection.open_readonly(self.paths.events_db)
        try:
            effects = effectqueue.open_effects(conn)
            held = self.budget_holds(conn)
        finally:
            conn.close()
        out["open_effects"] = len(effects)
        running = [e.target for e, state, _, _ in effects if e.kind == EffectKind.AGENT_RUN and state == "executing"]
        out["agents"] = [agent_summary(a, running.count(a.name), held) for a in self.config.agent]
        out["at"] = time.time()
        return out

    def budget_holds(self, conn) -> dict[str, str] | None:
        """agent → why a run of it would be held by a spend limit now (the tick's own reading,
        pulse.agents.spend.holds: nothing is read when no limit is set); None: the ledger unreadable."""
        from pulse.agents import spend
        try:
            return {name: hold.why for name, hold in spend.holds(conn, self.config.agent, self.config.budget).items()}
        except sqlite3.Error as err:
            self.log.warning("could not read the spend ledger for the summary: %s", err)
            return None

    async def presence(self, nc, js, hosts, seen) -> None:
        interval = self.config.fleet.presence_interval_s
        token = names.host_token(self.host)
        while True:
            try:
                body = json.dumps(await asyncio.to_thread(self.summary)).encode()
                await hosts.put(token, body)
                await seen.put(token, body)
                present = await self.read_bucket(js, names.HOSTS_BUCKET, hosts)
                kept = await self.read_bucket(js, names.SEEN_BUCKET, seen)
                now = time.time()
                view = {"at": now, "host": self.host, "ttl_s": self.config.fleet.presence_ttl_s,
                        "hosts": names.fleet_rows(present, kept, now)}
                await asyncio.to_thread(names.write_view, self.paths.runtime, view)
                self.note("connected", None)
            except self.link_errors as err:
                if nc.is_closed:
                    raise
                self.note("disconnected", f"presence: {names.describe(err)}")
                await asyncio.sleep(RETRY_S)
                continue
            await asyncio.sleep(interval)

    async def read_bucket(self, js, name: str, bucket) -> dict[str, dict]:
        """Every key of KV bucket `name` and its value. The keys come from the bucket's stream info
        (its subjects), not from nats-py's keys(): that makes a consumer each call, which the server
        keeps 5 minutes after it is left, so every host's look every presence_interval_s piled
        thousands of them up on a cluster until the server refused more ("maximum consumers limit
        reached", scripts/fleet_chaos.py)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError
        prefix = f"$KV.{name}."
        info = await js.stream_info(f"KV_{name}", subjects_filter=f"{prefix}>")
        out = {}
        for subject in (info.state.subjects or {}):
            key = subject[len(prefix):]
            try:
                entry = await bucket.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                continue   # expired between the listing and the read, or deleted
            if entry.value:
                out[key] = json.loads(entry.value)
        return out

    def ring_tick(self, reason: str) -> None:
        """A task taken from the fleet is news for the assignment rule (dropped if nobody listens)."""
        client.ring(self.paths, "wake", doorbells.Wake("fleet", reason))

    def set_published(self, last: int, count: int) -> None:
        with self.lock:
            self.account["published_through"] = last
            self.account["published"] += count
            if count and self.account["state"] != "connected":
                self.account.update(state="connected", since=time.time(), reason=None, server=self.link_server)
