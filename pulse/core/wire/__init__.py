"""Every message that crosses a process boundary, defined once, one module per family: `codec`
(msgpack frames, `Malformed`), `heartbeats` (worker → pulsed), `controlmsgs` (pulsectl / workers →
pulsed, and the status document), `doorbells` (wake, doorbell), `enginerpc` (tick / executor →
engine: effects, the snapshot, tasks as it carries them), `spawnmsgs` (pulsed ↔ its forkserver),
`eventmsgs` (events, their types, the effect kinds). Import each from its module.
"""
