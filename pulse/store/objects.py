"""objects/: content-addressed blobs (sha256), write-once, deduplicated.

A blob is referenced from events as "sha256:<hex>". `put` writes a temporary
file, fsyncs it and renames it into place, so a reader never sees half a blob
and a crash leaves at most a stray temporary file (collected by `gc`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

TMP_PREFIX = ".tmp-"


def _path(root: Path, digest: str) -> Path:
    if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return root / digest[:2] / digest[2:]


def put(root: Path, data: bytes) -> str:
    """Store `data`; returns "sha256:<hex>". Storing the same bytes twice writes once."""
    digest = hashlib.sha256(data).hexdigest()
    path = _path(root, digest)
    if path.exists():
        return f"sha256:{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)   # unique: threads may store the same bytes
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)
    return f"sha256:{digest}"


def get(root: Path, ref: str) -> bytes:
    digest = ref.removeprefix("sha256:")
    data = _path(root, digest).read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"object {digest} is corrupt")
    return data


def gc(root: Path, referenced: set[str], older_than_s: float, now: float | None = None) -> list[str]:
    """Remove blobs no event references that are older than `older_than_s`; returns their digests."""
    now = time.time() if now is None else now
    removed = []
    for path in root.glob("??/*"):
        digest = path.parent.name + path.name
        if path.name.startswith(TMP_PREFIX) or digest not in referenced:
            try:
                if now - path.stat().st_mtime > older_than_s:
                    path.unlink()
                    removed.append(digest)
            except FileNotFoundError:
                pass
    return removed
