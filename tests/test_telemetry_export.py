"""[telemetry] export: Pulse's own runs, sent on to an operator's OTLP/HTTP collector as GenAI trace
spans. The collector is a real HTTP server in the test that decodes what it gets with
opentelemetry-proto; the run is a stand-in for Claude Code that calls Pulse's gate through the real
MCP client (`pulsectl mcp`), reports through the official OTel SDK, and prints Claude Code's JSON."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pulse.workers.otlpexport import Exporter
from support import PULSECTL, init_home, wait_for

pytest.importorskip("mcp")

FLUSH_S = 0.3


class Collector:
    """OTLP/HTTP /v1/traces: answers the first `refuse` requests 503 (Retry-After: 0), then 200;
    keeps every request decoded, and the headers it came with."""

    def __init__(self, refuse: int = 0):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
        self.requests: list = []
        self.metrics: list = []                  # /v1/metrics requests, decoded
        self.headers: list[dict] = []
        self.refused = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/metrics" and self.headers.get("Content-Type") == "application/x-protobuf":
                    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
                    metrics = ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    outer.metrics.append(metrics)
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                if outer.refused < refuse:
                    outer.refused += 1
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                outer.requests.append(request)
                outer.headers.append(dict(self.headers))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list:
        return [(rs, span) for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def points(self, name: str) -> dict:
        """The newest data points of metric `name`: {attributes as a sorted tuple: value}."""
        from pulse.sensing.otlp import attributes as decode
        out: dict = {}
        for request in self.metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            out[tuple(sorted(decode(p.attributes).items()))] = value
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(span) -> dict:
    from pulse.sensing.otlp import attributes as decode
    return decode(span.attributes)


# Reports one API request as Claude Code does, looks at events and finishes through Pulse's gate
# (the real MCP client over stdio, `pulsectl mcp`), then prints Claude Code's result JSON.
GATED_CLAUDE = r'''
import asyncio, json, os, sys
from mcp import Client, StdioServerParameters
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
provider = LoggerProvider(resource=Resource.create({"service.name": "claude-code"}))
provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
provider.get_logger("com.anthropic.claude_code.events").emit(body="claude_code.api_request", attributes={
    "event.name": "api_request", "session.id": "s-export", "input_tokens": 321, "output_tokens": 45, "cost_usd": 0.02})
provider.shutdown()

async def main():
    async with Client(StdioServerParameters(command=sys.argv[1], args=["mcp"], env=dict(os.environ)),
                      read_timeout_seconds=60, mode="legacy") as c:
        await c.call_tool("events", {"target": "boundary"})
        await c.call_tool("finish", {"summary": "looked"})

asyncio.run(main())
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "looked",
                  "session_id": "s-export", "num_turns": 2, "total_cost_usd": 0.02,
                  "usage": {"input_tokens": 321, "output_tokens": 45}}))
'''


def add_task(pulsed) -> str:
    out = pulsed.ctl("task", "add", "--project", "ops", "--title", "look", "--prompt", "look around")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


@pytest.mark.daemon
def test_runs_reach_the_collector_as_genai_spans_and_a_down_collector_only_costs_a_counter(pulsed, tmp_path):
    script = tmp_path / "gated_claude.py"
    script.write_text(GATED_CLAUDE)
    collector = Collector(refuse=1)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        f'[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = {FLUSH_S}\n'
        f'export = "{collector.url}"\nexport_headers = {{ Authorization = "Bearer collector-token" }}\n'
        'export_give_up_s = 3\n\n'
        f'[[agent]]\nname = "claude-x"\nadapter = "claude-code"\nmcp = false\ntimeout_s = 90\n'
        f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, {json.dumps(PULSECTL)}]\n')
    try:
        pulsed.start(env={"PULSE_TICK_MS": "200"})
        pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
        task = add_task(pulsed)
        acked = wait_for(lambda: next(iter(pulsed.events("task-acked", task)), None)
                         or next(iter(pulsed.events("task-failed", task)), None), 60, 0.1, what="the run's end")
        assert acked["type"] == "task-acked", acked["data"]
        run = acked["data"]["run"]
        wait_for(lambda: any(s.name == "invoke_agent claude-x" for _, s in collector.spans()), 30, 0.1,
                 what="the run's span at the collector")
        # retried after the collector's first 503, then sent once
        export = wait_for(lambda: (e := pulsed.status().telemetry["export"])["sent"] and e, 10, 0.1,
                          what="the export's counters in status")
        assert (export["sent"], export["retries"], export["dropped"]) == (1, 1, 0), export
        assert collector.headers[0]["Authorization"] == "Bearer collector-token"
        (resource_spans, root), = [(rs, s) for rs, s in collector.spans() if s.name.startswith("invoke_agent")]
        assert resource_spans.schema_url == "https://opentelemetry.io/schemas/1.37.0"
        assert attributes(resource_spans.resource)["service.name"] == "pulse"
        a = attributes(root)
        print(a)
        assert {k: a.get(k) for k in ("gen_ai.operation.name", "gen_ai.agent.name", "gen_ai.conversation.id",
                                      "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                                      "gen_ai.provider.name", "pulse.run.id", "pulse.task.id", "pulse.project",
                                      "pulse.run.outcome")} == {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "claude-x",
            "gen_ai.conversation.id": "s-export", "gen_ai.usage.input_tokens": 321, "gen_ai.usage.output_tokens": 45,
            "gen_ai.provider.name": "anthropic", "pulse.run.id": run, "pulse.task.id": task, "pulse.project": "ops",
            "pulse.run.outcome": "acked"}
        assert root.end_time_unix_nano - root.start_time_unix_nano == pytest.approx(acked["data"]["run_ms"] * 1e6, abs=1e6)
        tools = [s for _, s in collector.spans() if s.parent_span_id == root.span_id]
        assert [(s.name, attributes(s)["gen_ai.tool.name"], attributes(s)["pulse.gate.verdict"]) for s in tools] == [
            ("execute_tool events", "events", "allowed"), ("execute_tool finish", "finish", "allowed")]
        assert all(s.trace_id == root.trace_id and attributes(s)["gen_ai.operation.name"] == "execute_tool"
                   for s in tools)
        assert root.start_time_unix_nano <= tools[0].start_time_unix_nano <= tools[0].end_time_unix_nano

        # The collector goes away: runs end as fast as before, and what could not be sent is counted.
        collector.close()
        began = time.monotonic()
        task = add_task(pulsed)
        wait_for(lambda: pulsed.events("task-acked", task), 60, 0.1, what="the second run acked")
        dropped = wait_for(lambda: (pulsed.status().telemetry["export"]["dropped"] or None), 30, 0.2,
                           what="the unsent run counted as dropped")
        print(f"second run acked and dropped in {time.monotonic() - began:.1f} s: {pulsed.status().telemetry['export']}")
        assert dropped == 1
        assert {w.name: w.state for w in pulsed.status().workers}["telemetry"] == "running"
    finally:
        collector.close()


@pytest.mark.daemon
def test_a_run_that_ended_while_the_telemetry_worker_was_down_is_still_sent(pulsed):
    """The telemetry worker frozen across a run's end, then killed: the worker pulsed starts in its
    place goes on from its checkpoint in events.db, and sends the run it never saw end."""
    import os
    import signal
    collector = Collector()
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        f'[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = {FLUSH_S}\nexport = "{collector.url}"\n'
        'export_metrics_s = 0.5\n\n'
        '[[agent]]\nname = "quick"\nmcp = false\nargv = ["sh", "-c", "echo done"]\n')
    try:
        pulsed.start(env={"PULSE_TICK_MS": "200", "PULSE_HUNG_AFTER_MS": "60000"})
        pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))

        def sent(task: str) -> list:
            return [s for _, s in collector.spans() if attributes(s).get("pulse.task.id") == task]
        first = add_task(pulsed)
        wait_for(lambda: sent(first), 30, 0.1, what="the first run at the collector")
        ended = pulsed.events("task-acked", first)[0]["id"]
        checkpoint = pulsed.home / "checkpoints" / "telemetry-export.json"
        wait_for(lambda: checkpoint.exists() and json.loads(checkpoint.read_text())["after_id"] >= ended, 10, 0.1,
                 what="the export's checkpoint past the first run")
        worker = pulsed.worker("telemetry").pid
        os.kill(worker, signal.SIGSTOP)                   # down across the second run's end
        try:
            second = add_task(pulsed)
            wait_for(lambda: pulsed.events("task-acked", second), 30, 0.1, what="the second run acked")
        finally:
            os.kill(worker, signal.SIGKILL)
        wait_for(lambda: pulsed.worker("telemetry").pid not in (None, worker) and pulsed.worker("telemetry").state
                 == "running", 30, 0.1, what="the telemetry worker restarted")
        [span] = wait_for(lambda: sent(second), 30, 0.1, what="the run that ended while it was down, sent")
        assert span.name == "invoke_agent quick" and attributes(span)["pulse.run.outcome"] == "acked"
        assert len(sent(first)) == 1                      # the checkpoint was past it: not sent again

        # Pulse's own metrics, through the OpenTelemetry SDK's exporter: what /metrics counts
        wait_for(lambda: collector.points("pulse.tasks").get((("pulse.task.status", "acked"),)) == 2, 15, 0.1,
                 what="the tasks' gauge at the collector")
        assert collector.points("pulse.events")[(("pulse.event.type", "task-acked"),)] == 2
        assert collector.points("pulse.effects")[(("pulse.effect.kind", "agent-run"), ("pulse.effect.origin", "engine"),
                                                  ("pulse.effect.outcome", "acked"))] == 2
        assert collector.points("pulse.export.runs")[(("pulse.outcome", "sent"),)] >= 1
        resource = attributes(collector.metrics[-1].resource_metrics[0].resource)
        assert resource["service.name"] == "pulse"
        # the collector gone: each collection is dropped and counted, the worker goes on
        collector.close()
        metrics = wait_for(lambda: (m := pulsed.status().telemetry["export"]["metrics"])["points_dropped"] and m, 20,
                           0.2, what="the metrics that could not be sent, counted")
        assert metrics["points_sent"] > 0 and metrics["last_error"], metrics
        assert pulsed.worker("telemetry").state == "running"
    finally:
        collector.close()


def test_offering_never_waits_on_a_collector_that_never_answers():
    """A collector that accepts connections and never answers: the exporter's thread waits on it,
    offers return at once, the queue stays within its bound and what it pushed out is counted."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    with socket.create_server(("127.0.0.1", 0), backlog=64) as hole:
        exporter = Exporter(f"http://127.0.0.1:{hole.getsockname()[1]}", {}, lambda batch: ExportTraceServiceRequest(),
                            queue_max=10, give_up_s=60).start()
        try:
            exporter.offer("first")
            wait_for(lambda: exporter.status()["queued"] == 0, 5, 0.01, what="the first batch taken (and stuck)")
            began = time.monotonic()
            for i in range(1000):
                exporter.offer(i)
            took = time.monotonic() - began
            status = exporter.status()
            assert took < 0.5, f"1000 offers took {took:.3f} s"
            assert (status["queued"], status["dropped"], status["sent"]) == (10, 990, 0), status
        finally:
            exporter.stop(timeout=0.1)


def test_a_failed_runs_blocked_and_unfinished_calls_are_error_spans_under_its_own():
    from pulse.agents import runspans
    from pulse.core.wire.eventmsgs import Event

    def ev(i, ts, type, target, **data):
        return Event(id=i, seq=i, ts=ts, mono=ts, type=type, source="executor", target=target, data=data)
    gate = [ev(1, 100.5, "gate-call", "s1", phase="open", agent="a", task="task-3"),
            ev(2, 100.6, "gate-call", "s1", phase="begin", call="s1#1", tool="restart_process", kind="write"),
            ev(3, 100.7, "gate-call", "s1", phase="blocked", tool="emit_effect", kind="write", blocked="FSM_BLOCKED"),
            ev(4, 101.0, "gate-call", "other", phase="open", agent="b", task="task-3"),      # another agent's
            ev(5, 101.1, "gate-call", "other", phase="begin", call="other#1", tool="events", kind="read")]
    end = ev(9, 110.0, "task-failed", "task-3", run="eff-9", agent="a", reason="stalled", error="silent",
             run_ms=10_000, telemetry={"tokens": {"input": 7}, "cost_usd": 0.5})
    run = runspans.run_end(end)
    run.calls = runspans.tool_calls(gate, run.agent, run.start, run.end)
    root, *tools = runspans.spans(run)
    a = attributes(root)
    assert (a["error.type"], a["gen_ai.usage.input_tokens"], a["pulse.run.cost_usd"]) == ("stalled", 7, 0.5)
    assert root.status.code == root.status.STATUS_CODE_ERROR and root.status.message == "silent"
    assert [(s.name, attributes(s)["pulse.gate.verdict"], attributes(s)["error.type"], s.end_time_unix_nano)
            for s in tools] == [("execute_tool restart_process", "unfinished", "unfinished", int(110.0 * 1e9)),
                                ("execute_tool emit_effect", "blocked", "FSM_BLOCKED", int(100.7 * 1e9))]
    assert all(s.parent_span_id == root.span_id and s.status.code == s.status.STATUS_CODE_ERROR for s in tools)
    assert runspans.spans(runspans.run_end(end))[0].trace_id == root.trace_id     # the same run: the same trace


@pytest.mark.parametrize("toml, says", [
    ('[telemetry]\nexport = "http://127.0.0.1:4318"\n', "set enabled = true too"),
    ('[telemetry]\nenabled = true\nexport = "127.0.0.1:4318"\n', "not an http:// or https:// collector"),
    ('[telemetry]\nenabled = true\nexport = "http://c:4318"\nexport_headers = { "Bad Name" = "x" }\n',
     "'Bad Name' is not a header name"),
    ('[telemetry]\nenabled = true\nexport = "http://c:4318"\nexport_headers = { X-Token = "a\\r\\nInjected: 1" }\n',
     "has a line break"),
    ('[telemetry]\nenabled = true\nexport = "http://c:4318"\nexport_queue = 0\n', "export_queue must be at least 1"),
    ('[[agent]]\nname = "a"\nargv = ["true"]\nloop_per_min = 0\n', "loop_per_min must be at least 1"),
])
def test_bad_export_and_loop_settings_are_refused_saying_where(toml, says):
    from pulse.core import config as configmod
    with pytest.raises(configmod.ConfigError, match=re.escape(says)):
        configmod.validate(configmod.decode(toml, "config.toml"), "config.toml")


def test_the_exports_header_values_are_never_shown():
    from pulse.core import config as configmod
    config = configmod.decode('[telemetry]\nenabled = true\nexport = "https://collector.example:4318/otlp"\n'
                              'export_headers = { Authorization = "Bearer s3cret" }\n', "config.toml")
    shown = configmod.to_toml(configmod.without_secrets(config))
    assert "s3cret" not in shown and "Authorization" in shown
    assert config.telemetry.export_headers == {"Authorization": "Bearer s3cret"}     # what the worker uses


def test_the_exporters_done_mark_passes_only_what_was_sent_or_dropped():
    """What the checkpoint is: the highest mark up to which every item offered was sent or dropped;
    an item in flight holds it back, a mark alone (None) is done without a request."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    collector = Collector()
    try:
        exporter = Exporter(collector.url, {}, lambda batch: ExportTraceServiceRequest(), queue_max=10,
                            give_up_s=5).start()
        try:
            exporter.offer(None, 3)
            wait_for(lambda: exporter.status_done() == 3, 5, 0.01, what="a mark alone, done")
            assert collector.requests == []               # nothing was sent for it
            exporter.offer(["span"], 7)
            wait_for(lambda: exporter.status_done() == 7, 5, 0.01, what="a sent item, done")
            assert len(collector.requests) == 1 and exporter.status()["sent"] == 1
        finally:
            exporter.stop(timeout=1)
    finally:
        collector.close()
    with socket.create_server(("127.0.0.1", 0), backlog=8) as hole:      # accepts, never answers
        exporter = Exporter(f"http://127.0.0.1:{hole.getsockname()[1]}", {}, lambda batch: ExportTraceServiceRequest(),
                            queue_max=2, give_up_s=60).start()
        try:
            exporter.offer(["a"], 1)
            wait_for(lambda: exporter.status()["queued"] == 0, 5, 0.01, what="the first batch in flight")
            for mark in (2, 3, 4):                        # 2 is pushed out of the full queue
                exporter.offer([str(mark)], mark)
            assert exporter.status()["dropped"] == 1 and exporter.status_done() == 0   # 1 is still in flight
        finally:
            exporter.stop(timeout=0.1)
