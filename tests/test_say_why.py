"""pulsectl says why: what failed and for what reason, what an operator changed, what it meant."""

from __future__ import annotations

import json
import signal

from support import engine_rule, init_home, wait_for


def test_a_failed_effect_says_why_in_emit_and_in_the_effects_listing(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    out = pulsed.ctl("emit", "exec", "--param", 'argv=["false"]', "--wait", "20")
    assert out.returncode == 1 and "failed: exit code 1" in out.stdout
    listing = pulsed.ctl("effects").stdout.splitlines()
    assert listing[0].split() == ["ID", "STATE", "KIND", "TARGET", "ORIGIN", "CREATED", "WHY"]
    assert listing[1].split()[1:3] == ["failed", "exec"] and listing[1].endswith("exit code 1")
    row = json.loads(pulsed.ctl("effects", "--json").stdout.splitlines()[0])
    assert row["state"] == "failed" and row["why"] == "exit code 1"


def test_events_of_a_type_come_from_the_whole_history_and_an_unknown_type_is_refused(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    assert pulsed.ctl("task", "add", "--project", "p", "--title", "early", "--prompt", "x").returncode == 0
    for _ in range(3):                    # push the task far back in the history
        assert pulsed.ctl("emit", "noop", "--wait", "20").returncode == 0
    out = pulsed.ctl("events", "--type", "task-created", "-n", "1")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1 and "task-created" in out.stdout
    assert "task-created" not in pulsed.ctl("events", "-n", "3").stdout
    bad = pulsed.ctl("events", "--type", "task-create")
    assert bad.returncode == 2 and "no event type 'task-create'" in bad.stderr and "task-created" in bad.stderr


def test_reload_and_operator_actions_are_events(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    assert pulsed.ctl("restart", "engine").returncode == 0
    (pulsed.home / "config.toml").write_text("[timings]\ntick_ms = 4000\n")
    assert pulsed.ctl("reload").returncode == 0
    operator = wait_for(lambda: pulsed.events("operator"), 10, what="the operator's restart recorded")
    assert operator[0]["target"] == "engine" and operator[0]["data"]["action"] == "restart"
    reload = pulsed.events("reload")[-1]["data"]
    assert reload["ok"] and reload["changed"] == ["timings"] and reload["restarted"] == ["tick"]


def test_stop_returns_once_pulsed_has_exited(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    out = pulsed.ctl("stop")
    assert out.returncode == 0 and f"pulsed (pid {pulsed.proc.pid}) stopped" in out.stdout
    assert pulsed.proc.poll() is not None or pulsed.proc.wait(5) == 0


def test_bare_config_says_what_to_run_and_an_unknown_command_suggests_the_nearest(pulsed):
    init_home(pulsed.home)
    out = pulsed.ctl("config")
    assert out.returncode == 2 and "--effective" in out.stderr     # a usage error, not help and success
    out = pulsed.ctl("stauts")
    assert out.returncode == 2 and "did you mean 'status'?" in out.stderr


def test_a_task_without_any_agent_says_so_and_its_run_fails_clearly(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    out = pulsed.ctl("task", "add", "--project", "p", "--title", "t", "--prompt", "do it")
    assert out.returncode == 0 and "no [[agent]] is configured" in out.stderr
    ran = pulsed.ctl("emit", "agent-run", "--target", out.stdout.strip(), "--wait", "20")
    assert ran.returncode == 1 and "no [[agent]] is configured" in ran.stdout


def test_notifications_come_in_a_burst_then_one_digest_per_window(pulsed, tmp_path):
    from pulse.core import client
    from pulse.core.wire import doorbells, enginerpc
    from pulse.store import effectqueue, eventsdb
    notes = tmp_path / "notes.jsonl"
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(f'[[notify]]\nkind = "file"\npath = "{notes}"\nburst = 3\ngroup_s = 6\n')
    pulsed.start()
    conn = eventsdb.open_events(pulsed.home / "events.db")
    flood = [effectqueue.new_effect(enginerpc.Effect(kind="notify", target="disk", params={"message": f"full {n}"}), "operator", 60)
             for n in range(8)]
    effectqueue.commit_effects(conn, flood, "test")          # as pulsectl emit does, eight at once
    client.ring(pulsed.paths, "doorbell", doorbells.Doorbell("test"))
    wait_for(lambda: all(effectqueue.effect_state(conn, e.id) == "acked" for e in flood), 20, what="all eight acked")
    sent = [json.loads(line) for line in notes.read_text().splitlines()]
    assert len(sent) == 3 and not any(s.get("digest") for s in sent)
    digest = wait_for(lambda: [json.loads(line) for line in notes.read_text().splitlines()][3:], 20,
                      what="the window's digest")
    assert len(digest) == 1 and digest[0]["digest"] and digest[0]["held_back"] == 5
    assert digest[0]["message"].startswith("5 more notification(s) about disk were held back")
    other = pulsed.ctl("emit", "notify", "--target", "memory", "--param", "message=m", "--wait", "20")
    assert other.returncode == 0 and json.loads(notes.read_text().splitlines()[-1])["target"] == "memory"
    conn.close()


def test_config_effective_shows_what_the_running_pulsed_uses_and_what_the_file_changes(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text("[timings]\ntick_ms = 4000\n")
    pulsed.start()
    (pulsed.home / "config.toml").write_text("[timings]\ntick_ms = 3000\n")     # edited, not reloaded
    out = pulsed.ctl("config", "--effective")
    assert out.returncode == 0, out.stderr
    assert "\ntick_ms = 4000" in out.stdout and "# timings.tick_ms: not what" in out.stdout
    assert "# timings.heartbeat_ms: not what" in out.stdout          # the tests' PULSE_HEARTBEAT_MS
    assert pulsed.ctl("reload").returncode == 0
    out = pulsed.ctl("config", "--effective").stdout
    assert "\ntick_ms = 3000" in out and "# timings.tick_ms:" not in out


def test_status_shows_hung_while_a_silent_worker_is_not_yet_replaced(pulsed, tmp_path):
    """An agent's rule that blocks SIGABRT (no traceback can stop it) and sleeps: from hung_after_ms
    until the SIGKILL at stop_grace_ms, status says `hung`, not `running`."""
    freeze = tmp_path / "freeze"
    engine_rule(pulsed, "freezer", f"""
        import pathlib, signal, time

        def freezer(prev, curr, inner):
            flag = pathlib.Path({str(freeze)!r})
            if flag.exists():
                flag.unlink()
                signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGABRT}})
                time.sleep(60)
            return [], 100

        RULES = [freezer]
        """)
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_STOP_GRACE_MS": "5000"})
    frozen = pulsed.worker("engine").pid
    freeze.touch()
    def hung_in_status():
        out = pulsed.ctl("status").stdout
        return out if " hung " in out else None

    shown = wait_for(hung_in_status, 15, what="status showing the engine hung")
    row = next(line for line in shown.splitlines() if line.startswith("engine"))
    assert row.split()[1] == "hung" and str(frozen) in row
    as_json = json.loads(pulsed.ctl("status", "--json").stdout)
    assert {w["name"]: w["state"] for w in as_json["workers"]}["engine"] == "hung"
    replaced = pulsed.wait_replaced("engine", frozen, timeout=20)
    assert replaced.state == "running"
    exited = [e for e in pulsed.events("worker-exited", "engine") if e["data"]["pid"] == frozen]
    assert exited and exited[0]["data"]["state"] == "hung" and exited[0]["data"]["signal"] == signal.SIGKILL
