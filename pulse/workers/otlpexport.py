"""Sends spans to an operator's OTLP/HTTP collector ([telemetry] export) without ever holding up
the worker that offers them.

`offer` only appends to a bounded queue (full: the oldest waiting run is dropped, counted); a thread
of its own takes up to BATCH runs at a time and POSTs them, protobuf, to <export>/v1/traces with the
operator's headers. A collector that is down, slow or answers 429/502/503/504 is tried again after
a backoff (doubling from BACKOFF_S to BACKOFF_MAX_S, or its Retry-After); a batch not sent within
give_up_s of its oldest run, or refused outright (any other status), is dropped and counted. What
it did is in `counts` (the telemetry worker's status): sent, dropped, retries, queued, last_error.

Each item may carry a mark (the event id it came from, ascending): `done` is the highest mark up to
which every item offered has been sent or dropped, what the caller checkpoints so that a restart
offers again only what may not have gone (an item sent twice is the same trace: its ids are derived).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("pulse.telemetry")

BATCH = 32                    # runs per request at most
TIMEOUT_S = 5.0               # one request's connect and answer
BACKOFF_S, BACKOFF_MAX_S = 0.5, 30.0
RETRYABLE = {429, 502, 503, 504}      # OTLP/HTTP's retryable statuses


class Exporter:
    def __init__(self, url: str, headers: dict[str, str], make_request, queue_max: int, give_up_s: float):
        """`make_request(batch)`: the protobuf message for a batch of offered items."""
        self.endpoint = url.rstrip("/") + "/v1/traces"
        self.headers = {**headers, "Content-Type": "application/x-protobuf"}
        self.make_request, self.queue_max, self.give_up_s = make_request, queue_max, give_up_s
        self.queue: collections.deque = collections.deque()        # (monotonic offered, item, mark)
        self.done = 0                 # every item marked up to this was sent or dropped
        self.overflowed = 0           # the highest mark dropped from a full queue (done once the batch in flight is)
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self.counts = collections.Counter()
        self.last_error = ""
        # never through a proxy from the environment: the operator names the collector itself
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.thread = threading.Thread(target=self._send_loop, name="otlp-export", daemon=True)

    def start(self) -> "Exporter":
        self.thread.start()
        return self

    def offer(self, item, mark: int = 0) -> None:
        """Queue `item` to be sent (None: nothing, only its mark); never waits. `mark`: its place
        (ascending), for `done`."""
        with self.cond:
            if len(self.queue) >= self.queue_max:
                _, lost, dropped = self.queue.popleft()
                self.overflowed = max(self.overflowed, dropped)
                self.counts["dropped"] += lost is not None     # under the lock, as every count
                self.last_error = "the export queue was full: the oldest run waiting was dropped"
            self.queue.append((time.monotonic(), item, mark))
            self.cond.notify()

    def status(self) -> dict:
        with self.cond:
            return {"url": self.endpoint, "sent": self.counts["sent"], "dropped": self.counts["dropped"],
                    "retries": self.counts["retries"], "queued": len(self.queue), "last_error": self.last_error}

    def status_done(self) -> int:
        with self.cond:
            return self.done

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _take(self) -> list[tuple[float, object, int]]:
        with self.cond:
            while not self.queue and not self.stopping.is_set():
                self.cond.wait()
            return [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]

    def _send_loop(self) -> None:
        while not self.stopping.is_set():
            batch = self._take()
            if batch:
                try:
                    self._send(batch)
                except Exception as err:          # a bug must not end the thread: the batch is dropped, said
                    self._drop(batch, f"{type(err).__name__}: {err}")
                with self.cond:                   # sent or dropped: done, and what overflowed before it
                    self.done = max(self.done, self.overflowed, *(mark for _, _, mark in batch))

    def _send(self, batch: list[tuple[float, object, int]]) -> None:
        batch = [entry for entry in batch if entry[1] is not None]    # a mark alone: nothing to send
        if not batch:
            return
        body = self.make_request([item for _, item, _ in batch]).SerializeToString()
        oldest, attempt = min(at for at, _, _ in batch), 0
        while True:
            status, wait, why = self._post(body)
            if status == 200:
                self._count("sent", len(batch))
                return
            retryable = status is None or status in RETRYABLE
            wait = wait if wait is not None else min(BACKOFF_MAX_S, BACKOFF_S * 2 ** attempt) * random.uniform(0.8, 1.2)
            if not retryable or time.monotonic() + wait - oldest > self.give_up_s or self.stopping.is_set():
                self._drop(batch, why)
                return
            self._count("retries", 1)
            attempt += 1
            if self.stopping.wait(wait):
                self._drop(batch, why)
                return

    def _post(self, body: bytes) -> tuple[int | None, float | None, str]:
        """(status or None when unreached, Retry-After seconds or None, why it failed)."""
        request = urllib.request.Request(self.endpoint, data=body, headers=self.headers, method="POST")
        try:
            with self.opener.open(request, timeout=TIMEOUT_S) as answer:
                answer.read(65536)
                return answer.status, None, ""
        except urllib.error.HTTPError as err:
            return err.code, retry_after(err.headers.get("Retry-After")), f"{self.endpoint} answered {err.code}"
        except (OSError, ValueError) as err:      # refused, unreachable, timed out, a bad answer
            return None, None, f"{self.endpoint}: {getattr(err, 'reason', None) or err}"

    def _count(self, key: str, n: int) -> None:
        with self.cond:
            self.counts[key] += n

    def _drop(self, batch: list, why: str) -> None:
        with self.cond:
            self.counts["dropped"] += len(batch)
            self.last_error = why
        log.warning("OTLP export: %d run(s) dropped: %s", len(batch), why)


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (its HTTP-date form is not taken: the backoff applies)."""
    try:
        return max(0.0, min(BACKOFF_MAX_S, float(value))) if value is not None else None
    except ValueError:
        return None
