"""The engine side of Pulse: what the agent's own code sees, and its directory's lifecycle.

`template/` is what a fresh home's engine directory starts from. The engine worker that runs
this code is `pulse.workers.enginehost`; nothing outside it imports code from the engine directory.
"""
