"""The agent's safety gate: every tool call an agent makes through `pulsectl mcp` is decided, run
and recorded here, inside Pulse.

`proxy` (`pulsectl mcp`, which every agent run starts) imports `protocol` and nothing else of the
gate, and answers the MCP handshake by hand (`mcpstdio`): the SDK's import would be most of its start.
"""
