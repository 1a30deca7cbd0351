"""rotate-file: a file that a [[watch.file]] glob matches, rotated or truncated in place.

Rotate is logrotate's copytruncate. The file is copied, gzipped, to `<file>.1.gz` (the copies
before it shifted to `.2.gz` … `.<keep>.gz`, the one that would fall beyond `keep` deleted first,
which also frees room on a full disk), then truncated in place: a writer holding it open with
O_APPEND writes its next line at the start of the emptied file, with nothing to reopen or signal.
What the writer appends while the copy is made is read after it, as a second gzip member of the
same copy (`zcat` and Python's gzip read both), and the file is truncated right after that last
read returns: only a line appended in the microseconds between the two is lost. A writer without
O_APPEND goes on at its old offset, leaving a hole of zeros before its next line (as under
logrotate). Truncate only empties the file.

Before anything is touched, the effect is refused (reason `refused`) for a target that the
[[watch.file]] it names does not match (it never acts beyond what was configured), a file inside
the Pulse home, a rotated copy, and anything that is not a regular file (a symlink is never
followed). Acked with the action, the file's size when it was emptied, the bytes freed (that size,
less the new copy's, plus the deleted copies') and the copies kept.

A copy that cannot be made within the effect's timeout fails (reason `timeout`) and leaves the file
as it was; so does a disk too full for the copy (reason `no-space`). If the executor dies between the
truncate and the write of what was read last (at most TAIL_IN_MEMORY bytes), that tail is lost;
anywhere else, the file is as it was or a copy holds everything.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from pulse.core import rotation, safepath
from pulse.core.config import ExecutorConfig, FileWatch
from pulse.core.home import inside
from pulse.core.wire.enginerpc import Effect
from pulse.effects import copytruncate
from pulse.effects.kinds import EffectContext, EffectFailed, os_failure

# -- what may be touched -------------------------------------------------------------------------------

def configured_watch(config: ExecutorConfig, name: object) -> FileWatch:
    watch = next((w for w in config.watch.file if w.name == name), None)
    if watch is None:
        known = ", ".join(w.name for w in config.watch.file) or "none"
        raise EffectFailed("bad-params", f"no [[watch.file]] named {name!r} (known: {known})")
    return watch


def kind_of_file(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a fifo"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return "not a regular file"


def checked_target(target: str | None, watch: FileWatch, home) -> tuple[str, int | None]:
    """(the target, the account whose rights it is trimmed with), if this effect may touch it; else
    EffectFailed saying why not."""
    if not target or not os.path.isabs(target):
        raise EffectFailed("bad-params", f"the target must be the absolute path of a file, got {target!r}")
    if rotation.is_copy(target):
        raise EffectFailed("refused", f"{target} is a copy a rotation keeps, not a file to rotate")
    found = {path: (st, writer) for path, st, writer in safepath.matched(watch.path)}
    if target not in found:
        raise EffectFailed("refused", f"{target} is not matched by [[watch.file]] {watch.name!r} "
                                      f"(path {watch.path!r}, never through a link): rotate-file acts on nothing else")
    if home is not None and inside(target, home):
        raise EffectFailed("refused", f"{target} is inside the Pulse home ({home}): Pulse never trims its own files")
    st, writer = found[target]
    if not stat.S_ISREG(st.st_mode):
        raise EffectFailed("refused", f"{target} is {kind_of_file(st.st_mode)}, not a regular file: never followed or trimmed")
    return target, writer


def open_regular(parent: safepath.Dir, name: str) -> int:
    """An fd on `name` in `parent`, read-write, refusing a symlink (O_NOFOLLOW) or anything but a
    regular file that replaced it since it was checked (O_NONBLOCK: a fifo does not hang the open)."""
    path = os.path.join(parent.path, name)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent.fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise EffectFailed("refused", f"{path} is a symlink: never followed") from None
        err.filename = path
        raise os_failure("rotate-file could not open the file", err) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EffectFailed("refused", f"{path} is not a regular file: never trimmed")
    return fd


# -- truncate, or rotate (pulse.effects.copytruncate) --------------------------------------------------

def truncate(fd: int) -> dict:
    size = os.fstat(fd).st_size
    os.ftruncate(fd, 0)
    return {"action": "truncate", "bytes": size, "bytes_freed": size}


def trim(parent: safepath.Dir, name: str, action: str, keep: int, deadline: float) -> dict:
    """Truncate or rotate `name` in `parent`, with whatever rights this process has."""
    fd = open_regular(parent, name)
    try:
        return truncate(fd) if action == "truncate" else copytruncate.rotate(parent, name, fd, keep, deadline)
    except copytruncate.TooSlow as err:
        raise EffectFailed("timeout", str(err), bytes_read=err.bytes_read) from None
    except OSError as err:
        raise os_failure(f"{action} of {os.path.join(parent.path, name)} stopped", err) from None
    finally:
        os.close(fd)


# -- the effect -----------------------------------------------------------------------------------------

def run_rotate_file(effect: Effect, ctx: EffectContext) -> dict:
    watch = configured_watch(ctx.config, effect.params.get("watch"))
    action = effect.params.get("action") or watch.action
    if action not in ("rotate", "truncate"):
        raise EffectFailed("refused", f"[[watch.file]] {watch.name!r} only notifies (action {action!r}): "
                                      "nothing to rotate or truncate")
    keep = effect.params.get("keep") or watch.keep
    path, writer = checked_target(effect.target, watch, ctx.paths.home if ctx.paths is not None else None)
    began = time.monotonic()
    try:
        parent, name = safepath.open_parent(path)     # again: what was matched may have been swapped since
    except safepath.Refused as err:
        raise EffectFailed("refused", str(err)) from None
    except OSError as err:
        raise os_failure("rotate-file found no file", err) from None
    try:
        writer = safepath.joined(parent.writer, writer, path)
        result = safepath.as_writer(writer, path, lambda: trim(parent, name, action, keep, ctx.deadline))
    except safepath.Refused as err:
        raise EffectFailed("refused", str(err)) from None
    finally:
        os.close(parent.fd)
    return {"path": path, "watch": watch.name, **result, **({"as_uid": writer} if writer is not None else {}),
            "took_s": round(time.monotonic() - began, 3)}
