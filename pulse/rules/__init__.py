"""Understand: rules composed as an onion.

Modules: `onion` (composing rules around an innermost layer), `survival` (the survival
rules, the onion's outer layers), `budget` (the engine's effect budget, applied by the tick).
"""
