"""`pulsectl mcp`: a thin proxy. MCP over stdio on one side (by hand for the initialize handshake,
pulse.gate.mcpstdio; the official `mcp` SDK, imported only here, for a 2026-07-28 connection), the
gate's unix socket on the other (pulse.gate.server, served inside Pulse), spoken in
pulse.gate.protocol's messages.

Every agent run starts one, so its start is every run's: it imports the protocol and the home's
leaf module, and nothing of the store, the effect registry, the config loader (unless the
operator's shell must find the socket from the home) or click (pulse.cli.main serves a plain
`pulsectl mcp` without it; tests/test_cli_imports.py holds it so).

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

import importlib.util
import io
import itertools
import json
import os
import socket
import sys
import threading
from typing import Any, Callable

from pulse import __version__
from pulse.core.home import GATE_SOCKET_ENV, RUN_TOKEN_ENV, Paths, resolve_home
from pulse.gate import mcpstdio, protocol
from pulse.gate.protocol import Answer, Call, Cancel, Hello, OperatorAnswer, Question, Refused, ToolError, Welcome

# Imports inside functions: every agent run starts `pulsectl mcp`, so its start is every run's: the
# mcp SDK (~1.5 s) only for a 2026-07-28 connection, pulse.gate.tools (~200 ms) only for tools/list
# offline, the config loader only when the socket must be found from the home.

GATE_UNAVAILABLE = "GATE_UNAVAILABLE"
OPERATOR_KEY = "pulse-operator"
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "description": "Your answer."}},
                 "required": ["answer"]}
DEFAULT_INSTRUCTIONS = "Pulse's tools for this host, through its safety gate (not reachable right now: retry)."
MAX_REPLY = 1 << 24


def failure(code: str, message: str, **details) -> tuple[dict, str]:
    err = ToolError(code, message, **details)
    return err.envelope(), err.text()


class GateConnection:
    """The proxy's client connection to the gate: one session; requests matched to answers by id.
    Blocking, with a reader thread: the proxy's start pays for no event loop (the SDK's loop, for a
    2026-07-28 connection, calls it through worker threads)."""

    def __init__(self, path: str, hello: Hello):
        self.path, self.hello = path, hello
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()            # one connect at a time
        self.write_lock = threading.Lock()
        self.welcome: Welcome | None = None
        self.refusal: Refused | None = None
        self.waiting: dict[int, list[Any]] = {}  # id → [threading.Event, Answer, cancelled]
        self.ids = itertools.count(1)
        self.last_error = "not tried yet"
        self.busy: Refused | None = None         # the gate's GATE_BUSY at the last try, if it was

    def connect(self) -> bool:
        with self.lock:
            if self.sock is not None:
                return True
            sock = socket.socket(socket.AF_UNIX)
            try:
                sock.connect(self.path)
                try:
                    sock.sendall(protocol.encode(self.hello))
                except OSError:
                    pass        # refused before its hello was read (GATE_BUSY): the refusal waits to be read
                reader = sock.makefile("rb")
                line = reader.readline(MAX_REPLY)
                if not line.endswith(b"\n"):
                    raise EOFError("the gate closed the connection")
                first = protocol.reply_decoder.decode(line)
            except (OSError, EOFError, ValueError) as err:
                sock.close()
                self.last_error = f"{type(err).__name__}: {err}"
                return False
            if not isinstance(first, Welcome):
                if isinstance(first, Refused) and first.retry:      # GATE_BUSY: the next call tries again
                    self.last_error = f"{first.code}: {first.message}"
                    self.busy = first
                elif isinstance(first, Refused):
                    self.refusal = first
                else:
                    self.last_error = f"the gate opened with a {type(first).__name__}, not a welcome"
                sock.close()
                return False
            self.busy = None
            self.sock, self.welcome = sock, first
        task = f" (task {first.task})" if first.task else ""
        ignored = f"; {first.ignored}" if first.ignored else ""
        print(f"pulsectl mcp: session {first.session} of {first.agent}{task} through the gate at "
              f"{self.path}{ignored}", file=sys.stderr, flush=True)
        threading.Thread(target=self._read, args=(reader, sock), name="gate-reader", daemon=True).start()
        return True

    def _read(self, reader, sock: socket.socket) -> None:
        try:
            while (line := reader.readline(MAX_REPLY)).endswith(b"\n"):
                reply = protocol.reply_decoder.decode(line)
                if isinstance(reply, Refused):      # RUN_ENDED: the run is over, and so is this session
                    self.refusal = reply
                    continue
                slot = self.waiting.get(reply.id) if isinstance(reply, Answer) else None
                if slot is not None:
                    slot[1] = reply
                    slot[0].set()
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                if self.sock is sock:
                    self.sock = None
            sock.close()
            for slot in list(self.waiting.values()):     # the gate went away mid-call: they answer unavailable
                slot[0].set()

    def send(self, make: Callable[[int], Call | Question]) -> int | tuple[dict, str]:
        """Send the request `make(id)` makes: its id, or (the envelope, the text) of why it was not sent."""
        if self.refusal is not None:
            return failure(self.refusal.code, self.refusal.message)
        if not self.connect():
            if self.refusal is not None:
                return failure(self.refusal.code, self.refusal.message)
            if self.busy is not None:
                return failure(self.busy.code, self.busy.message, retry=True)
            return failure(GATE_UNAVAILABLE, f"Pulse's gate is not reachable at {self.path} ({self.last_error}); "
                           "nothing was done: retry once pulsed runs", retry=True)
        ident = next(self.ids)
        slot: list[Any] = [threading.Event(), None, False]
        self.waiting[ident] = slot
        sock = self.sock
        try:
            with self.write_lock:
                sock.sendall(protocol.encode(make(ident)))
        except (OSError, AttributeError):
            slot[0].set()               # gone before it was sent: answered unavailable below
        return ident

    def wait(self, ident: int) -> tuple[dict, str] | None:
        """(the envelope, the text the model sees) of the answer to `ident`; None once it was cancelled."""
        slot = self.waiting[ident]
        try:
            slot[0].wait()
        finally:
            self.waiting.pop(ident, None)
        answer: Answer | None = slot[1]
        if slot[2]:
            return None
        if answer is None and self.refusal is not None:
            return failure(self.refusal.code, self.refusal.message)
        if answer is None:
            return failure(GATE_UNAVAILABLE, "the gate went away during the call; whether a write acted is "
                           "for a read to tell (its effect settles it): retry", retry=True)
        return answer.envelope, answer.text or json.dumps(answer.envelope, default=str)

    def cancel(self, ident: int) -> None:
        """The client gave up on the call: the gate records it (a write's effect settles it)."""
        slot = self.waiting.get(ident)
        if slot is None:
            return
        slot[2] = True
        sock = self.sock
        try:
            with self.write_lock:
                sock.sendall(protocol.encode(Cancel(ident)))
        except (OSError, AttributeError):
            pass
        slot[0].set()

    def request(self, make: Callable[[int], Call | Question]) -> tuple[dict, str] | None:
        sent = self.send(make)
        return sent if isinstance(sent, tuple) else self.wait(sent)


def offline_tools() -> list[tuple[str, str, dict]]:
    """Every tool, for a client that lists them while the gate is out of reach (each call then
    answers GATE_UNAVAILABLE). Imported only then: the tools' module brings the store and the
    effect registry, which a proxy that reaches the gate never needs (the gate's welcome lists them)."""
    from pulse.gate.tools import tool_list
    return tool_list(None)


def gate_socket(home) -> str | None:
    """Where the gate is: a run is told (PULSE_GATE_SOCKET); the operator's shell finds it from the
    home ([gate] socket_dir in its config). None, said on stderr, when there is no home."""
    if socket_path := os.environ.get(GATE_SOCKET_ENV):
        return socket_path
    from pulse.gate.sockets import socket_path as gate_socket_path
    root = resolve_home(str(home) if home is not None else None)
    if not root.is_dir():
        print(f"pulsectl: no Pulse home at {root} (run `pulsectl init`, or start pulsed)", file=sys.stderr)
        return None
    paths = Paths.for_client(root)
    from pulse.core import config as configmod  # only here: a run's proxy never reads the config
    try:
        shared = configmod.load(paths.config).gate.socket_dir
    except (configmod.ConfigError, OSError):
        shared = ""                    # the gate, if it runs, says what is wrong with it
    return gate_socket_path(paths, shared)


def run(home, agent: str | None) -> int:
    """`pulsectl mcp`: one session on stdin/stdout, until the client closes it. In an agent run the
    session is the run's agent and task, by the run token in its environment; the operator's own
    sessions may name an agent (`--agent`, else PULSE_AGENT, else operator-shell). The exit code."""
    socket_path = gate_socket(home)
    if socket_path is None:
        return 1
    if importlib.util.find_spec("mcp") is None:   # an install requirement; say so plainly if it is missing
        print("pulsectl: the MCP server needs the `mcp` package (pip install 'mcp>=2,<3')", file=sys.stderr)
        return 1
    # PULSE_TASK is not sent: a task is the run's, and only its token says which.
    serve(socket_path, Hello(os.environ.get(RUN_TOKEN_ENV) or None, agent or os.environ.get("PULSE_AGENT") or None))
    return 0


def serve(socket_path: str, hello: Hello) -> None:
    """Serve one session on stdin/stdout until the client closes it: by hand (pulse.gate.mcpstdio)
    when it opens with the initialize handshake, with the SDK when it opens in the 2026-07-28 era."""
    link = GateConnection(socket_path, hello)
    first = sys.stdin.buffer.readline()
    if not first:
        return                      # the client left before it said anything
    connect_and_say(link)
    if mcpstdio.opens_modern_era(first):
        serve_sdk(link, first)
        return
    mcpstdio.StdioServer(link, __version__, ANSWER_SCHEMA, offline_tools, DEFAULT_INSTRUCTIONS).serve(first)


def connect_and_say(link: GateConnection) -> None:
    """The session's first connection to the gate, and on stderr what became of it."""
    link.connect()
    if link.refusal is not None:
        print(f"pulsectl mcp: the gate refused this session: {link.refusal.code}: "
              f"{link.refusal.message}", file=sys.stderr, flush=True)
    elif link.welcome is None:
        print(f"pulsectl mcp: the gate is not reachable at {link.path} ({link.last_error}); "
              "calls answer GATE_UNAVAILABLE until it is", file=sys.stderr, flush=True)


class SdkStdin:
    """stdin for the SDK's stdio_server: the first line, read already, then the rest."""

    def __init__(self, first: bytes):
        self.first = first

    async def __aiter__(self):
        import anyio
        yield self.first.decode("utf-8", errors="replace")
        async for line in anyio.wrap_file(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")):
            yield line


def serve_sdk(link: GateConnection, first: bytes) -> None:
    """Serve one 2026-07-28 session with the official SDK, from its first line (read already)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp_types.version import is_version_at_least



    async def list_tools(ctx, params) -> types.ListToolsResult:
        await anyio.to_thread.run_sync(link.connect)
        offered = link.welcome.tools if link.welcome else offline_tools()
        return types.ListToolsResult(tools=[types.Tool(name=n, description=d, input_schema=s) for n, d, s in offered])

    async def call_tool(ctx, params) -> types.CallToolResult | types.InputRequiredResult:
        operator: OperatorAnswer | None = None
        if params.name == "ask_operator":
            round_ = await operator_round(ctx, params)
            if isinstance(round_, types.InputRequiredResult):
                # The client asks its person and calls again with the answer (the call the gate
                # judges). This round is a call too: the gate records it, and it changes no state.
                await request(Question)
                return round_
            operator = round_
        envelope, text = await request(lambda ident: Call(ident, params.name, params.arguments, operator))
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=envelope,
                                    is_error=not envelope["ok"])

    async def request(make) -> tuple[dict, str]:
        sent = await anyio.to_thread.run_sync(link.send, make)
        if isinstance(sent, tuple):
            return sent
        try:
            return await anyio.to_thread.run_sync(link.wait, sent, abandon_on_cancel=True)
        except BaseException:       # the client cancelled the call: the gate records it
            link.cancel(sent)
            raise

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
                return OperatorAnswer(answer=mcpstdio.operator_answer(reply))
            except ToolError as err:
                return OperatorAnswer(error=(err.code, err.message))
            except Exception as err:   # the connection cannot carry it after all
                return OperatorAnswer(error=("NO_OPERATOR", f"no operator can answer in this session ({type(err).__name__})"))
        answer = (params.input_responses or {}).get(OPERATOR_KEY)
        if answer is None:
            form = types.ElicitRequestFormParams(message=question, requested_schema=ANSWER_SCHEMA)
            return types.InputRequiredResult(input_requests={OPERATOR_KEY: types.ElicitRequest(params=form)})
        try:
            return OperatorAnswer(answer=mcpstdio.operator_answer(answer))
        except ToolError as err:
            return OperatorAnswer(error=(err.code, err.message))

    async def main() -> None:
        server = Server("pulse", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool,
                        instructions=link.welcome.instructions if link.welcome else DEFAULT_INSTRUCTIONS)
        async with stdio_server(stdin=SdkStdin(first)) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
