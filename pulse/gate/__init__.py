"""The agent's safety gate: every tool call an agent makes through `pulsectl mcp` is decided, run
and recorded here, inside Pulse.

Modules: `policy` (the gate itself, pure: every call classified, each session's `GateSession`
deciding on the `HostLedger` folded from every session's facts; it knows no tool by name),
`durable` (those facts in events.db, each decision in one transaction), `catalogue` (Pulse's tools
as the gate classifies them), `tools` (what each tool does, and a session's calls through the gate:
`ToolSession`), `protocol` (the typed messages between `pulsectl mcp` and the gate's socket),
`runs` (a run's pass to the gate, handed to the executor's runs, and the gate's verdict on a run),
`server` (the gate's socket inside Pulse: client connections, peer credentials, identity, limits),
`sockets` (where the gate's sockets are, and each agent account's own, in a directory only it can
enter), `proxy` (`pulsectl mcp`: MCP over stdio, proxied to that socket; it imports `protocol` and
nothing else of the gate), `mcpstdio` (the proxy's MCP server for the initialize handshake, by hand:
the SDK's import would be most of every run's `pulsectl mcp` start).
"""
