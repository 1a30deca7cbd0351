"""Last-known-good config of a [[process]], as processWatchdog reads it from the snapshot: when a
process's `config` files are to be kept known good, and when an edit of them is to be undone.
Pure functions; the files are read and written by the keep-config and restore-config effects.

The files' state is the watcher's `config:<process>` vital (each file's sha256 and ctime, or
missing); the known-good copies and the last restore are `Snapshot.known_good`, folded from
events.db. A file's change time is its ctime (no one can set it back, as `touch` or `cp -p` can
an mtime), a missing file's the first sample that found it gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from pulse.core.config import Process
from pulse.core.states import EffectState
from pulse.core.wire.enginerpc import Effect, KnownGood, Outcome, Snapshot, Vital
from pulse.core.wire.eventmsgs import EffectKind

NO_RECORD = KnownGood()


def config_files(curr: Snapshot, name: str) -> dict[str, dict] | None:
    """path → its state in the latest `config:<name>` sample; None before the first sample."""
    vital = curr.vitals.get(f"config:{name}")
    return None if vital is None else vital.data.get("files") or {}


def known_of(curr: Snapshot, name: str) -> KnownGood:
    return curr.known_good.get(name, NO_RECORD)


def changed_at(files: dict[str, dict], paths: Iterable[str], missing: bool = True) -> float | None:
    """When the newest change among `paths` happened: its ctime, or (`missing`) for a missing file
    when it was first found missing; None if none of them says."""
    keys = ("ctime", "missing_since") if missing else ("ctime",)
    times = [t for p in paths if p in files for t in map(files[p].get, keys) if isinstance(t, (int, float))]
    return max(times, default=None)


def differs(state: dict | None, good: str) -> bool:
    """The file is known not to hold the known-good content `good` (missing counts; a file that could
    not be read, or was not sampled, is not known to differ)."""
    if state is None or "error" in state:
        return False
    return bool(state.get("missing")) or state.get("sha256") != good


# -- keeping a config known good ---------------------------------------------------------------------

def healthy_throughout(proc: Process, probes: Sequence[Vital], started: float) -> bool:
    """Its health probe (if it has one) passed at every sample the snapshot keeps since the start
    (outside start_period_s), the latest at least config_good_after_s after the start."""
    if proc.health is None:
        return True
    counted = [v for v in probes if v.ts > started + proc.health.start_period_s]
    return (bool(counted) and all(v.data.get("ok", True) for v in counted)
            and counted[-1].ts >= started + proc.config_good_after_s)


def keep_effect(proc: Process, curr: Snapshot) -> Effect | None:
    """keep-config, when the process has been alive (and healthy) for config_good_after_s since a start
    after its files last changed (a process started before an edit may not have read it), and the
    files are not the known-good ones already. Not again within config_good_after_s of a failed keep
    (a file edited in between, an objects/ that cannot be written)."""
    files, alive = config_files(curr, proc.name), curr.vitals.get(f"process-alive:{proc.name}")
    started = None if alive is None or not alive.data.get("alive") else alive.data.get("started", alive.data.get("since"))
    if files is None or started is None:
        return None
    states = [files.get(p) for p in proc.config]
    if any(s is None or "error" in s for s in states):
        return None                       # not sampled yet, or unreadable: nothing sure to keep
    current = {p: files[p]["sha256"] for p in proc.config if "sha256" in files[p]}
    known = {p: h for p, h in known_of(curr, proc.name).files.items() if p in proc.config}
    if not current or current == known:
        return None
    # A file that is missing was kept from no one: when it went, if ever, is no edit the process missed.
    if started < (changed_at(files, proc.config, missing=False) or 0.0) or curr.ts - started < proc.config_good_after_s:
        return None
    if not healthy_throughout(proc, curr.history.get(f"health:{proc.name}", []), started):
        return None
    if any(o.kind == EffectKind.KEEP_CONFIG and o.state != EffectState.ACKED and curr.ts - o.ts < proc.config_good_after_s
           for o in curr.outcomes.get(proc.name, ())):
        return None
    return Effect(kind=EffectKind.KEEP_CONFIG, target=proc.name, origin="survival", idempotent=True,
                  params={"files": current})


# -- undoing an edit that broke it ---------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """Known-good files that changed: path → the known-good sha256, and when the newest change was."""
    files: dict[str, str]
    at: float


def unrestored_change(proc: Process, curr: Snapshot) -> Change | None:
    """The known-good files whose content changed within config_rollback_window_s, when no restore
    was committed since that change (one restore per change). A file never kept is never in it."""
    files = config_files(curr, proc.name)
    known = known_of(curr, proc.name)
    if files is None or not known.files:
        return None
    changed = {p: h for p, h in known.files.items() if p in proc.config and differs(files.get(p), h)}
    at = changed_at(files, changed)
    if not changed or at is None or curr.ts - at > proc.config_rollback_window_s:
        return None
    if known.restore_at is not None and known.restore_at >= at:
        return None
    return Change(changed, at)


def restarted_since(outcomes: Iterable[Outcome], ts: float) -> bool:
    """A restart ended after `ts`: the process was started on the changed files, and failed again."""
    return any(o.kind == EffectKind.RESTART_PROCESS and o.ts > ts for o in outcomes)


def restore_effect(proc: Process, change: Change, why: str) -> Effect:
    return Effect(kind=EffectKind.RESTORE_CONFIG, target=proc.name, origin="survival",
                  params={"files": {p: f"sha256:{h}" for p, h in sorted(change.files.items())}, "why": why,
                          "changed_at": change.at})


def restored_unrestarted(known: KnownGood) -> bool:
    """A restore wrote files back and no restart followed it yet: the process still runs (or last
    ran) on what was replaced."""
    return known.restore_state == EffectState.ACKED and bool(known.restored) and not known.restarted


def restore_failed(known: KnownGood) -> bool:
    return known.restore_state in (EffectState.FAILED, EffectState.EXPIRED)
