"""An effect that cannot be done as asked fails with a reason that names what is wrong, never as a
bug: bad params, a path the host refuses, a worker that is not there or not enabled, pulsed not
answering, the engine's promote checks. Each case is emitted with `pulsectl emit` to a real pulsed,
and read back from its effect-failed event; a bug would have been reason `error`, with a traceback
in pulse.log."""

from __future__ import annotations

import os
import signal

from support import init_home, wait_for

EMIT_WAIT_S = "30"


def emit(pulsed, kind: str, *args: str) -> tuple[str, object]:
    """Emit with --wait: (the effect's id, the finished pulsectl)."""
    out = pulsed.ctl("emit", kind, *args, "--wait", EMIT_WAIT_S)
    return out.stdout.split()[0], out


def failure(pulsed, kind: str, *args: str) -> dict:
    """Emit an effect that must fail; its effect-failed event, checked to be a failure, not a bug."""
    effect_id, out = emit(pulsed, kind, *args)
    assert out.returncode == 1, (out.stdout, out.stderr)
    failed = next(e for e in pulsed.events("effect-failed") if e["data"]["effect_id"] == effect_id)
    assert failed["data"]["reason"] != "error", failed["data"]
    assert "Traceback" not in pulsed.log_text()
    assert not [e for e in pulsed.events("error") if "traceback" in e["data"] or "Traceback" in e["data"]["message"]]
    return failed


def history(pulsed, effect_id: str) -> list[str]:
    return [e["type"] for e in pulsed.events() if effect_id in (e["data"].get("effect_id"), e["data"].get("id"))]


def old_file(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("old")
    os.utime(path, (1_000_000_000, 1_000_000_000))


# -- bad params: refused before the claim, naming the field ----------------------------------------------

def test_relative_paths_are_bad_params_and_nothing_is_touched(pulsed, tmp_path):
    init_home(pulsed.home)
    pulsed.start()
    failed = failure(pulsed, "archive", "--param", "from=logs/old", "--param", f"to={tmp_path / 'kept'}")
    assert failed["data"]["reason"] == "bad-params" and "`params.from` must be absolute" in failed["data"]["error"]
    assert history(pulsed, failed["data"]["effect_id"]) == ["effect", "effect-failed"]     # never claimed

    doomed = tmp_path / "doomed.log"
    doomed.write_text("x")
    failed = failure(pulsed, "cleanup", "--param", f'patterns=["{doomed}", "*.log"]')
    assert failed["data"]["reason"] == "bad-params"
    assert "`params.patterns` must be absolute, got '*.log'" in failed["data"]["error"]
    assert doomed.exists()                     # the absolute pattern before it deleted nothing either


def test_a_destination_the_host_refuses_fails_naming_the_path(pulsed, tmp_path):
    init_home(pulsed.home)
    pulsed.start()
    old_file(tmp_path / "sessions" / "a.json")
    (tmp_path / "not-a-dir").write_text("a file")
    failed = failure(pulsed, "archive", "--param", f"from={tmp_path / 'sessions'}",
                     "--param", f"to={tmp_path / 'not-a-dir' / 'archive'}")
    assert failed["data"]["reason"] == "bad-path", failed["data"]
    assert str(tmp_path / "not-a-dir" / "archive") in failed["data"]["error"]
    assert "Not a directory" in failed["data"]["error"] and failed["data"]["moved"] == 0
    assert (tmp_path / "sessions" / "a.json").exists()


def test_a_report_dir_that_cannot_be_made_fails_naming_it(pulsed, tmp_path):
    init_home(pulsed.home)
    (tmp_path / "not-a-dir").write_text("a file")
    (pulsed.home / "config.toml").write_text(f'[report]\ndir = "{tmp_path / "not-a-dir" / "reports"}"\n')
    pulsed.start()
    failed = failure(pulsed, "report")
    assert failed["data"]["reason"] == "bad-path" and "the report page could not be written" in failed["data"]["error"]


# -- restart-worker ----------------------------------------------------------------------------------------

def test_restart_worker_names_what_is_wrong_with_its_target(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    failed = failure(pulsed, "restart-worker", "--target", "nosuch")
    assert failed["data"]["reason"] == "bad-params" and "no worker named 'nosuch'" in failed["data"]["error"]
    assert "web" in failed["data"]["error"]                           # it says what the target may be
    failed = failure(pulsed, "restart-worker", "--target", "web")
    assert failed["data"]["reason"] == "not-enabled" and "[web] enabled = true" in failed["data"]["error"]


def test_restart_worker_restarts_web_while_it_is_enabled(pulsed):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')
    pulsed.start()
    web = pulsed.wait_state("web", "running")
    effect_id, out = emit(pulsed, "restart-worker", "--target", "web")
    assert out.returncode == 0, (out.stdout, out.stderr)
    pulsed.wait_replaced("web", web.pid)
    asked = [e["data"]["action"] for e in pulsed.events("operator", "web")]
    assert asked == ["restart"]                                        # an operator restart, not a crash


def test_restart_worker_when_pulsed_does_not_answer_is_unreachable(pulsed):
    init_home(pulsed.home)
    # pulsed is frozen for a few seconds below: its workers must not count as hung meanwhile
    pulsed.start(env={"PULSE_HUNG_AFTER_MS": "30000"})
    os.kill(pulsed.proc.pid, signal.SIGSTOP)
    try:
        effect_id, out = emit(pulsed, "restart-worker", "--target", "engine")
    finally:
        os.kill(pulsed.proc.pid, signal.SIGCONT)
    assert out.returncode == 1, (out.stdout, out.stderr)
    failed = wait_for(lambda: next((e for e in pulsed.events("effect-failed") if e["data"]["effect_id"] == effect_id),
                                   None), 10, what="the effect-failed event")
    assert failed["data"]["reason"] == "unreachable" and "pulsed did not answer" in failed["data"]["error"]
    assert "Traceback" not in pulsed.log_text()


# -- the engine's promote and rollback ---------------------------------------------------------------------

def test_a_promote_or_rollback_the_checks_refuse_is_refused_naming_the_check(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    failed = failure(pulsed, "engine-rollback")
    assert failed["data"]["reason"] == "refused" and failed["data"]["check"] == "rollback"
    assert "no promote to roll back" in failed["data"]["error"]
    failed = failure(pulsed, "engine-promote")
    assert failed["data"]["reason"] == "refused" and failed["data"]["check"] == "staging"
    assert "nothing to promote" in failed["data"]["error"]


def test_archive_and_cleanup_never_touch_the_home(pulsed, tmp_path):
    """Whoever emits them: the home, a folder inside it and a folder that holds it are refused by an
    archive, and a cleanup pattern that reaches into the home (through `..` or a link) deletes nothing there."""
    init_home(pulsed.home)
    pulsed.start()
    kept = tmp_path / "kept"
    for source, says in ((pulsed.home, "is Pulse's home"), (pulsed.home / "logs", "is inside Pulse's home"),
                         (pulsed.home.parent, "holds Pulse's home")):
        failed = failure(pulsed, "archive", "--param", f"from={source}", "--param", f"to={kept}",
                         "--param", "older_than_h=0")
        assert failed["data"]["reason"] == "refused" and says in failed["data"]["error"], failed["data"]
    failed = failure(pulsed, "archive", "--param", f"from={tmp_path / 'elsewhere'}",
                     "--param", f"to={pulsed.home / 'objects' / 'in'}")
    assert failed["data"]["reason"] == "refused" and "to" in failed["data"]["error"]
    assert not kept.exists() and (pulsed.home / "events.db").exists() and (pulsed.home / "config.toml").exists()

    (tmp_path / "x").mkdir()
    link = tmp_path / "link"
    link.symlink_to(pulsed.home)
    stray = tmp_path / "stray.log"
    stray.write_text("x")
    effect_id, out = emit(pulsed, "cleanup", "--param",
                          f'patterns=["{tmp_path}/x/../home/*.toml", "{link}/logs/*", "{stray}"]')
    assert out.returncode == 0, (out.stdout, out.stderr)
    acked = next(e for e in pulsed.events("effect-acked") if e["data"]["effect_id"] == effect_id)
    assert acked["data"]["removed"] == 1 and not stray.exists()
    assert (pulsed.home / "config.toml").exists() and (pulsed.home / "logs" / "pulse.log").exists()
