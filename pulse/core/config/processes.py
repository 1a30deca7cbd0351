"""[[process]]: the critical processes Pulse watches and restarts, with their health probe, memory
ceiling, crash-loop settings and last-known-good config files."""

import os
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from pulse.core.config.keys import ConfigError, Table

MAX_HEALTH_FAILURES = 20                      # the tick keeps this many recent samples of a counted key
                                              # (health probes; memory samples in a row, too)
MAX_MEMORY_WINDOW_SAMPLES = 720               # the growth fit reads at most this many samples (the newest)
MAX_RESTARTS = 50                             # the tick keeps a process's last 64 starts: enough to count these


class Health(Table):
    """A probe of whether a live process is any use: an HTTP GET of `url` (healthy: answers below
    400) or an `argv` whose exit code is the verdict (0 healthy). Sampled by the watcher into
    `health:<process>`; processWatchdog restarts the process after `failures` failed probes in a row."""
    url: str | None = None
    """The URL probed by an HTTP GET; exactly one of url or argv. Example: `"http://127.0.0.1:18789/readyz"`"""
    argv: list[str] | None = None
    """... or the argv run: exit 0 is healthy. Example: `["openclaw", "health", "--json"]`"""
    every_s: Annotated[float, Meta(gt=0)] = 10
    """A probe runs this often, in s."""
    timeout_s: Annotated[float, Meta(gt=0)] = 3
    """A probe not answered within this failed, in s."""
    failures: Annotated[int, Meta(ge=1, le=MAX_HEALTH_FAILURES)] = 3
    """Failed probes in a row before the process is restarted."""
    start_period_s: Annotated[float, Meta(ge=0)] = 0
    """Failed probes this soon after the process started do not count, in s; its first passing probe
    ends the start period sooner (as Docker's does)."""
    # A saturated event loop answers /health in seconds long before it stops answering.
    max_latency_ms: Annotated[float, Meta(gt=0)] | None = None
    """A probe that answers, but slower than this, failed all the same, in ms; below timeout_s; unset: only timeout_s
    bounds it. Example: `1000`"""


class Memory(Table):
    """A ceiling on a process's memory: the RSS of its whole tree (the process and every descendant,
    summed), which the watcher samples into `process-memory:<process>` every watcher interval.
    processWatchdog restarts the process after `for_samples` samples in a row above `max_mb`, and
    notifies (once per process, at most every [survival] notify_every_s) when a least-squares fit
    over the last `growth_window_s` of samples rises faster than `growth_mb_per_h`."""
    max_mb: Annotated[float, Meta(gt=0)] = 4096
    """The ceiling on the tree's RSS, in MiB."""
    for_samples: Annotated[int, Meta(ge=1, le=MAX_HEALTH_FAILURES)] = 3
    """Samples in a row above max_mb before the restart."""
    growth_mb_per_h: Annotated[float, Meta(ge=0)] = 500
    """A steeper growth is notified, in MiB an hour; 0: no growth notice."""
    growth_window_s: Annotated[float, Meta(gt=0)] = 600
    """The growth fit's window, in s: samples of one pid over at least 3/4 of it (or the newest 720 of them)."""


class Backoff(Table):
    """The wait before each start of a streak of failed ones: base_s, 2×base_s, 4×base_s … at most max_s."""
    base_s: Annotated[float, Meta(gt=0)] = 1
    """The wait before the second start of a streak, in s."""
    max_s: Annotated[float, Meta(gt=0)] = 300
    """The longest wait, in s; at least base_s."""


class PidFile(Table):
    """A pidfile that is JSON (OpenClaw's lock file: {"pid": 24677, ...}): the pid is at `key`."""
    path: str
    """The JSON file. Example: `"/home/agent/.openclaw/gateway.lock"`"""
    key: str = "pid"
    """The key of the pid in it."""


ExitCode = Annotated[int, Meta(ge=1, le=255)]


class Process(Table):
    """A critical process: watched by `process-alive`, restarted by `restart-process`. A restart stops
    what the process is now (`stop`, else SIGTERM to its process tree, SIGKILL after `stop_timeout_s`),
    waits for it to be gone, then starts `restart`: never two copies. Repeat the table for more."""
    name: str
    """Its name in status, events and commands. Example: `"gateway"`"""
    preset: str | None = None
    """The tested settings of a tool Pulse names (openclaw-gateway, hermes-gateway, litellm), merged under this table's
    own keys (`pulsectl guard --detect`). Example: `"openclaw-gateway"`"""
    pidfile: str | PidFile | None = None
    """Found by the pid in this file (or { path, key } for a JSON one); exactly one of pidfile or match. Example:
    `"/run/gateway.pid"`"""
    match: str | None = None
    """... or by this regex over its full command line (never Pulse's own processes). Example: `"openclaw.*gateway"`"""
    restart: list[str] | None = None
    """The argv that starts it, never a shell string; unset: Pulse never starts it. Example: `["openclaw", "gateway",
    "run"]`"""
    stop: list[str] | None = None
    """The argv that stops it; unset: SIGTERM to its process tree. Example: `["systemctl", "stop", "gateway"]`"""
    stop_timeout_s: Annotated[float, Meta(gt=0)] = 10
    """Still there this long after the stop: SIGKILL, in s."""
    start_grace_s: Annotated[float, Meta(ge=0)] = 1
    """Exited within this after a start: the restart failed, in its words, in s."""
    cwd: str | None = None
    """Where restart and stop run; unset: the home; relative: to the home. Example: `"/srv/gateway"`"""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Added to Pulse's environment for restart and stop."""
    # an agent's look-alike is not the gateway
    user: str | None = None
    """The account it runs as: a process of another account never counts as it, and restart starts it as this one; unset:
    Pulse's own. Example: `"openclaw"`"""
    health: Health | None = None
    memory: Memory | None = None
    # Known for a process Pulse started: its keeper records every exit in events.db.
    restart_exit_codes: list[ExitCode] = msgspec.field(default_factory=list)
    """Exit codes by which it asks to be restarted (Hermes' gateway: 75): restarted at once, not counted as a failure.
    Example: `[75]`"""
    stop_exit_codes: list[ExitCode] = msgspec.field(default_factory=list)
    """Exit codes by which it asks never to be restarted (Hermes: 78, bad config). Example: `[78]`"""
    config: list[str] = msgspec.field(default_factory=list)
    """Its config files, absolute paths, kept known good and restored if an edit breaks it (processWatchdog); none by
    default. Example: `["/etc/openclaw/openclaw.json"]`"""
    config_good_after_s: Annotated[float, Meta(gt=0)] = 60
    """Healthy this long since a start after its config files' last change: they are kept as known good, in s."""
    config_rollback_window_s: Annotated[float, Meta(gt=0)] = 600
    """Crash-looping or unhealthy within this of a change: the known-good files are restored, then it is restarted, in s."""
    # As supervisord's startsecs, PM2's min_uptime.
    min_uptime_s: Annotated[float, Meta(ge=0)] = 10
    """A start after which it died sooner than this failed (a crash loop), in s."""
    max_restarts: Annotated[int, Meta(ge=0, le=MAX_RESTARTS)] = 5
    """This many failed starts within restart_window_s hold it `fatal` (notified once, with its last output) until an
    operator starts it; 0: never held."""
    restart_window_s: Annotated[float, Meta(gt=0)] = 300
    """The window of max_restarts, in s."""
    restart_backoff: Backoff | None = None
    # A way out of a crash loop that restarting cannot end (a stuck session resumed at every start).
    on_crash_loop: list[str] | None = None
    """Once held fatal, this argv runs once (as user, in cwd, with env), then the process gets one more start; failing
    that too, it is held until an operator starts it. Example: `["/usr/local/bin/clear-stuck-session"]`"""
    keep_on_remove: bool = False
    """Taken out of config.toml, a reload stops it (its whole tree); true: left running, no longer watched."""


REMOVED_KEYS = ("name", "pidfile", "match", "stop", "stop_timeout_s", "cwd")   # what a stop needs of a table


def removed_definition(process: Process) -> dict:
    """What stop-process needs of a [[process]] a reload takes out, carried in the reload event (its
    env is left out: events.db is no place for tokens)."""
    return msgspec.to_builtins({k: getattr(process, k) for k in REMOVED_KEYS if getattr(process, k) is not None})


def validate_processes(processes: list[Process], origin: str) -> None:
    for i, proc in enumerate(processes):
        where = f"{origin}: $.process[{i}]"
        if (proc.pidfile is None) == (proc.match is None):
            raise ConfigError(f"{where}: set exactly one of pidfile or match")
        if proc.match is not None:
            try:
                re.compile(proc.match)
            except re.error as err:
                raise ConfigError(f"{where}.match: not a valid regex: {err}") from None
        if proc.restart is not None and not proc.restart:
            raise ConfigError(f"{where}.restart: an argv list needs at least the program")
        if proc.health is not None:
            validate_health(proc.health, f"{where}.health")
        if proc.memory is not None and not proc.restart:
            raise ConfigError(f"{where}.memory: a memory ceiling restarts the process: set its restart argv too")
        if proc.stop is not None and not proc.stop:
            raise ConfigError(f"{where}.stop: an argv list needs at least the program")
        if proc.on_crash_loop is not None:
            if not proc.on_crash_loop or not proc.on_crash_loop[0]:
                raise ConfigError(f"{where}.on_crash_loop: an argv list needs at least the program")
            if not proc.restart or proc.max_restarts == 0:
                raise ConfigError(f"{where}.on_crash_loop: runs when the process is held fatal, which needs a "
                                  "restart argv and max_restarts above 0")
        if proc.restart_backoff is not None and proc.restart_backoff.base_s > proc.restart_backoff.max_s:
            raise ConfigError(f"{where}.restart_backoff: base_s must be at most max_s")
        if both := set(proc.restart_exit_codes) & set(proc.stop_exit_codes):
            raise ConfigError(f"{where}: exit code {min(both)} is in both restart_exit_codes and stop_exit_codes")
        validate_config_files(proc, where)
    names = [p.name for p in processes]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.process: names must be unique")


def validate_config_files(proc: Process, where: str) -> None:
    """`[[process]] config`: absolute, distinct paths of a process Pulse can restart."""
    for j, path in enumerate(proc.config):
        if not path or not os.path.isabs(path):
            raise ConfigError(f"{where}.config[{j}]: must be an absolute path, got {path!r}")
        if path.endswith("/"):
            raise ConfigError(f"{where}.config[{j}]: names a directory ({path!r}); list the files themselves")
    if len(set(map(os.path.normpath, proc.config))) != len(proc.config):
        raise ConfigError(f"{where}.config: a file is listed twice")
    if proc.config and not proc.restart:
        raise ConfigError(f"{where}.config: needs a restart argv: after restoring the known-good files, "
                          "Pulse restarts the process so that it reads them")


def validate_health(health: Health, where: str) -> None:
    if (health.url is None) == (health.argv is None):
        raise ConfigError(f"{where}: set exactly one of url or argv")
    if health.url is not None and not re.match(r"https?://[^/\s]+", health.url):
        raise ConfigError(f"{where}.url: not an http:// or https:// URL: {health.url!r}")
    if health.argv is not None and not health.argv:
        raise ConfigError(f"{where}.argv: an argv list needs at least the program")
    if health.max_latency_ms is not None and not health.max_latency_ms < health.timeout_s * 1000:
        raise ConfigError(f"{where}.max_latency_ms must be greater than 0 and below timeout_s ({health.timeout_s:g} s: "
                          f"a slower probe times out anyway), got {health.max_latency_ms:g}")
