"""[survival], [store], [allow], [[notify]]: what the survival layer watches for and may do, what
the stores keep, what effects of the engine and agents may do, and where notifications go."""

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from pulse.core.config.keys import ConfigError, Table

if TYPE_CHECKING:
    from pulse.core.config import Config


class Store(Table):
    """What the stores keep: vitals, blobs, errors, and events.db's live history (docs/history.md):
    events past its bounds move, oldest first, into compressed segments under <home>/archive."""
    vitals_retention_h: Annotated[float, Meta(gt=0)] = 24
    """Vitals older than this are deleted, in hours."""
    objects_retention_days: Annotated[float, Meta(gt=0)] = 7
    """Unreferenced blobs older than this are deleted, in days."""
    error_coalesce_s: Annotated[float, Meta(gt=0)] = 3600
    """Identical errors this close together are one run, counted, in s."""
    # 0 would append every repeat: the flood that coalescing prevents
    error_repeat_s: Annotated[float, Meta(gt=0)] = 60
    """A run's repeats are appended as one error event per this, in s."""
    keep_days: Annotated[float, Meta(ge=0)] = 30
    """Events older than this leave the live history, in days; 0: no age bound."""
    # a bound below one segment's worth would move all the time
    max_mb: Annotated[float, Meta(ge=0)] = 512
    """The live history's size bound, in MiB; 0: no size bound, else at least 16."""
    keep_free_mb: Annotated[float, Meta(ge=0)] = 1024
    """The home's disk keeps this free: below it, the live history is held to what it is now (freed pages take the new
    events), in MiB."""
    archive: bool = True
    """Events past the bounds are archived; false: deleted."""
    archive_max_mb: Annotated[float, Meta(ge=0)] = 2048
    """The archive's bound, in MiB: its oldest segments go past it; 0: none."""


def validate_store(store: Store, origin: str) -> None:
    if 0 < store.max_mb < 16:
        raise ConfigError(f"{origin}: $.store.max_mb must be 0 (no size bound) or at least 16, got {store.max_mb:g}")


class Llm(Table):
    """The agent's LLM endpoint ([survival.llm]): a [[watch.network]] target whose failures llmWatchdog
    answers by restarting a [[process]], as processWatchdog restarts one (stop, then start)."""
    target: str
    """The name of a [[watch.network]] entry. Example: `"llm"`"""
    process: str | None = None
    """The [[process]] that serves it (required). Example: `"litellm"`"""
    restart: list[str] | None = None
    """No longer read: an error says what to write instead (a [[process]] and `process`)."""
    fail_after: Annotated[int, Meta(ge=1)] = 3
    """Failed checks in a row before a restart."""


class Survival(Table):
    """Thresholds of the survival rules (they run in the tick; the engine cannot change them)."""
    panic_failures: Annotated[int, Meta(ge=1)] = 3
    """panicRollback: survival's host repairs failed in a row since a promote."""
    auto_rollback_window_s: Annotated[float, Meta(gt=0)] = 600
    """autoRollback watches a promote this long, in s ..."""
    auto_rollback_errors: Annotated[int, Meta(ge=1)] = 5
    """... for this many engine errors ..."""
    auto_rollback_crashes: Annotated[int, Meta(ge=1)] = 3
    """... or this many engine crashes."""
    process_notify_after: Annotated[int, Meta(ge=1)] = 3
    """Failed restarts in a row before processWatchdog notifies."""
    process_backoff_base_s: Annotated[float, Meta(gt=0)] = 1
    """After a failed restart, the next waits this long, doubling, in s (a [[process]]'s restart_backoff overrides it)."""
    process_backoff_max_s: Annotated[float, Meta(gt=0)] = 300
    """... up to this, in s."""
    memory_pct: Annotated[float, Meta(ge=0, le=100)] = 90
    """resourceGuard acts above this memory use, in percent."""
    disk_pct: Annotated[float, Meta(ge=0, le=100)] = 90
    """resourceGuard acts above this disk use, in percent."""
    resource_cooldown_s: Annotated[float, Meta(ge=0)] = 300
    """Between two rounds of archive and cleanup for one cause, in s."""
    archive_from: str | None = None
    """Agent session files older than archive_age_h move from here ... Example: `"/home/agent/.openclaw/sessions"`"""
    archive_to: str | None = None
    """... to here. Example: `"/srv/archive/sessions"`"""
    archive_age_h: Annotated[float, Meta(ge=0)] = 72
    """The age at which session files are archived, in hours."""
    cleanup: list[str] = msgspec.field(default_factory=list)
    """Glob patterns of temporary files resourceGuard may delete."""
    disk_trim_min_mb: Annotated[float, Meta(ge=0)] = 1
    """Disk above disk_pct: first, every [[watch.file]] file this big is rotated or truncated (its action), before
    archive and cleanup, in MiB."""
    ballast_mb: Annotated[int, Meta(ge=0)] = 32
    """The ballast file, freed first when the disk is full so effects can still commit, in MiB."""
    error_tick_ms: Annotated[int, Meta(gt=0)] = 1_000
    """errorEscalate's tick while log errors keep coming, in ms."""
    notify_every_s: Annotated[float, Meta(ge=0)] = 300
    """At most one notification per (rule, target) this often, in s."""
    llm: Llm | None = None                    # unset: llmWatchdog is inactive


def validate_llm(config: "Config", origin: str) -> None:
    llm = config.survival.llm
    if llm is None:
        return
    if llm.target not in {t.name for t in config.watch.network}:
        raise ConfigError(f"{origin}: $.survival.llm.target: no [[watch.network]] named {llm.target!r}")
    if llm.restart is not None:
        raise ConfigError(f"{origin}: $.survival.llm.restart: the endpoint is now restarted as a [[process]] is "
                          "(stopped, then started, never two copies; an exec timeout killed a proxy started "
                          "this way): add a [[process]] with that argv as `restart` and a `match` or `pidfile`, "
                          "and write process = \"<its name>\" here")
    if llm.process is None:
        raise ConfigError(f"{origin}: $.survival.llm.process: required: the [[process]] that serves the endpoint")
    if not any(p.name == llm.process and p.restart for p in config.process):
        raise ConfigError(f"{origin}: $.survival.llm.process: no [[process]] named {llm.process!r} with a restart argv")


class Allow(Table):
    """What effects of origin `engine` or `agent` may do (survival and operator effects are trusted)."""
    kinds: list[str] = msgspec.field(
        default_factory=lambda: ["noop", "notify", "restart-process", "signal", "agent-run", "task-add"])
    """The effect kinds they may commit (agent-run: configured [[agent]]s only)."""
    exec_argv: list[list[str]] = msgspec.field(default_factory=list)
    """The argv prefixes an `exec` effect may start with."""
    any_exec: bool = False
    """Allow every `exec` argv (not recommended)."""
    signals: list[str] = msgspec.field(default_factory=lambda: ["SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2"])
    """The signals a `signal` effect may send to a [[process]]."""


class Notify(Table):
    """A notification channel ([[notify]]); a fresh home has one, of kind log."""
    kind: Literal["log", "file", "webhook", "command"]
    """log: pulse.log; file: JSON Lines appended to path; webhook: POSTed to url; command: argv gets it as JSON on stdin.
    Example: `"log"`"""
    name: str | None = None
    """Its name in events; unset: its kind. Example: `"ops"`"""
    path: str | None = None
    """file: the JSON Lines file. Example: `"/var/log/pulse-notify.jsonl"`"""
    url: str | None = None
    """webhook: the URL POSTed to. Example: `"https://hooks.example/pulse"`"""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """webhook: headers sent with each POST."""
    argv: list[str] | None = None
    """command: the argv run per notification. Example: `["/usr/local/bin/page-me"]`"""
    retries: Annotated[int, Meta(ge=0)] = 3
    """webhook: attempts after the first fails."""
    timeout_s: Annotated[float, Meta(gt=0)] = 10
    """One attempt may take this long, in s."""
    # Grouped per target, as Alertmanager groups.
    burst: Annotated[int, Meta(ge=1)] = 5
    """The first this many notifications of a window go out; the rest are held back and one digest per window says how
    many were."""
    group_s: Annotated[float, Meta(gt=0)] = 60
    """The window of burst, in s."""


def validate_notify(channels: list[Notify], origin: str) -> None:
    for i, channel in enumerate(channels):
        need = {"file": "path", "webhook": "url", "command": "argv"}.get(channel.kind)
        if need and not getattr(channel, need):
            raise ConfigError(f"{origin}: $.notify[{i}].{need}: required for kind {channel.kind!r}")
