"""pulsectl commands that are not status: logs, daemon start, init, config, worker control."""

from __future__ import annotations

import os
import sqlite3

import psutil
import pytest

from pulse.core import client, logs
from pulse.core.home import Paths
from support import wait_for


def test_logs_name_worker_and_pid_and_filter(pulsed):
    status = pulsed.start(env={"PULSE_TEST_INJECT": "tick:crash-before-ready,eventlog:exit-0"}).status()
    tick = next(w for w in status.workers if w.name == "tick")
    wait_for(lambda: "injected crash before ready" in pulsed.log_text(), 5, what="the crash in the log")
    out = pulsed.ctl("logs", "--worker", "tick", "-n", "1000")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines and all(line.split(" ")[1].startswith("tick[") or logs.about(line, "tick") for line in lines)
    # pulsed's lines about the tick are its restarts: they belong in the tick's log
    assert any(line.split(" ")[1].startswith("pulsed[") and "tick (pid" in line and "exited unexpectedly" in line
               for line in lines)
    assert any("RuntimeError: injected crash before ready" in line for line in lines)
    wait_for(lambda: "injected exit 0" in pulsed.log_text(), 5, what="the event writer's exit in the log")
    writer = pulsed.ctl("logs", "--worker", "eventlog", "-n", "1000").stdout.splitlines()
    assert any("injected exit 0" in line for line in writer)
    assert all(line.split(" ")[1].startswith("eventlog[") or logs.about(line, "eventlog") for line in writer)
    everything = pulsed.ctl("logs", "-n", "1000").stdout
    assert f"pulsed[{pulsed.proc.pid}] INFO pulse.supervisor: tick ready (pid {tick.pid}" in everything
    assert all(line[:4].isdigit() and line[23] == "Z" for line in everything.splitlines())


def test_output_pipe_yields_whole_lines(tmp_path):
    r, w = os.pipe()
    sink = logs.Sink(tmp_path / "x.log", to_stderr=False, max_bytes=1 << 20, backups=1)
    reader = logs.PipeReader(r, "tick", 42)
    os.write(w, b"first half of a line, ")
    assert reader.read(sink)
    os.write(w, b"second half\npartial")
    assert reader.read(sink)
    os.write(w, b" tail\n")
    reader.read(sink)
    os.close(w)
    assert not reader.read(sink)
    reader.close()
    sink.close()
    lines = (tmp_path / "x.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["tick[42] first half of a line, second half",
                                                         "tick[42] partial tail"]


def test_daemon_start_returns_once_ready(tmp_path, tracker):
    import subprocess

    from support import PULSECTL
    home = tmp_path / "home"
    env = {**os.environ, "PULSE_HEARTBEAT_MS": "100", "PULSE_STOP_GRACE_MS": "1000"}
    out = subprocess.run([PULSECTL, "--home", str(home), "daemon", "start"], capture_output=True, text=True,
                         timeout=60, env=env)
    pid = client.daemon_pid(Paths.for_client(home))
    tracker.add(pid, *[p.pid for p in psutil.Process(pid).children(recursive=True)] if pid else [])
    assert out.returncode == 0, out.stderr
    assert f"pulsed running (pid {pid})" in out.stdout
    assert psutil.Process(pid).ppid() != os.getpid()           # in the background, its own session
    assert os.getsid(pid) == pid
    status = subprocess.run([PULSECTL, "--home", str(home), "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, status.stdout
    again = subprocess.run([PULSECTL, "--home", str(home), "daemon", "start"], capture_output=True, text=True,
                           timeout=30, env=env)
    assert again.returncode == 2 and "already running" in again.stderr
    stop = subprocess.run([PULSECTL, "--home", str(home), "stop"], capture_output=True, text=True, timeout=30)
    assert stop.returncode == 0, stop.stderr
    assert client.daemon_pid(Paths.for_client(home)) is None


def test_daemon_start_fails_with_the_reason(tmp_path):
    import subprocess

    from support import PULSECTL
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[timings]\nbogus = 1\n")
    out = subprocess.run([PULSECTL, "--home", str(home), "daemon", "start"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "pulsed exited with code 78" in out.stderr and "unknown key $.timings.bogus" in out.stderr


def test_init_is_idempotent_and_says_what_it_made(tmp_path):
    import subprocess

    from support import PULSECTL
    home = tmp_path / "home"
    first = subprocess.run([PULSECTL, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0
    assert "config.toml" in first.stdout and "engine" in first.stdout and "staging" in first.stdout
    for db in ("events.db", "vitals.db"):   # made and in WAL before any worker opens them
        assert db in first.stdout
        conn = sqlite3.connect(home / db)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    second = subprocess.run([PULSECTL, "--home", str(home), "init"], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "nothing to make" in second.stdout
    log = subprocess.run(["git", "-C", str(home / "engine"), "log", "--format=%an"], capture_output=True,
                         text=True, timeout=30)
    assert log.stdout.strip() == "Pulse"


def test_check_config_and_effective(tmp_path):
    import subprocess

    from support import PULSECTL
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[timings]\ntick_ms = 2000\n")
    run = lambda *a, **env: subprocess.run([PULSECTL, "--home", str(home), *a], capture_output=True, text=True,
                                           timeout=30, env={**os.environ, **env})
    assert run("check-config").returncode == 0
    effective = run("config", "--effective", PULSE_HEARTBEAT_MS="250").stdout
    assert "tick_ms = 2000" in effective and "heartbeat_ms = 250" in effective and "stop_grace_ms = 5000" in effective
    (home / "config.toml").write_text("[[process]]\nname = 'x'\nmatch = 'x'\nrestrat = ['y']\n")
    bad = run("check-config")
    assert bad.returncode == 78 and "unknown key $.process[0].restrat" in bad.stderr
    (home / "config.toml").write_text("[[process]]\nname = 'x'\n")
    bad = run("check-config")
    assert bad.returncode == 78 and "$.process[0]: set exactly one of pidfile or match" in bad.stderr


def test_effective_shows_what_pulsed_runs_and_where_the_file_differs_even_when_it_is_broken(pulsed):
    pulsed.home.mkdir(parents=True)
    config = pulsed.home / "config.toml"
    config.write_text("[timings]\ntick_ms = 2000\n")
    pulsed.start(env={"PULSE_HEARTBEAT_MS": "250"})
    shown = pulsed.ctl("config", "--effective")
    assert shown.returncode == 0 and shown.stdout.startswith("# what the running pulsed uses\n"), shown.stderr
    assert "# timings.heartbeat_ms: not what" in shown.stdout and "heartbeat_ms = 250" in shown.stdout
    assert "tick_ms = 2000" in shown.stdout and "# timings.tick_ms" not in shown.stdout
    config.write_text("[timings]\ntick_ms = 'soon'\n")          # an edit pulsed has not taken, and never will
    shown = pulsed.ctl("config", "--effective")
    assert shown.returncode == 0 and "is not valid now" in shown.stdout and "$.timings.tick_ms" in shown.stdout
    assert "tick_ms = 2000" in shown.stdout, shown.stdout      # still what pulsed runs
    assert pulsed.terminate() == 0
    shown = pulsed.ctl("config", "--effective")
    assert shown.returncode == 78 and "$.timings.tick_ms" in shown.stderr and shown.stdout == ""


def test_unknown_worker_is_refused(pulsed):
    pulsed.start()
    out = pulsed.ctl("restart", "nobody")
    assert out.returncode == 2 and "nobody" in out.stderr


def test_every_command_is_registered_where_it_lives():
    import importlib

    from pulse.cli.group import COMMAND_MODULES
    defined = {c.name: m for m in set(COMMAND_MODULES.values())
               for c in importlib.import_module(f"pulse.cli.{m}").COMMANDS}
    assert defined == COMMAND_MODULES


def test_pipeline_commands_events_vitals_effects_emit(pulsed):
    import json as jsonlib
    pulsed.start()
    out = pulsed.ctl("emit", "noop", "--target", "demo", "--param", "n=3", "--param", "word=hi", "--wait", "10")
    assert out.returncode == 0, out.stderr
    effect_id = out.stdout.split()[0]
    assert out.stdout.splitlines()[-1] == f"{effect_id} acked"
    emitted = [jsonlib.loads(line) for line in pulsed.ctl("events", "--type", "effect", "--json").stdout.splitlines()]
    assert emitted[-1]["data"]["params"] == {"n": 3, "word": "hi"} and emitted[-1]["data"]["origin"] == "operator"
    recent = pulsed.ctl("events", "--since", "10m", "--type", "effect-acked").stdout
    assert effect_id in recent
    assert pulsed.ctl("events", "--since", "soon").returncode == 2          # neither ISO time nor duration
    wait_for(lambda: pulsed.vital("system-resource"), 10, what="a vital")
    vitals = [jsonlib.loads(line) for line in pulsed.ctl("vitals", "system-resource", "--json").stdout.splitlines()]
    assert vitals[0]["key"] == "system-resource" and "cpu_pct" in vitals[0]["data"]
    assert pulsed.ctl("vitals", "no-such-key").returncode == 1
    listed = [jsonlib.loads(line) for line in pulsed.ctl("effects", "--json").stdout.splitlines()]
    assert any(e["id"] == effect_id and e["state"] == "acked" for e in listed)
    assert effect_id not in pulsed.ctl("effects", "--pending").stdout
    bad = pulsed.ctl("emit", "noop", "--param", "no-equals-sign")
    assert bad.returncode == 2 and "key=value" in bad.stderr


@pytest.mark.parametrize("text, says", [
    ('[log]\nlevel = "verbose"\n', "$.log.level: Invalid enum value 'verbose'; one of: debug, info, warning, error"),
    ('[[notify]]\nkind = "email"\n', "$.notify[0].kind: Invalid enum value 'email'; one of: log, file, webhook, command"),
])
def test_an_enum_error_lists_the_valid_values(tmp_path, text, says):
    from pulse.core import config
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(config.ConfigError) as err:
        config.load(tmp_path / "config.toml", {})
    assert says in str(err.value)


def test_hung_after_ms_must_exceed_the_sqlite_busy_timeout(tmp_path):
    from pulse.core import config
    (tmp_path / "config.toml").write_text("[timings]\nhung_after_ms = 4000\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(tmp_path / "config.toml", {})
    assert "hung_after_ms (4000) must exceed sqlite_busy_timeout_ms (5000)" in str(err.value)
    assert config.load(tmp_path / "config.toml", {"PULSE_SQLITE_BUSY_TIMEOUT_MS": "1000"}).timings.hung_after_ms == 4000


# A new command as a contributor would add it: its module in pulse/cli/ (here a temporary folder that
# joins pulse.cli's path, so the module is pulse.cli.hellocmd and leaves no file in the tree), and a
# row of commandtable.py's table. The row goes into the table's own source, read and run in place of
# the module (a sitecustomize, so every pulsectl of the test sees it); nothing else is changed: the
# command runs, --help lists it, a typo is pointed at it, and the CLI reference (docs/cli.md) and the
# list of modules (docs/architecture.md) document it once scripts/gen_docs.py regenerates them.
NEW_COMMAND_ROW = '    "hello": ("hellocmd", "Greet WHO, from the home."),'
COMMAND_SITECUSTOMIZE = """\
import importlib.util, os, sys, types
import pulse.cli
pulse.cli.__path__.append(os.path.join(os.path.dirname(__file__), "cli"))
found = importlib.util.find_spec("pulse.cli.commandtable")
source = open(found.origin).read()
anchor = "COMMAND_TABLE: dict[str, tuple[str, str]] = {\\n"
assert source.count(anchor) == 1, "the command table moved: update this test"
module = types.ModuleType("pulse.cli.commandtable")
module.__file__ = found.origin
sys.modules[module.__name__] = module
exec(compile(source.replace(anchor, anchor + %r + "\\n"), found.origin, "exec"), module.__dict__)
""" % NEW_COMMAND_ROW
HELLO_COMMAND = '''\
\"\"\"pulsectl hello: a greeting, from the home.\"\"\"

import click

from pulse.cli.group import Context, pass_ctx


@click.command(name="hello")
@click.argument("who", default="world")
@pass_ctx
def hello_cmd(ctx: Context, who: str) -> None:
    """Greet WHO, from the home."""
    click.echo(f"hello {who}, from {ctx.home}")


COMMANDS = [hello_cmd]
'''


def test_a_command_is_its_module_and_one_row_of_the_command_table(tmp_path):
    import subprocess
    import sys
    folder = tmp_path / "newcommand"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(COMMAND_SITECUSTOMIZE)
    (folder / "cli").mkdir()
    (folder / "cli" / "hellocmd.py").write_text(HELLO_COMMAND)
    env = dict(os.environ, PYTHONPATH=str(folder), PULSE_HOME=str(tmp_path / "home"))
    pulsectl = os.path.join(os.path.dirname(sys.executable), "pulsectl")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    said = run(pulsectl, "hello", "operator")
    assert (said.returncode, said.stdout) == (0, f"hello operator, from {tmp_path / 'home'}\n"), said.stderr
    listed = run(pulsectl, "--help")
    assert "  hello " in listed.stdout and "Greet WHO, from the home." in listed.stdout, listed.stdout
    typo = run(pulsectl, "helo")
    assert typo.returncode == 2 and "did you mean 'hello'?" in typo.stderr, typo.stderr
    reference = run(sys.executable, "-c", "from pulse.cli import clireference; print(clireference.reference())")
    assert "\n## pulsectl hello\n" in reference.stdout and "Usage: pulsectl hello [OPTIONS] [WHO]" in reference.stdout, \
        reference.stderr
    gen_docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "gen_docs.py")
    modules = run(sys.executable, "-c", "import importlib.util; spec = importlib.util.spec_from_file_location('g', "
                  f"{gen_docs!r}); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g); "
                  "print(g.module_tables().split('#### `pulse/cli/`')[1].split('####')[0])")
    assert "| `hellocmd` | pulsectl hello: a greeting, from the home. |" in modules.stdout, modules.stderr
