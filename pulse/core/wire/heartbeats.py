"""The heartbeat socket: worker (PUSH) → pulsed (PULL)."""

from __future__ import annotations

from typing import Any

import msgspec


class Ready(msgspec.Struct, tag="ready"):
    name: str
    pid: int
    mono: float                 # time.monotonic() at sending: one clock for every process of a boot
    commit: str | None = None   # the engine: the commit of the tree it loaded


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    name: str
    pid: int
    seq: int
    mono: float
    extras: dict[str, Any] | None = None   # what the worker adds to status (Worker.status_extras), small


class Committed(msgspec.Struct, tag="committed"):
    """From the event writer: every event of pulsed's run up to `seq` is in events.db; with
    `resend`, something after it never arrived: send everything after it again."""
    name: str
    pid: int
    seq: int
    resend: bool = False


WorkerMessage = Ready | Heartbeat | Committed
