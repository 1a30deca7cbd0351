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
MAX_FILE_BYTES = 8 * 1024 * 1024      # a file larger than this is no config: never kept (file_state says so)


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
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)   # unique: threads may store the same bytes
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)
    # The rename (and a new fan-out directory's entry) lives in the directories: synced too, so a blob
    # an event names survives a power cut that events.db's commit, made after this returns, survives.
    fsync_dir(path.parent)
    if made:
        fsync_dir(root)
    return f"sha256:{digest}"


CHUNK = 1024 * 1024


def put_fd(root: Path, fd: int, deadline: float | None = None) -> tuple[str, int]:
    """Store what the open file `fd` holds, read from its start in chunks (a file too large to hold
    in memory); returns ("sha256:<hex>", bytes). The copy is made under a temporary name in `root`
    and renamed into place once its digest is known; TimeoutError past `deadline` (monotonic), the
    temporary copy removed."""
    root.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    tfd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=root)
    size = 0
    try:
        with os.fdopen(tfd, "wb") as out:
            while chunk := os.pread(fd, CHUNK, size):
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{size} bytes copied")
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        path = _path(root, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o400)
        os.replace(tmp, path)             # the same bytes stored before: replaced by themselves
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)                # the rename lives in the fan-out directory ...
    fsync_dir(root)                       # ... which may be new, as root's entry
    return f"sha256:{digest}", size


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def get(root: Path, ref: str) -> bytes:
    digest = ref.removeprefix("sha256:")
    data = _path(root, digest).read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"object {digest} is corrupt")
    return data


def path_of(root: Path, ref: str) -> Path:
    """Where the blob `ref` ("sha256:<hex>") lies under `root`: what an operator can open."""
    return _path(root, ref.removeprefix("sha256:"))


def ref(digest: str) -> str:
    """How events name the blob of a sha256 digest (hex): "sha256:<hex>"."""
    return f"sha256:{digest.removeprefix('sha256:')}"


def file_state(path: str | Path) -> dict:
    """What a file on the host is now, named as objects/ would name its content: {"sha256", "size",
    "ctime"} (ctime: its last change, which no one can set back), {"missing": True}, or {"error": ...}
    when it cannot be read or is larger than MAX_FILE_BYTES."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > MAX_FILE_BYTES:
                return {"error": f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB", "ctime": st.st_ctime}
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return {"missing": True}
    except OSError as err:
        return {"error": f"{err.strerror or err}"}
    if len(data) > MAX_FILE_BYTES:         # grew while being read
        return {"error": f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB", "ctime": st.st_ctime}
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "ctime": st.st_ctime}


def gc(root: Path, referenced: set[str], older_than_s: float, now: float | None = None) -> list[str]:
    """Remove blobs no event references that are older than `older_than_s`; returns their digests."""
    now = time.time() if now is None else now
    removed = []
    for path in root.glob(TMP_PREFIX + "*"):     # put_fd's copy, left by a crash before its rename
        try:
            if now - path.stat().st_mtime > older_than_s:
                path.unlink()
        except FileNotFoundError:
            pass
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
