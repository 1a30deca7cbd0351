"""The wire between `pulsectl mcp` (pulse.gate.proxy) and the gate (pulse.gate.server): every message
either side sends, as a typed struct, one JSON object per line, tagged by its "op".

The proxy imports this and nothing else of Pulse's gate: every agent run starts one, so what it
imports is paid at every run's start (scripts/bench_mcp_start.py). Keep it to msgspec and the stdlib.

A connection opens with `Hello` (a session: `pulsectl mcp`) or `Reset` (`pulsectl gate-reset`,
tokenless, the operator's uid only). A hello is answered `Welcome` or `Refused` (and the connection
closes; GATE_BUSY, retry, when the gate holds as many connections as [gate] max_sessions,
max_sessions_per_uid or max_sessions_per_pid allow, before the hello is read); a reset `ResetDone`
or `Refused`. Then the proxy sends `Call`, `Question` (an ask_operator question round, recorded) and
`Cancel`; the gate answers each call or question with an `Answer` of the same id, in any order
(calls run concurrently, as the gate's batch rule expects). When a run ends, its sessions' calls in
flight are answered RUN_ENDED, then `Refused` RUN_ENDED comes unasked and the connection closes.
"""

from __future__ import annotations

from typing import Any

import msgspec

VERSION = 1        # the gate's, in its Welcome


class ToolError(Exception):
    """A tool call that failed. `acted` (writes): whether the host may have changed anyway."""

    def __init__(self, code: str, message: str, acted: bool = False, **details):
        super().__init__(message)
        self.code, self.message, self.acted, self.details = code, message, acted, details

    def envelope(self) -> dict:
        error = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
        return {"ok": False, "error": error}

    def text(self) -> str:
        """What the model reads: the stable code first."""
        return f"{self.code}: {self.message}"


class Message(msgspec.Struct, tag_field="op", omit_defaults=True):
    pass


# -- the proxy (or `pulsectl gate-reset`) → the gate ----------------------------------------------------------

class Hello(Message, tag="hello"):
    """A session opens. `token`: the run's capability (PULSE_RUN_TOKEN), which alone says which run
    it is; `agent`: who the operator's own session acts as (--agent), ignored for a run."""
    token: str | None = None
    agent: str | None = None


class Reset(Message, tag="reset"):
    """`pulsectl gate-reset`: one session (its full id) or every session of an agent."""
    session: str | None = None
    agent: str | None = None
    keep_progress: bool = False


class OperatorAnswer(msgspec.Struct, omit_defaults=True):
    """ask_operator: the proxy asked its client's person first; the answer, or why there is none
    ((code, message))."""
    answer: str | None = None
    error: tuple[str, str] | None = None


class Call(Message, tag="call"):
    id: int
    name: Any = None           # as the client sent it: the gate records what no tool of ours is called
    args: Any = None
    operator: OperatorAnswer | None = None


class Question(Message, tag="question"):
    id: int


class Cancel(Message, tag="cancel"):
    of: int


# -- the gate → the proxy ---------------------------------------------------------------------------------

class Welcome(Message, tag="welcome"):
    session: str
    agent: str
    task: str
    run: str | None
    protocol: int
    tools: list[tuple[str, str, dict]]      # (name, description, input schema), as MCP lists them
    instructions: str
    ignored: str | None = None             # what the hello asked that a run's session does not get


class Refused(Message, tag="refused"):
    code: str
    message: str
    retry: bool = False                    # GATE_BUSY, RATE_LIMITED: the next call may try again
    retry_after_s: float | None = None


class Answer(Message, tag="answer"):
    id: int | None                         # None: a line the gate could not read as a request
    envelope: dict
    text: str = ""


class ResetDone(Message, tag="reset-done"):
    code: int
    out: list[str]
    err: str | None = None


Opening = Hello | Reset
Request = Call | Question | Cancel
Reply = Welcome | Refused | Answer | ResetDone

_encoder = msgspec.json.Encoder(enc_hook=str)     # a tool's result may hold what JSON has no type for
opening_decoder = msgspec.json.Decoder(Opening)
request_decoder = msgspec.json.Decoder(Request)
reply_decoder = msgspec.json.Decoder(Reply)


def encode(message: Message) -> bytes:
    """One line of the wire."""
    return _encoder.encode(message) + b"\n"


def answer_error(ident: int | None, err: ToolError) -> Answer:
    return Answer(ident, err.envelope(), err.text())
