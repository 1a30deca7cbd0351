"""Wake (the tick binds) and doorbell (the executor binds): one-way doorbells."""

from __future__ import annotations

import msgspec


class Wake(msgspec.Struct, tag="wake"):
    source: str
    reason: str = ""


class Doorbell(msgspec.Struct, tag="doorbell"):
    source: str
