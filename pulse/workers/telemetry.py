"""The telemetry worker: a local OTLP/HTTP receiver, when `[telemetry] enabled = true`.

The agent CLIs say what they do while they run, in OpenTelemetry (Claude Code's metrics and events,
Codex's [otel] log events); the runs Pulse starts are pointed here (pulse.agents.otel). This worker
takes POST /v1/logs, /v1/metrics and /v1/traces (application/x-protobuf or application/json, gzip
or not), decodes them with opentelemetry-proto, and folds them (pulse.sensing.otlp) into one
`telemetry` fact per run or session every flush_s. Raw telemetry never reaches events.db.

Bounded, in this order, before a body is read: the caller (beyond loopback: the token), the rate
(a token bucket: 429 with Retry-After), the declared size (Content-Length over max_body_kb: 413,
nothing read), the queue's room (503: OTLP exporters retry it). Callers with a token (the receiver's,
or a run's own, derived from it: pulse.agents.otel.run_token) have a bucket of their own and the whole queue, the others half of it: an
anonymous local flood cannot starve a run's telemetry and so get a quiet run ended as stalled. A body without a Content-Length is
read only up to the limit. What is decoded waits in a queue bounded by queue_kb for the main loop,
which folds it; the facts a flush writes are at most max_sources, so at most
max_sources * 60 / flush_s events a minute (32 * 12 = 384 by default), whatever is sent.

With `[telemetry] export`, every run that ended (task-acked, task-failed) is sent on to the
operator's collector as GenAI trace spans (pulse.agents.runspans), by a thread of its own with a
bounded queue (pulse.workers.otlpexport): a collector that is down costs a counter, never a wait.

Not core, like the web worker: uvicorn serves in a thread of its own, and the main loop heartbeats
only while that server's loop turns. Where it listens goes to the runtime directory
(`telemetry.json`), for the executor to hand each run.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time
import zlib

from pulse.core import config as configmod
from pulse.core import procs
from pulse.core.wire import eventmsgs
from pulse.store import eventsdb
from pulse.workers.harness import Worker
from pulse.workers.serverthread import ServerThread
from pulse.workers.webserver import give_back, libc, limit_arenas

# Imports inside functions: the OTLP receiver's protobuf modules and server (~15-35 ms each) load in the
# telemetry worker's own process, not in the forkserver that preloads every worker's module.

PROTOBUF, JSON = "application/x-protobuf", "application/json"
SIGNALS = ("logs", "metrics", "traces")
MAX_CONNECTIONS = 64          # uvicorn answers 503 past this many at once
KEEP_ALIVE_S = 5
ARENAS = 2                    # malloc arenas (the server's loop, the main loop): see pulse.workers.webserver
EXPORT_PER_FLUSH = 20        # ended runs read and offered to the exporter per flush at most
TRIM_AFTER_BYTES = 1 << 20    # a fold of this much hands freed memory back (malloc_trim costs < 1 ms)
CHECKPOINTS = "checkpoints"       # the home's directory of checkpoints (pulse.store.projection.DIRECTORY)
EXPORT_CHECKPOINT = "telemetry-export.json"   # the last run end the exporter sent or dropped
OBSERVE_EVERY = 12                # flushes a session's spend is summed over before it is recorded
SESSIONS_TRACKED = 256        # sessions whose last minute of requests is kept for the loop notice
SESSION_NOTICE_EVERY_S = 3600.0   # a session still looping is said again after this long


def request_types() -> dict[str, tuple[type, type]]:
    """Each signal's export request and response, from opentelemetry-proto."""
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as traces
    return {"logs": (logs.ExportLogsServiceRequest, logs.ExportLogsServiceResponse),
            "metrics": (metrics.ExportMetricsServiceRequest, metrics.ExportMetricsServiceResponse),
            "traces": (traces.ExportTraceServiceRequest, traces.ExportTraceServiceResponse)}


def read_token(path) -> str:
    """The receiver's token, made (mode 0600, created exclusively) if there is none yet."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    import secrets
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


class Bucket:
    """A token bucket: `rate` a second, up to `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst, self.level, self.at = rate, burst, float(burst), time.monotonic()

    def take(self) -> float:
        """0 when admitted, else the seconds until one would be."""
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= 1:
            self.level -= 1
            return 0.0
        return (1 - self.level) / self.rate


class Receiver:
    """The ASGI app: checks, reads within bounds, decodes, queues. Runs on the server's loop only."""

    def __init__(self, settings: configmod.Telemetry, token: str, token_required: bool, wake_fd: int):
        self.max_body = settings.max_body_kb * 1024
        self.queue_cap = settings.queue_kb * 1024
        self.token, self.token_required = token, token_required     # not required: loopback only
        # Callers with a token (the receiver's, or a run's own) have a bucket and half the queue of
        # their own: a local process flooding the receiver without it cannot starve a run's telemetry
        # (and so get a healthy, quiet run ended as stalled).
        self.buckets = {known: Bucket(settings.requests_per_s, settings.burst) for known in (True, False)}
        self.types = request_types()
        self.queue: collections.deque = collections.deque()    # (signal, message, bytes)
        self.queued = 0                         # bytes of the bodies in the queue (or being read)
        self.anonymous = 0                      # ... of them, from callers without the token
        self.lock = threading.Lock()
        self.wake_fd = wake_fd
        self.counts: collections.Counter = collections.Counter()   # accepted, and each refusal's status

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        status, headers, body = await self.handle(scope, receive)
        self.counts["accepted" if status == 200 else str(status)] += 1
        if status == 200 and self.caller({k.decode("latin-1").lower(): v.decode("latin-1")
                                          for k, v in scope["headers"]}) is not None:
            self.counts["with_token"] += 1      # of those accepted: a run Pulse started, or the operator's
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def handle(self, scope, receive) -> tuple[int, list, bytes]:
        signal = scope["path"].rstrip("/").removeprefix("/v1/")
        if signal not in SIGNALS:
            return refuse(404, f"no such OTLP path {scope['path']!r}: POST /v1/logs, /v1/metrics or /v1/traces")
        if scope["method"] != "POST":
            return refuse(405, "OTLP/HTTP takes POST only")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        caller = self.caller(headers)
        known = caller is not None
        if self.token_required and not known:
            return refuse(401, "this receiver listens beyond loopback: send its token (Authorization: Bearer "
                               "TOKEN, or X-Pulse-Token), from <home>/telemetry.token")
        wait = self.buckets[known].take()
        if wait:
            return refuse(429, "too many requests", [(b"retry-after", str(max(1, round(wait))).encode())])
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in (PROTOBUF, JSON):
            return refuse(415, f"content-type {kind or 'missing'}: send {PROTOBUF} or {JSON}")
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", "gzip"):
            return refuse(415, f"content-encoding {encoding}: send gzip or none")
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return refuse(413, f"a body of {declared} bytes is over this receiver's limit ({self.max_body})")
        # Room in the queue is taken before the body is read, so what is being read and what waits to
        # be folded are bounded together: a body of unknown length (chunked, or gzip) takes the most.
        room = self.max_body if declared is None or encoding == "gzip" else int(declared)
        if not self.reserve(room, known):
            return refuse(503, "the receiver's queue is full", [(b"retry-after", b"1")])
        try:
            message = await self.read_message(receive, signal, kind, encoding)
        except Refused as refusal:
            self.release(room, known)
            return refusal.answer
        except BaseException:           # the client went away mid-body, the server is stopping
            self.release(room, known)
            raise
        with self.lock:
            self.queue.append((signal, message, room, caller))
        try:
            os.write(self.wake_fd, b"!")
        except BlockingIOError:
            pass                        # the main loop has a wake-up waiting already
        reply = self.types[signal][1]()
        if kind == PROTOBUF:
            return 200, [(b"content-type", PROTOBUF.encode())], reply.SerializeToString()
        return 200, [(b"content-type", JSON.encode())], b"{}"

    async def read_message(self, receive, signal: str, kind: str, encoding: str):
        """The request's body, read within the limit, unzipped and decoded; Refused says why not."""
        body = await read_body(receive, self.max_body)
        if body is None:
            raise Refused(413, f"the body is over this receiver's limit ({self.max_body} bytes)")
        if encoding == "gzip":
            try:
                body = gunzip(body, self.max_body)
            except ValueError as err:
                raise Refused(400, str(err)) from None
            if body is None:
                raise Refused(413, f"the body, unzipped, is over this receiver's limit ({self.max_body} bytes)")
        try:
            return decode(self.types[signal][0], body, kind)
        except Exception as err:        # protobuf's DecodeError, json_format's ParseError, bad UTF-8
            raise Refused(400, f"not an OTLP {signal} export request ({kind}): {type(err).__name__}") from None

    def reserve(self, room: int, known: bool) -> bool:
        """Take `room` in the queue: a caller without the token only within the queue's half of its own."""
        with self.lock:
            if self.queued + room > self.queue_cap or (not known and self.anonymous + room > self.queue_cap // 2):
                return False
            self.queued += room
            self.anonymous += 0 if known else room
            return True

    def release(self, room: int, known: bool) -> None:
        with self.lock:
            self.queued -= room
            self.anonymous -= 0 if known else room

    def caller(self, headers: dict) -> str | None:
        """Who sent it: "*" with the receiver's token (the operator's own senders), the run id with
        that run's token (X-Pulse-Run and run_token), None without either."""
        import hmac

        from pulse.agents.otel import run_token
        given = headers.get("x-pulse-token") or ""
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer "):].strip()
        if not given:
            return None
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return "*"
        run = headers.get("x-pulse-run") or ""
        if run and hmac.compare_digest(given.encode(), run_token(self.token, run).encode()):
            return run
        return None

    def next_message(self) -> tuple[str, object, int, bool] | None:
        """The oldest decoded request, or None; its room stays taken until `release`."""
        with self.lock:
            return self.queue.popleft() if self.queue else None


class Refused(Exception):
    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.answer = refuse(status, why)


def refuse(status: int, why: str, headers: list | None = None) -> tuple[int, list, bytes]:
    return status, [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])], why.encode() + b"\n"


async def read_body(receive, limit: int) -> bytes | None:
    """The request's body, or None once it passes `limit` (what is past it is never kept)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def gunzip(body: bytes, limit: int) -> bytes | None:
    """gzip's content, or None when it unpacks past `limit` (a zip bomb stops there); ValueError: not gzip."""
    unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = unzip.decompress(body, limit + 1)
    except zlib.error as err:
        raise ValueError(f"content-encoding gzip, but the body is not gzip: {err}") from None
    return None if len(out) > limit or unzip.unconsumed_tail else out


def decode(request_type: type, body: bytes, kind: str):
    message = request_type()
    if kind == PROTOBUF:
        message.ParseFromString(body)
    else:
        from google.protobuf import json_format
        json_format.Parse(body.decode("utf-8"), message, ignore_unknown_fields=True)
    return message


class TelemetryWorker(Worker):
    name = "telemetry"

    def open(self) -> None:
        settings = self.config.telemetry
        host, port = configmod.listen_address(settings.listen)
        self.remote = not configmod.is_loopback(host)
        token = read_token(self.paths.telemetry_token)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, reuse_port=False)
        self.port = self.sock.getsockname()[1]
        # Published as soon as it listens, before the server's imports: a run starting meanwhile waits
        # for this address (pulse.agents.agentrun), and what it sends waits in the listen backlog.
        self.publish_address()
        import uvicorn

        from pulse.sensing.otlp import Fold
        self.libc = libc()
        limit_arenas(self.libc, ARENAS)        # before the server's thread makes its own
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.receiver = Receiver(settings, token, self.remote, self.wake_w)
        self.fold = Fold(settings.max_sources)
        self.flush_s = settings.flush_s
        self.next_flush = time.monotonic() + self.flush_s
        self.pending: list = []                # tallies a failed write keeps for the next flush
        self.written = 0                       # telemetry facts written since this worker started
        self.unobserved: dict[tuple[str, bool], dict] = {}     # (session, counted) → its spend not yet recorded
        self.flushes_unobserved = 0
        self.session_rates: dict[str, collections.deque] = {}   # session → (at, requests, tool calls) of its last minute
        self.noticed: dict[str, float] = {}    # session → when its loop was last said
        self.db = eventsdb.open_events(self.paths.events_db)
        self.handlers[self.wake_r] = self.take_queue
        self.server = uvicorn.Server(uvicorn.Config(
            self.receiver, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1,
            limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=KEEP_ALIVE_S))
        self.serving = ServerThread(self.server, self.sock, self.config.timings.heartbeat_ms / 1000, "otlp-server")
        self.exporter = self.open_export(settings)
        self.own_values: dict = {}             # this worker's counters, as the metrics' export reads them
        self.metrics = self.open_metrics(settings)
        self.export_file = self.paths.home / CHECKPOINTS / EXPORT_CHECKPOINT
        self.export_after = self.exported_until() if self.exporter is not None else 0
        self.export_saved = self.export_after
        self.log.info("receiving OTLP/HTTP at %s%s", self.url(), " (token required)" if self.remote else "")

    def url(self) -> str:
        host, _ = configmod.listen_address(self.config.telemetry.listen)
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"   # how a run on this host reaches it
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def publish_address(self) -> None:
        """Where runs send their telemetry, for the executor (pulse.agents.otel): written whole."""
        path = self.paths.telemetry_file
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url(), "pid": os.getpid(), "proc_start": procs.proc_start(os.getpid()),
                       "token_required": self.remote}, f)
        os.replace(tmp, path)

    def take_queue(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        now, folded = time.time(), 0
        while (item := self.receiver.next_message()) is not None:
            signal, message, room, caller = item
            try:
                self.fold.fold(signal, message, now, caller)
            except Exception as err:              # a decoded request the fold cannot read: dropped, said
                self.log.warning("an OTLP %s request was not folded: %s: %s", signal, type(err).__name__, err)
            finally:
                del message, item
                self.receiver.release(room, caller is not None)   # its room is free once it is folded
            folded += room
        if folded >= TRIM_AFTER_BYTES:
            give_back(self.libc)                  # a burst's buffers go back to the system, not kept
    def next_timer(self) -> float:
        return self.next_flush

    def on_timer(self, now: float) -> None:
        if now >= self.next_flush:
            self.flush()
            self.export_runs()
            self.own_values = self.own_counts()
            self.next_flush = time.monotonic() + self.flush_s

    def open_export(self, settings: configmod.Telemetry):
        """The exporter of Pulse's runs to the operator's collector ([telemetry] export), or None."""
        if settings.export is None:
            return None
        from pulse.agents import runspans
        from pulse.workers.otlpexport import Exporter
        resource = self.export_resource()
        return Exporter(settings.export, settings.export_headers,
                        lambda batch: runspans.export_request(batch, resource),
                        settings.export_queue, settings.export_give_up_s).start()

    def open_metrics(self, settings: configmod.Telemetry):
        """Pulse's own metrics to the operator's collector, through the OpenTelemetry SDK, or None."""
        if settings.export is None or not settings.export_metrics_s:
            return None
        from pulse.store.projection import DIRECTORY
        from pulse.workers.otlpmetrics import MetricsExport, Snapshot
        snapshot = Snapshot(self.paths.events_db, self.paths.home / DIRECTORY, lambda: self.own_values)
        return MetricsExport(settings.export, settings.export_headers, settings.export_metrics_s, snapshot,
                             self.export_resource())

    def export_resource(self) -> dict:
        return {"service.name": "pulse", "service.instance.id": f"{socket.gethostname()}:{self.paths.home.name}",
                "host.name": socket.gethostname()}

    def exported_until(self) -> int:
        """Where the export goes on from: the checkpoint (the last run end sent or dropped, so that
        runs that ended while this worker was down, or were offered and not yet sent when it died,
        are sent now), else, the first time, the newest event (the history before is not sent)."""
        try:
            return int(json.loads(self.export_file.read_text())["after_id"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.log.warning("the export's checkpoint %s is unreadable (%s): runs from now on are sent",
                             self.export_file, err)
        after = eventsdb.last_event_id(self.db)
        self.save_export_checkpoint(after)
        return after

    def save_export_checkpoint(self, after: int) -> None:
        """Written whole (a temporary file renamed over it)."""
        try:
            self.export_file.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = self.export_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"after_id": after, "url": self.config.telemetry.export}))
            os.replace(tmp, self.export_file)
            self.export_saved = after
        except OSError as err:          # a full disk: kept in memory, tried again at the next flush
            self.log.warning("the export's checkpoint was not written: %s", err)

    def export_runs(self) -> None:
        """Runs that ended since the last look, offered to the exporter (which never makes this wait);
        the checkpoint moved on to what it has sent or dropped."""
        from pulse.agents import runspans
        if self.exporter is None:
            return
        if (done := self.exporter.status_done()) > self.export_saved:
            self.save_export_checkpoint(done)
        try:
            # a few a flush: each reads its run's facts, and this loop must keep heartbeating
            ends = eventsdb.read_events(self.db, after_id=self.export_after, types=runspans.RUN_ENDS,
                                        limit=EXPORT_PER_FLUSH)
        except Exception as err:        # a busy store: next time
            self.log.warning("ended runs not read for export: %s", err)
            return
        for ev in ends:
            self.export_after = ev.id
            try:
                run = runspans.read_run(self.db, ev)
            except Exception as err:    # one run's facts unreadable: that run is not sent, the others are
                self.log.warning("run of event %d not exported: %s: %s", ev.id, type(err).__name__, err)
                run = None
            # every end is offered, a run or not, so the checkpoint passes it once it is done
            self.exporter.offer(runspans.spans(run) if run is not None else None, ev.id)

    def flush(self) -> None:
        """One fact per run or session heard from since the last flush (and what a failed write kept);
        then what sessions Pulse did not start spent, and their loops."""
        tallies = self.pending + self.fold.take()
        if not tallies:
            self.observe_sessions([])   # a session's spend is recorded even once it falls silent
            return
        events = [eventmsgs.now_event(eventmsgs.TELEMETRY, self.name, t.target, t.fact()) for t in tallies]
        try:
            eventsdb.append_events(self.db, events)
        except Exception as err:        # a locked or full store: kept for the next flush, within bounds
            self.pending = tallies[-self.fold.max_sources:]
            self.log.warning("telemetry facts not written (%d kept for the next flush): %s", len(self.pending), err)
            return
        self.pending = []
        self.written += len(events)
        self.observe_sessions(tallies)
        self.notice_loops(tallies)

    def observe_sessions(self, tallies: list, now: bool = False) -> None:
        """What sessions Pulse did not start reported spending, into the spend ledger: against the
        host's [budget] when sent with the receiver's token, else only shown (pulse.agents.spend).
        Summed per session over OBSERVE_EVERY flushes (a minute with the default flush_s), so a
        session spending all month adds one event a minute, not one a flush; `now`: written at once."""
        from pulse.agents import spend
        for t in tallies:
            if t.run is None and t.cost_usd > 0:
                key = (t.target, not t.anonymous)
                seen = self.unobserved.setdefault(key, {"usd": 0.0, "counted": not t.anonymous, "session": t.session,
                                                        "service": t.service})
                seen["usd"] = round(seen["usd"] + t.cost_usd, 6)
        self.flushes_unobserved += 1
        if not self.unobserved or not (now or self.flushes_unobserved >= OBSERVE_EVERY
                                       or len(self.unobserved) >= SESSIONS_TRACKED):
            return
        observed = [(target, data) for (target, _), data in self.unobserved.items()]
        self.unobserved, self.flushes_unobserved = {}, 0
        try:
            spend.observe(self.db, observed, self.config.budget, self.name)
        except Exception as err:        # a busy store: this spend of sessions is lost, said
            self.log.warning("the spend of %d session(s) Pulse did not start was not recorded: %s", len(observed), err)

    def notice_loops(self, tallies: list) -> None:
        """A session Pulse did not start (sent with the receiver's token) past [telemetry]
        session_loop_per_min: said (pulse.agents.loopnotice), at most once an hour each, never ended."""
        from pulse.agents import loopnotice, runguards
        per_min = self.config.telemetry.session_loop_per_min
        if per_min is None:
            return
        now = time.time()
        for t in tallies:
            if t.run is not None or t.anonymous:
                continue
            seen = self.session_rates.pop(t.target, None) or collections.deque()
            self.session_rates[t.target] = seen                 # the newest last: the oldest go first
            seen.append((now, t.api_requests, t.tool_calls))
            while seen and seen[0][0] < now - runguards.WINDOW_S:
                seen.popleft()
            requests, calls = sum(r for _, r, _ in seen), sum(c for _, _, c in seen)
            if max(requests, calls) <= per_min or now - self.noticed.get(t.target, -SESSION_NOTICE_EVERY_S) \
                    < SESSION_NOTICE_EVERY_S:
                continue
            who = t.target.removeprefix("session:")
            data = {"session": who, "service": t.service, "guard": "loop", "api_requests": requests,
                    "tool_calls": calls, "per_min": per_min, "at": now,
                    "detail": runguards.loop_words(requests, calls, per_min, f"session {who}")
                              + " (session_loop_per_min; a session Pulse did not start is never ended by it)"}
            try:
                loopnotice.write(self.db, t.target, data, self.name,
                                 f"{t.service or 'a session'} {who} looks in a loop (not Pulse's: left running)")
                self.noticed[t.target] = now
            except Exception as err:
                self.log.warning("the loop of session %s was not said: %s", who, err)
        while len(self.session_rates) > SESSIONS_TRACKED:
            self.session_rates.pop(next(iter(self.session_rates)))
        while len(self.noticed) > SESSIONS_TRACKED:
            self.noticed.pop(next(iter(self.noticed)))

    def own_counts(self) -> dict:
        """This worker's counters for the metrics' export (read on the main loop, handed over whole)."""
        export = self.exporter.status() if self.exporter is not None else {}
        try:                            # the server's thread counts into it, without a lock
            requests = {k: v for k, v in list(self.receiver.counts.items()) if k != "with_token"}
        except RuntimeError:            # it grew a key while read: the last values stand
            requests = self.own_values.get("requests", {})
        return {"requests": requests, "facts": self.written,
                "export_runs": {"sent": export.get("sent", 0), "dropped": export.get("dropped", 0)}}

    def status_extras(self) -> dict:
        export = {**self.exporter.status(), **({"metrics": self.metrics.status()} if self.metrics else {})} \
            if self.exporter is not None else None
        return {"url": self.url(), "token_required": self.remote, "facts": self.written,
                "dropped_records": self.fold.dropped, "requests": dict(self.receiver.counts),
                **({"export": export} if export is not None else {})}

    def healthy(self) -> bool:
        return self.serving.healthy()

    def close(self) -> None:
        self.serving.stop()
        if self.exporter is not None:
            self.exporter.stop()
        if self.metrics is not None:
            self.metrics.stop()
        try:
            self.paths.telemetry_file.unlink()
        except FileNotFoundError:
            pass
        self.take_queue()
        self.flush()                    # what was heard before the stop is not lost
        self.observe_sessions([], now=True)
        self.db.close()
