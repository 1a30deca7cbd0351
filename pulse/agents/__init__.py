"""Work for agents: tasks, the agent CLIs that take them, their runs and what they may spend.

The gate every tool call passes is pulse.gate, a layer above this one: a run reaches it through
the RunGate the executor hands it (EffectContext.gate).
"""
