"""config.toml's agents' tables ([tasks], [[agent]], [budget]) read alone, for the pulsectl commands
that read nothing else (task add, task show, budget): the file's ~25 other tables' Structs are ~5 ms
of such a command's time."""

from pathlib import Path

import msgspec

from pulse.core.config.agentwork import Agent, SpendLimits, Tasks, validate_agents
from pulse.core.config.keys import ConfigError, decode_toml


class AgentTables(msgspec.Struct):
    """config.toml's [tasks], [[agent]] and [budget], read alone (load_agent_tables): each declared as
    Config declares it (tests/test_config_reference.py holds the two alike)."""
    tasks: Tasks = msgspec.field(default_factory=Tasks)
    agent: list[Agent] = msgspec.field(default_factory=list)
    budget: SpendLimits = msgspec.field(default_factory=SpendLimits)


def load_agent_tables(path: Path) -> AgentTables:
    """The agents' tables of config.toml at `path`, decoded and checked (validate_agents) without the
    file's others. Anything wrong in them is said by a whole load of the file (pulse.core.config.whole),
    in the words every other command says it; a bad table they do not read is not theirs to refuse."""
    try:
        raw = decode_toml(path.read_bytes())
        tables = msgspec.convert({k: v for k, v in raw.items() if k in AgentTables.__struct_fields__}, AgentTables,
                                 str_keys=True)
        validate_agents(tables, str(path))
        return tables
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ConfigError):
        from pulse.core.config import whole  # the file's every table: what is wrong, or a file that is missing
        config = whole.load(path)
        return AgentTables(tasks=config.tasks, agent=config.agent, budget=config.budget)
