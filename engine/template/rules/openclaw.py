"""OpenClaw's gateway: when restarting it did not help, hand its failures to an agent as a task.

An example, inert until the gateway is configured. In config.toml, Pulse watches the gateway,
probes its readiness on loopback and restarts it (survival's processWatchdog: when it dies, or
after `failures` failed probes in a row, with backoff and a notification):

    [[process]]
    name = "openclaw-gateway"
    match = "openclaw.* gateway"
    restart = ["openclaw", "gateway", "--port", "18789", "--force"]
    health = { url = "http://127.0.0.1:18789/readyz", every_s = 10, timeout_s = 3, failures = 3 }
    # or: health = { argv = ["openclaw", "health", "--json"], every_s = 30, timeout_s = 15 }

This rule adds what survival does not decide: once RESTARTS_BEFORE_TASK restarts have not made
it healthy, it adds one task (the `task-add` effect) for the agents, with the last probe's error;
the assignment rule hands it out like any other. One task per unhealthy streak: a healthy probe
starts a new streak.
"""

from pulse.engine.api import Effect

GATEWAY = "openclaw-gateway"          # the [[process]] name
RESTARTS_BEFORE_TASK = 2


def gateway_task(curr) -> Effect | None:
    """The task-add for the gateway's current unhealthy streak, or None (pure: easy to test)."""
    probes = curr.history.get(f"health:{GATEWAY}", [])
    if not probes or probes[-1].data.get("ok", True):
        return None
    healthy = [v.ts for v in probes if v.data.get("ok")]
    since = healthy[-1] if healthy else 0.0        # the streak's start, as far as the snapshot knows
    outcomes = curr.outcomes.get(GATEWAY, [])
    restarts = [o for o in outcomes if o.kind == "restart-process" and o.ts > since]
    if len(restarts) < RESTARTS_BEFORE_TASK:
        return None
    if any(o.kind == "task-add" and o.ts > since for o in outcomes):
        return None
    if any(e.kind == "task-add" and e.target == GATEWAY for e in curr.pending):
        return None
    last = probes[-1].data
    said = last.get("error") or f"status {last.get('status')}"
    return Effect(kind="task-add", target=GATEWAY, params={
        "project": "openclaw", "title": "OpenClaw gateway stays unhealthy after restarts",
        "prompt": (f"The OpenClaw gateway ([[process]] {GATEWAY}) fails its health probe ({said}); "
                   f"Pulse restarted it {len(restarts)} times without effect. Find out why (its logs, "
                   "`openclaw health --json`, its config) and fix it.")})


async def hand_over(prev, curr, inner):
    """Decorates: the inner rules first; then, if restarting did not help, a task."""
    effects, tick_ms = await inner(prev, curr)
    if any(e.kind == "task-add" and e.target == GATEWAY for e in effects):
        return effects, tick_ms
    task = gateway_task(curr)
    return (effects + [task] if task else effects), tick_ms


RULES = [hand_over]
