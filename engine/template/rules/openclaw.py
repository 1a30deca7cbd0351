"""OpenClaw's gateway: when restarting it did not help, hand its failures to an agent as a task.

An example, inert until the gateway is configured. In config.toml, Pulse watches the gateway,
probes its readiness on loopback and restarts it (survival's processWatchdog: when it dies, or
after `failures` failed probes in a row, with backoff and a notification). Find it by its lock
file, not by `match`: its title changes from "node .../openclaw.mjs gateway run" to "openclaw"
to "openclaw-gateway" within its first seconds, so a pattern loses it (see docs/gateways.md):

    [[process]]
    name = "openclaw-gateway"
    pidfile = { path = "/home/agent/.openclaw/tmp/openclaw-1000/gateway.state.lock", key = "pid" }
    restart = ["openclaw", "gateway", "run", "--port", "18789", "--bind", "loopback"]
    start_grace_s = 8
    health = { url = "http://127.0.0.1:18789/readyz", every_s = 5, timeout_s = 2, failures = 3, start_period_s = 15 }

This rule adds what survival does not decide: once RESTARTS_BEFORE_TASK restarts have not made
it healthy, it adds one task (the `task-add` effect) for the agents, with the last probe's error;
the assignment rule hands it out like any other. One task per unhealthy streak: a healthy probe
starts a new streak.

A restart counts against the gateway only once it had its chance: a probe still failed
START_PERIOD_S (keep it equal to health.start_period_s) after it, and no other restart came
within that time. A start that failed at once (exit 78: a config it refuses) and was followed by
survival's restore of its config is not one; nor is the restore's own restart, which leaves the
gateway still starting (ready 7-11 s later), not broken.
"""

from pulse.engine.api import Effect

GATEWAY = "openclaw-gateway"          # the [[process]] name
RESTARTS_BEFORE_TASK = 2
START_PERIOD_S = 15.0                 # the gateway's health.start_period_s


def restore_restart(curr, restarts):
    """The restart that survival's restore of the gateway's config made (the first one to end
    after the restore did), or None."""
    known = curr.known_good.get(GATEWAY)
    if known is None or known.restore_ended_at is None:
        return None
    return next((o for o in restarts if o.ts >= known.restore_ended_at), None)


def restarts_without_effect(curr, probes, since: float) -> list:
    """The restarts since `since` after which the gateway still failed its probe once its start
    period was over, not the restore's own, nor one another restart followed within the period."""
    restarts = sorted((o for o in curr.outcomes.get(GATEWAY, []) if o.kind == "restart-process" and o.ts > since),
                      key=lambda o: o.ts)
    own = restore_restart(curr, restarts)
    counted = []
    for i, restart in enumerate(restarts):
        judged_at = restart.ts + START_PERIOD_S
        superseded = i + 1 < len(restarts) and restarts[i + 1].ts < judged_at
        if restart is own or superseded:
            continue
        if any(p.ts >= judged_at and not p.data.get("ok") for p in probes):
            counted.append(restart)
    return counted


def gateway_task(curr) -> Effect | None:
    """The task-add for the gateway's current unhealthy streak, or None (pure: easy to test)."""
    probes = curr.history.get(f"health:{GATEWAY}", [])
    if not probes or probes[-1].data.get("ok", True):
        return None
    healthy = [v.ts for v in probes if v.data.get("ok")]
    since = healthy[-1] if healthy else 0.0        # the streak's start, as far as the snapshot knows
    restarts = restarts_without_effect(curr, [p for p in probes if p.ts > since], since)
    if len(restarts) < RESTARTS_BEFORE_TASK:
        return None
    outcomes = curr.outcomes.get(GATEWAY, [])
    if any(o.kind == "task-add" and o.ts > since for o in outcomes):
        return None
    if any(e.kind == "task-add" and e.target == GATEWAY for e in curr.pending):
        return None
    last = probes[-1].data
    said = last.get("error") or f"status {last.get('status')}"
    return Effect(kind="task-add", target=GATEWAY, params={
        "project": "openclaw", "title": "OpenClaw gateway stays unhealthy after restarts",
        "prompt": (f"The OpenClaw gateway ([[process]] {GATEWAY}) fails its health probe ({said}); "
                   f"Pulse restarted it {len(restarts)} times without effect (each time still failing "
                   f"{START_PERIOD_S:g} s after the restart). Find out why (its logs, "
                   "`openclaw health --json`, its config) and fix it.")})


async def hand_over(prev, curr, inner):
    """Decorates: the inner rules first; then, if restarting did not help, a task."""
    effects, tick_ms = await inner(prev, curr)
    if any(e.kind == "task-add" and e.target == GATEWAY for e in effects):
        return effects, tick_ms
    task = gateway_task(curr)
    return (effects + [task] if task else effects), tick_ms


RULES = [hand_over]
