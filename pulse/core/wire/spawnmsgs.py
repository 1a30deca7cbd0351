"""pulsed ↔ its forkserver (a socketpair, not zmq)."""

from __future__ import annotations

import msgspec


class Spawn(msgspec.Struct, tag="spawn"):
    name: str
    start: int                  # how many times pulsed has started this worker, counting this one
    config: bytes               # msgpack of the worker's slice of the config (pulse.core.config.SLICES)
    runtime: str
    home: str
    run: float = 0.0            # pulsed's run: the mono stamp of its supervisor-started event
    instance: str = ""          # the instance's name ([pulse] name, else the home's folder): in its title


class Spawned(msgspec.Struct, tag="spawned"):
    name: str
    pid: int
    mono: float = 0.0           # when the forkserver had its process (a spare told to go, else a fork)


class Exited(msgspec.Struct, tag="exited"):
    pid: int
    code: int | None            # exit status, or None when killed by a signal
    signal: int | None


ForkserverMessage = Spawn | Spawned | Exited
