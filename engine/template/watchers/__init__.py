"""The engine's watchers. Each module exports what it defines."""
