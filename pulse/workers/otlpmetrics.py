"""Pulse's own metrics, out: a core set of what /metrics serves, sent to the operator's collector
([telemetry] export) through the official OpenTelemetry SDK's OTLP/HTTP metrics exporter.

The SDK's periodic reader collects every `interval_s` on a thread of its own and hands the points
to its OTLPMetricExporter (protobuf, <export>/v1/metrics, the operator's headers, TIMEOUT_S at
most, retried by the SDK within it, no proxy from the environment). The worker's main loop never
waits on it. One collection is one request: nothing queues behind a collector that is down, so
what could not be sent is dropped and counted (`Counting`: the points sent and dropped, the last
error), and, the counters being cumulative, the next export that goes through carries the totals.

The set (cumulative counters and gauges), folded from events.db as /metrics folds them
(pulse.web.metrics.Counts, from the web worker's checkpoint when there is one, never writing it):
  pulse.events                  events written, by `pulse.event.type`
  pulse.effects                 effects ended, by `pulse.effect.kind`, `pulse.effect.origin`, `pulse.effect.outcome`
  pulse.survival.actions        survival's effects, by `pulse.rule`
  pulse.process.restarts        restarts of guarded processes, by `pulse.process`
  pulse.tasks                   tasks by `pulse.task.status` (a gauge)
  pulse.spend.host.today        what the host spent today (UTC), runs and counted sessions (a gauge, USD)
and the telemetry worker's own: pulse.telemetry.requests (by `pulse.outcome`: accepted or the HTTP
status refused), pulse.telemetry.facts, pulse.export.runs (by `pulse.outcome`: sent, dropped).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Imports inside functions: the OpenTelemetry SDK and its exporter (~130-200 ms with requests, python
# -X importtime) load only when [telemetry] export is on, in the telemetry worker's own process, not
# in the forkserver that preloads every worker's module.

log = logging.getLogger("pulse.telemetry")

TIMEOUT_S = 5.0               # one export, retries within it included
SCOPE = "pulse"


def counting_exporter(url: str, headers: dict[str, str]):
    """The SDK's OTLPMetricExporter to <url>/v1/metrics, wrapped so what it sends and drops is counted."""
    import requests
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    session = requests.Session()
    session.trust_env = False          # never through a proxy from the environment: the operator names the collector

    class Counting(MetricExporter):
        def __init__(self):
            self.inner = OTLPMetricExporter(endpoint=url.rstrip("/") + "/v1/metrics", headers=dict(headers),
                                            timeout=TIMEOUT_S, session=session)
            super().__init__()                # cumulative: a dropped export loses nothing of the totals
            self.lock = threading.Lock()
            self.sent = self.dropped = self.exports = 0
            self.last_error = ""

        def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
            points = count_points(metrics_data)
            try:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
            except Exception as err:          # the SDK's bug or a bad answer: this collection is dropped
                result, why = MetricExportResult.FAILURE, f"{type(err).__name__}: {err}"
            else:
                why = f"{url}: the collector did not take the metrics (down, refused, or slower than {TIMEOUT_S:g} s)"
            with self.lock:
                self.exports += 1
                if result == MetricExportResult.SUCCESS:
                    self.sent += points
                else:
                    self.dropped += points
                    self.last_error = why
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return self.inner.force_flush(timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            self.inner.shutdown(timeout_millis=timeout_millis)

        def status(self) -> dict:
            with self.lock:
                return {"url": url.rstrip("/") + "/v1/metrics", "exports": self.exports, "points_sent": self.sent,
                        "points_dropped": self.dropped, "last_error": self.last_error}

    return Counting()


def count_points(metrics_data) -> int:
    return sum(len(m.data.data_points) for rm in metrics_data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics)


class Snapshot:
    """What the callbacks report, read once a collection on the reader's thread (its own connections)."""

    def __init__(self, events_db: Path, checkpoints: Path, own: Callable[[], dict]):
        self.events_db, self.checkpoints, self.own = events_db, checkpoints, own
        self.fold = None
        self.conn: sqlite3.Connection | None = None
        self.values: dict = {}
        self.read_at = 0.0
        self.lock = threading.Lock()

    def get(self) -> dict:
        """The values, read again unless read within the last second (one collection calls every callback)."""
        with self.lock:
            if time.monotonic() - self.read_at > 1.0:
                try:
                    self.values = self.read()
                except Exception as err:        # a busy store: the last values stand, said
                    log.warning("Pulse's metrics were not read for export: %s: %s", type(err).__name__, err)
                self.read_at = time.monotonic()
            return self.values

    def read(self) -> dict:
        from pulse.agents import spend
        from pulse.core import clock
        from pulse.store import connection
        from pulse.store.projection import Folded
        from pulse.web.metrics import COUNTS
        if self.conn is None:
            self.conn = connection.open_readonly(self.events_db)
            self.fold = Folded(COUNTS, self.conn, self.checkpoints, save=False)
        with connection.read_snapshot(self.conn):
            counts = self.fold.catch_up(self.conn, save=False)
            now = clock.now()
            host_today = spend.load(self.conn, now).used(spend.HOST, "usd_per_day", now)
        return {"types": dict(counts.types), "effects": dict(counts.effects), "survival": dict(counts.survival),
                "restarts": dict(counts.process_restarts), "tasks": dict(counts.task_statuses()),
                "host_today": host_today, **self.own()}

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                except sqlite3.Error as err:     # the reader's thread's: it goes with the process
                    log.debug("the metrics' connection was not closed here: %s", err)
                self.conn = None


class MetricsExport:
    """A MeterProvider of its own (never the global one) with the SDK's periodic reader."""

    def __init__(self, url: str, headers: dict[str, str], interval_s: float, snapshot: Snapshot, resource: dict):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        self.snapshot = snapshot
        self.exporter = counting_exporter(url, headers)
        self.reader = PeriodicExportingMetricReader(self.exporter, export_interval_millis=interval_s * 1000,
                                                    export_timeout_millis=TIMEOUT_S * 1000 + 1000)
        self.provider = MeterProvider(resource=Resource.create(resource), metric_readers=[self.reader])
        self.instruments(self.provider.get_meter(SCOPE))

    def instruments(self, meter) -> None:
        from opentelemetry.metrics import Observation

        def observe(key: str, names: tuple[str, ...]):
            def callback(options):
                values = self.snapshot.get().get(key) or {}
                if not isinstance(values, dict):
                    return [Observation(values)]
                return [Observation(n, dict(zip(names, k if isinstance(k, tuple) else (k,))))
                        for k, n in values.items()]
            return [callback]

        meter.create_observable_counter("pulse.events", observe("types", ("pulse.event.type",)), unit="{event}",
                                        description="events written to events.db")
        meter.create_observable_counter("pulse.effects", observe(
            "effects", ("pulse.effect.kind", "pulse.effect.origin", "pulse.effect.outcome")), unit="{effect}",
            description="effects ended")
        meter.create_observable_counter("pulse.survival.actions", observe("survival", ("pulse.rule",)),
                                        unit="{effect}", description="survival's effects, by the rule that committed them")
        meter.create_observable_counter("pulse.process.restarts", observe("restarts", ("pulse.process",)),
                                        unit="{restart}", description="restarts of guarded processes")
        meter.create_observable_gauge("pulse.tasks", observe("tasks", ("pulse.task.status",)), unit="{task}",
                                      description="tasks by status")
        meter.create_observable_gauge("pulse.spend.host.today", observe("host_today", ()), unit="USD",
                                      description="the host's spend today (UTC): runs and counted sessions")
        meter.create_observable_counter("pulse.telemetry.requests", observe("requests", ("pulse.outcome",)),
                                        unit="{request}", description="OTLP requests to the receiver, by outcome")
        meter.create_observable_counter("pulse.telemetry.facts", observe("facts", ()), unit="{event}",
                                        description="telemetry facts written since the worker started")
        meter.create_observable_counter("pulse.export.runs", observe("export_runs", ("pulse.outcome",)),
                                        unit="{run}", description="runs exported as traces, sent or dropped")

    def status(self) -> dict:
        return self.exporter.status()

    def stop(self) -> None:
        """Shut down without a last export (a collector that is down must not hold the worker's stop)."""
        try:
            self.exporter.inner.shutdown()              # a last collection, if the reader makes one, fails fast
            self.provider.shutdown(timeout_millis=1000)
        except Exception as err:
            log.debug("the metrics' export did not shut down cleanly: %s", err)
        self.snapshot.close()
