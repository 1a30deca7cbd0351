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

import os
import sys
import time
from pathlib import Path

from pulse.core import clock

MAX_LINE = 16 * 1024      # a longer line is cut, so one runaway writer cannot grow pulsed
WORKER_FORMAT = "%(levelname)s %(name)s: %(message)s"


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
        out = f"{clock.iso(time.time())} {source}[{pid}] {text}"
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


LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class Log:
    """pulsed's own lines, in the workers' format (`LEVEL name: message`), straight into the
    sink. The part of `logging`'s interface pulsed uses, without importing logging and what it
    pulls in: pulsed stays resident for as long as the host runs, every KiB counts."""

    sink: Sink | None = None          # set once by pulsed's main
    level = LEVELS["info"]

    def __init__(self, name: str):
        self.name = name

    def _line(self, level: str, message: str, args: tuple) -> None:
        if LEVELS[level] < Log.level or Log.sink is None:
            return
        text = message % args if args else message
        for line in text.splitlines() or [""]:
            Log.sink.line("pulsed", os.getpid(), f"{level.upper()} {self.name}: {line}")

    def debug(self, message: str, *args) -> None:
        self._line("debug", message, args)

    def info(self, message: str, *args) -> None:
        self._line("info", message, args)

    def warning(self, message: str, *args) -> None:
        self._line("warning", message, args)

    def error(self, message: str, *args) -> None:
        self._line("error", message, args)

    def critical(self, message: str, *args) -> None:
        self._line("critical", message, args)


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


def log_files(log_file: Path) -> list[Path]:
    """pulse.log.N … pulse.log.1, pulse.log: oldest first."""
    rotated = sorted((p for p in log_file.parent.glob(log_file.name + ".*") if p.suffix[1:].isdigit()),
                     key=lambda p: -int(p.suffix[1:]))
    return rotated + ([log_file] if log_file.exists() else [])


def written_by(line: str, process: str | None) -> bool:
    """A pulse.log line ("TIME NAME[PID] ...") comes from `process` (every line when None), or is
    pulsed's about it: a worker's crashes, restarts and hangs are written by pulsed, and a log of
    the tick without them hides what happened to it."""
    if process is None:
        return True
    parts = line.split(" ", 2)
    if len(parts) < 2:
        return False
    if parts[1].startswith(process + "["):
        return True
    return parts[1].startswith("pulsed[") and about(line, process)


def about(line: str, process: str) -> bool:
    """pulsed's line names `process` as its subject: "tick (pid 5) exited ...", "tick ready ...",
    "tick restarts in ...", "retrying failed tick", "... to start tick"."""
    message = line.split(": ", 1)[1] if ": " in line else ""
    return (message.startswith(f"{process} ") or message.rstrip("\n").endswith(f" {process}")
            or f" {process} (pid" in message)


def tail(log_file: Path, process: str | None, n: int) -> list[str]:
    """The last `n` lines of pulse.log and its rotations, of `process` (or of every process)."""
    out: list[str] = []
    for path in log_files(log_file):
        with open(path, encoding="utf-8", errors="replace") as f:
            out = (out + [line.rstrip("\n") for line in f if written_by(line, process)])[-n:] if n else []
    return out

