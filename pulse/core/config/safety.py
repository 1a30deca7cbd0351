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
    vitals_retention_h: Annotated[float, Meta(gt=0, description="Vitals older than this are deleted, in hours.")] = 24
    objects_retention_days: Annotated[float, Meta(
        gt=0, description="Unreferenced blobs older than this are deleted, in days.")] = 7
    error_coalesce_s: Annotated[float, Meta(
        gt=0, description="Identical errors this close together are one run, counted, in s.")] = 3600
    # 0 would append every repeat: the flood that coalescing prevents
    error_repeat_s: Annotated[float, Meta(
        gt=0, description="A run's repeats are appended as one error event per this, in s.")] = 60
    keep_days: Annotated[float, Meta(
        ge=0, description="Events older than this leave the live history, in days; 0: no age bound.")] = 30
    # a bound below one segment's worth would move all the time
    max_mb: Annotated[float, Meta(
        ge=0, description="The live history's size bound, in MiB; 0: no size bound, else at least 16.")] = 512
    keep_free_mb: Annotated[float, Meta(
        ge=0, description="The home's disk keeps this free: below it, the live history is held to what it is now "
                          "(freed pages take the new events), in MiB.")] = 1024
    archive: Annotated[bool, Meta(description="Events past the bounds are archived; false: deleted.")] = True
    archive_max_mb: Annotated[float, Meta(
        ge=0, description="The archive's bound, in MiB: its oldest segments go past it; 0: none.")] = 2048


def validate_store(store: Store, origin: str) -> None:
    if 0 < store.max_mb < 16:
        raise ConfigError(f"{origin}: $.store.max_mb must be 0 (no size bound) or at least 16, got {store.max_mb:g}")


class Llm(Table):
    """The agent's LLM endpoint ([survival.llm]): a [[watch.network]] target whose failures llmWatchdog
    answers by restarting a [[process]], as processWatchdog restarts one (stop, then start)."""
    target: Annotated[str, Meta(description="The name of a [[watch.network]] entry.", examples=["llm"])]
    process: Annotated[str | None, Meta(description="The [[process]] that serves it (required).",
                                        examples=["litellm"])] = None
    restart: Annotated[list[str] | None, Meta(
        description="No longer read: an error says what to write instead (a [[process]] and `process`).")] = None
    fail_after: Annotated[int, Meta(ge=1, description="Failed checks in a row before a restart.")] = 3


class Survival(Table):
    """Thresholds of the survival rules (they run in the tick; the engine cannot change them)."""
    panic_failures: Annotated[int, Meta(
        ge=1, description="panicRollback: survival's host repairs failed in a row since a promote.")] = 3
    auto_rollback_window_s: Annotated[float, Meta(gt=0, description="autoRollback watches a promote this long, in s ...")] = 600
    auto_rollback_errors: Annotated[int, Meta(ge=1, description="... for this many engine errors ...")] = 5
    auto_rollback_crashes: Annotated[int, Meta(ge=1, description="... or this many engine crashes.")] = 3
    process_notify_after: Annotated[int, Meta(
        ge=1, description="Failed restarts in a row before processWatchdog notifies.")] = 3
    process_backoff_base_s: Annotated[float, Meta(
        gt=0, description="After a failed restart, the next waits this long, doubling, in s (a [[process]]'s "
                          "restart_backoff overrides it).")] = 1
    process_backoff_max_s: Annotated[float, Meta(gt=0, description="... up to this, in s.")] = 300
    memory_pct: Annotated[float, Meta(ge=0, le=100, description="resourceGuard acts above this memory use, in percent.")] = 90
    disk_pct: Annotated[float, Meta(ge=0, le=100, description="resourceGuard acts above this disk use, in percent.")] = 90
    resource_cooldown_s: Annotated[float, Meta(
        ge=0, description="Between two rounds of archive and cleanup for one cause, in s.")] = 300
    archive_from: Annotated[str | None, Meta(
        description="Agent session files older than archive_age_h move from here ...",
        examples=["/home/agent/.openclaw/sessions"])] = None
    archive_to: Annotated[str | None, Meta(description="... to here.", examples=["/srv/archive/sessions"])] = None
    archive_age_h: Annotated[float, Meta(ge=0, description="The age at which session files are archived, in hours.")] = 72
    cleanup: Annotated[list[str], Meta(description="Glob patterns of temporary files resourceGuard may delete.")] = \
        msgspec.field(default_factory=list)
    disk_trim_min_mb: Annotated[float, Meta(
        ge=0, description="Disk above disk_pct: first, every [[watch.file]] file this big is rotated or truncated "
                          "(its action), before archive and cleanup, in MiB.")] = 1
    ballast_mb: Annotated[int, Meta(
        ge=0, description="The ballast file, freed first when the disk is full so effects can still commit, "
                          "in MiB.")] = 32
    error_tick_ms: Annotated[int, Meta(gt=0, description="errorEscalate's tick while log errors keep coming, in ms.")] = 1_000
    notify_every_s: Annotated[float, Meta(
        ge=0, description="At most one notification per (rule, target) this often, in s.")] = 300
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
    kinds: Annotated[list[str], Meta(
        description="The effect kinds they may commit (agent-run: configured [[agent]]s only).")] = msgspec.field(
        default_factory=lambda: ["noop", "notify", "restart-process", "signal", "agent-run", "task-add"])
    exec_argv: Annotated[list[list[str]], Meta(description="The argv prefixes an `exec` effect may start with.")] = \
        msgspec.field(default_factory=list)
    any_exec: Annotated[bool, Meta(description="Allow every `exec` argv (not recommended).")] = False
    signals: Annotated[list[str], Meta(description="The signals a `signal` effect may send to a [[process]].")] = \
        msgspec.field(default_factory=lambda: ["SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2"])


class Notify(Table):
    """A notification channel ([[notify]]); a fresh home has one, of kind log."""
    kind: Annotated[Literal["log", "file", "webhook", "command"], Meta(
        description="log: pulse.log; file: JSON Lines appended to path; webhook: POSTed to url; command: argv "
                    "gets it as JSON on stdin.", examples=["log"])]
    name: Annotated[str | None, Meta(description="Its name in events; unset: its kind.", examples=["ops"])] = None
    path: Annotated[str | None, Meta(description="file: the JSON Lines file.",
                                     examples=["/var/log/pulse-notify.jsonl"])] = None
    url: Annotated[str | None, Meta(description="webhook: the URL POSTed to.", examples=["https://hooks.example/pulse"])] = None
    headers: Annotated[dict[str, str], Meta(description="webhook: headers sent with each POST.")] = \
        msgspec.field(default_factory=dict)
    argv: Annotated[list[str] | None, Meta(description="command: the argv run per notification.",
                                           examples=[["/usr/local/bin/page-me"]])] = None
    retries: Annotated[int, Meta(ge=0, description="webhook: attempts after the first fails.")] = 3
    timeout_s: Annotated[float, Meta(gt=0, description="One attempt may take this long, in s.")] = 10
    # Grouped per target, as Alertmanager groups.
    burst: Annotated[int, Meta(
        ge=1, description="The first this many notifications of a window go out; the rest are held back and one "
                          "digest per window says how many were.")] = 5
    group_s: Annotated[float, Meta(gt=0, description="The window of burst, in s.")] = 60


def validate_notify(channels: list[Notify], origin: str) -> None:
    for i, channel in enumerate(channels):
        need = {"file": "path", "webhook": "url", "command": "argv"}.get(channel.kind)
        if need and not getattr(channel, need):
            raise ConfigError(f"{origin}: $.notify[{i}].{need}: required for kind {channel.kind!r}")
