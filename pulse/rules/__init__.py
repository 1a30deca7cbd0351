"""Understand: rules composed as an onion.

Modules: `onion` (composing rules around an innermost layer), `survival` (the survival
rules, the onion's outer layers), `knowngood` (when processWatchdog keeps a process's config
known good, and when it restores it), `budget` (the engine's effect budget, applied by the tick),
`guardview` (the processes, configs and watched files as status shows them), `processstate` (a
guarded process's states and crash-loop arithmetic, stdlib only).
"""
