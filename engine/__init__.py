"""The engine side of Pulse: the one process that runs the agent's own code.

`pulse.engine.process` is the engine worker; `template/` is what a fresh home's
engine directory starts from. Nothing outside the engine process imports code
from the engine directory.
"""
