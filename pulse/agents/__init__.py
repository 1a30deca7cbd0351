"""Work for agents, and the gate that every agent's tool call passes.

Modules: `tasks` (tasks as events, and their projections), `taskview` (one task as a person reads
it: `pulsectl task show` and the task page), `routing` (which agents may take a
task, and how busy each is), `adapters` (how one agent CLI
runs one task), `agentrun` (the agent-run effect), `runcgroup` (a run's own cgroup: who is
the run, and how all of it ends), `runlimits` (what bounds one run: memory, pids, cpu, disk),
`runstall` (a run silent too long: no output, no telemetry), `runfacts` (what a running run has
reported to the telemetry receiver), `runguards` (a run ended mid-run for its reported spend or a
loop), `loopnotice` (a loop only said, when on_loop = "notice"), `runspans` (a finished run as GenAI
trace spans, for an operator's collector), `otel` (where a run sends its telemetry, tagged as the run),
`spend` (spend limits that fail closed: the ledger of what runs reserved and cost), `gate` (the agent's safety gate, pure: it
knows no tool by name), `catalogue` (Pulse's tools as the gate classifies them), `gatestore` (the
gate's facts in events.db), `toolserver` (Pulse's tools, every call through the gate), `taskpolicy`
(what an agent's create_task may make, and which tasks and events a run may see),
`gateserver` (the gate's socket inside Pulse: sessions, run tokens, peer credentials), `gatesockets`
(each agent account's own socket, in a directory only it can enter), `gateproxy`
(`pulsectl mcp`: MCP over stdio, proxied to that socket).
"""
