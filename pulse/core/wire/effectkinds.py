"""EffectKind: the name of every effect kind Pulse ships. Written by scripts/gen_docs.py from
pulse.effects.registry (its own rows, then the kinds of the layers above plugged in by entry point:
agent-run, task-add, report), never by hand: a new kind is its code and its registry row.

A rule names a kind as EffectKind.X, so a misspelt one is an AttributeError when the module loads,
not an effect no executor knows; `pulsectl check-config` knows every built-in kind from it, without
importing their modules. The rules are below the registry (the tick imports no executor), so the
names are written here, in core, rather than read from it. An engine's own kinds are its
executors' and stay plain strings. What each kind does: docs/rules.md."""

from __future__ import annotations

from pulse.core.wire.names import Name


class EffectKind(Name):
    """Every effect kind Pulse ships, by name (this module's docstring says whence)."""
    NOOP = "noop"
    EXEC = "exec"
    NOTIFY = "notify"
    RESTART_PROCESS = "restart-process"
    STOP_PROCESS = "stop-process"
    ON_CRASH_LOOP = "on-crash-loop"
    SIGNAL = "signal"
    KEEP_CONFIG = "keep-config"
    RESTORE_CONFIG = "restore-config"
    RESTART_WORKER = "restart-worker"
    ARCHIVE = "archive"
    CLEANUP = "cleanup"
    ROTATE_FILE = "rotate-file"
    TRIM_DIR = "trim-dir"
    ENGINE_PROMOTE = "engine-promote"
    ENGINE_ROLLBACK = "engine-rollback"
    AGENT_RUN = "agent-run"
    REPORT = "report"
    TASK_ADD = "task-add"
