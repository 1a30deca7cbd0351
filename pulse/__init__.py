"""Pulse: a supervisor that keeps an AI agent's host alive.

The folders are the layers (docs/architecture.md draws them):

    core/       what every process shares: config, wire, states, home, logs, procs, clock, sdnotify,
                client
    workers/    the worker processes: harness, and one module each (watcher, tick, executor,
                engine, eventwriter)
    sensing/    the built-in sensors (builtin) and the runner that samples them (runner)
    rules/      the onion (onion), the survival rules (survival), the engine's budget (budget)
    effects/    the effect kinds and what they do (registry, kinds, notify, repairs)
    store/      persistence: every SQL statement (db), blobs (objects), the disk ballast (ballast)
    agents/     tasks for agents (tasks, adapters, agentrun, spend)
    gate/       the agents' safety gate (policy, durable, tools, protocol, server, proxy)
    cli/        pulsectl, one module per command group

The installed import name is ``pulse`` alone; the repository's ``supervisor/`` and ``engine/``
folders install as ``pulse.supervisor`` (pulsed) and ``pulse.engine`` (the agent's side).
"""

__version__ = "0.1.0"
