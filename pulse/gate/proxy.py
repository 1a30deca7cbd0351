"""`pulsectl mcp`: a thin proxy. MCP over stdio on one side (the official `mcp` SDK, imported only
here), the gate's unix socket on the other (pulse.agents.gateserver, served inside Pulse).

The proxy decides nothing and opens no store: who the session is, what a call may do and every
fact about it are the gate's. It only carries calls, and does what only the MCP connection can:
asks the client's person an ask_operator question, then sends the answer with the call.

Fails closed: while the gate cannot be reached (pulsed down, the executor restarting) every call
answers GATE_UNAVAILABLE, and the agent may retry; the next call connects again (a new session of
the same run, which inherits what the last one left unverified). A refused session (no live run
token and not the operator's uid; a run that ended, RUN_ENDED) answers the gate's refusal code to
every call; GATE_BUSY (the gate holds all the connections it allows) answers that call, and the
next one tries again.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

from pulse.agents.toolserver import ToolError, tool_list

GATE_UNAVAILABLE = "GATE_UNAVAILABLE"
OPERATOR_KEY = "pulse-operator"
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "description": "Your answer."}},
                 "required": ["answer"]}
DEFAULT_INSTRUCTIONS = "Pulse's tools for this host, through its safety gate (not reachable right now: retry)."


def operator_answer(reply: Any) -> str:
    """The text of an elicitation reply (a model or its dict), or ToolError when nobody answered."""
    action = getattr(reply, "action", None) or (reply.get("action") if isinstance(reply, dict) else None)
    content = getattr(reply, "content", None) if not isinstance(reply, dict) else reply.get("content")
    if action != "accept" or not isinstance(content, dict) or not isinstance(content.get("answer"), str):
        raise ToolError("NO_ANSWER", f"the operator did not answer ({action or 'no reply'})")
    return content["answer"]


def failure(code: str, message: str, **details) -> tuple[dict, str]:
    err = ToolError(code, message, **details)
    return err.envelope(), f"{err.code}: {err.message}"


class GateLink:
    """The connection to the gate: one session; requests matched to replies by id."""

    def __init__(self, path: str, hello: dict):
        self.path, self.hello = path, hello
        self.stream = None
        self.welcome: dict | None = None
        self.refusal: dict | None = None
        self.waiting: dict[int, Any] = {}       # id → [anyio.Event, reply]
        self.ids = itertools.count(1)
        self.last_error = "not tried yet"
        self.busy: dict | None = None           # the gate's GATE_BUSY at the last try, if it was

    async def connect(self, group) -> bool:
        import anyio
        from anyio.streams.buffered import BufferedByteReceiveStream
        if self.stream is not None:
            return True
        try:
            stream = await anyio.connect_unix(self.path)
            reader = BufferedByteReceiveStream(stream)
            try:
                await stream.send(json.dumps(self.hello).encode() + b"\n")
            except (anyio.BrokenResourceError, OSError):
                pass        # refused before its hello was read (GATE_BUSY): the refusal waits to be read
            first = json.loads(await reader.receive_until(b"\n", 1 << 24))
        except (OSError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, ValueError) as err:
            self.last_error = f"{type(err).__name__}: {err}"
            return False
        if first.get("op") == "refused":
            if first.get("retry"):      # GATE_BUSY: the next call tries again
                self.last_error = f"{first.get('code')}: {first.get('message')}"
                self.busy = first
            else:
                self.refusal = first
            await stream.aclose()
            return False
        self.busy = None
        self.stream, self.welcome = stream, first
        task = f" (task {first['task']})" if first.get("task") else ""
        ignored = f"; {first['ignored']}" if first.get("ignored") else ""
        print(f"pulsectl mcp: session {first['session']} of {first['agent']}{task} through the gate at "
              f"{self.path}{ignored}", file=sys.stderr, flush=True)
        group.start_soon(self._read, reader, stream)
        return True

    async def _read(self, reader, stream) -> None:
        import anyio
        try:
            while True:
                reply = json.loads(await reader.receive_until(b"\n", 1 << 24))
                if reply.get("op") == "refused":      # RUN_ENDED: the run is over, and so is this session
                    self.refusal = reply
                    continue
                slot = self.waiting.get(reply.get("id"))
                if slot is not None:
                    slot[1] = reply
                    slot[0].set()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError,
                OSError, ValueError):
            pass
        finally:
            if self.stream is stream:
                self.stream = None
            for slot in self.waiting.values():     # the gate went away mid-call: they answer unavailable
                slot[0].set()

    async def request(self, group, message: dict) -> tuple[dict, str]:
        import anyio
        if self.refusal is not None:
            return failure(self.refusal["code"], self.refusal["message"])
        if not await self.connect(group):
            if self.refusal is not None:
                return failure(self.refusal["code"], self.refusal["message"])
            if self.busy is not None:
                return failure(self.busy["code"], self.busy["message"], retry=True)
            return failure(GATE_UNAVAILABLE, f"Pulse's gate is not reachable at {self.path} ({self.last_error}); "
                           "nothing was done: retry once pulsed runs", retry=True)
        ident = next(self.ids)
        slot: list[Any] = [anyio.Event(), None]
        self.waiting[ident] = slot
        stream = self.stream
        try:
            await stream.send(json.dumps({**message, "id": ident}, default=str).encode() + b"\n")
            await slot[0].wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        except BaseException:           # the client cancelled the call: the gate records it
            with anyio.CancelScope(shield=True):
                try:
                    await stream.send(json.dumps({"op": "cancel", "of": ident}).encode() + b"\n")
                except Exception:
                    pass
            raise
        finally:
            self.waiting.pop(ident, None)
        if slot[1] is None and self.refusal is not None:
            return failure(self.refusal["code"], self.refusal["message"])
        if slot[1] is None:
            return failure(GATE_UNAVAILABLE, "the gate went away during the call; whether a write acted is "
                           "for a read to tell (its effect settles it): retry", retry=True)
        return slot[1]["envelope"], slot[1].get("text") or json.dumps(slot[1]["envelope"], default=str)


def serve(socket_path: str, hello: dict) -> None:
    """Serve one session on stdin/stdout until the client closes it."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp_types.version import is_version_at_least

    from pulse import __version__

    link = GateLink(socket_path, hello)
    group_holder: list = []

    async def list_tools(ctx, params) -> types.ListToolsResult:
        await link.connect(group_holder[0])
        offered = link.welcome["tools"] if link.welcome else tool_list(None)
        return types.ListToolsResult(tools=[types.Tool(name=n, description=d, input_schema=s) for n, d, s in offered])

    async def call_tool(ctx, params) -> types.CallToolResult | types.InputRequiredResult:
        message: dict[str, Any] = {"op": "call", "name": params.name, "args": params.arguments}
        if params.name == "ask_operator":
            round_ = await operator_round(ctx, params)
            if isinstance(round_, types.InputRequiredResult):
                # The client asks its person and calls again with the answer (the call the gate
                # judges). This round is a call too: the gate records it, and it changes no state.
                await link.request(group_holder[0], {"op": "question"})
                return round_
            if round_ is not None:
                message["operator"] = round_
        envelope, text = await link.request(group_holder[0], message)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=envelope,
                                    is_error=not envelope["ok"])

    async def operator_round(ctx, params):
        """How ask_operator reaches a person: on 2026-07-28 connections the question goes back
        inline (InputRequiredResult) and the answer comes with the retried call; on older ones, a
        server-to-client elicitation request, asked here before the call goes to the gate. None
        when the client declared no form elicitation: nobody can answer."""
        caps = ctx.session.client_capabilities
        elicitation = caps.elicitation if caps is not None else None
        if elicitation is None or (elicitation.form is None and elicitation.url is not None):
            return None
        question = (params.arguments or {}).get("question")
        if not isinstance(question, str) or not question:
            return None                     # the gate refuses the call, INVALID_INPUT
        if not is_version_at_least(ctx.protocol_version or "", "2026-07-28"):
            try:
                reply = await ctx.session.elicit_form(question, ANSWER_SCHEMA, related_request_id=ctx.request_id)
                return {"answer": operator_answer(reply)}
            except ToolError as err:
                return {"error": [err.code, err.message]}
            except Exception as err:   # the connection cannot carry it after all
                return {"error": ["NO_OPERATOR", f"no operator can answer in this session ({type(err).__name__})"]}
        answer = (params.input_responses or {}).get(OPERATOR_KEY)
        if answer is None:
            form = types.ElicitRequestFormParams(message=question, requested_schema=ANSWER_SCHEMA)
            return types.InputRequiredResult(input_requests={OPERATOR_KEY: types.ElicitRequest(params=form)})
        try:
            return {"answer": operator_answer(answer)}
        except ToolError as err:
            return {"error": [err.code, err.message]}

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group_holder.append(group)
            await link.connect(group)
            if link.refusal is not None:
                print(f"pulsectl mcp: the gate refused this session: {link.refusal['code']}: "
                      f"{link.refusal['message']}", file=sys.stderr, flush=True)
            elif link.welcome is None:
                print(f"pulsectl mcp: the gate is not reachable at {socket_path} ({link.last_error}); "
                      "calls answer GATE_UNAVAILABLE until it is", file=sys.stderr, flush=True)
            server = Server("pulse", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool,
                            instructions=(link.welcome or {}).get("instructions", DEFAULT_INSTRUCTIONS))
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            group.cancel_scope.cancel()

    anyio.run(main)
