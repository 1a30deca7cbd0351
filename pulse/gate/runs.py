"""A run's way through the gate, as the executor hands it over: the gate it serves gives each agent
run a pass (an unguessable token, registered before the run starts and revoked once all of it has
ended, and the environment that tells the run's `pulsectl mcp` who it is and where the gate is),
and judges the run by the gate's facts when it ends.

The tokens live in the one process that serves the gate and starts the runs (the executor): the
gate server owns its `RunTokens`, and the executor passes the server's `RunGate` to each effect it
runs (EffectContext.gate), so the agent-run effect holds no registry of its own and nothing is
shared through a module global.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pulse.core.config import Agent
from pulse.core.home import GATE_SOCKET_ENV, RUN_TOKEN_ENV
from pulse.gate import policy
from pulse.gate.durable import DurableStore


@dataclass(frozen=True)
class RunIdentity:
    run: str          # the agent-run effect's id
    agent: str
    task: str
    uid: int | None = None   # the account the run's processes run as ([[agent]] user), if any
    # the run's cgroup, as /proc/<pid>/cgroup names it ((controller, path), ...; pulse.agents.runcgroup):
    # its token is honoured only from a process inside it. None: the host gave the run none.
    cgroup: tuple[tuple[str, str], ...] | None = None


ENDED_KEPT = 4096     # ended runs remembered (by token hash), so a late session hears RUN_ENDED, not RUN_UNKNOWN


class RunTokens:
    """The live runs' capabilities, kept in the process that serves the gate (the executor, which
    starts and ends the runs): registered before a run starts, revoked when it ends. Only a hash
    is kept, so nothing here can be read back into a token. Thread-safe (runner threads register
    and revoke, the gate's loop looks up). `listeners` hear each revoked run's id, in the revoking
    thread: the gate ends that run's open sessions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[str, RunIdentity] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()   # token hash → run id, the newest ENDED_KEPT
        self.ended_runs: set[str] = set()                    # their run ids: their sessions answer RUN_ENDED
        self.listeners: list[Callable[[str], None]] = []

    @staticmethod
    def digest(token: str) -> str:
        return hashlib.sha256(token.encode(errors="replace")).hexdigest()

    def register(self, run: str, agent: str, task: str, uid: int | None = None,
                 cgroup: tuple[tuple[str, str], ...] | None = None) -> str:
        """A new unguessable token for `run` (256 bits)."""
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.live[self.digest(token)] = RunIdentity(run, agent, task, uid, cgroup)
            self.ended_runs.discard(run)
        return token

    def revoke(self, token: str) -> None:
        digest = self.digest(token)
        with self.lock:
            identity = self.live.pop(digest, None)
            if identity is None:
                return
            self.ended[digest] = identity.run
            self.ended_runs.add(identity.run)
            while len(self.ended) > ENDED_KEPT:
                self.ended_runs.discard(self.ended.popitem(last=False)[1])
            listeners = list(self.listeners)
        for listener in listeners:
            listener(identity.run)

    def lookup(self, token: str) -> RunIdentity | None:
        with self.lock:
            return self.live.get(self.digest(token))

    def ended_run(self, token: str) -> str | None:
        """The id of the ended run this token was (one of the last ENDED_KEPT), else None."""
        with self.lock:
            return self.ended.get(self.digest(token))

    def is_live(self, run: str) -> bool:
        with self.lock:
            return run not in self.ended_runs


class RunPass(NamedTuple):
    """A run's pass: its token (to revoke) and the environment its processes get."""
    token: str
    env: dict[str, str]


class RunGate:
    """What an agent run gets of the gate that this process serves (EffectContext.gate)."""

    def __init__(self, tokens: RunTokens, socket_for: Callable[[int | None], str]):
        """`socket_for(uid)`: the socket a run under `uid` (None: pulsed's account) reaches the gate on."""
        self.tokens, self.socket_for = tokens, socket_for

    def admit(self, run: str, agent: str, task: str, uid: int | None = None,
              cgroup: tuple[tuple[str, str], ...] | None = None) -> RunPass:
        """Before the run starts: its token registered; its `pulsectl mcp` sessions are this run's,
        whatever they say."""
        token = self.tokens.register(run, agent, task, uid, cgroup)
        return RunPass(token, {RUN_TOKEN_ENV: token, GATE_SOCKET_ENV: self.socket_for(uid)})

    def revoke(self, run_pass: RunPass) -> None:
        """Once all of the run has ended (safe to repeat): its sessions answer RUN_ENDED."""
        self.tokens.revoke(run_pass.token)

    def verdict(self, conn, agent: Agent, task: str, since: float, checkpoints: Path | None = None) -> tuple[str, str] | None:
        return run_verdict(conn, agent, task, since, checkpoints)


def run_verdict(conn, agent: Agent, task: str, since: float, checkpoints: Path | None = None) -> tuple[str, str] | None:
    """A run that exited well is acked only if its gate agrees: (reason, error) when it does not.
    The run's sessions are those of its agent and task opened since it started; a write they (or
    an earlier attempt) left unverified or in flight fails it, `unverified-write`; a run that used
    the gate and never called finish fails, `no-finish`, unless the [[agent]] has
    gate_requires_finish = false. A run that tried writes, all refused by the gate (or that never
    acted), while no write of its task was made and verified, fails `no-write`: it did not do what
    it was asked, whatever it says. A run that never used the gate answers to nothing here."""
    store = DurableStore(conn, "executor", checkpoints=checkpoints)
    store.transact(lambda: None)          # settles what the run's sessions left in flight
    ledger = store.ledger
    principal = (agent.name, task)
    if pending := ledger.pending(principal):
        return "unverified-write", f"the agent left a write unverified ({', '.join(pending)}); the run is not acked"
    mine = [s for s in ledger.sessions.values() if (s.agent, s.task) == principal and s.opened >= since]
    used = any(s.calls or s.blocked for s in mine)
    if used and agent.gate_requires_finish and not any(s.finished for s in mine):
        return "no-finish", "the agent used the gate but never called finish; the run is not acked"
    refused = sum(s.refused_writes for s in mine)
    if refused and not (ledger.actors.get(principal) or policy.Actor()).verified:
        return "no-write", (f"every write the agent tried was refused or never acted ({refused}), and none of "
                            "its task's writes was made and verified; the run is not acked, whatever it answered")
    return None
