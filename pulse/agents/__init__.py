"""Work for agents: tasks, the agent CLIs that take them, their runs and what they may spend.

Modules: `tasks` (tasks as events, and their projections), `taskview` (one task as a person reads
it: `pulsectl task show` and the task page), `routing` (which agents may take a
task, and how busy each is), `adapters` (how one agent CLI
runs one task), `agentrun` (the agent-run effect), `runcgroup` (a run's own cgroup: who is
the run, and how all of it ends), `runlimits` (what bounds one run: memory, pids, cpu, disk),
`runstall` (a run silent too long: no output, no telemetry), `runfacts` (what a running run has
reported to the telemetry receiver), `runguards` (a run ended mid-run for its reported spend or a
loop), `loopnotice` (a loop only said, when on_loop = "notice"), `runspans` (a finished run
as GenAI trace spans, for an operator's collector), `otel` (where a run sends its telemetry,
tagged as the run), `spend` (spend limits that fail closed: the ledger of what runs reserved and cost), `taskpolicy`
(what an agent's create_task may make, and which tasks and events a run may see).
The gate every tool call passes is pulse.gate, a layer above this one: a run reaches it through
the RunGate the executor hands it (EffectContext.gate).
"""
