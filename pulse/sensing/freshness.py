"""Proof that work happens ([[watch.fresh]]): a heartbeat file, a cron's output directory or a
loopback URL's answer that must change within `within_s`. Alive and healthy is not enough: a
heartbeat that reports success while its work never ran, or cron runs skipped in silence, leave
the process up and its /health green; only the work's own traces show that nothing happens.

Key `fresh:<name>`. Each sample carries `changed_at` (the last sign of work: a file's mtime, the
newest mtime in a directory, the moment the URL's answer was first seen as it is now),
`watching_since` (when this watch began: the last sign of work when none was ever seen),
`looked_at` (when it looked: the time it is judged at) and `stale`. The judgement lives in
pulse.core.staleness; the watcher says it too, to ring the tick on the edge.

A path is read as root beside accounts that may be hostile: its directories are walked without
following a link (pulse.core.safepath), a last-component link is followed only where nobody but
root and Pulse could have placed it, and inside a directory nothing is followed: a link's own
mtime counts, a linked directory is not entered. Nothing is read but metadata. A URL is loopback
only (config), fetched without a proxy or a redirect, its answer read up to MAX_BODY_BYTES.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import stat
import time
import urllib.error
import urllib.request
from typing import Any

from pulse.core import config as configmod
from pulse.core import safepath
from pulse.core.plugins import Watcher
from pulse.core.staleness import is_stale, last_work
from pulse.core.wire.enginerpc import Vital

MAX_ENTRIES = 100_000        # a directory's entries looked at per sample (all levels); the rest: `truncated`
MAX_BODY_BYTES = 1024 * 1024
FETCH_TIMEOUT_S = 5.0
VALUE_CHARS = 200            # of the URL's field, kept in the sample (what status shows)


# -- a path ----------------------------------------------------------------------------------------------

def open_last(path: str) -> tuple[safepath.Dir, str]:
    """(the directory holding `path`, its name there), a last-component link followed only where
    nobody but root and Pulse could have placed it (as pulse.core.safepath.open_readable)."""
    parent, name = safepath.open_parent(path)
    try:
        st = safepath.lstat_in(parent, name)
    except FileNotFoundError:
        return parent, name
    except BaseException:
        os.close(parent.fd)
        raise
    if stat.S_ISLNK(st.st_mode):
        trusted_place = parent.writer is None and not parent.shared
        os.close(parent.fd)
        if not trusted_place:
            raise safepath.Refused(f"{path} is a symbolic link another account could have placed: never followed")
        return safepath.open_file_parent(path)
    return parent, name


def newest_in(top: safepath.Dir, recursive: bool) -> dict[str, Any]:
    """The newest mtime among a directory's entries (lstat: a link's own), with the entry's name,
    how many were looked at, and whether MAX_ENTRIES cut the look short. Subdirectories are
    entered (never through a link) when `recursive`."""
    newest, newest_name, seen, truncated = None, None, 0, False
    pending: list[tuple[safepath.Dir, str]] = [(top, "")]
    try:
        while pending:
            here, prefix = pending.pop()
            try:
                for entry in safepath.listing(here):
                    if seen >= MAX_ENTRIES:
                        truncated = True
                        break
                    seen += 1
                    try:
                        st = safepath.lstat_in(here, entry)
                    except FileNotFoundError:
                        continue        # gone between the listing and the look
                    if newest is None or st.st_mtime > newest:
                        newest, newest_name = st.st_mtime, prefix + entry
                    if recursive and stat.S_ISDIR(st.st_mode):
                        try:
                            pending.append((safepath.step(here, entry), f"{prefix}{entry}/"))
                        except (OSError, safepath.Refused):
                            pass        # gone, or a directory Pulse does not enter: its own mtime counted
            finally:
                if here is not top:
                    os.close(here.fd)
            if truncated:
                break
    finally:
        for here, _ in pending:
            if here is not top:
                os.close(here.fd)
    return {"changed_at": newest, "newest": newest_name, "entries": seen, "truncated": truncated}


def look_at_path(path: str, recursive: bool) -> dict[str, Any]:
    """A file's mtime, or the newest mtime in a directory (an empty one: its own); `error` when it
    cannot be looked at (missing, refused)."""
    try:
        parent, name = open_last(path)
    except (OSError, safepath.Refused) as err:
        return {"kind": None, "changed_at": None, "error": describe(err, path)}
    try:
        st = safepath.lstat_in(parent, name)
        if not stat.S_ISDIR(st.st_mode):
            return {"kind": "file", "changed_at": st.st_mtime, "error": None}
        top = safepath.step(parent, name)
    except (OSError, safepath.Refused) as err:
        return {"kind": None, "changed_at": None, "error": describe(err, path)}
    finally:
        os.close(parent.fd)
    try:
        found = newest_in(top, recursive)
        if found["changed_at"] is None:
            found["changed_at"] = os.fstat(top.fd).st_mtime     # empty: when it was made or emptied
        return {"kind": "directory", **found, "error": None}
    except (OSError, safepath.Refused) as err:
        return {"kind": "directory", "changed_at": None, "error": describe(err, path)}
    finally:
        os.close(top.fd)


def describe(err: BaseException, path: str) -> str:
    if isinstance(err, FileNotFoundError):
        return f"{path} does not exist"
    return str(err) if isinstance(err, safepath.Refused) else f"{path}: {err.strerror or err}"


# -- a URL -----------------------------------------------------------------------------------------------

class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a way elsewhere: loopback is what the operator configured."""

    def redirect_request(self, *args, **kwargs):
        return None


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)


def field_of(document: Any, dotted: str) -> Any:
    """`document`'s value at a dotted path ("cron.runs", "jobs.0.last_run"): KeyError naming the part
    that is not there."""
    value = document
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def fetch_value(url: str, field: str | None, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """GET `url`: its answer (or its JSON's `field`) as a digest and a short text; `error` when there
    is no value to compare (refused, an error status, not JSON, no such field, too large)."""
    out: dict[str, Any] = {"status": None, "digest": None, "value": None, "error": None}
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "pulse-fresh"})
    try:
        with OPENER.open(request, timeout=timeout_s) as response:
            out["status"] = response.status
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as err:
        out.update(status=err.code, error=f"http {err.code} {err.reason}")
        return out
    except (OSError, http.client.HTTPException, ValueError) as err:    # refused, timeout, garbage
        out["error"] = f"{getattr(err, 'reason', err)}"
        return out
    if len(body) > MAX_BODY_BYTES:
        out["error"] = f"its answer is larger than {MAX_BODY_BYTES // 1024} KiB"
        return out
    if field is not None:
        try:
            value = field_of(json.loads(body), field)
        except ValueError as err:
            out["error"] = f"its answer is not JSON: {err}"
            return out
        except KeyError as err:
            out["error"] = f"its JSON has no {field!r} (no {err.args[0]!r})"
            return out
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        out["value"] = text[:VALUE_CHARS]
    else:       # the whole answer is compared, never kept: it may say more than the operator asked to watch
        text = body.decode("utf-8", "replace")
        out["bytes"] = len(body)
    out["digest"] = hashlib.sha256(text.encode()).hexdigest()
    return out


# -- the watcher -----------------------------------------------------------------------------------------

class FreshWatch(Watcher):
    """A `[[watch.fresh]]`: key `fresh:<name>`, sampled every watcher interval. Wakes the tick when
    it turns stale (an edge: a watch that stays stale rings once)."""

    def __init__(self, watch: configmod.FreshWatch, interval_ms: int):
        self.watch = watch
        self.name = self.key = f"fresh:{watch.name}"
        self.interval_ms = interval_ms
        self.timeout_s = FETCH_TIMEOUT_S + 2
        # only the (one) collect thread of this watcher touches these, and resume() before the first collect
        self._since: float | None = None
        self._digest: str | None = None
        self._changed_at: float | None = None

    def resume(self, data: dict[str, Any]) -> None:
        """Carry on from the last stored sample (the watcher restarted): when watching began, and for
        a URL, the answer seen and since when, so a restart does not make a stale answer new."""
        since = data.get("watching_since")
        if isinstance(since, (int, float)) and not isinstance(since, bool):
            self._since = float(since)
        changed = data.get("changed_at")
        if self.watch.url is not None and isinstance(data.get("digest"), str) and isinstance(changed, (int, float)):
            self._digest, self._changed_at = data["digest"], float(changed)

    def collect(self) -> dict[str, Any]:
        now = time.time()
        self._since = self._since or now
        w = self.watch
        if w.path is not None:
            data = {"path": w.path, **look_at_path(w.path, w.recursive)}
        else:
            data = {"url": w.url, "field": w.field, **fetch_value(w.url, w.field)}
            if data["digest"] is not None and data["digest"] != self._digest:
                self._digest, self._changed_at = data["digest"], time.time()
            data["changed_at"] = self._changed_at
            if data["digest"] is None:      # no answer to compare: the last one seen stays the last sign of work
                data["digest"] = self._digest
        data.update(watching_since=self._since, within_s=w.within_s, looked_at=time.time())
        data["stale"] = is_stale(data["looked_at"], data, w.within_s)
        data["age_s"] = round(data["looked_at"] - last_work(data), 3)
        return data

    def should_wake(self, window: list[Vital]) -> bool:
        latest = window[-1].data if window else None
        previous = window[-2].data if len(window) >= 2 else None
        return bool(latest and latest.get("stale")) and not (previous and previous.get("stale"))
