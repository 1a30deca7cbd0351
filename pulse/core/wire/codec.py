"""How every message crosses a process boundary: msgpack frames, encoded and decoded here.

A frame that does not decode to the expected union raises `Malformed`; receivers log it and drop
it, and the next valid frame still works.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class Malformed(Exception):
    pass


_encoder = msgspec.msgpack.Encoder()
_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode(frame: bytes, kind: type[T]) -> T:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise Malformed(f"{err} (frame of {len(frame)} bytes: {bytes(frame[:32])!r})") from None
