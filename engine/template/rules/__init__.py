"""The engine's rules. Each module exports what it defines."""
