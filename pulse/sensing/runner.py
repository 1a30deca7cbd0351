"""Running watchers inside a worker process without blocking its main loop.

The watcher process runs the built-in watchers with it; the engine process runs
the agent's watchers with it. Either way the worker's main loop must keep
heartbeating, so:

- every `collect()` runs in a small thread pool; a finished collect puts its
  result on a queue and writes one byte to a pipe whose read end is in
  `handlers`, so the main loop wakes at once;
- the main thread alone touches SQLite (a connection belongs to its thread):
  it writes the results to vitals.db in one transaction per batch, then asks
  each watcher's `should_wake(window)` over the key's last `wake_window_s`, and
  rings the tick (a `Wake` sent NOBLOCK; if nobody listens yet — the tick is
  restarting, or our connection is not up in the first milliseconds — it is
  offered again every WAKE_RETRY_S for WAKE_RETRY_FOR_S, then dropped: the vital
  is in SQLite, and the tick sees it on its next tick anyway);
- a collect that raises is an `error` event (identical ones coalesce); one that
  runs past its `timeout_s` is an `error` event "hung", and that watcher is not
  collected again until the stuck call returns (never two collects of one
  watcher at once), while the others carry on.

Two optional hooks, beyond the public `Watcher` API, let a watcher react to the
kernel rather than to the clock (process-alive uses them for pidfds):

    event_fd        int | None: an fd that becomes readable when the watcher
                    should be sampled now. Polled by the main loop while no
                    collect of that watcher is in flight (a pidfd stays readable
                    once its process died: polling it during the collect would spin).
    after_sample(data)  called on the main thread after each stored sample; it may
                    open or close its event_fd there, so the fd is owned by the
                    thread that polls it.
    close()         called when the runner closes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import zmq

from pulse.core.config import EngineConfig, WatcherConfig
from pulse.core.plugins import Watcher
from pulse.core.wakepipe import drain, poke
from pulse.core.wire import codec, doorbells
from pulse.core.wire.enginerpc import Vital
from pulse.store import ballast, errorruns, vitalsdb

MAX_THREADS = 32          # one per watcher up to this: a hung collect holds a thread, the others need theirs
MIN_INTERVAL_S = 0.05     # a watcher asking for less (or for nonsense) would spin the loop
MAX_MESSAGE = 500         # error messages are cut: they are fingerprints, not dumps
MAX_TRACEBACK = 4_000
WAKE_RETRY_S = 0.02       # a wake nobody took is offered again this often ...
WAKE_RETRY_FOR_S = 5.0    # ... for this long (the tick restarting, or not yet connected at our start)


@dataclass
class _Slot:
    """One watcher's schedule and the state of its collect."""
    watcher: Watcher
    due: float                        # monotonic time of the next collect
    started: float | None = None      # monotonic start of the collect in flight, None when idle
    hung_reported: bool = False       # the collect in flight overran timeout_s and was reported
    rush: bool = False                # sample again as soon as the collect in flight returns
    armed_fd: int | None = None       # the watcher's event_fd while it is in `handlers`


@dataclass
class _Result:
    slot: _Slot
    ts: float                         # wall time the collect finished: the vital's ts
    data: Any = None
    error: BaseException | None = None
    trace: str = ""


def seconds(value: Any, default: float, scale: float = 1.0) -> float:
    """A watcher's interval or timeout in seconds: its own if it is a sane number, else the default."""
    try:
        out = float(value) * scale
    except (TypeError, ValueError):
        return default
    return max(MIN_INTERVAL_S, out) if out == out else default   # NaN is not a number we can wait for


def unstorable(data: Any) -> str | None:
    """Why `data` cannot be a vital's data, or None. One bad sample must not sink its batch
    (vitals.data is CHECKed as JSON, and NaN is not JSON)."""
    if not isinstance(data, dict):
        return f"{type(data).__name__}, not a dict"
    try:
        json.dumps(data, default=str, allow_nan=False)
    except (TypeError, ValueError) as err:
        return f"data that is not JSON: {err}"
    return None


def describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return text[:MAX_MESSAGE]


class WatcherRunner:
    """Runs `watchers` from a worker's main loop: merge `handlers`, delegate `next_timer`/`on_timer`.

    `handlers` changes as event fds come and go, from inside its own callbacks and
    from `on_timer`. A worker either shares the dict (the watcher process:
    `runner.handlers.update(self.handlers); self.handlers = runner.handlers`) or
    merges it again after every callback and `on_timer`; a stale entry is harmless
    for one round (its callback checks that the fd is still armed), but an fd the
    runner dropped must leave the poll set before the next poll."""

    def __init__(self, watchers: Sequence[Watcher], *, vitals_conn: sqlite3.Connection,
                 events_conn: sqlite3.Connection, wake_sock: zmq.Socket, source: str, config: WatcherConfig | EngineConfig,
                 log: logging.Logger, ballast_path: Path | None = None):
        self.vitals_conn, self.events_conn, self.wake_sock = vitals_conn, events_conn, wake_sock
        self.ballast = ballast_path   # released when the disk is full, so the vital saying so still lands
        self.source, self.config, self.log = source, config, log
        self.default_interval_s = config.timings.watcher_interval_ms / 1000
        self.handlers: dict[object, Callable[[], None]] = {}
        now = time.monotonic()
        self._slots = [_Slot(w, due=now) for w in watchers]   # first collects from the loop, after Ready
        self._by_watcher = {id(s.watcher): s for s in self._slots}
        self._results: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._done_r, self._done_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._write_lock = threading.Lock()   # close() vs a late collect thread writing to a closed fd number
        self._closed = False
        self._unsent_wakes: dict[str, float] = {}   # reason → monotonic time to give up offering it
        self.handlers[self._done_r] = self._on_done
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(self._slots))),
                                        thread_name_prefix=f"{source}-collect")

    # -- the main loop's side -------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        times = []
        for slot in self._slots:
            if slot.started is None:
                times.append(slot.due)
            elif not slot.hung_reported:
                times.append(slot.started + self._timeout_s(slot))
        if self._unsent_wakes:
            times.append(time.monotonic() + WAKE_RETRY_S)
        return min(times, default=None)

    def on_timer(self, now: float) -> None:
        self._retry_wakes(now)
        for slot in self._slots:
            if slot.started is None:
                if now >= slot.due:
                    self._submit(slot, now)
            elif not slot.hung_reported and now >= slot.started + self._timeout_s(slot):
                slot.hung_reported = True
                self._error(slot, f"hung: collect() still running after {self._timeout_s(slot):g} s")

    def sample_now(self, watcher: Watcher) -> None:
        """Collect `watcher` at once (an event said so), or right after the collect in flight."""
        slot = self._by_watcher[id(watcher)]
        if slot.started is None:
            self._submit(slot, time.monotonic())
        else:
            slot.rush = True

    def close(self) -> None:
        """Stop collecting. A hung collect thread is abandoned: the process is exiting."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for slot in self._slots:
            self._disarm(slot)
            closer = getattr(slot.watcher, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception as err:
                    self.log.warning("closing watcher %s: %s", slot.watcher.name, describe(err))
        self.handlers.pop(self._done_r, None)
        with self._write_lock:
            self._closed = True
            os.close(self._done_w)
        os.close(self._done_r)

    # -- collecting -----------------------------------------------------------------------------------

    def _interval_s(self, slot: _Slot) -> float:
        return seconds(getattr(slot.watcher, "interval_ms", None), self.default_interval_s, 1 / 1000)

    def _timeout_s(self, slot: _Slot) -> float:
        return seconds(getattr(slot.watcher, "timeout_s", None), Watcher.timeout_s)

    def _submit(self, slot: _Slot, now: float) -> None:
        slot.started, slot.hung_reported, slot.rush = now, False, False
        self._disarm(slot)
        self._pool.submit(self._collect, slot)

    def _collect(self, slot: _Slot) -> None:
        """In a pool thread: run one collect, hand the result to the main thread."""
        try:
            result = _Result(slot, 0.0, data=slot.watcher.collect())
        except BaseException as err:   # the watcher's bug, whatever it is, is reported, not lost with the thread
            result = _Result(slot, 0.0, error=err, trace=traceback.format_exc()[-MAX_TRACEBACK:])
        result.ts = time.time()
        self._results.put(result)
        with self._write_lock:
            if self._closed:
                return
            poke(self._done_w)

    def _on_done(self) -> None:
        """The pipe said a collect finished: settle every finished collect in one batch."""
        drain(self._done_r)
        results = []
        while True:
            try:
                results.append(self._results.get_nowait())
            except queue.Empty:
                break
        if results:
            self._settle(results, time.monotonic())

    def _settle(self, results: list[_Result], now: float) -> None:
        sampled: list[tuple[_Slot, Vital]] = []
        for r in results:
            if r.slot.hung_reported:
                self.log.info("watcher %s returned after %.1f s", r.slot.watcher.name, now - r.slot.started)
            if r.error is not None:
                self._error(r.slot, describe(r.error), traceback=r.trace)
            elif (problem := unstorable(r.data)) is not None:
                self._error(r.slot, f"collect() returned {problem}")
            else:
                sampled.append((r.slot, Vital(r.slot.watcher.key, r.ts, r.data)))
        stored = self._store([v for _, v in sampled])
        for slot, vital in sampled:
            self._after_sample(slot, vital)
        for r in results:
            self._reschedule(r.slot, now)
            self._arm(r.slot)
        if stored:
            for slot, vital in sampled:
                self._maybe_wake(slot, vital)

    def _reschedule(self, slot: _Slot, now: float) -> None:
        # Fixed rate from the collect's start, read after after_sample (process-alive shortens its
        # interval after a death); after a hang, a full interval from now so a stuck target is not hammered.
        base = now if slot.hung_reported else slot.started
        slot.due = now if slot.rush else base + self._interval_s(slot)
        slot.started, slot.hung_reported, slot.rush = None, False, False

    def _store(self, vitals: list[Vital]) -> bool:
        if not vitals:
            return False
        try:
            vitalsdb.append_vitals(self.vitals_conn, vitals)
            return True
        except sqlite3.Error as err:
            if self.ballast is not None and ballast.is_full_disk(err) and ballast.release(self.ballast):
                self.log.error("disk full: released the ballast to record what the watchers see")
                return self._store(vitals)
            self.log.error("could not write %d vitals: %s", len(vitals), err)
            self._record_error("vitals.db", f"cannot write vitals: {describe(err)}")
            return False

    def _after_sample(self, slot: _Slot, vital: Vital) -> None:
        hook = getattr(slot.watcher, "after_sample", None)
        if callable(hook):
            try:
                hook(vital.data)
            except Exception as err:
                self._error(slot, f"after_sample: {describe(err)}", traceback=traceback.format_exc()[-MAX_TRACEBACK:])

    def _maybe_wake(self, slot: _Slot, vital: Vital) -> None:
        window = vitalsdb.vitals_window(self.vitals_conn, vital.key, time.time() - self.config.timings.wake_window_s)
        try:
            wake = bool(slot.watcher.should_wake(window))
        except Exception as err:
            self._error(slot, f"should_wake: {describe(err)}", traceback=traceback.format_exc()[-MAX_TRACEBACK:])
            return
        if wake:
            self.ring(vital.key)

    def ring(self, reason: str) -> None:
        """Ring the tick now, or keep offering the wake for a little while if nobody takes it."""
        if self._send_wake(reason):
            self._unsent_wakes.pop(reason, None)
        elif reason not in self._unsent_wakes:
            self.log.debug("the tick is not listening; offering the wake for %s again shortly", reason)
            self._unsent_wakes[reason] = time.monotonic() + WAKE_RETRY_FOR_S

    def _send_wake(self, reason: str) -> bool:
        try:
            self.wake_sock.send(codec.encode(doorbells.Wake(self.source, reason=reason)), zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.log.debug("rang the tick: %s", reason)
        return True

    def _retry_wakes(self, now: float) -> None:
        for reason, give_up in list(self._unsent_wakes.items()):
            if self._send_wake(reason):
                del self._unsent_wakes[reason]
            elif now >= give_up:
                del self._unsent_wakes[reason]
                self.log.debug("dropped a wake for %s: nobody took it (the vital is stored)", reason)

    # -- event fds ------------------------------------------------------------------------------------

    def _arm(self, slot: _Slot) -> None:
        """Poll the watcher's event fd (if it has one) while no collect of it is in flight."""
        fd = getattr(slot.watcher, "event_fd", None)
        if fd == slot.armed_fd:
            return
        self._disarm(slot)
        if isinstance(fd, int) and fd >= 0:
            slot.armed_fd = fd
            self.handlers[fd] = lambda: self._on_event(slot)

    def _disarm(self, slot: _Slot) -> None:
        if slot.armed_fd is not None:
            self.handlers.pop(slot.armed_fd, None)
            slot.armed_fd = None

    def _on_event(self, slot: _Slot) -> None:
        if slot.armed_fd is not None:   # a stale call after the fd was dropped in the same poll round is ignored
            self.log.debug("watcher %s: event fd readable, sampling now", slot.watcher.name)
            self.sample_now(slot.watcher)

    # -- errors ---------------------------------------------------------------------------------------

    def _error(self, slot: _Slot, message: str, **data) -> None:
        self._record_error(f"watcher:{slot.watcher.name}", message, key=slot.watcher.key, **data)

    def _record_error(self, target: str, message: str, **data) -> None:
        try:
            store = self.config.store
            count = errorruns.record_error(self.events_conn, self.source, target, message, coalesce_s=store.error_coalesce_s,
                                    repeat_s=store.error_repeat_s, **data)
        except sqlite3.Error as err:
            self.log.error("%s: %s (and it could not be recorded: %s)", target, message, err)
            return
        # The first of a run of identical errors is logged; the repeats are counted in the error events.
        level = logging.WARNING if count == 1 else logging.DEBUG
        self.log.log(level, "%s: %s", target, message)
