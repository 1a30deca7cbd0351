"""Execute: the effect kinds and what each does.

Modules: `kinds` (the built-in kinds and the allow-list), `notify` (the notify kind's
channels), `repairs` (archive, cleanup, engine promote and rollback, restart-worker).
"""
