"""An example business rule. Rules see the snapshot (latest vitals, pending effects,
recent outcomes, the engine's health) and return (effects, tick_ms).

Export rules in RULES, outermost first. `tick_ms` None leaves the cadence to Pulse.

The guide to writing rules is docs/rules.md in Pulse's source: every field of the snapshot,
every effect kind and its params (notify: message, title, level, channels), how the engine's
effects are budgeted and how a rule limits itself (params["rule"], curr.notified), testing a
rule in tests/, promote and rollback.
"""

from pulse.engine.api import Effect, Snapshot  # noqa: F401  (the types a rule works with)


async def passthrough(prev, curr, inner):
    """Does nothing itself: lets the rules inside it decide."""
    return await inner(prev, curr)


RULES = [passthrough]
