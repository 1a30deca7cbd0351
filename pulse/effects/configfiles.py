"""A [[process]]'s config files, kept known good and restored: what the keep-config and
restore-config kinds do, the diff summary a restore is told with, and the known-good record
folded from their events (the tick's snapshot and `pulsectl process config` read the same fold).

keep-config copies each file into objects/ (content-addressed, so an unchanged file costs
nothing) and its ack names every copy: that event is the known-good record, and keeps the
copies from objects/ gc. A copy survival asks for is checked against the sha256 it judged good:
a file edited since is not kept (reason `changed`).

restore-config writes known-good copies back, only those its params name, only files of the
process's `config`, and only copies that objects/ holds intact (all are read before any is
written). Each file it replaces is first kept in objects/ itself (`broken` in the ack), then
replaced atomically (a temporary file in the same directory, fsynced, renamed over it, keeping
its mode and, where permitted, its owner); a symlink's target is what is replaced. A file whose
content is already the known-good one is left as it is.

Each file is reached without following a directory that is a link, and read or replaced through its
directory's descriptor (pulse.core.safepath); one under another account's directory, or behind a
link another account placed, is read and written with that account's rights.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
import sqlite3
import stat
from pathlib import Path
from typing import Iterable

import msgspec

from pulse.core import safepath
from pulse.core.config import Process
from pulse.core.states import EffectState
from pulse.core.wire.enginerpc import Effect, KnownGood
from pulse.core.wire.eventmsgs import EFFECT_END_STATES, EffectEvent, EffectKind, Event
from pulse.effects.kinds import EffectContext, EffectFailed, configured_process, os_failure
from pulse.store import eventsdb, objects

KEEP = EffectKind.KEEP_CONFIG
RESTORE = EffectKind.RESTORE_CONFIG
RESTART = EffectKind.RESTART_PROCESS     # a restart after a restore is the one that follows it
DIFF_LINES = 6                  # changed lines a diff summary shows per file ...
DIFF_LINE_CHARS = 120           # ... each cut to this (a config may be one long line of JSON)
UNDONE_LINES = 40               # a restore's unified diff (what it undid), per file, at most this many lines ...
UNDONE_BYTES = 4096             # ... and this many bytes: it goes out in a notification
NEW_FILE_MODE = 0o600           # a restored file that no longer existed: it may hold secrets


# -- reading and writing the files ----------------------------------------------------------------------

def config_process(ctx: EffectContext, name: str | None, paths: Iterable[str]) -> Process:
    """The configured process, when every path is one of its `config` files (else bad-params: an
    effect never reads or writes another file)."""
    process = configured_process(ctx.config, name)
    if not process.config:
        raise EffectFailed("bad-params", f"[[process]] {process.name!r} lists no config files")
    strangers = [p for p in paths if p not in process.config]
    if strangers:
        raise EffectFailed("bad-params", f"{strangers[0]!r} is not one of the config files of [[process]] "
                           f"{process.name!r} ({', '.join(process.config)})")
    return process


def on_file(path: str, what: str, act) -> object:
    """act(parent, name) on the config file `path`, reached as safepath.open_file_parent reaches it,
    with the rights of whoever could have placed it; Refused and OSError as the effect's failure."""
    try:
        parent, name = safepath.open_file_parent(path)
    except safepath.Refused as err:
        raise EffectFailed("refused", f"{what}: {err}", path=path) from None
    except OSError as err:
        raise os_failure(what, err) from None
    try:
        return safepath.as_writer(parent.writer, path, lambda: act(parent, name))
    except safepath.Refused as err:
        raise EffectFailed("refused", f"{what}: {err}", path=path) from None
    except OSError as err:
        err.filename = err.filename or path
        raise os_failure(what, err) from None
    finally:
        os.close(parent.fd)


def read_config(path: str) -> bytes | None:
    """The file's bytes, None when it does not exist; EffectFailed when it cannot be read or is
    larger than any config (objects.MAX_FILE_BYTES)."""
    data = on_file(path, f"reading {path}", _read_in)
    if data is not None and len(data) > objects.MAX_FILE_BYTES:
        raise EffectFailed("too-large", f"{path} is larger than {objects.MAX_FILE_BYTES // (1024 * 1024)} MiB: "
                           "no config file is that large", path=path)
    return data


def _read_in(parent: safepath.Dir, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent.fd)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise safepath.Refused(f"{os.path.join(parent.path, name)} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(objects.MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replace the file at `path` (a symlink's target) with `data`: whole or not at all."""
    on_file(path, f"restoring {path}", lambda parent, name: _replace_in(parent, name, data))


def _replace_in(parent: safepath.Dir, name: str, data: bytes) -> None:
    try:
        old = safepath.lstat_in(parent, name)
    except FileNotFoundError:
        old = None
    tmp = f".{name}.pulse-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent.fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) if old is not None else NEW_FILE_MODE)
            if old is not None:
                try:
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass        # not root: the file is ours, as the one it replaces was or could not be otherwise
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=parent.fd)
        except OSError:
            pass
        raise
    safepath.fsync_dir(parent)        # the rename itself survives a power cut


def diff_summary(path: str, before: bytes | None, after: bytes, lines: int = DIFF_LINES) -> str:
    """A few lines saying how `after` differs from `before` (unified diff, no context):
    "PATH: -R +A lines" and the first changed lines, each cut short."""
    if before is None:
        return f"{path}: was missing; written back ({len(after)} bytes)"
    try:
        old, new = before.decode().splitlines(), after.decode().splitlines()
    except UnicodeDecodeError:
        return f"{path}: binary, {len(before)} bytes → {len(after)} bytes"
    changed = [line for line in list(difflib.unified_diff(old, new, n=0, lineterm=""))[2:]
               if not line.startswith("@@")]
    removed = sum(1 for line in changed if line.startswith("-"))
    shown = [line if len(line) <= DIFF_LINE_CHARS else line[:DIFF_LINE_CHARS - 1] + "…" for line in changed[:lines]]
    more = [f"… {len(changed) - lines} more changed lines"] if len(changed) > lines else []
    return "\n".join([f"{path}: -{removed} +{len(changed) - removed} lines", *shown, *more])


def undone_diff(path: str, operators: bytes | None, good: bytes, lines: int = UNDONE_LINES,
                max_bytes: int = UNDONE_BYTES) -> str:
    """What a restore undid, as a unified diff (3 lines of context) from the file as the operator left
    it to the known-good copy written back, cut to `lines` lines and `max_bytes` bytes (each line but
    the two naming the file to DIFF_LINE_CHARS), with a last line saying how much was left out."""
    if operators is None:
        return f"{path}: was missing; the known-good copy was written back ({len(good)} bytes)"
    try:
        old, new = operators.decode().splitlines(), good.decode().splitlines()
    except UnicodeDecodeError:
        return f"{path}: binary, {len(operators)} bytes → {len(good)} bytes (no text diff)"
    diff = list(difflib.unified_diff(old, new, f"{path} (as it was: undone)", f"{path} (known good: restored)",
                                     lineterm=""))
    shown, size = [], 0
    for i, line in enumerate(diff[:lines]):
        if i >= 2 and len(line) > DIFF_LINE_CHARS:     # a long path still names its file, and which side it is
            line = line[:DIFF_LINE_CHARS - 1] + "…"
        if size + len(line.encode()) + 1 > max_bytes:
            break
        shown.append(line)
        size += len(line.encode()) + 1
    if len(shown) < len(diff):
        shown.append(f"… {len(diff) - len(shown)} more diff lines left out")
    return "\n".join(shown)


# -- the kinds -------------------------------------------------------------------------------------------

def run_keep(effect: Effect, ctx: EffectContext) -> dict:
    """Copy the process's config files into objects/ as its known good. With `files` (path → sha256,
    survival's): exactly those, each only if it still has that content. Without (an operator's pin):
    every config file that exists, as it is now."""
    expected: dict[str, str] | None = effect.params.get("files")
    process = config_process(ctx, effect.target, expected or ())
    kept, missing = {}, []
    for path in expected if expected is not None else process.config:
        data = read_config(path)
        if data is None and expected is None:
            missing.append(path)
            continue
        digest = None if data is None else hashlib.sha256(data).hexdigest()
        if expected is not None and digest != expected[path]:
            raise EffectFailed("changed", f"{path} changed since it was judged good: not kept", path=path)
        try:
            ref = objects.put(ctx.objects, data)
        except OSError as err:
            raise os_failure(f"keeping a copy of {path} in objects/", err) from None
        kept[path] = {"sha256": digest, "ref": ref, "size": len(data)}
    if not kept:
        raise EffectFailed("bad-path", f"none of the config files of {process.name!r} exists: nothing to keep")
    return {"files": kept, "pinned": expected is None, "missing": missing}


def run_restore(effect: Effect, ctx: EffectContext) -> dict:
    """Write the known-good copies named in `files` (path → "sha256:<hex>") back, keeping what each
    replaces in objects/."""
    wanted: dict[str, str] = effect.params["files"]
    config_process(ctx, effect.target, wanted)
    good = {}
    for path, ref in wanted.items():     # every copy first: one that is gone or corrupt restores nothing
        try:
            good[path] = objects.get(ctx.objects, ref)
        except (OSError, ValueError) as err:
            raise EffectFailed("missing-object", f"the known-good copy of {path} ({ref}) cannot be read: "
                               f"{getattr(err, 'strerror', None) or err}; nothing restored", path=path) from None
    done: list[dict] = []
    for path, data in good.items():
        try:
            done.append(restore_one(path, data, wanted[path], ctx.objects))
        except EffectFailed as failure:
            failure.data.update(files=done, restored=[f["path"] for f in done if f["restored"]])
            raise
    restored = [f for f in done if f["restored"]]
    return {"files": done, "restored": [f["path"] for f in restored],
            "diff": "\n".join(f["diff"] for f in restored) or "every file already had its known-good content",
            "undone": "\n".join(f["undone"] for f in restored),
            "kept": {f["path"]: f["kept"] for f in restored if f.get("kept")}}


def restore_one(path: str, data: bytes, good_ref: str, root: Path) -> dict:
    """Write one known-good copy back unless the file already holds it; what it replaced is kept first."""
    current = read_config(path)
    if current == data:
        return {"path": path, "good": good_ref, "restored": False}
    try:
        broken = objects.put(root, current) if current is not None else None
        write_atomically(path, data)
    except OSError as err:
        raise os_failure(f"restoring {path}", err) from None
    return {"path": path, "good": good_ref, "broken": broken, "restored": True,
            "kept": str(objects.path_of(root, broken)) if broken else None,
            "diff": diff_summary(path, current, data), "undone": undone_diff(path, current, data)}


# -- the known-good record, folded from events -----------------------------------------------------------

FOLDED_EVENTS = (EffectEvent.COMMITTED, *EFFECT_END_STATES)


def fold(book: dict[str, KnownGood], ev: Event) -> None:
    """Fold one event into `book` (process → KnownGood). Each change replaces a record rather than
    altering it, so a snapshot holding the old one keeps what it saw."""
    kind, target = ev.data.get("kind"), ev.target
    if target is None:
        return
    record = book.get(target, KnownGood())
    replace = msgspec.structs.replace
    if ev.type == EffectEvent.COMMITTED:
        if kind == RESTORE:
            book[target] = replace(record, restore_id=ev.data.get("id"), restore_at=ev.ts,
                                   restore_why=(ev.data.get("params") or {}).get("why"), restore_state=None,
                                   restore_ended_at=None, restored=[], restore_summary=None, restarted=False,
                                   restore_undone=None, restore_kept={})
        elif kind == RESTART and record.restore_ended_at is not None and not record.restarted:
            book[target] = replace(record, restarted=True)
        return
    if ev.type not in EFFECT_END_STATES or ev.data.get("requeued"):
        return
    state = EFFECT_END_STATES[ev.type]
    if kind == KEEP and state == EffectState.ACKED:
        files = ev.data.get("files") or {}
        book[target] = replace(record, files={path: f["sha256"] for path, f in files.items()}, kept_at=ev.ts,
                               pinned=bool(ev.data.get("pinned")))
    elif kind == RESTORE and ev.data.get("effect_id") == record.restore_id:
        book[target] = replace(record, restore_state=state, restore_ended_at=ev.ts,
                               restored=list(ev.data.get("restored") or []),
                               restore_summary=ev.data.get("diff") if state == EffectState.ACKED
                               else ev.data.get("error") or ev.data.get("reason"),
                               restore_undone=ev.data.get("undone") if state == EffectState.ACKED else None,
                               restore_kept=dict(ev.data.get("kept") or {}))


def known_good_of(conn: sqlite3.Connection, process: str) -> tuple[KnownGood, list[Event]]:
    """`process`'s known-good record, folded from the whole history, and its restores' end events
    (newest last): what `pulsectl process config` shows."""
    book: dict[str, KnownGood] = {}
    restores = []
    for ev in eventsdb.events_of_types(conn, FOLDED_EVENTS, eventsdb.last_event_id(conn)):
        if ev.target != process:
            continue
        fold(book, ev)
        if ev.data.get("kind") == RESTORE and ev.type != EffectEvent.COMMITTED:
            restores.append(ev)
    return book.get(process, KnownGood()), restores
