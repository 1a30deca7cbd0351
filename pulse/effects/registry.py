"""Every built-in effect kind, one descriptor each: what its params are, whether running it twice
is safe, what [allow] checks for it, how it runs, and the hooks the executor calls around it; and
what others need to know of it: whether it is a repair (the tick, the report), what resource it
changes and whether its ack proves the change (the agent's gate), whether it tells a person (the tick).

The executor's loop names no kind: it asks `get(kind)`. A kind that is not here is the engine's
own (declared by an executor in the agent's engine directory) and runs in the engine process.
`reference()` renders this table as Markdown for docs/rules.md, so the rule author's guide is
generated from what the executor enforces.

Params are checked against the kind's schema before the effect is claimed: an effect whose
params do not fit is failed, reason `bad-params`, with the field named, and never runs. Keys a
schema does not name are kept (a rule may tag its effects, e.g. params["rule"]).
"""

from __future__ import annotations

import difflib
import enum
import functools
import os
import sqlite3
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Callable, Collection, Iterable, Literal

import msgspec

from pulse.core.config import MAX_KEEP, Allow, ExecutorConfig
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EffectKind
from pulse.effects import configfiles, dirs, files, kinds, notify, repairs
from pulse.effects.kinds import EffectContext

UNTRUSTED_ORIGINS = ("engine", "agent")      # checked against [allow]; survival and operator are trusted

Seconds = Annotated[float, msgspec.Meta(gt=0)]


# -- params, one Struct per kind ---------------------------------------------------------------------

class NoParams(msgspec.Struct):
    pass


class ExecParams(msgspec.Struct):
    argv: Annotated[list[str], msgspec.Meta(min_length=1)]   # a list, never a shell string
    env: dict[str, str] = {}                                 # added to Pulse's environment
    cwd: str | None = None
    timeout_s: Seconds | None = None                         # at most [timings] effect_timeout_s


class NotifyParams(msgspec.Struct):
    message: str = ""
    title: str | None = None
    level: str = "info"                                      # the log channel's level
    channels: list[str] | None = None                        # [[notify]] names; unset: every channel
    timeout_s: Seconds | None = None


class RestartProcessParams(msgspec.Struct):
    grace_s: Annotated[float, msgspec.Meta(ge=0)] | None = None   # still running after this: a daemon
                                                             # (unset: the [[process]] start_grace_s)
    timeout_s: Seconds | None = None
    why: str | None = None                                   # dead | unhealthy | exit-code | endpoint-down |
                                                             # memory | stale | config-restored
    code: int | None = None                                  # the exit code it died with, when recorded
    signal: str | None = None                                # ... or the signal that killed it
    pid: int | None = None                                   # ... and the pid that exited (or was over its ceiling)
    endpoint: str | None = None                              # why = endpoint-down: the [[watch.network]] target
    rss_mb: float | None = None                              # why = memory: its tree's RSS at the last sample ...
    max_mb: float | None = None                              # ... its ceiling ...
    samples: int | None = None                               # ... and how many samples in a row were above it
    watch: str | None = None                                 # why = stale: the [[watch.fresh]] that saw no work
    reason: str | None = None                                # the figures in words, for the report and the page


class StopProcessParams(msgspec.Struct):
    timeout_s: Seconds | None = None
    why: str | None = None                                   # operator | removed (a reload took its table out)
    reload: int | None = None                                # why = removed: the reload event's id
    definition: dict | None = None                           # why = removed: its table as it was (no env)


class OnCrashLoopParams(msgspec.Struct):
    starts: int | None = None                                # the failed starts in a row that held it fatal


class SignalParams(msgspec.Struct):
    signal: str = kinds.DEFAULT_SIGNAL                       # a name: "SIGHUP", "SIGTERM", ...


def not_absolute(field: str, paths: Iterable[str]) -> str | None:
    """What is wrong with `paths` (the param `field`) if one is not absolute, else None: a relative path
    would mean whatever the executor's working directory is."""
    relative = [p for p in paths if not os.path.isabs(p)]
    return f"`params.{field}` must be absolute, got {relative[0]!r}" if relative else None


class ArchiveParams(msgspec.Struct):
    from_: str = msgspec.field(name="from")                  # absolute
    to: str                                                  # absolute
    older_than_h: Annotated[float, msgspec.Meta(ge=0)] = 72

    def __post_init__(self):                                 # a ValueError here is a ValidationError: bad-params
        if problem := not_absolute("from", [self.from_]) or not_absolute("to", [self.to]):
            raise ValueError(problem)


class CleanupParams(msgspec.Struct):
    patterns: list[str] = []                                 # absolute globs; never inside the home
    vitals_gc: bool = False                                  # also collect vitals past [store] retention
    objects_gc: bool = False                                 # also collect unreferenced blobs

    def __post_init__(self):                                 # checked before any pattern deletes a file
        if problem := not_absolute("patterns", self.patterns):
            raise ValueError(problem)


Sha256Hex = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
ObjectRef = Annotated[str, msgspec.Meta(pattern="^sha256:[0-9a-f]{64}$")]


class KeepConfigParams(msgspec.Struct):
    files: dict[str, Sha256Hex] | None = None                # path → the sha256 it was judged good with;
                                                             # unset: every config file as it is now (a pin)

    def __post_init__(self):
        if problem := not_absolute("files", self.files or ()):
            raise ValueError(problem)


class RestoreConfigParams(msgspec.Struct):
    files: Annotated[dict[str, ObjectRef], msgspec.Meta(min_length=1)]   # path → its known-good copy in objects/
    why: str | None = None                                   # crash-loop | unhealthy | stop-exit-code | operator
    changed_at: float | None = None                          # when the files changed (their newest ctime)

    def __post_init__(self):
        if problem := not_absolute("files", self.files):
            raise ValueError(problem)


class RotateFileParams(msgspec.Struct):
    watch: str                                               # the [[watch.file]] whose glob matches the target
    action: Literal["rotate", "truncate"] | None = None      # unset: that [[watch.file]]'s action
    keep: Annotated[int, msgspec.Meta(ge=1, le=MAX_KEEP)] | None = None   # unset: its keep


class TrimDirParams(msgspec.Struct):
    watch: str                                               # the [[watch.dir]] whose glob matches the target
    why: str | None = None                                   # the bounds it broke (max_files, max_mb, max_age)


class EngineRollbackParams(msgspec.Struct):
    to: str | None = None                                    # a commit; unset: the one before the last promote
    reason: str | None = None


class EnginePromoteParams(msgspec.Struct):
    message: str | None = None                               # the merge commit's message


# -- allow-checks beyond the kind itself --------------------------------------------------------------

def allow_exec(effect: Effect, allow: Allow, process_names: Collection[str]) -> str | None:
    """argv starts with an allow.exec_argv prefix and sets no env or cwd, unless allow.any_exec"""
    # env and cwd would make a prefix meaningless (LD_PRELOAD, PATH, a relative program)
    if allow.any_exec:
        return None
    argv = effect.params.get("argv")
    if not isinstance(argv, list) or not any(prefix and argv[:len(prefix)] == prefix for prefix in allow.exec_argv):
        return f"not-allowed: exec argv {effect.params.get('argv')!r} matches no allow.exec_argv prefix"
    if effect.params.get("env") or effect.params.get("cwd"):
        return "not-allowed: exec env and cwd need allow.any_exec"
    return None


def allow_configured_process(effect: Effect, allow: Allow, process_names: Collection[str]) -> str | None:
    """the target is a configured [[process]]"""
    if effect.target not in process_names:
        return f"not-allowed: {effect.target!r} is not a configured [[process]]"
    return None


def allow_signal(effect: Effect, allow: Allow, process_names: Collection[str]) -> str | None:
    """a signal from allow.signals, to a configured [[process]]"""
    if effect.params.get("signal", kinds.DEFAULT_SIGNAL) not in allow.signals:
        return f"not-allowed: signal {effect.params.get('signal')!r} is not in allow.signals"
    return allow_configured_process(effect, allow, process_names)


# -- the descriptors ----------------------------------------------------------------------------------

AllowCheck = Callable[[Effect, Allow, Collection[str]], "str | None"]


TARGET_RESOURCE = "target:{target}"   # what a kind changes unless it says: the thing its target names


class Repair(enum.StrEnum):
    """What a repair kind puts right."""
    HOST = "host"       # something on the host survival watches: a process, the disk, the logs
    ENGINE = "engine"   # the engine, by putting it back to a commit that worked


@dataclass(frozen=True)
class Kind:
    name: str
    doc: str                                                  # one paragraph, for docs/rules.md
    params: type[msgspec.Struct]
    run: Callable[[Effect, EffectContext], dict]              # the effect-acked data, or raises EffectFailed
    idempotent: bool                                          # safe to run twice: the default to give it
    target: str = "unused"                                    # what the effect's target names
    allow: AllowCheck | None = None                           # what [allow] checks beyond the kind
    admit: Callable[[Effect, ExecutorConfig], bool] | None = None   # may it start now? (else: stays pending)
    release: Callable[[str], None] | None = None              # it ended: give back what admit took
    # In the claim's transaction: None to claim it, else why it is held (pending, unclaimed): agent-run's spend limits
    reserve: Callable[[sqlite3.Connection, Effect, ExecutorConfig], str | None] | None = None
    settle_orphan: Callable[[Effect, sqlite3.Connection, ExecutorConfig], None] | None = None
    retry_failed: Callable[[Effect, dict], bool] | None = None   # put a failure back in the queue?
    expires: Callable[[Effect], bool] | None = None   # may it expire unrun at its deadline? (None: it may)
    starts_process: bool = False     # it acts through a process group recorded in its claim (none: not started)
    # What others need to know of the kind:
    repairs: Repair | None = None    # it puts right a fault: survival's effects of it are its repairs (the report)
    resource: str = TARGET_RESOURCE  # what it changes, as the gate names resources ({target}: its target, or *)
    # What the effect acts on, where its params may name it too (agent-run: the task): the resource is
    # named from it, and an effect whose target and params name two things is refused (a ValueError
    # here: bad-params), so the gate and the executor never act on different ones.
    subject: Callable[[Effect], str | None] | None = None
    ack_verifies: bool = False       # its ack is the whole change: nothing for a later read to verify (the gate)
    tells_operator: bool = False     # it tells a person something: the tick remembers when each rule last did


def confinement(effect: Effect, ctx: EffectContext) -> list[str] | None:
    """The directories an archive or cleanup from an agent or the engine stays in: those the
    operator's config names (repairs.named_dirs); None (anywhere but the home) for survival's and
    the operator's own."""
    return repairs.named_dirs(ctx.config) if effect.origin in UNTRUSTED_ORIGINS else None


def _notify_retry(effect: Effect, data: dict) -> bool:
    """A notification whose channels failed waits and is tried again: the network may be what is down."""
    return effect.idempotent and data.get("reason") == "notify"


def _notify_expires(effect: Effect) -> bool:
    """An idempotent notification is never dropped at its deadline: it is kept until a channel takes
    it (its deadline only ends the retries of the other channels, once one has)."""
    return not effect.idempotent


OWN_KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(EffectKind.NOOP, "Does nothing: for benchmarks and tests.", NoParams, kinds.run_noop, True, ack_verifies=True),
    Kind(EffectKind.EXEC, "Runs an argv in its own process group; acked on exit code 0. The event has the code "
         "and the last 2 KiB of output; the whole output is in objects/.",
         ExecParams, kinds.run_exec, False, "free text (what it is about)", allow=allow_exec, starts_process=True,
         repairs=Repair.HOST),
    Kind(EffectKind.NOTIFY, "Sends a notification through every configured [[notify]] channel (or the named "
         "ones); acked when every channel took it. Each channel that takes it is recorded (a `notify` "
         "event) and never sent it again, across retries and executor restarts. When idempotent, a "
         "notification no channel took is kept and retried with backoff (effect_retry_base_ms, "
         "doubling to effect_retry_max_ms) until one does, whatever its deadline; once one has, the "
         "others are retried until the deadline, then it is acked naming them `undelivered`. Every "
         "param, including keys this table does not name, is in the JSON each channel receives.",
         NotifyParams, notify.run_notify, True, "what the notification is about", retry_failed=_notify_retry,
         expires=_notify_expires, ack_verifies=True, tells_operator=True),
    Kind(EffectKind.RESTART_PROCESS, "Stops what the configured [[process]] is now (its `stop` argv, else SIGTERM "
         "to its process tree, SIGKILL after stop_timeout_s) and waits for it to be gone, then starts its "
         "`restart` argv under a keeper that outlives Pulse and records its exit (process-exited); acked "
         "on its exit code, or as a daemon if it still runs after grace_s. Never two copies.",
         RestartProcessParams, kinds.run_restart, False, "a configured [[process]]",
         allow=allow_configured_process, repairs=Repair.HOST, resource="process:{target}"),
    Kind(EffectKind.STOP_PROCESS, "Stops what the configured [[process]] is now, as restart-process stops it (its "
         "`stop` argv, else SIGTERM to its process tree, SIGKILL after stop_timeout_s), and starts nothing; "
         "acked with the pids it stopped (none: nothing ran). An operator's `pulsectl process stop` commits "
         "it, and survival does for a [[process]] a reload took out (its table, as it was, in `definition`).",
         StopProcessParams, kinds.run_stop, True, "a configured [[process]]",
         allow=allow_configured_process, resource="process:{target}"),
    Kind(EffectKind.ON_CRASH_LOOP, "Runs a [[process]]'s `on_crash_loop` argv once (as its `user`, in its `cwd`, with "
         "its `env`), in its own process group; acked on exit 0. The event has the code and the last 2 KiB of "
         "output; the whole output is in objects/. processWatchdog commits it when the process is held fatal "
         "for crash-looping, then gives the process one more start.",
         OnCrashLoopParams, kinds.run_on_crash_loop, False, "a configured [[process]] with `on_crash_loop`",
         allow=allow_configured_process, starts_process=True, resource="process:{target}"),
    Kind(EffectKind.SIGNAL, "Sends a signal to a configured [[process]], found by its pidfile or match, never "
         "by a pid taken from the effect.",
         SignalParams, kinds.run_signal, False, "a configured [[process]]", allow=allow_signal,
         resource="process:{target}"),
    Kind(EffectKind.KEEP_CONFIG, "Keeps a copy of each `config` file of a [[process]] in objects/ as its known-good "
         "config; the ack names every copy (path → sha256, ref), and is the record that survives restarts. "
         "With `files`, only files that still have the sha256 they were judged good with (else reason "
         "`changed`); without, every config file as it is now (an operator's pin).",
         KeepConfigParams, configfiles.run_keep, True, "a configured [[process]] with `config` files",
         allow=allow_configured_process, resource="process:{target}", ack_verifies=True),
    Kind(EffectKind.RESTORE_CONFIG, "Writes the known-good copies named in `files` back over a [[process]]'s "
         "`config` files (only those, all read from objects/ before any is written), each atomically; "
         "what each replaces is kept in objects/ first (`broken` in the ack, and `kept`, its path, beside "
         "its `diff` summary and `undone`, a bounded unified diff of what it undid). A file "
         "already holding its known-good content is left alone. processWatchdog restarts the process "
         "after it.",
         RestoreConfigParams, configfiles.run_restore, False, "a configured [[process]] with `config` files",
         allow=allow_configured_process, repairs=Repair.HOST, resource="process:{target}"),
    Kind(EffectKind.RESTART_WORKER, "Asks pulsed to restart one of its workers (an operator-style restart, "
         "never counted as a crash): watcher, tick, executor, engine, or web while [web] is enabled "
         "(else it fails with reason not-enabled).",
         NoParams, lambda e, ctx: repairs.restart_worker(e.target, ctx.paths), True, "a worker name",
         resource="worker:{target}"),
    Kind(EffectKind.ARCHIVE, "Moves files older than older_than_h from one directory to another, keeping their "
         "relative paths. Never the home, a folder inside it, or one that holds it; never through a link; "
         "from an agent or the engine, only within directories the config names.", ArchiveParams,
         lambda e, ctx: repairs.archive(e.params, ctx.home, named=confinement(e, ctx)), False, repairs=Repair.HOST),
    Kind(EffectKind.CLEANUP, "Deletes files matching absolute globs (never inside the home, never through a link; "
         "from an agent or the engine, only within directories the config names), and collects old "
         "vitals and unreferenced objects.",
         CleanupParams, lambda e, ctx: repairs.cleanup(e.params, ctx.paths, ctx.config, named=confinement(e, ctx)),
         True, repairs=Repair.HOST),
    Kind(EffectKind.ROTATE_FILE, "Rotates a file that the named [[watch.file]] glob matches (copytruncate: a gzipped "
         "copy `<file>.1.gz`, the older ones shifted up to `keep` and those beyond deleted, then the file "
         "truncated in place, so a writer holding it open with O_APPEND goes on writing at its start), or "
         "truncates it; acked with the action and the bytes freed. Refused for a file that glob does not "
         "match, one inside the Pulse home, and anything but a regular file (a symlink is never followed).",
         RotateFileParams, files.run_rotate_file, False, "the file's absolute path", repairs=Repair.HOST,
         resource=TARGET_RESOURCE),   # the file: what the gate's events read of its target verifies
    Kind(EffectKind.TRIM_DIR, "Keeps a directory that the named [[watch.dir]] glob matches within its bounds: its "
         "regular files (however deep, never through a link) are deleted, or archived into objects/, oldest "
         "first by mtime until max_files, max_mb and max_age hold; a file open for writing is never touched. "
         "Archived files are named, with their blobs, in `dir-archived` events committed before they are "
         "removed. Acked with the files and bytes taken away; failed with reason `still-over` when open files "
         "keep it over a bound. Refused for a directory that glob does not match and for the Pulse home.",
         TrimDirParams, dirs.run_trim_dir, True, "the directory's absolute path", repairs=Repair.HOST,
         resource=TARGET_RESOURCE),
    Kind(EffectKind.ENGINE_PROMOTE, "Promotes the engine's committed staging tree behind the promote checks, "
         "then reloads the engine.",
         EnginePromoteParams, lambda e, ctx: repairs.engine_promote(e.params, ctx.paths, ctx.config), False,
         resource="worker:engine"),   # it reloads the engine worker
    Kind(EffectKind.ENGINE_ROLLBACK, "Rolls the engine's main branch back and reloads the engine. Built in, "
         "never the engine's: a rollback is wanted exactly when the engine is broken.",
         EngineRollbackParams, lambda e, ctx: repairs.engine_rollback(e.params, ctx.paths), False,
         repairs=Repair.ENGINE, resource="worker:engine"),
)}


# The higher layers' kinds (agent-run and task-add of pulse.agents, report of pulse.report) plug in
# under these entry points, so that this module, below them, imports neither.
PLUGIN_GROUP = "pulse.effect_kinds"
DISTRIBUTION = "pulse-supervisor"        # setup.cfg's name: the one distribution whose kinds are taken


@functools.cache
def all_kinds() -> dict[str, Kind]:
    """Every built-in kind: this module's own, then those of Pulse's own `pulse.effect_kinds` entry
    points (another distribution's are never read: an engine's own kinds come from its executors,
    and run in the engine process, never in the executor)."""
    from importlib.metadata import distribution  # Pulse's own metadata only: no scan of every distribution
    plugged = [ep.load() for ep in distribution(DISTRIBUTION).entry_points
               if ep.group == PLUGIN_GROUP and ep.value.startswith("pulse.")]
    return {**OWN_KINDS, **{kind.name: kind for kind in plugged}}


def get(kind: str) -> Kind | None:
    """The built-in kind, or None: the engine's own."""
    return all_kinds().get(kind)


def expires(effect: Effect) -> bool:
    """May this effect expire unrun at its deadline? Every kind's may (the engine's own too), unless
    its descriptor says otherwise (an idempotent notification is kept until a channel takes it)."""
    kind = get(effect.kind)
    return kind is None or kind.expires is None or kind.expires(effect)


def repair_kinds(what: Repair | None = None) -> frozenset[str]:
    """The kinds that repair `what`; every repair kind when None."""
    return frozenset(k.name for k in all_kinds().values() if k.repairs is not None and (what is None or k.repairs == what))


def resource(kind: str, target: str | None, params: dict | None = None) -> str:
    """What an effect of `kind` on `target` (with `params`) changes, as the gate names it; a kind this
    registry does not know (the engine's own) changes its target. Effects whose subject cannot be
    told (bad params) touch the kind's whole class."""
    known = all_kinds().get(kind)
    if known is not None and known.subject is not None:
        try:
            target = known.subject(Effect(kind=kind, target=target, params=dict(params or {})))
        except ValueError:
            target = None
    template = known.resource if known is not None else TARGET_RESOURCE
    return template.format(target=target if target not in (None, "") else "*")


def ack_verifies(kind: str) -> bool:
    return kind in all_kinds() and all_kinds()[kind].ack_verifies


def tells_operator(kind: str) -> bool:
    return kind in all_kinds() and all_kinds()[kind].tells_operator


def refusal(effect: Effect, allow: Allow, process_names: Collection[str]) -> str | None:
    """Why [allow] refuses this effect ("not-allowed: ..."), or None if it may run.

    Only origins engine and agent are checked; every kind they emit must be in allow.kinds, the
    engine's own executors' kinds included (an agent's emit_effect must not reach one the operator
    never listed). Built-in kinds may check their params further."""
    if effect.origin not in UNTRUSTED_ORIGINS:
        return None
    if effect.kind not in allow.kinds:
        return f"not-allowed: kind {effect.kind!r} is not in allow.kinds"
    kind = all_kinds().get(effect.kind)
    return kind.allow(effect, allow, process_names) if kind is not None and kind.allow else None


def params_problem(effect: Effect) -> str | None:
    """What is wrong with a built-in effect's params, naming the field; None if they fit."""
    kind = all_kinds()[effect.kind]
    try:
        msgspec.convert(effect.params, kind.params)
    except msgspec.ValidationError as err:
        text = str(err).replace("`$.", "`params.").replace("`$`", "`params`")
        return f"{effect.kind}: {text}"
    try:
        kind.subject and kind.subject(effect)
    except ValueError as err:
        return f"{effect.kind}: {err}"
    return None


def unknown_kinds(names: Iterable[str], engine_kinds: Collection[str] = ()) -> list[str]:
    """Each name that is neither a built-in kind nor one the engine declares, with a suggestion."""
    known = [*all_kinds(), *engine_kinds]
    out = []
    for name in names:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        out.append(f"{name!r} is no effect kind" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return out


def _type_name(kind: object) -> str:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(msgspec.json.encode(a).decode() for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if kind is type(None):
        return "None"
    return kind.__name__ if isinstance(kind, type) and not args else str(kind).replace("typing.", "")


def _params_rows(params: type[msgspec.Struct]) -> list[str]:
    rows = []
    for field in msgspec.structs.fields(params):
        if field.required:
            default = "required"
        else:
            value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
            default = f"default `{msgspec.json.encode(value).decode()}`"
        rows.append(f"`{field.encode_name}` ({_type_name(field.type)}, {default})")
    return rows


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0].rstrip(".") if doc else ""


def reference() -> str:
    """Every built-in kind as Markdown: what it does, its target, its params, its idempotent default."""
    lines = []
    for kind in all_kinds().values():
        params = "; ".join(_params_rows(kind.params)) or "none"
        lines += [f"### `{kind.name}`", "", kind.doc, "",
                  f"- target: {kind.target}",
                  f"- params: {params}",
                  f"- idempotent by default: {'yes' if kind.idempotent else 'no'}",
                  "- [allow], for effects of the engine or an agent: the kind in `allow.kinds`"
                  + (f"; {_first_line(kind.allow.__doc__)}" if kind.allow else ""), ""]
    return "\n".join(lines)
