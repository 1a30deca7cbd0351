"""The OpenClaw example: a task once restarting the gateway did not help, one per streak."""

from rules.openclaw import GATEWAY, gateway_task

from pulse.engine.api import Effect, Outcome, Snapshot, Vital


def snap(oks, restarts=(), added=(), pending=()):
    history = {f"health:{GATEWAY}": [Vital(f"health:{GATEWAY}", 100.0 + i, {"ok": ok, "status": None if ok else 503})
                                     for i, ok in enumerate(oks)]}
    outcomes = {GATEWAY: [Outcome("r", "restart-process", "acked", ts) for ts in restarts]
                + [Outcome("t", "task-add", "acked", ts) for ts in added]}
    return Snapshot(tick=1, ts=200.0, history=history, outcomes=outcomes, pending=list(pending))


def test_no_task_while_healthy_or_not_yet_restarted_enough():
    assert gateway_task(Snapshot(tick=1, ts=0.0)) is None                       # not configured: inert
    assert gateway_task(snap([True, True])) is None
    assert gateway_task(snap([True, False, False], restarts=[101.5])) is None   # one restart so far


def test_a_task_after_restarts_that_did_not_help_once_per_streak():
    task = gateway_task(snap([True, False, False, False], restarts=[101.5, 102.5]))
    assert task.kind == "task-add" and task.target == GATEWAY and "503" in task.params["prompt"]
    assert gateway_task(snap([True, False, False, False], restarts=[101.5, 102.5], added=[103.5])) is None
    assert gateway_task(snap([True, False, False, False], restarts=[101.5, 102.5],
                             pending=[Effect(kind="task-add", target=GATEWAY)])) is None
    # restarts before the last healthy probe helped: they do not count
    assert gateway_task(snap([False, True, False], restarts=[99.0, 99.5])) is None
