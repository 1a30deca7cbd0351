"""The rough edges a new operator hit in pulsectl: help, config, reload, status."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import PULSECTL, pulsectl


def ctl(home, *args: str) -> subprocess.CompletedProcess:
    return pulsectl(["--home", str(home), *args], timeout=60)


def test_the_top_level_help_cuts_no_description(tmp_path):
    out = subprocess.run([PULSECTL, "--help"], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0
    commands = out.stdout.split("Commands:", 1)[1].splitlines()
    assert len([line for line in commands if line.strip()]) >= 30
    assert not [line for line in commands if "..." in line or "…" in line]


def test_config_without_effective_is_a_usage_error(tmp_path):
    out = ctl(tmp_path / "home", "config")
    assert out.returncode == 2 and "--effective" in out.stderr


def test_the_same_bad_config_exits_78_from_check_config_and_reload(pulsed):
    pulsed.start()
    (pulsed.home / "config.toml").write_text("[timings]\nhartbeat_ms = 100\n")
    check = pulsed.ctl("check-config")
    reload = pulsed.ctl("reload")
    assert check.returncode == 78 and "did you mean heartbeat_ms?" in check.stderr
    assert reload.returncode == 78, reload.stderr
    assert "keeps its running configuration" in reload.stderr and "hartbeat_ms" in reload.stderr
    assert pulsed.ctl("status").returncode == 0


def test_status_json_has_no_raw_epoch_floats(pulsed):
    pulsed.start()
    out = pulsed.ctl("status", "--json")
    data = json.loads(out.stdout)
    worker = data["workers"][0]
    assert worker["started_at"][:2] == "20" and worker["started_at"].endswith("Z")
    assert worker["heartbeat_at"].endswith("Z") and data["supervisor"]["started_at"].endswith("Z")


def test_a_worker_whose_heartbeat_is_overdue_is_late_before_it_is_hung(pulsed, tracker):
    import os
    import signal

    from support import wait_for
    pulsed.start(env={"PULSE_HUNG_AFTER_MS": "8000"})
    watcher = pulsed.worker("watcher")
    os.kill(watcher.pid, signal.SIGSTOP)
    try:
        late = wait_for(lambda: (w := pulsed.worker("watcher")).state == "late" and w, 5, what="watcher late")
        assert late.pid == watcher.pid and late.heartbeat_age_s < 8
        out = pulsed.ctl("status")
        assert out.returncode == 0 and any(line.split()[:2] == ["watcher", "late"] for line in out.stdout.splitlines())
    finally:
        os.kill(watcher.pid, signal.SIGCONT)
    wait_for(lambda: pulsed.worker("watcher").state == "running", 5, what="watcher running again")
    assert pulsed.worker("watcher").pid == watcher.pid


def test_crashes_and_operator_restarts_are_counted_apart(pulsed):
    import os
    import signal

    from support import wait_for
    pulsed.start()
    os.kill(pulsed.worker("tick").pid, signal.SIGKILL)
    wait_for(lambda: (w := pulsed.worker("tick")).state == "running" and w.crashes == 1, 10, what="tick replaced")
    assert pulsed.ctl("restart", "executor").returncode == 0
    wait_for(lambda: pulsed.worker("executor").state == "running", 10, what="executor restarted")
    data = {w["name"]: w for w in json.loads(pulsed.ctl("status", "--json").stdout)["workers"]}
    assert (data["tick"]["crashes"], data["tick"]["operator_restarts"]) == (1, 0)
    assert (data["executor"]["crashes"], data["executor"]["operator_restarts"]) == (0, 1)
    rows = {line.split()[0]: line.split() for line in pulsed.ctl("status").stdout.splitlines()[1:5]}
    assert rows["tick"][4:6] == ["1", "0"] and rows["executor"][4:6] == ["0", "1"]


def test_the_footer_explains_lifecycle_events_not_yet_written():
    from pulse.cli import statusview
    from pulse.core.wire import controlmsgs
    status = controlmsgs.Status(version=1, supervisor=controlmsgs.SupervisorStatus(pid=1, uptime_s=5.0, home="/h"), workers=[])
    footer = statusview.table(status, None, 4)
    assert "4 lifecycle events not yet in events.db" in footer and "held by pulsed until its event writer" in footer


@pytest.mark.fresh_home   # what pulsed's first run makes and says
def test_pulsed_first_run_says_what_it_created(pulsed):
    assert not pulsed.home.exists()
    pulsed.start()
    said = [line.split(": ", 1)[1] for line in pulsed.log_text().splitlines() if "first run: " in line
            or "ballast file" in line]
    text = "\n".join(said)
    for made in (f"made the home {pulsed.home}/", f"made {pulsed.home / 'config.toml'}",
                 f"made {pulsed.home / 'engine'}/ (git, branch main)", f"made {pulsed.home / 'events.db'}",
                 f"ballast file {pulsed.home / 'ballast'} of 32 MiB"):
        assert made in text, text


def test_events_vitals_and_effects_print_iso_times_never_epoch_floats(tmp_path):
    import re

    from support import init_home
    home = tmp_path / "home"
    init_home(home)
    (home / "config.toml").write_text('[[process]]\nname = "svc"\nmatch = "^no-such-process-i23c$"\n')
    assert ctl(home, "pause", "svc", "--for", "10m").returncode == 0
    assert ctl(home, "emit", "noop", "--target", "demo").returncode == 0
    outputs = [ctl(home, "events", "--json").stdout, ctl(home, "events").stdout, ctl(home, "effects", "--json").stdout]
    pause = next(json.loads(line) for line in outputs[0].splitlines() if '"pause"' in line)
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", pause["data"]["until"])
    assert pause["ts"].endswith("Z")
    effect = json.loads(outputs[2].splitlines()[0])
    assert effect["created"].endswith("Z") and effect["deadline"].endswith("Z")
    for out in outputs:
        assert out and not re.search(r"\b1[7-9]\d{8}(\.\d+)?\b", out), out


def test_emit_waiting_while_pulsed_is_down_says_so_and_that_it_stays_queued(tmp_path):
    from support import init_home
    home = tmp_path / "home"
    init_home(home)
    out = ctl(home, "emit", "noop", "--target", "demo", "--wait", "0.2")
    assert out.returncode == 1
    assert f"pulsed is not running on {home}; it stays queued and runs once pulsed starts" in out.stderr, out.stderr


def test_vitals_of_a_family_name_alone_lists_each_of_its_keys(tmp_path):
    import time

    from pulse.core.wire.enginerpc import Vital
    from pulse.store import vitalsdb
    from support import init_home
    home = tmp_path / "home"
    paths = init_home(home)
    conn = vitalsdb.open_vitals(paths.vitals_db)
    vitalsdb.append_vitals(conn, [Vital(f"health:{name}", time.time(), {"ok": True}) for name in ("web1", "api")]
                           + [Vital("healthz", time.time(), {})])
    conn.close()
    keys = [line.split()[0] for line in ctl(home, "vitals", "health").stdout.splitlines()]
    assert keys == ["health:api", "health:web1"]
    assert ctl(home, "vitals", "nothing").returncode == 1


def test_check_config_warns_of_an_agent_program_not_on_path_and_its_run_gives_up_at_once(tmp_path):
    from pulse.agents import tasks
    from support import init_home
    home = tmp_path / "home"
    init_home(home)
    (home / "config.toml").write_text('[[agent]]\nname = "bot"\nadapter = "command"\nargv = ["no-such-agent-cli-i36"]\n'
                                      '\n[[agent]]\nname = "claude"\nadapter = "claude-code"\nenv = { PATH = "/nowhere" }\n')
    out = ctl(home, "check-config")
    assert out.returncode == 0, out.stderr
    assert "warning: " in out.stderr and "$.agent[0] (bot): its program 'no-such-agent-cli-i36' is not on PATH" in out.stderr
    assert "$.agent[1] (claude): its program 'claude' is not on PATH" in out.stderr
    assert "not-installed" in tasks.FINAL_REASONS       # a run that cannot start is given up, not retried
