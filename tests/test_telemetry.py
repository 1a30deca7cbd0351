"""The telemetry receiver: a real pulsed with [telemetry] enabled, fed by the official OpenTelemetry
SDK's OTLP/HTTP exporters (what a real exporter sends), and its bounds tried with raw sockets."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from pulse.sensing import otlp
from support import Pulsed, Tracker, init_home, wait_for

FLUSH_S = 0.3


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    """(pulsed, the receiver's URL): one pulsed for the tests that only send and read."""
    tracker = Tracker()
    home = tmp_path_factory.mktemp("telemetry") / "home"
    pulsed = Pulsed(home, tracker)
    init_home(home)
    (home / "config.toml").write_text(f'[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = {FLUSH_S}\n'
                                      'max_body_kb = 64\nqueue_kb = 256\nburst = 60\nrequests_per_s = 5\n'
                                      'session_loop_per_min = 3\n\n[budget]\nusd_per_day = 1.0\n\n'
                                      '[[agent]]\nname = "idle"\nargv = ["true"]\nmcp = false\n')
    try:
        pulsed.start()
        pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
        url = wait_for(lambda: (pulsed.status().telemetry or {}).get("url"), 10, what="the receiver's url")
        yield pulsed, url
        pulsed.terminate()
    finally:
        tracker.kill_all()


def resource(**attrs):
    from opentelemetry.sdk.resources import Resource
    return Resource.create({"service.name": "claude-code", **attrs})


def send_metrics(url: str, res, record, headers: dict | None = None) -> None:
    """`record(meter)` adds to instruments; one export, as a CLI's periodic reader makes (cumulative)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{url}/v1/metrics", timeout=5,
                                                              headers=headers),
                                           export_interval_millis=3_600_000)
    provider = MeterProvider(resource=res, metric_readers=[reader])
    record(provider.get_meter("com.anthropic.claude_code"), provider)
    provider.shutdown()


def send_logs(url: str, res, records: list[tuple[str, dict]], headers: dict | None = None) -> None:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    provider = LoggerProvider(resource=res)
    provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{url}/v1/logs", timeout=5,
                                                                                 headers=headers)))
    logger = provider.get_logger("com.anthropic.claude_code.events")
    for name, attrs in records:
        logger.emit(body=name, attributes={"event.name": name.rsplit(".", 1)[-1], **attrs})
    provider.shutdown()


def facts(pulsed: Pulsed, target: str) -> list[dict]:
    return [e["data"] for e in pulsed.events("telemetry", target)]


def summed(pulsed: Pulsed, target: str) -> dict:
    out: dict = {"tokens": {}, "cost_usd": 0.0, "api_requests": 0, "tool_calls": 0, "errors": 0}
    for data in facts(pulsed, target):
        for kind, n in data["tokens"].items():
            out["tokens"][kind] = out["tokens"].get(kind, 0) + n
        for key in ("cost_usd", "api_requests", "tool_calls", "errors"):
            out[key] += data[key]
    out["cost_usd"] = round(out["cost_usd"], 6)
    return out


def post(url: str, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def as_a_run(pulsed: Pulsed) -> dict:
    """The receiver's own token (the operator's senders): it may speak for any run."""
    return {"X-Pulse-Token": (pulsed.home / "telemetry.token").read_text().strip()}


@pytest.mark.daemon
def test_a_runs_tokens_cost_and_calls_become_facts(receiver):
    pulsed, url = receiver
    run = resource(**{"pulse.run.id": "eff-tokens-1", "pulse.task.id": "task-7", "pulse.agent": "claude"})
    token = as_a_run(pulsed)

    def claude_metrics(meter, provider):
        # what Claude Code's metrics say again of its api_request events: not counted twice
        meter.create_counter("claude_code.token.usage").add(150, {"type": "input", "session.id": "s-1"})
        meter.create_counter("claude_code.cost.usage").add(0.06, {"session.id": "s-1"})
    send_metrics(url, run, claude_metrics, token)
    send_logs(url, run, [("claude_code.api_request", {"session.id": "s-1", "input_tokens": 100, "output_tokens": 20,
                                                      "cache_read_tokens": 5, "cost_usd": 0.05}),
                         ("claude_code.api_request", {"session.id": "s-1", "input_tokens": 50, "output_tokens": 20,
                                                      "cost_usd": 0.01}),
                         ("claude_code.tool_result", {"session.id": "s-1", "tool_name": "Bash", "success": "false"}),
                         ("claude_code.api_error", {"session.id": "s-1", "error": "overloaded", "status_code": "529"})],
              token)
    want = {"tokens": {"input": 150, "output": 40, "cache_read": 5}, "cost_usd": 0.06, "api_requests": 3,
            "tool_calls": 1, "errors": 2}
    seen: list = []
    wait_for(lambda: seen.append(summed(pulsed, "eff-tokens-1")) or seen[-1] == want, 10, 0.1,
             what=f"the run's facts to sum to {want}")
    first = facts(pulsed, "eff-tokens-1")[0]
    assert (first["run"], first["task"], first["agent"], first["session"]) == ("eff-tokens-1", "task-7", "claude", "s-1")
    assert first["last_at"] > time.time() - 60
    # aggregated: far fewer facts than the records and data points sent
    assert len(facts(pulsed, "eff-tokens-1")) <= 3

    # The GenAI conventions' token metric, cumulative (the SDK's default): each export adds what is new
    def genai(meter, provider):
        tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
        tokens.record(30, {"gen_ai.token.type": "input"})
        provider.force_flush()
        tokens.record(12, {"gen_ai.token.type": "input"})
        tokens.record(7, {"gen_ai.token.type": "output"})
    send_metrics(url, resource(**{"pulse.run.id": "eff-genai-1"}), genai, token)
    wait_for(lambda: summed(pulsed, "eff-genai-1")["tokens"] == {"input": 42, "output": 7}, 10, 0.1,
             what="the GenAI metric's tokens, counted once")

    # Without the token a record's run tags are not believed (what a run reports can end it): it is
    # counted as the session it names, never as the run.
    send_logs(url, resource(**{"pulse.run.id": "eff-forged"}),
              [("claude_code.api_request", {"session.id": "s-forged", "cost_usd": 100.0})])
    wait_for(lambda: summed(pulsed, "session:s-forged")["cost_usd"] == 100.0, 10, 0.1, what="the anonymous session")
    assert facts(pulsed, "eff-forged") == []
    assert "run" not in facts(pulsed, "session:s-forged")[0]
    # A run's own token (what every run Pulse starts sends) speaks for that run, and for no other; and
    # whatever it sends with it is that run's: tagged as another run, or not tagged at all, it is
    # counted as its own (a run cannot move its spend off its account by dropping its tags)
    from pulse.agents.otel import run_token
    secret = (pulsed.home / "telemetry.token").read_text().strip()
    as_a = {"X-Pulse-Token": run_token(secret, "eff-a"), "X-Pulse-Run": "eff-a"}
    send_logs(url, resource(**{"pulse.run.id": "eff-a"}), [("claude_code.api_request", {"session.id": "s-a"})], as_a)
    send_logs(url, resource(**{"pulse.run.id": "eff-b"}), [("claude_code.api_request", {"session.id": "s-b"})], as_a)
    send_logs(url, resource(), [("claude_code.api_request", {"session.id": "s-untagged", "cost_usd": 0.5})], as_a)
    wait_for(lambda: summed(pulsed, "eff-a")["api_requests"] == 3, 10, 0.1,
             what="run a's records, tagged b and untagged too, as its own")
    assert summed(pulsed, "eff-a")["cost_usd"] == 0.5
    assert facts(pulsed, "eff-b") == [] and facts(pulsed, "session:s-b") == [] and facts(pulsed, "session:s-untagged") == []


@pytest.mark.daemon
def test_a_session_pulse_did_not_start_is_counted_by_its_id_and_json_is_taken(receiver):
    pulsed, url = receiver
    body = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "codex"}}]},
            "scopeLogs": [{"logRecords": [
                {"body": {"stringValue": "codex.sse_event"}, "attributes": [
                    {"key": "event.name", "value": {"stringValue": "codex.sse_event"}},
                    {"key": "conversation.id", "value": {"stringValue": "conv-9"}},
                    {"key": "event.kind", "value": {"stringValue": "response.completed"}},
                    {"key": "input_token_count", "value": {"intValue": "4236"}},
                    {"key": "output_token_count", "value": {"intValue": "2"}}]},
                {"body": {"stringValue": "codex.api_request"}, "attributes": [
                    {"key": "conversation.id", "value": {"stringValue": "conv-9"}},
                    {"key": "http.response.status_code", "value": {"intValue": "200"}}]}]}]}]}
    status, reply = post(url, "/v1/logs", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert (status, json.loads(reply)) == (200, {})
    wait_for(lambda: summed(pulsed, "session:conv-9")["tokens"] == {"input": 4236, "output": 2}, 10, 0.1,
             what="the Codex session's tokens")
    assert summed(pulsed, "session:conv-9")["api_requests"] == 1
    status, reply = post(url, "/v1/logs", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and b"not an OTLP logs export request" in reply


@pytest.mark.daemon
def test_an_operators_own_session_counts_against_the_host_budget_and_its_loop_is_said(receiver):
    """An operator's own Claude Code pointed at the receiver with its token: its spend is in `pulsectl
    budget` and counts against [budget] (the next run of an agent is held), its loop is noticed and
    left alone. Sent without the token (as any local process, an agent run too, can), a session's
    spend is shown, one sum, and counts against nothing."""
    pulsed, url = receiver

    def budget() -> dict:
        out = pulsed.ctl("budget", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def uncounted(seen: dict) -> float:
        return next((s["today_usd"] for s in seen["sessions"] if not s["counted"]), 0.0)
    before = uncounted(budget())            # the module's other tests sent some without the token
    own = resource(**{"service.name": "claude-code"})
    send_logs(url, own, [("claude_code.api_request", {"session.id": "op-1", "cost_usd": 0.6})] * 2
              + [("claude_code.api_request", {"session.id": "op-1", "cost_usd": 0})] * 3, as_a_run(pulsed))
    send_logs(url, own, [("claude_code.api_request", {"session.id": "anon-1", "cost_usd": 5.0})] * 6)
    seen: list = []
    wait_for(lambda: seen.append(budget()) or len(seen[-1]["sessions"]) == 2 and uncounted(seen[-1]) >= before + 30.0
             and seen[-1]["sessions"][0]["today_usd"] == 1.2, 15, 0.2, what="both sessions in the budget")
    host = next(r for r in seen[-1]["agents"] if r["agent"] == "*")
    assert host["today_usd"] == 1.2 and host["sessions_today_usd"] == 1.2, host     # only the one with the token
    counted, others = seen[-1]["sessions"]
    assert (counted["session"], counted["service"], counted["counted"]) == ("op-1", "claude-code", True), counted
    assert (others["session"], others["counted"]) == (None, False), others
    text = pulsed.ctl("budget").stdout
    # (what the module's other tests sent without the token may land later: summed a minute at a time)
    assert "claude-code op-1: $1.20 today" in text and "without the receiver's token: $" in text, text
    # counted against the host's [budget]: past it, the host's alert, and an agent's next run is held
    wait_for(lambda: any(e["data"]["scope"] == "*" and e["data"]["level"] == 100 for e in pulsed.events("spend-alert")),
             10, 0.1, what="the host's spend alert")
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--agent", "idle")
    task = out.stdout.strip().split()[0].rstrip(":")
    held = wait_for(lambda: next(iter(pulsed.events("spend-held", task)), None), 15, 0.1, what="the run held")
    assert "the host: $1.20 of $1.00 usd_per_day" in held["data"]["why"], held
    # its loop (5 API requests in a minute, session_loop_per_min = 3) is said, once; the anonymous one's is not
    [noticed] = wait_for(lambda: pulsed.events("loop-noticed", "session:op-1"), 10, 0.1, what="the session's loop")
    assert noticed["data"]["api_requests"] == 5 and "never ended" in noticed["data"]["detail"], noticed
    assert pulsed.events("loop-noticed", "session:anon-1") == []
    note = wait_for(lambda: next((e for e in pulsed.events("effect") if e["data"]["kind"] == "notify"
                                  and e["data"]["params"].get("rule") == "loop"), None), 10, 0.1, what="its notification")
    assert note["target"] == "session:op-1"


def whole_answer(answer: bytes) -> bool:
    """The head and all of the body its Content-Length names (the two may come in separate reads)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return length is None or len(body) >= int(length.group(1))


def raw_request(url: str, head: str, body: bytes = b"") -> tuple[int, str, float]:
    """Send `head` (and `body`) on a socket of our own; (status, response, seconds to the answer)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        began = time.monotonic()
        s.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while not whole_answer(answer):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        took = time.monotonic() - began
    text = answer.decode("latin-1")
    return int(text.split(" ", 2)[1]), text, took


@pytest.mark.daemon
def test_an_oversized_body_is_refused_before_it_is_read(receiver):
    pulsed, url = receiver
    # 100 MB declared, none of it sent: the answer comes at once, so nothing was waited for or read
    status, text, took = raw_request(url, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                                          "Content-Length: 104857600\r\n")
    assert status == 413 and "over this receiver's limit" in text and took < 2
    # no Content-Length (chunked): read only up to the limit (64 KiB here), then refused
    chunk = b"x" * 70_000
    status, text, _ = raw_request(url, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                                       "Transfer-Encoding: chunked\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
    assert status == 413
    # a gzip bomb stops at the limit too
    import gzip
    status, _ = post(url, "/v1/logs", gzip.compress(b"\0" * 1_000_000),
                     {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert status == 413
    wait_for(lambda: pulsed.status().telemetry["requests"].get("413", 0) >= 3, 10, 0.1,
             what="the refusals counted in status")   # sent with the worker's next heartbeat


@pytest.mark.daemon
def test_past_its_burst_a_sender_is_told_to_wait(receiver):
    pulsed, url = receiver
    codes, refused = [], None
    while refused is None and len(codes) < 400:     # a burst of 60, then 5 a second
        req = urllib.request.Request(url + "/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(req, timeout=5) as answer:
                codes.append(answer.status)
        except urllib.error.HTTPError as err:
            codes.append(err.code)
            refused = err
    assert codes[0] == 200 and refused is not None, codes
    assert refused.code == 429 and int(refused.headers["Retry-After"]) >= 1, codes
    # a caller with the token (every run Pulse starts) has a bucket of its own: the flood cost it nothing
    token = (pulsed.home / "telemetry.token").read_text().strip()
    assert post(url, "/v1/traces", b"", {"Content-Type": "application/x-protobuf", "X-Pulse-Token": token})[0] == 200


@pytest.mark.daemon
def test_beyond_loopback_a_request_without_the_token_is_refused(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[telemetry]\nenabled = true\nlisten = "0.0.0.0:0"\nflush_s = 0.3\n')
    pulsed.start()
    pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
    info = wait_for(lambda: pulsed.status().telemetry, 10, what="the receiver's status")
    assert info["token_required"] is True
    url = info["url"]
    status, reply = post(url, "/v1/logs", b"", {"Content-Type": "application/x-protobuf"})
    assert status == 401 and b"telemetry.token" in reply
    status, _ = post(url, "/v1/logs", b"", {"Content-Type": "application/x-protobuf", "Authorization": "Bearer wrong"})
    assert status == 401
    token = (pulsed.home / "telemetry.token").read_text().strip()
    assert (pulsed.home / "telemetry.token").stat().st_mode & 0o777 == 0o600
    send_logs(url, resource(**{"pulse.run.id": "eff-remote"}), [("claude_code.api_request", {})],
              headers={"Authorization": f"Bearer {token}"})
    wait_for(lambda: summed(pulsed, "eff-remote")["api_requests"] == 1, 10, 0.1, what="the authorised run's fact")


# -- the fold, pure --------------------------------------------------------------------------------

def logs_request(sources: list[str]):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    req = ExportLogsServiceRequest()
    for run in sources:
        rl = req.resource_logs.add()
        rl.resource.attributes.append(KeyValue(key="pulse.run.id", value=AnyValue(string_value=run)))
        rec = rl.scope_logs.add().log_records.add()
        rec.attributes.append(KeyValue(key="event.name", value=AnyValue(string_value="tool_result")))
    return req


def test_the_fold_tracks_at_most_max_sources_and_counts_the_rest():
    fold = otlp.Fold(max_sources=2)
    fold.logs(logs_request(["a", "b", "c", "a"]), 1.0)
    tallies = {t.target: t for t in fold.take()}
    assert set(tallies) == {"a", "b"} and tallies["a"].tool_calls == 2 and fold.dropped == 1
    fold.logs(logs_request(["c"]), 2.0)          # a flush frees the slots
    assert [t.target for t in fold.take()] == ["c"]


# -- runs Pulse starts report to it ------------------------------------------------------------------

def test_a_run_is_pointed_at_the_receiver_its_file_names_only_while_that_very_process_lives(tmp_path):
    """telemetry.json names the receiver by pid and start time: a file a killed receiver left, whose
    pid another process now has (or that names none), points no run at a port nobody serves."""
    import os
    import subprocess

    from pulse.agents import otel
    from pulse.core import procs
    info, token = tmp_path / "telemetry.json", tmp_path / "telemetry.token"
    token.write_text("secret\n")
    look = lambda: otel.receiver(info, token, "eff-1", "task-3", "claude")  # noqa: E731
    me = os.getpid()
    info.write_text(json.dumps({"url": "http://127.0.0.1:4318", "pid": me, "proc_start": procs.proc_start(me)}))
    found = look()
    assert found is not None and found.url == "http://127.0.0.1:4318" and found.token == otel.run_token("secret", "eff-1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    for stale in ({"pid": me, "proc_start": "1"}, {"pid": me}, {"pid": gone.pid, "proc_start": procs.proc_start(me)}):
        info.write_text(json.dumps({"url": "http://127.0.0.1:4318", **stale}))
        assert look() is None, stale



def claude_invocation(env: dict | None = None):
    from pulse.agents import adapters
    from pulse.core.config import Agent
    agent = Agent(name="claude", adapter="claude-code", env=env or {}, mcp=False)
    adapter = adapters.load_adapter("claude-code")
    return adapter, agent, adapter.invocation(agent, adapters.Task("task-3", "hi"), "/tmp")


def test_a_claude_code_run_is_pointed_at_the_receiver_and_tagged_unless_its_env_says_otherwise():
    from pulse.agents.otel import Receiver
    tags = {"pulse.run.id": "eff-1", "pulse.task.id": "task-3", "pulse.agent": "claude"}
    adapter, agent, inv = claude_invocation()
    adapter.report_to(inv, Receiver("http://127.0.0.1:4318", None, tags), agent.env)
    assert inv.env["CLAUDE_CODE_ENABLE_TELEMETRY"] == "1" and inv.env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert inv.env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf" and "OTEL_EXPORTER_OTLP_HEADERS" not in inv.env
    assert inv.env["OTEL_RESOURCE_ATTRIBUTES"] == "pulse.run.id=eff-1,pulse.task.id=task-3,pulse.agent=claude"
    # the run's token and which run it is for, by the environment
    adapter, agent, inv = claude_invocation()
    adapter.report_to(inv, Receiver("http://10.0.0.5:4318", "tok", tags), agent.env)
    assert inv.env["OTEL_EXPORTER_OTLP_HEADERS"] == "x-pulse-token=tok,x-pulse-run=eff-1"
    # the operator's own exporter wins; the run is still tagged, after the operator's attributes
    own = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_RESOURCE_ATTRIBUTES": "team=infra"}
    adapter, agent, inv = claude_invocation(own)
    adapter.report_to(inv, Receiver("http://127.0.0.1:4318", "tok", tags), agent.env)
    assert inv.env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318" and "CLAUDE_CODE_ENABLE_TELEMETRY" not in inv.env
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in inv.env        # our token never goes to another endpoint
    assert inv.env["OTEL_RESOURCE_ATTRIBUTES"].startswith("team=infra,pulse.run.id=eff-1,")


def test_a_codex_run_gets_its_otel_exporter_as_a_config_override_and_the_token_only_by_env():
    from pulse.agents import adapters
    from pulse.agents.otel import Receiver
    from pulse.core.config import Agent
    agent = Agent(name="codex", adapter="codex", mcp=False)
    adapter = adapters.load_adapter("codex")
    inv = adapter.invocation(agent, adapters.Task("task-4", "hi"), "/tmp")
    adapter.report_to(inv, Receiver("http://127.0.0.1:4318", "tok", {"pulse.run.id": "eff-2"}), agent.env)
    at = inv.argv.index("exec") + 1
    assert inv.argv[at:at + 2] == ["-c", 'otel.exporter={"otlp-http" = {"endpoint" = "http://127.0.0.1:4318/v1/logs", '
                                         '"protocol" = "binary"}}']
    assert not any("tok" in a for a in inv.argv)
    assert inv.env["OTEL_EXPORTER_OTLP_HEADERS"] == "x-pulse-token=tok,x-pulse-run=eff-2"
    assert inv.env["OTEL_RESOURCE_ATTRIBUTES"] == "pulse.run.id=eff-2"


# A stand-in for `claude -p --output-format json` that exports like Claude Code does, configured only
# by the environment its run was given (the OTel SDK reads OTEL_EXPORTER_OTLP_ENDPOINT and
# OTEL_RESOURCE_ATTRIBUTES itself), then waits for the test to have seen its spend before it ends.
FAKE_CLAUDE = r'''
import json, os, sys, time
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
assert os.environ["CLAUDE_CODE_ENABLE_TELEMETRY"] == "1"
provider = LoggerProvider(resource=Resource.create({"service.name": "claude-code"}))
provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
provider.get_logger("com.anthropic.claude_code.events").emit(body="claude_code.api_request", attributes={
    "event.name": "api_request", "session.id": "s-run", "input_tokens": 1234, "cost_usd": 0.25})
deadline = time.time() + 60
while not os.path.exists(os.environ["FAKE_RELEASE"]) and time.time() < deadline:
    time.sleep(0.05)
provider.shutdown()
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "ok", "session_id": "s-run",
                  "num_turns": 1, "total_cost_usd": 0.25}))
'''


def with_fake_claude(pulsed: Pulsed, tmp_path) -> Path:
    """pulsed started with the receiver and FAKE_CLAUDE as agent "claude"; the file that lets its runs end."""
    import sys
    script, release = tmp_path / "fake_claude.py", tmp_path / "release"
    script.write_text(FAKE_CLAUDE)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(
        f'[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = {FLUSH_S}\n\n'
        f'[[agent]]\nname = "claude"\nadapter = "claude-code"\nmcp = false\ntimeout_s = 90\n'
        f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]\nenv = {{ FAKE_RELEASE = "{release}" }}\n')
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
    return release


def started_run(pulsed: Pulsed) -> tuple[str, str]:
    """(task, run) of a task added now, once its run has the task."""
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "spend")
    assert out.returncode == 0, out.stderr
    task = out.stdout.strip().split()[0].rstrip(":")
    run = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 30, 0.1,
                   what="the run to start")["data"]["run"]
    return task, run


@pytest.mark.daemon
def test_a_run_pulse_starts_reports_its_spend_while_it_runs(pulsed, tmp_path):
    release = with_fake_claude(pulsed, tmp_path)
    task, run = started_run(pulsed)
    # seen while the run still runs (it waits for `release`): tagged with its run, task and agent
    fact = wait_for(lambda: next(iter(facts(pulsed, run)), None), 30, 0.1, what="the run's telemetry fact")
    assert not pulsed.events("task-acked", task)
    assert (fact["task"], fact["agent"], fact["tokens"], fact["cost_usd"]) == (task, "claude", {"input": 1234}, 0.25)
    release.write_text("")
    wait_for(lambda: pulsed.events("task-acked", task), 30, 0.1, what="task-acked")


@pytest.mark.daemon
def test_a_run_that_starts_while_the_receiver_is_down_waits_for_it(pulsed, tmp_path):
    """Its spend and loop guards read what it reports: a run that started before the receiver was up
    (as pulsed starts, or as the receiver restarts) would run unguarded, and FAKE_CLAUDE, given no
    receiver, fails."""
    release = with_fake_claude(pulsed, tmp_path)
    assert pulsed.ctl("stop", "telemetry").returncode == 0
    task, run = started_run(pulsed)
    assert pulsed.ctl("start", "telemetry").returncode == 0
    fact = wait_for(lambda: next(iter(facts(pulsed, run)), None), 30, 0.1, what="the run's telemetry fact")
    assert (fact["task"], fact["tokens"]) == (task, {"input": 1234})
    release.write_text("")
    wait_for(lambda: pulsed.events("task-acked", task), 30, 0.1, what="task-acked")


def test_an_event_is_named_by_its_event_name_attribute_before_the_records_own_field():
    # Codex 0.171 sends event_name "event otel/src/events/session_telemetry.rs:1187" on every record
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    req = ExportLogsServiceRequest()
    rec = req.resource_logs.add().scope_logs.add().log_records.add()
    rec.event_name = "event otel/src/events/session_telemetry.rs:1187"
    for key, value in (("event.name", AnyValue(string_value="codex.sse_event")),
                       ("event.kind", AnyValue(string_value="response.completed")),
                       ("conversation.id", AnyValue(string_value="c-1")),
                       ("input_token_count", AnyValue(string_value="4237")), ("cached_token_count", AnyValue(int_value=0))):
        rec.attributes.append(KeyValue(key=key, value=value))
    fold = otlp.Fold(max_sources=4)
    fold.logs(req, 1.0)
    (tally,) = fold.take()
    assert (tally.target, tally.tokens) == ("session:c-1", {"input": 4237})
