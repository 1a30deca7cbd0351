"""`pulsectl logs` itself, click-free: pulse.cli.logcmd declares it to click, pulse.cli.fastpath runs
it without it."""

from __future__ import annotations

import os
import time

from pulse.cli.context import Context, echo
from pulse.core import logs as logsmod


def print_log(ctx: Context, follow: bool, worker: str | None, lines: int) -> None:
    """The last `lines` lines of pulse.log (of `worker` alone, when given); `follow`: then every new
    one, across rotation, until interrupted."""
    path = ctx.paths.log_file
    for line in logsmod.tail(path, worker, lines):
        echo(line)
    if not follow:
        return
    f = open(path, encoding="utf-8", errors="replace") if path.exists() else None
    if f is not None:
        f.seek(0, os.SEEK_END)
    try:
        while True:
            line = f.readline() if f is not None else ""
            if line:
                if logsmod.written_by(line, worker):
                    echo(line.rstrip("\n"))
                continue
            time.sleep(0.2)
            try:   # rotated or created: reopen
                if f is None or os.stat(path).st_ino != os.fstat(f.fileno()).st_ino:
                    if f is not None:
                        f.close()
                    f = open(path, encoding="utf-8", errors="replace")
            except FileNotFoundError:
                f = None
    except KeyboardInterrupt:
        pass
