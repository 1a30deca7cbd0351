"""What an engine plugs into Pulse besides rules: a sensor (Watcher) and a runner of its own effect
kind (Executor). Pulse's built-in sensors are Watchers too; the engine's API (pulse.engine.api)
hands both classes to the agent's code. Here, in the core, so that the sensors need not import
the agent's API."""

from __future__ import annotations

from typing import Any

from pulse.core.wire.enginerpc import Effect, Vital


class Watcher:
    """Senses one thing. `collect()` returns the sample's data (a JSON-able dict), written to
    vitals.db under `key` every `interval_ms`; `should_wake(window)` sees the key's last
    minute of vitals (oldest first) and returns True to ring the tick at once."""

    name: str = "watcher"
    key: str = "watcher"
    interval_ms: int = 5_000
    timeout_s: float = 5.0       # a collect() slower than this is an error; the others carry on

    def collect(self) -> dict[str, Any]:
        raise NotImplementedError

    def should_wake(self, window: list[Vital]) -> bool:
        return False


class Executor:
    """Carries out effects of one `kind`. `run(effect)` returns a JSON-able result dict,
    or raises to fail the effect."""

    kind: str = "executor"

    def run(self, effect: Effect) -> dict[str, Any]:
        raise NotImplementedError
