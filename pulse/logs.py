"""One log writer: pulsed.

Workers write plain lines to stderr, which is a pipe into pulsed. pulsed stamps
each whole line with the time and `name[pid]`, and writes it to its own stderr
(journald under systemd) and to <home>/logs/pulse.log, which it alone rotates.
Lines from different processes arrive on different pipes and are written whole,
so they never interleave mid-line. faulthandler tracebacks and anything a worker
prints before its logging is set up reach the log the same way.

multiprocessing-logging is not used: it needs a queue and a feeder thread in
every child, and it loses what bypasses `logging` (faulthandler writes to fd 2).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

MAX_LINE = 16 * 1024      # a longer line is cut, so one runaway writer cannot grow pulsed
WORKER_FORMAT = "%(levelname)s %(name)s: %(message)s"


def stamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


class RotatingFile:
    """pulse.log, rotated by size to pulse.log.1 … pulse.log.N. Only pulsed writes it, so only
    pulsed rotates it. (logging.handlers would do, at the cost of importing socket, pickle and
    more into pulsed, which must stay small.)"""

    def __init__(self, path: Path, max_bytes: int, backups: int):
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8", "replace")
        try:
            if os.fstat(self.fd).st_size + len(data) > self.max_bytes:
                self.rotate()
            os.write(self.fd, data)
        except OSError as err:   # a full disk must not take the supervisor down
            sys.stderr.write(f"pulse.log: {err}\n")

    def rotate(self) -> None:
        os.close(self.fd)
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            os.truncate(self.path, 0)
        self.fd = self._open()

    def close(self) -> None:
        os.close(self.fd)


class Sink:
    """Where every line ends up: stderr (optional) and the rotating file."""

    def __init__(self, log_file: Path | None, *, to_stderr: bool, max_bytes: int, backups: int):
        self.to_stderr = to_stderr
        self.file = RotatingFile(log_file, max_bytes, backups) if log_file is not None else None

    def line(self, source: str, pid: int, text: str) -> None:
        out = f"{stamp()} {source}[{pid}] {text}"
        if self.to_stderr:
            try:
                sys.stderr.write(out + "\n")
                sys.stderr.flush()
            except OSError:
                pass
        if self.file is not None:
            self.file.write(out)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class SinkHandler(logging.Handler):
    """pulsed's own `logging` records, into the sink."""

    def __init__(self, sink: Sink, source: str = "pulsed"):
        super().__init__()
        self.sink, self.source = sink, source
        self.setFormatter(logging.Formatter(WORKER_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            for line in text.splitlines() or [""]:
                self.sink.line(self.source, os.getpid(), line)
        except Exception:
            self.handleError(record)


class PipeReader:
    """Whole lines from one worker's output pipe."""

    def __init__(self, fd: int, name: str, pid: int | None):
        self.fd, self.name, self.pid = fd, name, pid
        self.buffer = b""
        os.set_blocking(fd, False)

    def read(self, sink: Sink) -> bool:
        """Drain what is there; False at EOF (every writer closed the pipe)."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return True
            if not chunk:
                if self.buffer:
                    self._emit(sink, self.buffer)
                    self.buffer = b""
                return False
            self.buffer += chunk
            *lines, self.buffer = self.buffer.split(b"\n")
            for line in lines:
                self._emit(sink, line)
            if len(self.buffer) > MAX_LINE:
                self._emit(sink, self.buffer[:MAX_LINE] + b" [cut]")
                self.buffer = b""

    def _emit(self, sink: Sink, raw: bytes) -> None:
        sink.line(self.name, self.pid or 0, raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"))

    def close(self) -> None:
        os.close(self.fd)


def setup_worker_logging(level: str) -> None:
    """In a worker: plain lines on stderr (the pipe to pulsed)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)   # inherited from pulsed: never write its file from here
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(WORKER_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_files(log_file: Path) -> list[Path]:
    """pulse.log.N … pulse.log.1, pulse.log: oldest first."""
    rotated = sorted((p for p in log_file.parent.glob(log_file.name + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    return rotated + ([log_file] if log_file.exists() else [])
