"""What the guards of issue 21 look like from outside: a [[process]]'s config files against their
known-good copies, and each [[watch.file]] glob's latest sample and last trim. The tick computes
these from its snapshot and hands them to pulsed in its heartbeat; `pulsectl status`, the page and
/metrics show them. Pure functions over the snapshot; no I/O here.
"""

from __future__ import annotations

from typing import Sequence

from pulse.core.config import FileWatch, Process
from pulse.core.states import EffectState
from pulse.core.wire import ConfigFileStatus, ConfigStatus, FileWatchStatus, Snapshot
from pulse.rules import knowngood

MB = 1024 * 1024
ENDED = (EffectState.ACKED, EffectState.FAILED, EffectState.EXPIRED)


def config_file_state(path: str, sampled: dict[str, dict] | None, good: dict[str, str]) -> str:
    """One config file, as ConfigFileStatus.state names it."""
    if sampled is None:
        return "unsampled"
    state = sampled.get(path)
    if state is None:
        return "unsampled"
    if "error" in state:
        return "unreadable"
    if state.get("missing"):
        return "missing" if path in good else "not-kept"
    if path not in good:
        return "not-kept"
    return "known-good" if state.get("sha256") == good[path] else "changed"


def config_status(curr: Snapshot, proc: Process) -> ConfigStatus | None:
    """A process's config files against its known-good copies; None when it has no `config`."""
    if not proc.config:
        return None
    sampled, known = knowngood.config_files(curr, proc.name), knowngood.known_of(curr, proc.name)
    files = [ConfigFileStatus(path, config_file_state(path, sampled, known.files)) for path in proc.config]
    return ConfigStatus(files=files, kept_at=known.kept_at, pinned=known.pinned, restored_at=known.restore_at,
                        restore_why=known.restore_why, restore_state=known.restore_state,
                        restore_summary=known.restore_summary)


def file_watch_status(curr: Snapshot, watch: FileWatch) -> FileWatchStatus:
    """A [[watch.file]] glob: its latest sample (files, bytes, the largest, how many over max_mb) and
    its last trim that ended, of any file it matched then."""
    view = FileWatchStatus(name=watch.name, path=watch.path, action=watch.action, max_mb=watch.max_mb)
    samples = curr.history.get(f"file:{watch.name}") or ()
    if not samples:
        return view
    found = [f for f in samples[-1].data.get("files", []) if isinstance(f.get("bytes"), int)]
    largest = max(found, key=lambda f: f["bytes"], default=None)
    trims = [o for f in found for o in curr.outcomes.get(f.get("path", ""), ())
             if o.kind == "rotate-file" and o.state in ENDED]
    last = max(trims, key=lambda o: o.ts, default=None)
    view.files, view.sampled_at = len(found), samples[-1].ts
    view.bytes = sum(f["bytes"] for f in found)
    view.over = sum(1 for f in found if f["bytes"] > watch.max_mb * MB)
    if largest is not None:
        view.largest, view.largest_bytes = largest.get("path"), largest["bytes"]
    if last is not None:
        view.last_trim_at, view.last_trim_state = last.ts, last.state
    return view


def guards(curr: Snapshot, processes: Sequence[Process], watches: Sequence[FileWatch]) -> dict:
    """The tick's heartbeat extras for status: config per process that has any, and every watch."""
    configs = {p.name: view for p in processes if (view := config_status(curr, p)) is not None}
    return {"configs": configs, "files": [file_watch_status(curr, w) for w in watches]}
