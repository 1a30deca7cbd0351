"""Every message that crosses a process boundary, defined once, one module per family: `codec`
(msgpack frames, `Malformed`), `heartbeats` (worker → pulsed), `controlmsgs` (pulsectl / workers →
pulsed, and the status document), `doorbells` (wake, doorbell), `enginerpc` (tick / executor →
engine: effects, the snapshot, tasks as it carries them), `spawnmsgs` (pulsed ↔ its forkserver),
`eventmsgs` (events, their types, the effect kinds). Import each from its module.
"""

import importlib


def __getattr__(name: str):
    """Engine directories made before the split import the snapshot's types from here (their
    tests are the operator's code, and a promote runs them): those names still resolve, to
    enginerpc. New code imports from the family module, engines from pulse.engine.api."""
    enginerpc = importlib.import_module("pulse.core.wire.enginerpc")
    if not name.startswith("_") and hasattr(enginerpc, name):
        return getattr(enginerpc, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
