"""MCP over stdio for `pulsectl mcp`, in the initialize handshake's protocol versions (2024-11-05 to
2025-11-25), which every agent CLI Pulse runs speaks: newline-delimited JSON-RPC 2.0 on stdin and
stdout, answering as the official `mcp` SDK's server does.

By hand rather than with the SDK: importing the SDK's server costs ~0.6 s on 2 cores (its pydantic
models of every protocol version, and starlette, uvicorn and click through its HTTP transport), and
every agent run starts a `pulsectl mcp`. A connection that opens in the stateless 2026-07-28 era (a
request carrying the protocol version in its `_meta`, as the SDK tells the eras apart) is served by
the SDK instead (pulse.gate.proxy.serve_sdk).

What the proxy offers: `initialize`, `ping`, `tools/list`, `tools/call` (concurrently, each one
cancellable by `notifications/cancelled`) and, for ask_operator, the `elicitation/create` request
to a client that declared form elicitation; any other method answers -32601.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import msgspec

from pulse.gate.protocol import Call, OperatorAnswer, ToolError

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"
METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32601, -32602, -32603


class RpcError(Exception):
    """A request answered with a JSON-RPC error (the SDK's codes, messages and data)."""

    def __init__(self, code: int, message: str, data: Any = ""):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def error(self) -> dict:
        return {"code": self.code, "message": self.message, "data": self.data}


def opens_modern_era(line: bytes) -> bool:
    """The first message opens a 2026-07-28 connection: a request other than initialize whose
    params' `_meta` names its protocol version (the SDK's own rule)."""
    try:
        message = json.loads(line)
    except ValueError:
        return False
    if not isinstance(message, dict) or message.get("method") in (None, "initialize"):
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and MODERN_ENVELOPE_KEY in meta


def may_elicit(capabilities: Any) -> bool:
    """The client declared form elicitation (an empty `elicitation` is form, as 2025-06-18 has it)."""
    elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
    if not isinstance(elicitation, dict):
        return False
    return "form" in elicitation or "url" not in elicitation


class StdioServer:
    """One MCP session on stdin/stdout, each tool call carried to the gate by `link`
    (pulse.gate.proxy.GateConnection)."""

    def __init__(self, link, version: str, answer_schema: dict, offline_tools, default_instructions: str):
        self.link, self.version, self.answer_schema = link, version, answer_schema
        self.offline_tools, self.default_instructions = offline_tools, default_instructions
        self.capabilities: Any = {}
        self.out = sys.stdout.buffer
        self.write_lock = anyio.Lock()
        self.calls: dict[Any, anyio.CancelScope] = {}
        self.asked: dict[int, list[Any]] = {}          # our request id → [anyio.Event, the response]
        self.asked_ids = iter(range(1, 1 << 62))
        self.group = None

    async def send(self, message: dict) -> None:
        line = msgspec.json.encode({"jsonrpc": "2.0", **message}) + b"\n"
        async with self.write_lock:
            try:
                await anyio.to_thread.run_sync(self._write, line)
            except OSError:
                pass            # the client is gone: its stdin's end ends the session

    def _write(self, line: bytes) -> None:
        self.out.write(line)
        self.out.flush()

    async def run(self, group, lines) -> None:
        """Serve the lines of stdin (an async iterator of bytes) until it ends."""
        self.group = group
        async for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                print(f"pulsectl mcp: not JSON on stdin, ignored: {line[:200]!r}", file=sys.stderr, flush=True)
                continue
            if not isinstance(message, dict) or not isinstance(message.get("id", 0), (int, str)):
                continue        # JSON-RPC ids are numbers or strings: anything else is no message of MCP's
            method = message.get("method")
            if isinstance(method, str) and "id" in message:
                group.start_soon(self._request, message["id"], method, message.get("params"))
            elif isinstance(method, str):
                self._notified(method, message.get("params"))
            elif "id" in message:
                self._response(message)

    def _notified(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict) \
                and isinstance(params.get("requestId"), (int, str)):
            scope = self.calls.get(params["requestId"])
            if scope is not None:       # no answer follows: the client gave up on it
                scope.cancel()

    def _response(self, message: dict) -> None:
        slot = self.asked.get(message.get("id"))
        if slot is not None:
            slot[1] = message
            slot[0].set()

    async def _request(self, ident: Any, method: str, params: Any) -> None:
        with anyio.CancelScope() as scope:
            self.calls[ident] = scope
            try:
                result = await self._answer(method, params)
            except RpcError as err:
                await self.send({"id": ident, "error": err.error()})
                return
            except Exception as err:     # a bug of ours answers this request, and the session goes on
                await self.send({"id": ident, "error": {"code": INTERNAL_ERROR, "message": f"{type(err).__name__}: {err}"}})
                return
            finally:
                self.calls.pop(ident, None)
            await self.send({"id": ident, "result": result})

    async def _answer(self, method: str, params: Any) -> dict:
        params = params if params is not None else {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "Invalid request parameters")
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            await self.link.connect(self.group)
            offered = self.link.welcome.tools if self.link.welcome else self.offline_tools()
            return {"tools": [{"name": n, "description": d, "inputSchema": s} for n, d, s in offered]}
        if method == "tools/call":
            return await self._call(params)
        raise RpcError(METHOD_NOT_FOUND, "Method not found", method)

    def _initialize(self, params: dict) -> dict:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(INVALID_PARAMS, "Invalid request parameters")
        self.capabilities = params.get("capabilities") or {}
        welcome = self.link.welcome
        return {"capabilities": {"tools": {"listChanged": False}},
                "instructions": welcome.instructions if welcome else self.default_instructions,
                "protocolVersion": asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1],
                "serverInfo": {"name": "pulse", "version": self.version}}

    async def _call(self, params: dict) -> dict:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            raise RpcError(INVALID_PARAMS, "Invalid request parameters")
        operator = await self._ask_operator(arguments) if name == "ask_operator" else None
        envelope, text = await self.link.request(self.group, lambda ident: Call(ident, name, arguments, operator))
        return {"content": [{"type": "text", "text": text}], "isError": not envelope["ok"], "structuredContent": envelope}

    async def _ask_operator(self, arguments: dict | None) -> OperatorAnswer | None:
        """The client's person asked (elicitation/create) before the call goes to the gate; None when the
        client declared no form elicitation: nobody can answer (the tool says so)."""
        from pulse.gate.proxy import operator_answer
        question = (arguments or {}).get("question")
        if not may_elicit(self.capabilities) or not isinstance(question, str) or not question:
            return None                     # the gate refuses a call without a question, INVALID_INPUT
        ident = next(self.asked_ids)
        slot: list[Any] = [anyio.Event(), None]
        self.asked[ident] = slot
        try:
            await self.send({"id": ident, "method": "elicitation/create",
                             "params": {"mode": "form", "message": question, "requestedSchema": self.answer_schema}})
            await slot[0].wait()
        finally:
            self.asked.pop(ident, None)
        reply = slot[1] or {}
        if "result" not in reply:
            why = (reply.get("error") or {}).get("message") if isinstance(reply.get("error"), dict) else None
            return OperatorAnswer(error=("NO_OPERATOR", f"no operator can answer in this session ({why or 'no reply'})"))
        try:
            return OperatorAnswer(answer=operator_answer(reply["result"]))
        except ToolError as err:
            return OperatorAnswer(error=(err.code, err.message))


async def stdin_lines(first: bytes):
    """The first line (read already, to tell the era) and then the rest of stdin."""
    yield first
    stdin = anyio.wrap_file(sys.stdin.buffer)
    while line := await stdin.readline():
        yield line

