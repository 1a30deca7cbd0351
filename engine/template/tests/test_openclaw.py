"""The OpenClaw example: a task once restarting the gateway did not help, one per streak."""

from rules.openclaw import GATEWAY, START_PERIOD_S, gateway_task

from pulse.engine.api import Effect, KnownGood, Outcome, Snapshot, Vital

P = START_PERIOD_S


def snap(probes, restarts=(), added=(), pending=(), failed=(), restored_at=None):
    """probes: (ts, ok) pairs; restarts / failed: when each acked / failed restart ended."""
    history = {f"health:{GATEWAY}": [Vital(f"health:{GATEWAY}", ts, {"ok": ok, "status": None if ok else 503})
                                     for ts, ok in probes]}
    outcomes = {GATEWAY: [Outcome("r", "restart-process", "acked", ts) for ts in restarts]
                + [Outcome("f", "restart-process", "failed", ts) for ts in failed]
                + [Outcome("t", "task-add", "acked", ts) for ts in added]}
    known = {GATEWAY: KnownGood(restore_id="k", restore_at=restored_at - 0.2, restore_why="crash-loop",
                                restore_state="acked", restore_ended_at=restored_at, restarted=True)} \
        if restored_at is not None else {}
    now = max([ts for ts, _ in probes] + [0.0])
    return Snapshot(tick=1, ts=now, history=history, outcomes=outcomes, pending=list(pending), known_good=known)


def failing(start, end, every=5.0):
    """Failed probes every `every` s from `start` through `end`."""
    out, ts = [], start
    while ts <= end:
        out.append((ts, False))
        ts += every
    return out


def test_no_task_while_healthy_or_not_yet_restarted_enough():
    assert gateway_task(Snapshot(tick=1, ts=0.0)) is None                       # not configured: inert
    assert gateway_task(snap([(100, True), (105, True)])) is None
    assert gateway_task(snap([(100, True)] + failing(105, 140), restarts=[110])) is None   # one restart so far


def test_a_task_after_restarts_that_did_not_help_once_per_streak():
    probes = [(100, True)] + failing(105, 110 + 2 * P + 10)
    restarts = [110, 110 + P + 5]                  # each still failing once its start period was over
    task = gateway_task(snap(probes, restarts=restarts))
    assert task.kind == "task-add" and task.target == GATEWAY and "503" in task.params["prompt"]
    assert "2 times" in task.params["prompt"]
    assert gateway_task(snap(probes, restarts=restarts, added=[probes[-1][0]])) is None
    assert gateway_task(snap(probes, restarts=restarts, pending=[Effect(kind="task-add", target=GATEWAY)])) is None
    # restarts before the last healthy probe helped: they do not count
    assert gateway_task(snap([(50, False), (60, False), (100, True)] + failing(105, 120),
                             restarts=[55, 56])) is None


def test_a_restart_is_judged_only_after_its_start_period():
    restarts = [110, 110 + P + 5]
    judged_at = restarts[1] + P
    # the second restart's start period is not over: the gateway may still be starting
    assert gateway_task(snap([(100, True)] + failing(105, judged_at - 1), restarts=restarts)) is None
    assert gateway_task(snap([(100, True)] + failing(105, judged_at), restarts=restarts)) is not None


def test_a_failed_start_then_the_config_restores_own_restart_is_no_task():
    """OpenClaw refused its config (exit 78: the restart failed at 110), survival restored the
    config (111) and restarted it (acked at 119, its start_grace_s later); the gateway is still
    starting, 1.6 s from ready. Neither restart was without effect."""
    probes = [(100, True)] + failing(105, 119 + 9.4, every=1.0)
    assert gateway_task(snap(probes, failed=[110], restarts=[119], restored_at=111)) is None
    # ... and the restore's own restart never counts, even once its start period is over
    probes = [(100, True)] + failing(105, 119 + P + 5, every=1.0)
    assert gateway_task(snap(probes, failed=[110], restarts=[119], restored_at=111)) is None
    # while two restarts after it that did not help do
    later = [119 + P + 5, 119 + 2 * P + 10]
    probes = [(100, True)] + failing(105, later[1] + P, every=1.0)
    task = gateway_task(snap(probes, failed=[110], restarts=[119, *later], restored_at=111))
    assert task is not None and "2 times" in task.params["prompt"]
