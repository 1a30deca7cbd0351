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

import itertools
import json
import sys
import threading
from typing import Any

import msgspec

from pulse.gate.protocol import Call, OperatorAnswer, ToolError

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"
METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32601, -32602, -32603


def operator_answer(reply: Any) -> str:
    """The text of an elicitation reply (a model or its dict), or ToolError when nobody answered."""
    action = getattr(reply, "action", None) or (reply.get("action") if isinstance(reply, dict) else None)
    content = getattr(reply, "content", None) if not isinstance(reply, dict) else reply.get("content")
    if action != "accept" or not isinstance(content, dict) or not isinstance(content.get("answer"), str):
        raise ToolError("NO_ANSWER", f"the operator did not answer ({action or 'no reply'})")
    return content["answer"]


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
    (pulse.gate.proxy.GateConnection). Each request is answered from a thread of its own, so calls
    run at once as the client sends them (the gate's batch rule sees them together)."""

    def __init__(self, link, version: str, answer_schema: dict, offline_tools, default_instructions: str):
        self.link, self.version, self.answer_schema = link, version, answer_schema
        self.offline_tools, self.default_instructions = offline_tools, default_instructions
        self.capabilities: Any = {}
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()                    # stdout, and the tables below
        self.calls: dict[Any, list[Any]] = {}           # the client's request id → [cancelled, the gate's call id]
        self.asked: dict[int, list[Any]] = {}           # our request id → [threading.Event, the response]
        self.asked_ids = itertools.count(1)

    def send(self, message: dict) -> None:
        line = msgspec.json.encode({"jsonrpc": "2.0", **message}) + b"\n"
        with self.lock:
            try:
                self.out.write(line)
                self.out.flush()
            except OSError:
                pass            # the client is gone: its stdin's end ends the session

    def serve(self, first: bytes) -> None:
        """Serve `first` (read already, to tell the era) and the rest of stdin until it ends; then
        the calls still in flight are cancelled, as the client's leaving gives them up."""
        line = first
        while line:
            self.handle(line)
            line = sys.stdin.buffer.readline()
        with self.lock:
            flying = list(self.calls.values())
        for call in flying:
            call[0] = True
            if call[1] is not None:
                self.link.cancel(call[1])

    def handle(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError:
            print(f"pulsectl mcp: not JSON on stdin, ignored: {line[:200]!r}", file=sys.stderr, flush=True)
            return
        if not isinstance(message, dict) or not isinstance(message.get("id", 0), (int, str)):
            return              # JSON-RPC ids are numbers or strings: anything else is no message of MCP's
        method = message.get("method")
        if isinstance(method, str) and "id" in message:
            with self.lock:
                self.calls[message["id"]] = [False, None]
            threading.Thread(target=self._request, args=(message["id"], method, message.get("params")),
                             daemon=True).start()
        elif isinstance(method, str):
            self._notified(method, message.get("params"))
        elif "id" in message:
            self._response(message)

    def _notified(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict) \
                and isinstance(params.get("requestId"), (int, str)):
            with self.lock:
                call = self.calls.get(params["requestId"])
            if call is not None:        # no answer follows: the client gave up on it
                call[0] = True
                if call[1] is not None:
                    self.link.cancel(call[1])

    def _response(self, message: dict) -> None:
        slot = self.asked.get(message.get("id"))
        if slot is not None:
            slot[1] = message
            slot[0].set()

    def _request(self, ident: Any, method: str, params: Any) -> None:
        try:
            result = self._answer(ident, method, params)
            reply = None if result is None else {"id": ident, "result": result}
        except RpcError as err:
            reply = {"id": ident, "error": err.error()}
        except Exception as err:     # a bug of ours answers this request, and the session goes on
            reply = {"id": ident, "error": {"code": INTERNAL_ERROR, "message": f"{type(err).__name__}: {err}"}}
        with self.lock:
            cancelled = self.calls.pop(ident, [True])[0]
        if reply is not None and not cancelled:
            self.send(reply)

    def _answer(self, ident: Any, method: str, params: Any) -> dict | None:
        """The result; None when the call was cancelled."""
        params = params if params is not None else {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "Invalid request parameters")
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            self.link.connect()
            offered = self.link.welcome.tools if self.link.welcome else self.offline_tools()
            return {"tools": [{"name": n, "description": d, "inputSchema": s} for n, d, s in offered]}
        if method == "tools/call":
            return self._call(ident, params)
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

    def _call(self, ident: Any, params: dict) -> dict | None:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            raise RpcError(INVALID_PARAMS, "Invalid request parameters")
        operator = self._ask_operator(arguments) if name == "ask_operator" else None
        call = self.calls.get(ident, [True])
        if call[0]:
            return None                 # cancelled while its person was asked: the gate never sees it
        sent = self.link.send(lambda gate_id: Call(gate_id, name, arguments, operator))
        if isinstance(sent, tuple):
            envelope, text = sent
        else:
            call[1] = sent
            if call[0]:                 # cancelled as it was sent
                self.link.cancel(sent)
            answered = self.link.wait(sent)
            if answered is None:
                return None
            envelope, text = answered
        return {"content": [{"type": "text", "text": text}], "isError": not envelope["ok"], "structuredContent": envelope}

    def _ask_operator(self, arguments: dict | None) -> OperatorAnswer | None:
        """The client's person asked (elicitation/create) before the call goes to the gate; None when the
        client declared no form elicitation: nobody can answer (the tool says so)."""
        question = (arguments or {}).get("question")
        if not may_elicit(self.capabilities) or not isinstance(question, str) or not question:
            return None                     # the gate refuses a call without a question, INVALID_INPUT
        ident = next(self.asked_ids)
        slot: list[Any] = [threading.Event(), None]
        self.asked[ident] = slot
        try:
            self.send({"id": ident, "method": "elicitation/create",
                       "params": {"mode": "form", "message": question, "requestedSchema": self.answer_schema}})
            slot[0].wait()
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
