"""When a [[watch.fresh]] is stale, from its samples (`fresh:<name>`, pulse.sensing.freshness):
pure functions over plain data, stdlib only, here in the core so that the watcher (to ring the
tick on the edge), the survival rules and status judge alike.

The last sign of work is the sample's `changed_at` (a file's mtime, a directory's newest, when a
URL's answer last changed), or when watching began if none was ever seen. A watch is stale once
`within_s` has passed since then, as of the sample's own look (its `looked_at`, else its ts; not
the tick's time: a watcher that fell behind must not make old news stale), so the watcher and the
rules judge a sample alike.
"""

from __future__ import annotations

from typing import Any, Sequence


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def last_work(data: dict[str, Any]) -> float:
    """The last sign of work a sample shows: its `changed_at`, else when watching began."""
    changed = number(data.get("changed_at"))
    return changed if changed is not None else number(data.get("watching_since")) or 0.0


def stale_at(data: dict[str, Any], within_s: float, not_before: float = 0.0) -> float:
    """When the watch turns (or turned) stale: within_s after its last sign of work, or after
    `not_before` (a restart of the process it proves: the new copy gets within_s to show work)."""
    return max(last_work(data), not_before) + within_s


def looked_at(ts: float, data: dict[str, Any]) -> float:
    """When the sample stored at `ts` looked."""
    return number(data.get("looked_at")) or ts


def is_stale(ts: float, data: dict[str, Any], within_s: float, not_before: float = 0.0) -> bool:
    """Is the sample stored at `ts` stale?"""
    return looked_at(ts, data) >= stale_at(data, within_s, not_before)


def worked_since(samples: Sequence[Any], since: float) -> bool:
    """Did any sample (an enginerpc.Vital) see work after `since`?"""
    return any(last_work(v.data) > since and v.data.get("changed_at") is not None for v in samples)
