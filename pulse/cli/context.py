"""What every pulsectl command is handed, and how it prints: click-free, so that the commands
pulse.cli.fastpath serves without click run the very same code as through click."""

from __future__ import annotations

import re
import sys

from pulse.cli.launch import request_or_exit
from pulse.core.home import Paths, resolve_home


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    """click.echo's behaviour for text, without importing click: each call flushed (so stdout and
    stderr interleave as written), and ANSI escapes stripped when the stream is not a terminal (a
    task's title is the operator's text)."""
    stream = sys.stderr if err else sys.stdout
    if "\x1b" in message and not stream.isatty():
        message = re.sub(r"\033\[[;?0-9]*[a-zA-Z]", "", message)
    stream.write(message + "\n" if nl else message)
    stream.flush()


def fail(message: str, code: int = 1):
    """`pulsectl: MESSAGE` on stderr and exit CODE."""
    echo(f"pulsectl: {message}", err=True)
    sys.exit(code)


def unusable_store(err: Exception) -> int | None:
    """The exit code for a store that cannot be used, said in one line naming the file and what to
    do, never a traceback; None when `err` is not one (it propagates)."""
    if isinstance(err, PermissionError):
        # An account Pulse keeps out (an agent run's own `user`): one line naming what it cannot
        # reach, never a traceback. 77: EX_NOPERM.
        echo(f"pulsectl: permission denied: {err.filename or err} (out of this account's reach: "
             "an agent run under its own user reaches only Pulse's gate, through `pulsectl mcp`)", err=True)
        return 77
    from pulse.store.connection import StoreError  # only now: most commands never touch a store
    if not isinstance(err, StoreError):
        return None
    echo(f"pulsectl: {err}", err=True)
    return 78


class Context:
    def __init__(self, home: str | None, timeout: float):
        self.home = resolve_home(home)
        self.timeout = timeout

    @property
    def paths(self) -> Paths:
        return Paths.for_client(self.home)

    def config(self, load: str = "load"):
        """config.toml with PULSE_* overrides (or, `load="load_agent_tables"`, its agents' tables
        alone); exit 78 (like pulsed) naming what is wrong."""
        from pulse.core import config as configmod  # its structs and tomllib, ~8 ms: not every command reads it
        try:
            return getattr(configmod, load)(self.paths.config)
        except configmod.ConfigError as err:
            fail(str(err), 78)

    def request(self, message):
        return request_or_exit(self.paths, message, self.timeout)
