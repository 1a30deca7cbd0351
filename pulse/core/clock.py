"""Time as Pulse writes and reads it: UTC ISO stamps, durations like `10m`, doubling backoff.

Stdlib only (pulsed imports it).
"""

from __future__ import annotations

import math
import os
import re
import time

_DURATION = r"^(\d+(?:\.\d+)?)([smhd])$"   # compiled at first use (re caches it): most runs parse none
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def iso(ts: float, ms: bool = True) -> str:
    """A wall time in UTC: 2026-12-02T19:37:29.123Z (ms=False: …:29Z)."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return text + (f".{int(ts % 1 * 1000):03d}Z" if ms else "Z")


# The stores keep wall times as epoch seconds (cheap to compare; the tick and the page read them); a
# person, and a script reading --json, gets ISO 8601 in UTC instead of `"until": 1796292125.5162346`.
# Which values are wall times: those under a key named for a time (ts, created, …_at, …_since), or a
# fractional number of seconds in 2001 … 2096 (pids and counts are integers). `mono` is no wall time.
TIME_KEY = (r"(^|_)(ts|at|time|now|created|deadline|until|since|started|ended|opened|last|expires|"
            r"next_retry|before|slot)$")


def is_wall_time(key: str, value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and 1e9 <= value < 4e9
            and (bool(re.search(TIME_KEY, key)) or not float(value).is_integer()))


def readable_times(value: object, key: str = "") -> object:
    """`value` with each wall time in it as ISO 8601 (is_wall_time), whatever its depth."""
    if isinstance(value, dict):
        return {k: readable_times(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [readable_times(v, key) for v in value]
    return iso(float(value)) if is_wall_time(key, value) else value


def parse_duration(text: str) -> float | None:
    """Seconds in `30s`, `10m`, `2h`, `1d` (or `1.5h`); None if `text` is no such duration."""
    m = re.match(_DURATION, text.strip())
    return float(m[1]) * _UNIT_S[m[2]] if m else None


def poll_ms(seconds: float) -> int:
    """The timeout of a poll for a deadline `seconds` away, in whole ms, rounded up: zmq's poll takes
    an int, and a last fraction of a ms rounded down to 0 returns at once, spinning until the deadline."""
    return max(0, math.ceil(seconds * 1000))


def backoff(attempt: int, first: float, cap: float) -> float:
    """The wait before retry number `attempt` (1, 2, 3 …): first, 2×first, 4×first … at most cap."""
    return min(first * 2 ** (attempt - 1), cap)


def parse_since(text: str) -> float:
    """An ISO time (naive = UTC) or a duration back from now (30s, 10m, 2h, 1d), as a wall time;
    ValueError naming the text otherwise."""
    seconds = parse_duration(text)
    if seconds is not None:
        return time.time() - seconds
    from datetime import datetime, timezone  # ~1.5 ms: only a printed time
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO time nor a duration like 10m") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


# Test-only seam, documented in docs/testing.md: the wall time that windows of time (a spend limit's
# day and month) are reckoned in is shifted by this many seconds, so a test can roll a day over
# without waiting one. Read at every call; event stamps are not shifted.
TEST_OFFSET_ENV = "PULSE_TEST_CLOCK_OFFSET_S"


def offset_s() -> float:
    try:
        return float(os.environ.get(TEST_OFFSET_ENV) or 0)
    except ValueError:
        return 0.0


def now() -> float:
    """The wall time windows of time are reckoned in: time.time(), shifted only by the test seam."""
    return time.time() + offset_s()
