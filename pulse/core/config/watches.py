"""[watch] and its lists: the built-in watcher's thresholds, network targets, error logs, files that
must not fill the disk, proof that work happens, directories that only grow."""

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from pulse.core.config.keys import ConfigError, Table
from pulse.core.config.schedules import duration_problem, parse_every
from pulse.core.config.services import is_loopback, urlsplit_host

if TYPE_CHECKING:
    from pulse.core.config import Config

MAX_KEEP = 100                                # rotated copies a [[watch.file]] may keep
MAX_FIELD_CHARS = 200                         # a [[watch.fresh]] field's dotted path
WATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")   # it names a vital: file:<name>


class NetworkTarget(Table):
    """An outbound check ([[watch.network]]): DNS resolution of `host`, and an HTTP GET of `url` if given."""
    name: str
    """Its name: the vital network:<name>. Example: `"llm"`"""
    host: str | None = None
    """A host name resolved by DNS; host, url or both. Example: `"api.anthropic.com"`"""
    url: str | None = None
    """A URL fetched by an HTTP GET. Example: `"http://127.0.0.1:4000/health"`"""
    timeout_s: Annotated[float, Meta(gt=0)] = 5
    """A check not done within this failed, in s."""


class ErrorLogWatch(Table):
    """A log file tailed for keywords ([[watch.error_log]]), across rotation and truncation."""
    name: str
    """Its name: the vital error-log:<name>. Example: `"gateway"`"""
    path: str
    """The log file. Example: `"/var/log/openclaw/gateway.log"`"""
    keywords: list[str] = msgspec.field(
        default_factory=lambda: ["ERROR", "CRITICAL", "Traceback"])
    """A line holding any of these is an error."""


class FileWatch(Table):
    """Files that must not fill the disk ([[watch.file]]): every regular file `path` matches is
    sampled into vitals (`file:<name>`); one over `max_mb` is rotated, truncated or notified about
    by the survival layer (fileGuard), and when the disk is high resourceGuard trims these first."""
    name: str
    """Its name: the vital file:<name>. Example: `"traces"`"""
    path: str
    """An absolute glob (** spans directories). Example: `"/home/agent/.openclaw/logs/*.jsonl"`"""
    max_mb: Annotated[float, Meta(gt=0)] = 1024
    """A matching file over this is acted on, in MiB."""
    # copytruncate: its writer keeps its fd
    action: Literal["rotate", "truncate", "notify"] = "rotate"
    """rotate: a gzipped copy beside it, the file truncated in place; truncate: emptied in place, nothing kept; notify:
    only said."""
    keep: Annotated[int, Meta(ge=1, le=MAX_KEEP)] = 3
    """rotate keeps <path>.1.gz … <path>.<keep>.gz, the newest first."""


class FreshWatch(Table):
    """Proof that work happens ([[watch.fresh]]): something that must change within `within_s`, a
    heartbeat file or a cron's output directory (`path`: the file's mtime, or the newest mtime in the
    directory), or a loopback URL's answer (`url`; with `field`, only that dotted field of its JSON).
    Sampled into `fresh:<name>`; stale: notified once per staleness, and `restart` restarted if set."""
    name: str
    """Its name: the vital fresh:<name>. Example: `"heartbeat"`"""
    path: str | None = None
    """An absolute file (its mtime) or directory (its newest mtime); links out of it never followed; exactly one of path
    or url. Example: `"/home/agent/.openclaw/heartbeat"`"""
    recursive: bool = False
    """A directory: its subdirectories' entries count too."""
    url: str | None = None
    """... or a loopback URL whose answer must change. Example: `"http://127.0.0.1:18789/status"`"""
    field: str | None = None
    """With url: only this dotted path into its JSON answer counts. Example: `"cron.runs"`"""
    within_s: Annotated[float, Meta(gt=0)] = 3600
    """No change for this long: stale, notified once, in s."""
    restart: str | None = None
    """The [[process]] restarted when stale; unset: only notified. Example: `"gateway"`"""


class DirWatch(Table):
    """Directories that only grow ([[watch.dir]]): every directory `path` matches is sampled into
    vitals (`dir:<name>`: its regular files, however deep, never through a link); one over a bound
    has its oldest files (by mtime) deleted or archived into the home's objects/ until the bounds
    hold again (dirGuard, trim-dir). A file still open for writing is never touched."""
    name: str
    """Its name: the vital dir:<name>. Example: `"cron-output"`"""
    path: str
    """An absolute directory or glob of directories. Example: `"/home/agent/.hermes/cron/output/*"`"""
    max_mb: Annotated[float, Meta(gt=0)] | None = None
    """The files under each directory together are at most this, in MiB; set at least one bound. Example: `512`"""
    max_files: Annotated[int, Meta(ge=1)] | None = None
    """... at most this many files. Example: `1000`"""
    max_age: str | None = None
    """... none older than this (30m, 12h, 7d, 1h30m). Example: `"14d"`"""
    oldest: Literal["delete", "archive"] = "delete"
    """What happens to the oldest files: deleted, or moved into objects/, named in the effect's event."""


class Watch(Table):
    """Thresholds at which a built-in watcher rings the tick at once instead of waiting, and what else it watches."""
    cpu_pct: Annotated[float, Meta(ge=0, le=100)] = 95
    """CPU use above this rings the tick, in percent."""
    memory_pct: Annotated[float, Meta(ge=0, le=100)] = 90
    """Memory use above this rings the tick, in percent."""
    disk_pct: Annotated[float, Meta(ge=0, le=100)] = 90
    """Use of disk_path's disk above this rings the tick, in percent."""
    disk_path: str = "/"
    """The disk watched, by a path on it."""
    network: list[NetworkTarget] = msgspec.field(default_factory=list)   # none on a fresh install
    error_log: list[ErrorLogWatch] = msgspec.field(default_factory=list)
    file: list[FileWatch] = msgspec.field(default_factory=list)
    fresh: list[FreshWatch] = msgspec.field(default_factory=list)
    dir: list[DirWatch] = msgspec.field(default_factory=list)


def validate_watch(config: "Config", origin: str) -> None:
    for i, target in enumerate(config.watch.network):
        if not (target.host or target.url):
            raise ConfigError(f"{origin}: $.watch.network[{i}]: set host, url or both")
    validate_watched_files(config.watch.file, origin)
    validate_fresh_watches(config, origin)
    validate_watched_dirs(config.watch.dir, origin)


def validate_watch_name(where: str, name: str) -> None:
    if not WATCH_NAME.fullmatch(name):
        raise ConfigError(f"{where}.name: letters, digits and _ . : - (not starting with a symbol), got {name!r}")


def validate_watch_place(where: str, name: str, path: str, what: str) -> None:
    """A [[watch.file]]'s or [[watch.dir]]'s name, and its path: absolute, never climbing with '..'
    (a glob climbing out of where it points is not what was configured)."""
    validate_watch_name(where, name)
    if not os.path.isabs(path):
        raise ConfigError(f"{where}.path must be an absolute {what}, got {path!r}")
    if ".." in Path(path).parts:
        raise ConfigError(f"{where}.path must not contain '..', got {path!r}")


def validate_watched_files(files: list[FileWatch], origin: str) -> None:
    for i, watch in enumerate(files):
        validate_watch_place(f"{origin}: $.watch.file[{i}]", watch.name, watch.path, "glob")
    names = [w.name for w in files]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.file: names must be unique")


def validate_fresh_watches(config: "Config", origin: str) -> None:
    restartable = {p.name for p in config.process if p.restart}
    for i, watch in enumerate(config.watch.fresh):
        where = f"{origin}: $.watch.fresh[{i}]"
        validate_watch_name(where, watch.name)
        if (watch.path is None) == (watch.url is None):
            raise ConfigError(f"{where}: set exactly one of path or url")
        if watch.path is not None and (not os.path.isabs(watch.path) or ".." in Path(watch.path).parts):
            raise ConfigError(f"{where}.path must be an absolute path without '..', got {watch.path!r}")
        if watch.url is not None:
            host = urlsplit_host(watch.url)
            if host is None:
                raise ConfigError(f"{where}.url: not an http:// or https:// URL: {watch.url!r}")
            if not is_loopback(host):
                raise ConfigError(f"{where}.url: only a loopback address (127.0.0.1, ::1, localhost), got {host!r}")
        if watch.field is not None and (watch.url is None or not watch.field or len(watch.field) > MAX_FIELD_CHARS
                                        or "" in watch.field.split(".")):
            raise ConfigError(f"{where}.field: a dotted path into the url's JSON answer (like \"cron.runs\"), "
                              f"and only with url; got {watch.field!r}")
        if watch.recursive and watch.path is None:
            raise ConfigError(f"{where}.recursive: only with path")
        if watch.restart is not None and watch.restart not in restartable:
            raise ConfigError(f"{where}.restart: no [[process]] named {watch.restart!r} with a restart argv")
    names = [w.name for w in config.watch.fresh]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.fresh: names must be unique")


def validate_watched_dirs(dirs: list[DirWatch], origin: str) -> None:
    if not dirs:
        return
    for i, watch in enumerate(dirs):
        where = f"{origin}: $.watch.dir[{i}]"
        validate_watch_place(where, watch.name, watch.path, "directory or glob")
        if Path(watch.path) == Path("/"):
            raise ConfigError(f"{where}.path: not / itself: name the directory that grows")
        if watch.max_mb is None and watch.max_files is None and watch.max_age is None:
            raise ConfigError(f"{where}: set at least one of max_mb, max_files, max_age")
        if watch.max_age is not None and (problem := duration_problem(watch.max_age)):
            raise ConfigError(f"{where}.max_age: {problem}")
    names = [w.name for w in dirs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{origin}: $.watch.dir: names must be unique")


def max_age_s(watch: DirWatch) -> float | None:
    """A [[watch.dir]]'s max_age in seconds (validated: it parses)."""
    return None if watch.max_age is None else parse_every(watch.max_age)
