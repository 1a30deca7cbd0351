"""[[agent]] stall_s: a run silent that long (no output, no telemetry) is ended as `stalled`, every
process of it gone, instead of waiting out timeout_s. A real pulsed and a fake agent that says nothing."""

from __future__ import annotations

import json
import sys
import time

import psutil
import pytest

from support import init_home, wait_for

# Says nothing and sleeps, with a child of its own that sleeps too: both must be gone at the end.
SILENT = r'''
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.environ["PIDS"], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(300)
'''
# Says a line every 0.2 s, then nothing.
CHATTY = r'''
import sys, time
for i in range(int(sys.argv[1])):
    print(f"working {i}", flush=True)
    time.sleep(0.2)
time.sleep(300)
'''


def config(script, stall_s: float, *args: str) -> str:
    argv = json.dumps([sys.executable, str(script), *args])
    return (f'[[agent]]\nname = "quiet"\nadapter = "command"\nargv = {argv}\ntimeout_s = 120\nstall_s = {stall_s}\n'
            '\n[tasks]\nmax_failures = 1\n')


def add_task(pulsed) -> str:
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "go")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split()[0].rstrip(":")


@pytest.mark.daemon
def test_a_silent_run_is_ended_as_stalled_long_before_its_timeout_with_all_its_processes(pulsed, tmp_path):
    script, pids = tmp_path / "silent.py", tmp_path / "pids"
    script.write_text(SILENT)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(config(script, 2).replace('timeout_s = 120', f'timeout_s = 120\n'
                                                                         f'env = {{ PIDS = "{pids}" }}'))
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    task = add_task(pulsed)
    started = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 30, 0.1, what="the run")
    procs = [psutil.Process(int(p)) for p in wait_for(lambda: pids.exists() and pids.read_text().split(), 20, 0.05,
                                                      what="the agent's pids")]
    failed = wait_for(lambda: next(iter(pulsed.events("task-failed", task)), None)
                      or next(iter(pulsed.events("task-given-up", task)), None), 30, 0.1, what="the run's end")
    data = next(iter(pulsed.events("task-failed", task)))["data"]
    assert data["reason"] == "stalled" and "silent for" in data["error"] and "stall_s (2 s)" in data["error"]
    assert failed["ts"] - started["ts"] < 20               # its timeout_s is 120
    for proc in procs:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, f"{proc.pid} outlived its run"


@pytest.mark.daemon
def test_output_keeps_a_run_alive_and_its_end_is_counted_from_the_last_line(pulsed, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(config(script, 1.5, "20"))    # 4 s of lines, each within 1.5 s
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    task = add_task(pulsed)
    started = wait_for(lambda: next(iter(pulsed.events("task-executing", task)), None), 30, 0.1, what="the run")
    wait_for(lambda: pulsed.events("task-failed", task), 30, 0.1, what="the run's end")
    failed = pulsed.events("task-failed", task)[0]
    assert failed["data"]["reason"] == "stalled"
    assert failed["ts"] - started["ts"] >= 4 + 1.5 - 0.5    # not before its last line plus stall_s
    assert time.time() - started["ts"] < 60


# Prints one line, then only exports (as Claude Code in print mode does until its end): an event every
# 0.3 s for 6 s, by the OTel SDK configured from the environment its run got, then nothing at all.
EXPORTING = r'''
import sys, time
print("starting", flush=True)
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
provider = LoggerProvider(resource=Resource.create())
provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
logger = provider.get_logger("com.anthropic.claude_code.events")
began = time.time()
while time.time() - began < 6:
    logger.emit(body="claude_code.tool_result", attributes={"event.name": "tool_result", "success": "true"})
    time.sleep(0.3)
with open(sys.argv[1], "w") as f:
    f.write(str(time.time()))
time.sleep(300)
'''


@pytest.mark.daemon
def test_telemetry_keeps_a_run_that_prints_nothing_alive(pulsed, tmp_path):
    script, last = tmp_path / "exporting.py", tmp_path / "last-export"
    script.write_text(EXPORTING)
    init_home(pulsed.home)
    argv = json.dumps([sys.executable, str(script), str(last)])
    (pulsed.home / "config.toml").write_text(
        '[telemetry]\nenabled = true\nlisten = "127.0.0.1:0"\nflush_s = 0.3\n\n'
        f'[[agent]]\nname = "quiet"\nadapter = "claude-code"\nmcp = false\nargv = {argv}\ntimeout_s = 120\n'
        'stall_s = 3\n\n[tasks]\nmax_failures = 1\n')
    pulsed.start(env={"PULSE_TICK_MS": "200"})
    pulsed.wait_running(("watcher", "tick", "executor", "telemetry"))
    task = add_task(pulsed)
    wait_for(lambda: pulsed.events("task-failed", task), 60, 0.1, what="the run's end")
    failed = pulsed.events("task-failed", task)[0]
    assert failed["data"]["reason"] == "stalled" and "no output and no telemetry" in failed["data"]["error"]
    assert last.exists(), "ended while it was still exporting"
    assert failed["ts"] >= float(last.read_text()) + 3 - 0.5    # its last export, then stall_s of silence
    run = pulsed.events("task-executing", task)[0]["data"]["run"]
    assert sum(e["data"]["tool_calls"] for e in pulsed.events("telemetry", run)) >= 10


@pytest.mark.parametrize("table, where", [
    ('[[agent]]\nname = "a"\ntimeout_s = 60\nstall_s = 60\n', "$.agent[0].stall_s"),
    ('[[agent]]\nname = "a"\nstall_s = 0\n', "$.agent[0].stall_s"),
    ('[telemetry]\nlisten = "localhost"\n', "$.telemetry.listen"),
    ('[telemetry]\nmax_body_kb = 0\n', "$.telemetry.max_body_kb"),
    ('[telemetry]\nmax_body_kb = 64\nqueue_kb = 32\n', "$.telemetry.queue_kb"),
])
def test_bad_stall_and_telemetry_settings_say_what_and_where(table, where):
    from pulse.core import config as configmod
    with pytest.raises(configmod.ConfigError) as err:
        configmod.validate(configmod.decode(table, "config.toml"), "config.toml")
    assert where in str(err.value), err.value
