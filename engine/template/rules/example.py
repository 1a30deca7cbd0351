"""An example business rule. Rules see the snapshot (latest vitals, pending effects,
recent outcomes, the engine's health) and return (effects, tick_ms).

Export rules in RULES, outermost first. `tick_ms` None leaves the cadence to Pulse.
"""

from pulse.engine.api import Effect, Snapshot  # noqa: F401  (the types a rule works with)


async def passthrough(prev, curr, inner):
    """Does nothing itself: lets the rules inside it decide."""
    return await inner(prev, curr)


RULES = [passthrough]
