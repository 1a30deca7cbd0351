"""msgpack as plain data, with the standard library alone: for pulsectl's status, which runs in loops.

Importing msgspec costs more than the rest of `pulsectl status` (its submodules, and typing, uuid,
decimal and datetime with them: ~30 ms on a 2-core host, python -X importtime), so status reads
pulsed's reply here, into dicts and lists. It reads what msgspec writes (maps, arrays, strings,
binaries, integers, floats, nil and booleans; no extension types); tests/test_wire.py holds it to
msgspec.
"""

from __future__ import annotations

import struct


class Record(dict):
    """A decoded map whose keys read as attributes too (`status.workers`), as the Structs they were
    encoded from: the views read either."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Malformed(ValueError):
    pass


_FIXED = {0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
          0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
_LENGTH = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I",   # bin, str
           0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I"}                            # array, map


def unpack(frame: bytes) -> object:
    """The value `frame` holds, its maps as Records; Malformed if it is not exactly one value."""
    try:
        value, end = _value(memoryview(frame), 0)
    except (IndexError, struct.error, UnicodeDecodeError, TypeError, RecursionError) as err:
        raise Malformed(f"not msgpack ({err}; {len(frame)} bytes)") from None
    if end != len(frame):
        raise Malformed(f"{len(frame) - end} bytes after the value")
    return value


def _value(buf: memoryview, at: int) -> tuple[object, int]:
    head = buf[at]
    at += 1
    if head <= 0x7F:
        return head, at
    if head >= 0xE0:
        return head - 0x100, at
    if 0xA0 <= head <= 0xBF:
        return _str(buf, at, head & 0x1F)
    if 0x90 <= head <= 0x9F:
        return _array(buf, at, head & 0x0F)
    if 0x80 <= head <= 0x8F:
        return _map(buf, at, head & 0x0F)
    if head == 0xC0:
        return None, at
    if head in (0xC2, 0xC3):
        return head == 0xC3, at
    if head in _FIXED:
        fmt = _FIXED[head]
        return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
    if head in _LENGTH:
        fmt = _LENGTH[head]
        n, at = struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
        if head <= 0xC6:
            return bytes(buf[at:at + n]), at + n
        return (_str if head <= 0xDB else _array if head <= 0xDD else _map)(buf, at, n)
    raise Malformed(f"msgpack type 0x{head:02x} is not one Pulse sends")


def _str(buf: memoryview, at: int, n: int) -> tuple[str, int]:
    if at + n > len(buf):
        raise IndexError("a string runs past the end")
    return str(buf[at:at + n], "utf-8"), at + n


def _array(buf: memoryview, at: int, n: int) -> tuple[list, int]:
    items = []
    for _ in range(n):
        item, at = _value(buf, at)
        items.append(item)
    return items, at


def _map(buf: memoryview, at: int, n: int) -> tuple[Record, int]:
    record = Record()
    for _ in range(n):
        key, at = _value(buf, at)
        record[key], at = _value(buf, at)
    return record, at
