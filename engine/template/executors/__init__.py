"""The engine's executors. Each module exports what it defines."""
