"""Execute: the effect kinds and what each does.

Modules: `registry` (one descriptor per built-in kind: params, idempotence, [allow] check,
run, hooks, and the properties other layers read: repair, resource, ack verifies, tells a
person), `kinds` (the kinds that start processes, and the process primitives),
`keeper` (the parent of each process restart-process starts, keeping its output and recording
its exits), `keepers` (the server that forks a keeper per start, so none pays for an interpreter),
`notify` (the notify kind's channels), `repairs` (archive, cleanup, engine promote and
rollback, restart-worker), `configfiles` (keep-config and restore-config: a process's config
files kept known good and restored, and the known-good record folded from their events), `files`
(rotate-file: a watched file rotated or truncated in place), `copytruncate` (the rotation's steps,
which the keeper's own log shares), `dirs` (trim-dir: a watched
directory's oldest files deleted or archived until its bounds hold).
"""

# Every built-in kind's name: what registry.all_kinds() holds (tests/test_cli_imports.py keeps the two
# equal), so that pulsectl checks [allow] kinds without importing every kind's module. Strings, not
# frozenset(EffectKind): this package is imported by every keeper a fresh interpreter starts
# (python -m pulse.effects.keeper), which would pay msgspec's import for the enum (~15 ms).
BUILT_IN_KINDS = frozenset({
    "agent-run", "archive", "cleanup", "engine-promote", "engine-rollback", "exec", "keep-config", "noop",
    "notify", "on-crash-loop", "report", "restart-process", "restart-worker", "restore-config", "rotate-file",
    "signal", "stop-process", "task-add", "trim-dir"})
