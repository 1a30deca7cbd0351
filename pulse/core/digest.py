"""SHA-256 of a few bytes without loading OpenSSL.

hashlib loads OpenSSL (_hashlib, ~3 ms), a tenth of a pulsectl command that hashes a few KiB (a
projection's version, a schedule's jitter, a gate call's arguments). Small data, in a process that
has not loaded hashlib, goes to the interpreter's own SHA-256 (the same digest; hashlib's fallback
where OpenSSL is missing); large data, or a process that has hashlib already, to OpenSSL.
"""

from __future__ import annotations

import functools
import sys

BUILTIN_MAX = 1 << 20   # bytes: past this OpenSSL's speed more than pays for its loading


def sha256(data: bytes):
    """The SHA-256 of `data`, as hashlib.sha256(data) (its digest() and hexdigest())."""
    if len(data) <= BUILTIN_MAX and "hashlib" not in sys.modules and (builtin := _builtin_sha256()):
        return builtin(data)
    import hashlib  # OpenSSL: only past BUILTIN_MAX, or where another caller loaded it already
    return hashlib.sha256(data)


@functools.cache
def _builtin_sha256():
    for module in ("_sha2", "_sha256"):     # CPython 3.12 on, 3.11
        try:
            return __import__(module).sha256
        except ImportError:
            continue
    return None
