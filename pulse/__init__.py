"""Pulse: a supervisor that keeps an AI agent's host alive.

The installed import name is ``pulse`` alone; the supervisor and the engine side
live in the repository's ``supervisor/`` and ``engine/`` folders and install as
``pulse.supervisor`` and ``pulse.engine``.
"""

__version__ = "0.1.0"
