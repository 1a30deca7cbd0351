"""`GET /metrics`: Prometheus text, written by `prometheus_client`.

Counters are derived from events.db, so they survive restarts of the web worker: at start the
web worker folds the history once (the type counts by one GROUP BY, the rest from the events of
the few types they need, found by the type index); each scrape folds only the events committed
since the last one, and the ticks vitals.db recorded since. Gauges come from pulsed's status and
the latest vitals. A scrape's cost does not grow with the history.

Events never change (pulse.store.eventsdb), so an event folded once is folded for good. The rule errors
are the `count`s of the error events, plus the repeats that error_runs counts and no event holds
yet, read in the same snapshot as the events: the counter rises with every occurrence, and never
falls when those repeats move into an event.
"""

from __future__ import annotations

import collections
import sqlite3
from pathlib import Path
from typing import Iterable

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest

from pulse import __version__
from pulse.agents.tasks import ENDED, NEW, TRANSITIONS
from pulse.core.states import LATE, PROCESS_FAILING, ProcessState, TaskStatus, WorkerState
from pulse.core.wire.controlmsgs import Status
from pulse.core.wire.eventmsgs import (
    EFFECT_END_EVENTS,
    EFFECT_END_STATES,
    TASK_EVENTS,
    EffectEvent,
    EffectKind,
    Event,
    EventType,
    TaskEvent,
)
from pulse.store import connection, errorruns, eventsdb, historysize, vitalsdb
from pulse.store.projection import Folded, Projection

EFFECT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
TICK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
STATES = tuple(WorkerState)
HOST = "system-resource"           # the vital whose fields are the host's gauges
HOST_FIELDS = ("cpu_pct", "memory_pct", "disk_pct", "swap_pct")
LAST_EFFECT_TARGETS = 1_000       # the overview's "last action" is remembered for this many targets
MIB = 1024 * 1024                  # the watcher samples megabytes (MiB); Prometheus wants bytes
# Events folded per read when catching up: a page opened after an hour unwatched catches up on
# ~50,000 events, and 10,000 a read left the web worker ~11 MiB more RSS for good (the hour-long soak)
CATCH_UP_BATCH = 1_000
FOLDED_TYPES = (EffectEvent.COMMITTED, *EFFECT_END_EVENTS.values(), "error", *TASK_EVENTS)
# A task in one of these statuses is counted by status and forgotten, so the counts' memory follows the
# open tasks, not the history (an operator's retry of a given-up one moves it back from the count).
ENDED_TASK_STATUSES = ENDED


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def buckets(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


def effect_why(params: dict) -> str | None:
    """Why an effect was made, as the page says it: a restart's `why` (dead, unhealthy, memory), or
    the rule that sent a notification."""
    return params.get("why") or params.get("rule")


class Counts:
    """Everything /metrics counts, folded from events.db and vitals.db. `catch_up` reads what is new."""

    def __init__(self):
        self.last_event = 0
        self.last_tick_row = 0
        self.types: collections.Counter = collections.Counter()
        self.effects: collections.Counter = collections.Counter()          # (kind, origin, outcome)
        self.durations: dict[str, Histogram] = {}
        self.open_origins: dict[str, str] = {}                              # effect id → origin, until it ends
        self.survival: collections.Counter = collections.Counter()         # rule
        self.process_restarts: collections.Counter = collections.Counter() # process
        self.rule_errors = 0                                                # in error events
        self.rule_errors_unrecorded = 0                                     # in error_runs, as last read
        self.tasks: dict[str, str] = {}                                     # task id → status, while open
        self.ended_tasks: collections.Counter = collections.Counter()      # status → tasks that ended in it
        self.ticks = Histogram(TICK_BUCKETS)
        self.last_effect: dict[str, dict] = {}                              # target → its newest effect (the overview)
        self.open_trims: dict[str, str] = {}                                # rotate-file effect id → its watch, until it ends
        self.bytes_freed: collections.Counter = collections.Counter()      # watch → bytes its rotate-files freed
        self.config_restores: collections.Counter = collections.Counter()  # process → restore-config acked
        self.open_dir_trims: dict[str, str] = {}                            # trim-dir effect id → its watch, until it ends
        self.dir_removed: collections.Counter = collections.Counter()      # watch → files its trim-dirs took away
        self.dir_freed: collections.Counter = collections.Counter()        # watch → their bytes

    def fold_all(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.types[ev.type] += 1
            self.fold(ev)
            self.last_event = ev.id

    def fold_ticks(self, vitals: sqlite3.Connection) -> None:
        for row, duration_ms in vitalsdb.tick_durations(vitals, self.last_tick_row):
            self.ticks.observe(duration_ms / 1000)
            self.last_tick_row = row

    def fold(self, ev: Event) -> None:
        d = ev.data
        if ev.type == EffectEvent.COMMITTED:
            self.open_origins[d.get("id", "")] = d.get("origin", "unknown")
            if d.get("origin") == "survival":
                self.survival[(d.get("params") or {}).get("rule") or d.get("kind", "unknown")] += 1
            if ev.target:
                self.remember_effect(ev.target, d, ev.ts)
            if d.get("kind") == EffectKind.ROTATE_FILE:
                self.open_trims[d.get("id", "")] = str((d.get("params") or {}).get("watch") or "unknown")
            if d.get("kind") == EffectKind.TRIM_DIR:
                self.open_dir_trims[d.get("id", "")] = str((d.get("params") or {}).get("watch") or "unknown")
        elif ev.type in EFFECT_END_STATES:
            if d.get("requeued"):
                return
            last = self.last_effect.get(ev.target or "")
            if last is not None and last["id"] == d.get("effect_id"):
                last.update(outcome=EFFECT_END_STATES[ev.type], error=d.get("error") or d.get("reason"))
            origin = self.open_origins.pop(d.get("effect_id", ""), "unknown")
            kind = d.get("kind", "unknown")
            self.effects[(kind, origin, EFFECT_END_STATES[ev.type])] += 1
            if kind == EffectKind.RESTART_PROCESS and ev.type == EffectEvent.ACKED and ev.target:
                self.process_restarts[ev.target] += 1
            if kind == EffectKind.RESTORE_CONFIG and ev.type == EffectEvent.ACKED and ev.target:
                self.config_restores[ev.target] += 1
            watch = self.open_trims.pop(d.get("effect_id", ""), None)
            if watch is not None and ev.type == EffectEvent.ACKED and isinstance(d.get("bytes_freed"), int):
                self.bytes_freed[watch] += d["bytes_freed"]
            watched_dir = self.open_dir_trims.pop(d.get("effect_id", ""), None)
            if watched_dir is not None and isinstance(d.get("removed"), int):   # a failed trim may have removed some
                self.dir_removed[watched_dir] += d["removed"]
                self.dir_freed[watched_dir] += int(d.get("bytes_freed") or 0)
            if ev.type == EffectEvent.ACKED and isinstance(d.get("duration_s"), (int, float)):
                self.durations.setdefault(kind, Histogram(EFFECT_BUCKETS)).observe(d["duration_s"])
        elif ev.type == EventType.ERROR:
            if ev.source in ("engine", "tick") and (ev.target or "").startswith("engine"):
                self.rule_errors += int(d.get("count", 1) or 1)
        elif ev.type in TASK_EVENTS and ev.target:
            now = self.tasks.get(ev.target, NEW)
            if ev.type == TaskEvent.RETRIED and now == NEW and self.ended_tasks[TaskStatus.GIVEN_UP]:
                now = TaskStatus.GIVEN_UP               # given up, counted and forgotten: open again
                self.ended_tasks[now] -= 1
            after = TRANSITIONS.get(now, {}).get(ev.type, now)
            if after in ENDED_TASK_STATUSES:
                self.tasks.pop(ev.target, None)
                self.ended_tasks[after] += 1
            else:
                self.tasks[ev.target] = after

    def task_statuses(self) -> collections.Counter:
        """Tasks by status: the open ones by their status, with those that ended."""
        return collections.Counter(self.tasks.values()) + self.ended_tasks


    def remember_effect(self, target: str, effect: dict, ts: float) -> None:
        """The newest effect of each target, as the overview shows it (kind, why, reason, outcome), for
        the LAST_EFFECT_TARGETS targets most recently acted on."""
        params = effect.get("params") or {}
        self.last_effect.pop(target, None)
        self.last_effect[target] = {"id": effect.get("id"), "ts": ts, "kind": effect.get("kind"),
                                    "origin": effect.get("origin"), "why": effect_why(params),
                                    "reason": params.get("reason") or params.get("title"), "outcome": "pending",
                                    "error": None}
        if len(self.last_effect) > LAST_EFFECT_TARGETS:
            del self.last_effect[next(iter(self.last_effect))]


def rebuild_counts(events: sqlite3.Connection, upto_id: int) -> Counts:
    """The counts from the first event, without a checkpoint: the type counts by one GROUP BY, the
    rest from the events of the few types they need, found by the type index."""
    counts = Counts()
    counts.last_event = upto_id
    counts.types.update(eventsdb.event_type_counts(events, upto_id))
    for ev in eventsdb.events_of_types(events, FOLDED_TYPES, upto_id=upto_id):
        counts.fold(ev)
    return counts


def dump_counts(c: Counts) -> dict:
    """What a checkpoint keeps of the counts: those of events.db (the ticks' come from vitals.db, which
    keeps a day, and the unrecorded errors are read at each scrape)."""
    return {"last_event": c.last_event, "types": dict(c.types), "effects": [[*key, n] for key, n in c.effects.items()],
            "durations": {kind: [h.counts, h.sum] for kind, h in c.durations.items()},
            "open_origins": c.open_origins, "survival": dict(c.survival), "process_restarts": dict(c.process_restarts),
            "rule_errors": c.rule_errors, "tasks": c.tasks, "ended_tasks": dict(c.ended_tasks),
            "last_effect": c.last_effect, "open_trims": c.open_trims, "bytes_freed": dict(c.bytes_freed),
            "config_restores": dict(c.config_restores), "open_dir_trims": c.open_dir_trims,
            "dir_removed": dict(c.dir_removed), "dir_freed": dict(c.dir_freed)}


def load_counts(raw: dict) -> Counts:
    c = Counts()
    c.last_event, c.rule_errors = raw["last_event"], raw["rule_errors"]
    for name in ("types", "survival", "process_restarts", "ended_tasks", "bytes_freed", "config_restores",
                 "dir_removed", "dir_freed"):
        getattr(c, name).update(raw[name])
    c.effects.update({(kind, origin, outcome): n for kind, origin, outcome, n in raw["effects"]})
    for kind, (buckets, total) in raw["durations"].items():
        h = c.durations[kind] = Histogram(EFFECT_BUCKETS)
        if len(buckets) != len(h.counts):
            raise ValueError(f"the {kind} histogram has {len(buckets)} buckets, not {len(h.counts)}")
        h.counts, h.sum = list(buckets), total
    c.open_origins, c.tasks, c.last_effect, c.open_trims = (raw["open_origins"], raw["tasks"], raw["last_effect"],
                                                            raw["open_trims"])
    c.open_dir_trims = raw["open_dir_trims"]
    return c


COUNTS = Projection(name="web.metrics", new=Counts, fold=Counts.fold_all, dump=dump_counts, load=load_counts,
                    rebuild=rebuild_counts, code=(Counts, Histogram, EFFECT_BUCKETS, FOLDED_TYPES, effect_why,
                                                  TRANSITIONS, ENDED_TASK_STATUSES, LAST_EFFECT_TARGETS))


class MetricsFold:
    """The counts as a checkpointed projection, caught up at each scrape on that scrape's connections."""

    def __init__(self, checkpoints: Path):
        self.folded: Folded[Counts] | None = None
        self.checkpoints = checkpoints

    def catch_up(self, events: sqlite3.Connection, vitals: sqlite3.Connection | None) -> Counts:
        with connection.read_snapshot(events):
            if self.folded is None:
                self.folded = Folded(COUNTS, events, self.checkpoints, batch=CATCH_UP_BATCH)
            counts = self.folded.catch_up(events)
            counts.rule_errors_unrecorded = errorruns.unrecorded_engine_errors(events)
            counts.history = historysize.summary(events, None)    # as read at each scrape, never checkpointed
        if vitals is not None:
            counts.fold_ticks(vitals)
        return counts

    def save(self) -> None:
        if self.folded is not None:
            self.folded.save()


class Collector:
    """A prometheus_client collector over Counts and the live status."""

    def __init__(self, counts: Counts, status: Status | None, vitals: dict[str, dict], spend: list[dict] = (),
                 schedules: list[dict] = ()):
        self.counts, self.status, self.vitals, self.spend = counts, status, vitals, spend
        self.schedules = schedules

    def collect(self) -> Iterable:
        c, s = self.counts, self.status
        up = GaugeMetricFamily("pulse_worker_up", "1 if the worker runs", labels=["worker"])
        state = GaugeMetricFamily("pulse_worker_state", "1 for the worker's current state", labels=["worker", "state"])
        restarts = CounterMetricFamily("pulse_worker_restarts", "Restarts since pulsed started", labels=["worker"])
        age = GaugeMetricFamily("pulse_worker_heartbeat_age_seconds", "Since the last heartbeat", labels=["worker"])
        for w in s.workers if s else ():
            up.add_metric([w.name], 1 if w.state in (WorkerState.RUNNING, LATE) else 0)   # late: running, heartbeat overdue
            for name in STATES:
                state.add_metric([w.name, name], 1 if w.state == name else 0)
            restarts.add_metric([w.name], w.restarts)
            if w.heartbeat_age_s is not None:
                age.add_metric([w.name], w.heartbeat_age_s)
        yield from (up, state, restarts, age)
        alive = GaugeMetricFamily("pulse_process_alive", "1 if the critical process is alive", labels=["process"])
        process_restarts = CounterMetricFamily("pulse_process_restarts", "Restarts of the critical process (acked)",
                                               labels=["process"])
        memory = GaugeMetricFamily("pulse_process_memory_bytes", "RSS of the critical process and its descendants, "
                                   "as last sampled", labels=["process"])
        ceiling = GaugeMetricFamily("pulse_process_memory_max_bytes", "The critical process's memory ceiling "
                                    "([[process]] memory max_mb)", labels=["process"])
        pstate = GaugeMetricFamily("pulse_process_state", "1 for the guarded process's current state (starting, "
                                   "running, unhealthy, backoff, fatal, dead, stopped, paused, unknown)",
                                   labels=["process", "state"])
        failing = GaugeMetricFamily("pulse_process_failing", "1 if the guarded process is dead, in backoff, fatal "
                                    "or unhealthy (what makes `pulsectl status` exit 5)", labels=["process"])
        uptime = GaugeMetricFamily("pulse_process_uptime_seconds", "Since the running process started", labels=["process"])
        healthy = GaugeMetricFamily("pulse_process_health_ok", "1 if the last health probe passed", labels=["process"])
        latency = GaugeMetricFamily("pulse_process_health_latency_seconds", "How long the last health probe took",
                                    labels=["process"])
        for p in s.processes if s else ():
            alive.add_metric([p.name], 1 if p.alive else 0)
            process_restarts.add_metric([p.name], c.process_restarts[p.name])
            if p.rss_mb is not None:
                memory.add_metric([p.name], round(p.rss_mb * MIB))
            if p.max_mb is not None:
                ceiling.add_metric([p.name], round(p.max_mb * MIB))
            for name in ProcessState:
                pstate.add_metric([p.name, name], 1 if p.state == name else 0)
            failing.add_metric([p.name], 1 if p.state in PROCESS_FAILING else 0)
            if p.uptime_s is not None:
                uptime.add_metric([p.name], p.uptime_s)
            if p.health is not None:
                healthy.add_metric([p.name], 1 if p.health.ok else 0)
                if p.health.latency_ms is not None:
                    latency.add_metric([p.name], p.health.latency_ms / 1000)
        yield from (alive, process_restarts, memory, ceiling, pstate, failing, uptime, healthy, latency)
        yield from self.guards()
        effects = CounterMetricFamily("pulse_effects", "Effects that ended", labels=["kind", "origin", "outcome"])
        for (kind, origin, outcome), n in sorted(c.effects.items()):
            effects.add_metric([kind, origin, outcome], n)
        yield effects
        durations = HistogramMetricFamily("pulse_effect_duration_seconds", "Run time of acked effects", labels=["kind"])
        for kind, h in sorted(c.durations.items()):
            durations.add_metric([kind], h.buckets(), h.sum)
        yield durations
        ticks = HistogramMetricFamily("pulse_tick_duration_seconds", "One tick's rule chain")
        ticks.add_metric([], c.ticks.buckets(), c.ticks.sum)
        yield ticks
        survival = CounterMetricFamily("pulse_survival_actions", "Effects the survival rules committed", labels=["rule"])
        for rule, n in sorted(c.survival.items()):
            survival.add_metric([rule], n)
        yield survival
        yield CounterMetricFamily("pulse_rule_errors", "Errors of the engine's rules",
                                  value=c.rule_errors + c.rule_errors_unrecorded)
        types = CounterMetricFamily("pulse_events", "Events in events.db", labels=["type"])
        for type_, n in sorted(c.types.items()):
            types.add_metric([type_], n)
        yield types
        tasks = GaugeMetricFamily("pulse_tasks", "Tasks by status", labels=["status"])
        for status, n in sorted(c.task_statuses().items()):
            tasks.add_metric([status], n)
        yield tasks
        yield CounterMetricFamily("pulse_gate_blocked", "Calls the agent's gate refused", value=c.types[EventType.GATE_BLOCKED])
        engine = GaugeMetricFamily("pulse_engine_info", "The engine's commit", labels=["commit"])
        if s and s.engine_commit:
            engine.add_metric([s.engine_commit], 1)
        yield engine
        build = GaugeMetricFamily("pulse_build_info", "Pulse's version", labels=["version"])
        build.add_metric([__version__], 1)
        yield build
        host = self.vitals.get(HOST) or {}
        for field in HOST_FIELDS:
            if isinstance(host.get(field), (int, float)):
                name = field.removesuffix("_pct")
                yield GaugeMetricFamily(f"pulse_host_{name}_percent", f"Host {name} use, %", value=host[field])
        yield from spend_metrics(self.spend)
        yield from schedule_metrics(self.schedules)
        yield from history_metrics(getattr(c, "history", None))


    def guards(self) -> Iterable:
        """The config files of each process against their known-good copies, and each watched glob."""
        c, s = self.counts, self.status
        changed = GaugeMetricFamily("pulse_process_config_changed", "1 if a config file of the process differs "
                                    "from (or is missing beside) its known-good copy", labels=["process"])
        restores = CounterMetricFamily("pulse_process_config_restores", "Known-good config restores (acked)",
                                       labels=["process"])
        for p in s.processes if s else ():
            if p.config is not None:
                changed.add_metric([p.name], int(any(f.state in ("changed", "missing") for f in p.config.files)))
                restores.add_metric([p.name], c.config_restores[p.name])
        total = GaugeMetricFamily("pulse_watched_file_bytes", "Size of the files a [[watch.file]] glob matches, "
                                  "as last sampled", labels=["watch"])
        largest = GaugeMetricFamily("pulse_watched_file_largest_bytes", "The largest of them", labels=["watch"])
        over = GaugeMetricFamily("pulse_watched_files_over_max", "How many of them are over max_mb", labels=["watch"])
        freed = CounterMetricFamily("pulse_watched_file_bytes_freed", "Bytes its rotations and truncations freed",
                                    labels=["watch"])
        for f in s.files if s else ():
            if f.files is not None:
                total.add_metric([f.name], f.bytes)
                largest.add_metric([f.name], f.largest_bytes)
                over.add_metric([f.name], f.over)
            freed.add_metric([f.name], c.bytes_freed[f.name])
        yield from (changed, restores, total, largest, over, freed)
        yield from self.dir_guards()
        yield from fresh_metrics(s.fresh if s else ())

    def dir_guards(self) -> Iterable:
        """Each watched directory glob: its files as last sampled, and what its trims took away."""
        c, s = self.counts, self.status
        files = GaugeMetricFamily("pulse_watched_dir_files", "Files in the directories a [[watch.dir]] glob "
                                  "matches, as last sampled", labels=["watch"])
        size = GaugeMetricFamily("pulse_watched_dir_bytes", "Their size", labels=["watch"])
        over = GaugeMetricFamily("pulse_watched_dirs_over_bounds", "How many of the directories break a bound",
                                 labels=["watch"])
        oldest = GaugeMetricFamily("pulse_watched_dir_oldest_file_mtime_seconds", "The oldest file's mtime "
                                   "(Unix time)", labels=["watch"])
        removed = CounterMetricFamily("pulse_watched_dir_files_removed", "Files its trims deleted or archived",
                                      labels=["watch"])
        freed = CounterMetricFamily("pulse_watched_dir_bytes_freed", "Their bytes", labels=["watch"])
        for d in s.dirs if s else ():
            if d.dirs is not None:
                files.add_metric([d.name], d.files)
                size.add_metric([d.name], d.bytes)
                over.add_metric([d.name], d.over)
                if d.oldest_mtime is not None:
                    oldest.add_metric([d.name], d.oldest_mtime)
            removed.add_metric([d.name], c.dir_removed[d.name])
            freed.add_metric([d.name], c.dir_freed[d.name])
        yield from (files, size, over, oldest, removed, freed)


def fresh_metrics(proofs: Iterable) -> Iterable:
    """Each [[watch.fresh]] (its FreshWatchStatus): stale or not, and how long since its last sign of work."""
    stale = GaugeMetricFamily("pulse_fresh_stale", "1 if the [[watch.fresh]] saw no sign of work within its "
                              "within_s", labels=["watch"])
    age = GaugeMetricFamily("pulse_fresh_age_seconds", "Time from its last sign of work (or, if none was seen, "
                            "from when watching began) to its latest sample", labels=["watch"])
    within = GaugeMetricFamily("pulse_fresh_within_seconds", "Its within_s", labels=["watch"])
    for f in proofs:
        within.add_metric([f.name], f.within_s)
        if f.stale is not None:
            stale.add_metric([f.name], int(f.stale))
        if f.age_s is not None:
            age.add_metric([f.name], f.age_s)
    return (stale, age, within)


def spend_metrics(rows: Iterable[dict]) -> Iterable:
    """Spend against limits per agent (pulse.agents.spend.overview; the host as agent="*"): a limit
    that is not set is not exported."""
    spent = GaugeMetricFamily("pulse_agent_spend_usd", "Reported cost of the agent's runs (reserved while "
                              "they run) in the UTC day or month", labels=["agent", "window"])
    limit = GaugeMetricFamily("pulse_agent_spend_limit_usd", "The agent's spend limit ([[agent]] budget; "
                              "agent=\"*\": the host's [budget])", labels=["agent", "window"])
    runs = GaugeMetricFamily("pulse_agent_runs_last_hour", "Runs the agent started in the last hour", labels=["agent"])
    runs_limit = GaugeMetricFamily("pulse_agent_runs_per_hour_limit", "The agent's runs_per_hour", labels=["agent"])
    waiting = GaugeMetricFamily("pulse_agent_tasks_waiting_budget", "Tasks held back by a spend limit",
                                labels=["agent"])
    for r in rows:
        for window, used, of in (("day", r["today_usd"], r["usd_per_day"]), ("month", r["month_usd"], r["usd_per_month"])):
            spent.add_metric([r["agent"], window], used)
            if of is not None:
                limit.add_metric([r["agent"], window], of)
        runs.add_metric([r["agent"]], r["runs_last_hour"])
        if r["runs_per_hour"] is not None:
            runs_limit.add_metric([r["agent"]], r["runs_per_hour"])
        waiting.add_metric([r["agent"]], len(r["waiting_tasks"]))
    return (spent, limit, runs, runs_limit, waiting)


def schedule_metrics(rows: Iterable[dict]) -> Iterable:
    """Each [[schedule]] (pulse.core.schedule.rows): its runs, slots skipped behind an open run, runs
    failed in a row, whether a run is open, and when the next is due."""
    runs = CounterMetricFamily("pulse_schedule_runs", "Runs the schedule made (slots and manual)", labels=["schedule"])
    skipped = CounterMetricFamily("pulse_schedule_skipped", "Slots skipped: the last run was still open",
                                  labels=["schedule"])
    failing = GaugeMetricFamily("pulse_schedule_failures_in_row", "Its runs that ended failed, in a row",
                                labels=["schedule"])
    waiting = GaugeMetricFamily("pulse_schedule_run_open", "1 while its last run's task or effect is open",
                                labels=["schedule"])
    due = GaugeMetricFamily("pulse_schedule_next_run_timestamp_seconds", "When its next run is due (unix time)",
                            labels=["schedule"])
    for r in rows:
        runs.add_metric([r["name"]], r["runs"] + r["manual_runs"])
        skipped.add_metric([r["name"]], r["skipped"])
        failing.add_metric([r["name"]], r["failures_in_row"])
        waiting.add_metric([r["name"]], 1 if r["open_run"] else 0)
        due.add_metric([r["name"]], r["next_run"])
    return (runs, skipped, failing, waiting, due)


def history_metrics(h: dict | None) -> Iterable:
    """events.db's live history and what left it for the archive (pulse.store.historysize)."""
    if h is None:
        return ()
    return (GaugeMetricFamily("pulse_history_live_bytes", "Bytes of events.db's pages in use", value=h["live_bytes"]),
            CounterMetricFamily("pulse_history_moved_events", "Events moved out of events.db (archived or deleted)",
                                value=h["moved_events"]),
            GaugeMetricFamily("pulse_history_archive_bytes", "Bytes of the archive's segments", value=h["archive_bytes"]),
            GaugeMetricFamily("pulse_history_archive_segments", "Segments in the archive", value=h["segments"]))


def exposition(counts: Counts, status: Status | None, vitals: dict[str, dict], spend: list[dict] = (),
               schedules: list[dict] = ()) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(counts, status, vitals, spend, schedules))
    return generate_latest(registry)
