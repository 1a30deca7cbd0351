"""The agent-run executor: a configured agent works on a task, at most once at a time; and
task-add, by which a rule hands work to the agents (a new pending task).

Per-agent concurrency is kept by the executor's loop (SLOTS); a run killed with its executor
is settled by settle_interrupted, which puts the task back to pending before the effect fails.
"""

from __future__ import annotations

import functools
import grp
import logging
import os
import pwd
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated

import msgspec

from pulse.agents import (
    adapters,
    loopnotice,
    otel,
    routing,
    runcgroup,
    runfacts,
    runguards,
    runlimits,
    runstall,
    spend,
    tasks,
    taskview,
)
from pulse.core.argvtemplate import substitute
from pulse.core.config import Agent, ExecutorConfig
from pulse.core.home import Paths
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EffectKind, TaskEvent
from pulse.effects.kinds import RUN_MARK, SOURCE, EffectContext, EffectFailed, run_process, stop_marked, store_output
from pulse.effects.registry import Kind, Seconds
from pulse.store import commitwatch, eventsdb, projection

log = logging.getLogger("pulse.executor")

# How long a run that starts before the telemetry receiver is up waits for it (a receiver that never
# comes, failed until its retry, costs each run this much, said in the log).
RECEIVER_WAIT_S = 10.0


class AgentSlots:
    """Per-agent concurrency, kept by the executor's loop: an agent-run effect is dispatched only
    while its agent runs fewer than `concurrency`; the others stay pending (unclaimed) until a
    slot frees or their deadline expires them. An agent-run without params.agent takes the
    first configured agent with a free slot (the assignment rule knew no agent to name)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, str] = {}          # effect id → agent

    def admit(self, effect: Effect, config: ExecutorConfig) -> bool:
        if effect.kind != EffectKind.AGENT_RUN:
            return True
        wanted = effect.params.get("agent")
        if not config.agent:
            return True               # nothing to wait for: it fails when run, saying so
        with self.lock:
            for agent in config.agent:
                if wanted not in (None, agent.name):
                    continue
                if sum(1 for a in self.running.values() if a == agent.name) < agent.concurrency:
                    self.running[effect.id] = agent.name
                    return True
            return wanted is not None and wanted not in {a.name for a in config.agent}   # unknown: fails when run

    def release(self, effect_id: str) -> None:
        with self.lock:
            self.running.pop(effect_id, None)

    def reserved(self, effect_id: str) -> str | None:
        with self.lock:
            return self.running.get(effect_id)


SLOTS = AgentSlots()


def configured_agent(config: ExecutorConfig, name: object) -> Agent:
    for agent in config.agent:
        if agent.name == name:
            return agent
    if not config.agent:
        raise EffectFailed("no-agent", "no [[agent]] is configured: add one to config.toml, then pulsectl reload")
    raise EffectFailed("bad-params", f"{name!r} is not a configured [[agent]]")


def run_agent_of(effect: Effect, config: ExecutorConfig) -> Agent:
    """The [[agent]] a run is for: params.agent, else the one its slot was taken for, else the first."""
    return configured_agent(config, effect.params.get("agent") or SLOTS.reserved(effect.id)
                            or next((a.name for a in config.agent), None))


def reserve_spend(conn, effect: Effect, config: ExecutorConfig) -> str | None:
    """agent-run's Kind.reserve: in the claim's transaction, the run's expected cost is reserved
    against the agent's and the host's spend limits (pulse.agents.spend), or the run is held: why."""
    try:
        agent = run_agent_of(effect, config)
    except EffectFailed:
        return None                   # no such agent: it fails when run, saying so
    return spend.reserve(conn, effect, agent, _task_param(effect) or None, config.budget, SOURCE)


def settle_spend(conn, effect: Effect, config: ExecutorConfig, data: dict, interrupted: bool = False,
                 started: bool = True) -> None:
    """The run ended: its reservation becomes the cost its CLI reported (data["result"]["cost_usd"]),
    else what its telemetry reported while it ran (a run ended mid-turn prints no result)."""
    try:
        agent = run_agent_of(effect, config)
    except EffectFailed:
        return
    result, reported = data.get("result"), data.get("telemetry")
    cost = result.get("cost_usd") if isinstance(result, dict) else None
    if not _is_number(cost) and isinstance(reported, dict) and reported.get("cost_usd"):
        cost = reported["cost_usd"]
    cost = cost if _is_number(cost) else None
    spend.settle(conn, effect.id, agent, config.budget, cost, SOURCE, interrupted=interrupted, started=started)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_subject(effect: Effect) -> str | None:
    """The task an agent-run acts on: params.task_id, else its target. Both set, they must name the
    same task (ValueError): the gate keys the write on one, and the executor must not act on another."""
    named = {tasks.parse_task_id(str(x)) for x in (effect.params.get("task_id"), effect.target) if x not in (None, "")}
    if len(named) > 1:
        raise ValueError(f"its target {effect.target!r} and params.task_id {effect.params.get('task_id')!r} "
                         "name different tasks")
    return named.pop() if named else None


def _task_param(effect: Effect) -> str:
    try:
        return run_subject(effect) or ""
    except ValueError:
        return ""


def run_agent(effect: Effect, ctx: EffectContext) -> dict:
    """Run a configured agent on a task (params task_id, agent).

    One transaction moves the task pending → assigned → executing, each event carrying
    run = this effect's id (refused: the effect fails, reason task-state, and nothing ran).
    The adapter's argv runs through run_process: its own process group, recorded in the
    claim, killed at the agent's timeout_s (params.timeout_s may shorten it; effect_timeout_s
    does not apply: the operator configured this agent), or sooner, reason stalled, once silent
    (no output, no telemetry) for its stall_s (pulse.agents.runstall), or once its telemetry reports
    spend or a loop past its agent's bounds (pulse.agents.runguards). Its full output goes to objects/.
    Then task-acked with the adapter's result, or task-failed (task-given-up after
    [tasks] max_failures in a row), each only while this run still holds the task.

    Not idempotent: a run interrupted by the executor's death is not re-run as such; the
    settlement of the orphan (settle_interrupted) fails the task's run, reason interrupted,
    which puts it back to pending for the assignment rule to hand out again after retry_base_s.
    A run of a task that ran before is told what those runs wrote through the gate (its prompt,
    prompt_with_history), and the gate refuses to repeat a write whose effect may have acted
    until a look shows it is still needed (pulse.gate.policy)."""
    conn = eventsdb.open_events(ctx.home / "events.db", "FULL")
    try:
        try:
            task, agent, adapter, state = _start(effect, ctx, conn)
        except BaseException:
            settle_spend(conn, effect, ctx.config, {}, started=False)     # nothing ran: nothing spent
            raise
        home = ctx.home
        base = {"task_id": task, "agent": agent.name, "attempt": state.attempts}
        try:
            data = _run_agent_process(effect, ctx, conn, agent, adapter, state, home, base)
        except BaseException as err:
            failure = err if isinstance(err, EffectFailed) else None
            why = failure.error if failure else f"{type(err).__name__}: {err}"
            extra = {k: v for k, v in (failure.data if failure else {}).items()
                     if k in ("output", "stderr", "code", "result", "run_ms", "telemetry", "notices")}
            settle_spend(conn, effect, ctx.config, extra)      # settled already, unless it failed before its result
            _end_run(conn, ctx, task, effect.id, TaskEvent.FAILED, reason=failure.reason if failure else "error",
                     error=why, agent=agent.name, **extra)
            raise
        return data
    finally:
        conn.close()


def _start(effect: Effect, ctx: EffectContext, conn):
    """(task, agent, adapter, task state) of a run about to start: the task moved to executing."""
    task = _task_param(effect)
    if not task:
        raise EffectFailed("bad-params", "agent-run needs params.task_id (task-7, or 7)")
    agent = run_agent_of(effect, ctx.config)
    try:
        adapter = adapters.load_adapter(agent.adapter)
    except Exception as err:          # a third-party adapter may fail to import
        raise EffectFailed("adapter", f"adapter {agent.adapter!r}: {type(err).__name__}: {err}") from None
    # Who may take it (pin, projects, tags) is fixed when the task is created, so this check
    # needs no transaction: a rule that names an agent the task is not for runs nothing.
    if (held := tasks.load(conn, task)) is not None and (why := routing.refusal(agent, held)) is not None:
        raise EffectFailed("not-eligible", f"{task}: {why}", task_id=task, agent=agent.name)
    try:
        state = tasks.start_run(conn, task, agent.name, effect.id, SOURCE)
    except tasks.IllegalTransition as err:
        raise EffectFailed("task-state", str(err), task_id=task, agent=agent.name) from None
    return task, agent, adapter, state


def _end_run(conn, ctx: EffectContext, task: str, run: str, type: str, **data) -> bool:
    try:
        t = ctx.config.tasks
        tasks.record(conn, task, type, SOURCE, t.max_failures, run=run, retry=(t.retry_base_s, t.retry_max_s),
                     same_end=(t.same_end_max, t.same_end_reasons), **data)
        return True
    except tasks.IllegalTransition as err:      # the run no longer holds the task (an operator gave it up)
        log.warning("%s: %s not recorded: %s", task, type, err)
        return False


def _run_agent_process(effect: Effect, ctx: EffectContext, conn, agent: Agent, adapter, state, home: Path,
                       base: dict) -> dict:
    if agent.cwd is not None:
        workdir = substitute(agent.cwd, {"task_id": state.id, "agent": agent.name, "project": state.project})
    else:
        workdir = str(home / "work" / state.id)
        os.makedirs(workdir, mode=0o700, exist_ok=True)
    limit = agent.timeout_s
    asked = effect.params.get("timeout_s")
    if isinstance(asked, (int, float)) and not isinstance(asked, bool) and asked > 0:
        limit = min(limit, float(asked))
    ctx.timeout_s, ctx.deadline = limit, time.monotonic() + limit
    started = time.time()
    # The run's private files (an MCP config, a usage file): mode 0700, gone once it is parsed (or,
    # when the executor died while it ran, once the interrupted run is settled: remove_scratch).
    scratch = tempfile.mkdtemp(prefix=scratch_prefix(effect.id))
    # The run's own cgroup (None where the host lets Pulse make none: rlimits and the environment
    # mark then): its processes, whatever they do, are the run's, and only they may use its token.
    account = run_account(agent)
    cgroup = runcgroup.create(effect.id, agent.limits)
    run_pass = None
    try:
        if ctx.gate is None:
            raise EffectFailed("no-gate", "no gate serves this process: agent runs are the executor's, which serves it")
        # The run's capability: registered with the gate (served by this process) before it starts,
        # revoked once all of it has ended; its `pulsectl mcp` sessions are this run's, whatever they say.
        run_pass = ctx.gate.admit(effect.id, agent.name, state.id, account[0] if account else None,
                                  cgroup.membership if cgroup else None)
        own = {**run_pass.env, RUN_MARK: effect.id}
        if account is not None:           # its files are its own; the scratch dir (0700) is the run's
            os.chown(scratch, *account)
            if agent.cwd is None:
                os.chown(workdir, *account)
            own.update(account_env(agent.user))
        with_token = msgspec.structs.replace(agent, env={**agent.env, **own})
        prompt = prompt_with_history(state.prompt, taskview.earlier_writes(conn, state.id))
        invocation = adapter.invocation(with_token, adapters.Task(state.id, prompt, state.title, state.project),
                                        workdir, home=home, scratch=scratch)
        receiver = telemetry_receiver(home, ctx.config.telemetry.enabled, effect.id, state.id, agent.name)
        if receiver is not None:
            adapter.report_to(invocation, receiver, agent.env)   # the run's telemetry to Pulse, tagged as the run
        if account is not None:           # what the adapter wrote there (an MCP config, a token file) too
            for entry in os.scandir(scratch):
                os.chown(entry.path, *account, follow_symlinks=False)
        cap = (spend.reservation(conn, effect.id) or {}).get("cap_usd")
        if cap is not None:          # the dollars left under the tightest limit, where the CLI takes a cap
            adapter.cap_spend(invocation, float(cap))
        leader: list[int] = []
        recorded = ctx.started
        ctx.started = lambda pgid: (leader.append(pgid), recorded(pgid))
        floor = runlimits.rlimits(agent.limits, cgroup.enforced if cgroup else set(), account, agent.concurrency)
        facts = runfacts.RunFacts(effect.id, home / "events.db", eventsdb.last_event_id(conn)) \
            if receiver is not None else None
        stall = None if agent.stall_s is None else runstall.Stall(agent.stall_s, facts)
        guards = run_guards(agent, facts, cap, stall, loop_notice(home, effect.id, state.id, agent.name))
        watch = runlimits.Watch(agent.limits, [workdir, scratch], lambda: end_run_processes(effect.id, cgroup, leader),
                                cgroup.hit if cgroup else None, guards, facts)
        join, fds = cgroup.joiner() if cgroup else (None, [])
        began = time.monotonic()
        err = bytearray()
        watch.start()
        try:
            code, stdout, timed_out = run_process(invocation.argv, ctx, env={**invocation.env, RUN_MARK: effect.id},
                                                  cwd=invocation.cwd, stderr=err, account=account,
                                                  preexec=runlimits.preexec(join, floor),
                                                  on_output=stall.output if stall is not None else None)
        finally:
            for fd in fds:
                os.close(fd)
            watch.stop()
            # A run ends when all of it ends: what left its process group (its cgroup, else the mark in
            # its environment) is stopped here, before the verdict, so nothing acts after task-acked.
            escaped = end_run_processes(effect.id, cgroup, [])
            ctx.gate.revoke(run_pass)
        over = watch.verdict(code)
        reported = reported_totals(facts)
        notices = [g.noticed for g in guards if getattr(g, "noticed", None)]
        stderr = bytes(err)
        run = adapters.RunOutput(code, stdout, stderr, timed_out, invocation)
        result = adapter.parse(run)
    finally:
        if run_pass is not None:
            ctx.gate.revoke(run_pass)       # again: the run may have failed before it started
        if cgroup is not None:
            remove_cgroup(cgroup)
        shutil.rmtree(scratch, ignore_errors=True)
    ref = store_output(ctx.objects, stdout)
    summary = result.summary(code)
    data = {**base, "code": code, "output": ref, "bytes": len(stdout), "result": summary,
            "run_ms": round((time.monotonic() - began) * 1000, 1), **({"escaped": escaped} if escaped else {}),
            **({"telemetry": reported} if reported else {}), **({"notices": notices} if notices else {})}
    if stderr:
        data["stderr"] = store_output(ctx.objects, stderr)
    settle_spend(conn, effect, ctx.config, data)       # what it cost, before the verdict is recorded
    if over is not None:                 # over a limit: ended by Pulse, whatever the agent said
        raise EffectFailed(*over, **data)
    if not result.ok:
        reason = "timeout" if timed_out else (result.reason or "agent")
        raise EffectFailed(reason, result.error or "the agent failed", **data)
    if (refusal := ctx.gate.verdict(conn, agent, state.id, started, home / projection.DIRECTORY)) is not None:
        raise EffectFailed(*refusal, **data)
    if not _end_run(conn, ctx, state.id, effect.id, TaskEvent.ACKED, result=summary, agent=agent.name,
                    output=ref, code=code, run_ms=data["run_ms"], **({"notices": notices} if notices else {})):
        raise EffectFailed("task-state", f"{state.id}: the agent finished, but the task had moved on", **data)
    return data


def run_guards(agent: Agent, facts: runfacts.RunFacts | None, cap_usd: float | None, stall, notice=None) -> list:
    """What the run's watch checks besides its limits: silence, and with telemetry, spend and loops
    (a loop only said, through `notice`, when the agent's on_loop is "notice")."""
    guards = [stall] if stall is not None else []
    if facts is not None:
        if (cap := runguards.spend_cap(agent.max_run_usd, cap_usd)) is not None:
            guards.append(runguards.SpendGuard(facts, cap))
        if agent.loop_per_min is not None:
            guards.append(runguards.LoopGuard(facts, agent.loop_per_min, notice if agent.on_loop == "notice" else None))
    return guards


def loop_notice(home: Path, run: str, task: str, agent: str):
    """The callback that says a run's loop (on_loop = "notice"): a `loop-noticed` fact on its task and
    a notification, written from the watch's thread on a connection of its own. A store that refuses
    the write loses the fact, never the run: the notice is still kept in the run's end."""

    def notice(seen: dict) -> None:
        data = {"run": run, "task": task, "agent": agent, **seen}
        try:
            conn = eventsdb.open_events(home / "events.db", "FULL")
            try:
                loopnotice.write(conn, task, data, SOURCE, f"{agent} looks in a loop on {task} (left running)")
            finally:
                conn.close()
        except Exception as err:
            log.warning("run %s: its loop notice was not written: %s", run, err)
    return notice


def reported_totals(facts: runfacts.RunFacts | None) -> dict:
    """What the run reported to the receiver by its end (the last flush may come later)."""
    if facts is None:
        return {}
    facts.read(now=True)
    facts.close()
    return facts.totals()


def prompt_with_history(prompt: str, writes: list[str]) -> str:
    """The task's prompt, and when earlier runs of it wrote through the gate, what those writes did:
    a run after an interrupted one must not start blind and repeat a change that was made."""
    if not writes:
        return prompt
    return (prompt + "\n\n---\nPulse: this task was run before. What those runs changed through Pulse's tools, "
            "oldest first:\n" + "\n".join(f"- {w}" for w in writes) + "\nLook at what they touched before you "
            "change it again: a write whose effect may have acted is refused until a look shows it is still needed.")


def end_run_processes(run: str, cgroup: runcgroup.RunCgroup | None, leader: list[int]) -> int:
    """Kill what is left of a run and wait until it is gone: its whole cgroup (frozen, then killed),
    else its process group (`leader`, when known) and what carries its mark. How many there were."""
    if cgroup is not None:
        try:
            return cgroup.freeze_and_kill()
        except (OSError, TimeoutError) as err:
            raise EffectFailed("stop", f"run {run}: its cgroup could not be emptied: {err}") from None
    for pgid in leader:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return stop_marked(run)


def remove_cgroup(cgroup: runcgroup.RunCgroup) -> None:
    """The run's cgroup, emptied (a run that failed before its end) and removed."""
    try:
        cgroup.freeze_and_kill()
    except (OSError, TimeoutError) as err:
        log.warning("run %s: %s", cgroup.run, err)
    cgroup.remove()


def scratch_prefix(run: str) -> str:
    """The name a run's scratch directory starts with (mkdtemp adds a random tail: /tmp is shared)."""
    return f"pulse-run-{run}-"


def remove_scratch(run: str, owners: set[int]) -> None:
    """An interrupted run's scratch directory, which its own `finally` never removed: only a real
    directory (not a symlink) owned by pulsed's uid or the run's account."""
    for path in Path(tempfile.gettempdir()).glob(scratch_prefix(run) + "*"):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid in owners:
            shutil.rmtree(path, ignore_errors=True)


def telemetry_receiver(home: Path, enabled: bool, run: str, task: str, agent: str) -> otel.Receiver | None:
    """Pulse's telemetry receiver, for this run; None when [telemetry] is off (`enabled`), or when it
    is not up within RECEIVER_WAIT_S. A run started as pulsed starts, or as the receiver restarts,
    waits for it: the run's spend and loop guards read only what it reports there."""
    paths = Paths.for_client(Path(home))
    look = functools.partial(otel.receiver, paths.telemetry_file, paths.telemetry_token, run, task, agent)
    if not enabled:
        return look()
    found = commitwatch.written(paths.telemetry_file, look, RECEIVER_WAIT_S)
    if found is None:
        log.warning("run %s: no telemetry receiver after %g s, though [telemetry] is enabled: it runs without "
                    "its telemetry, and its agent's spend and loop guards see nothing of it", run, RECEIVER_WAIT_S)
    return found


def run_account(agent: Agent) -> tuple[int, int] | None:
    """(uid, gid) the agent CLI runs as ([[agent]] user, group); None: pulsed's own."""
    if agent.user is None and agent.group is None:
        return None
    try:
        pw = pwd.getpwnam(agent.user) if agent.user else pwd.getpwuid(os.getuid())
    except KeyError:
        raise EffectFailed("bad-params", f"[[agent]] {agent.name}: no account {agent.user!r}") from None
    try:
        gid = grp.getgrnam(agent.group).gr_gid if agent.group else pw.pw_gid
    except KeyError:
        raise EffectFailed("bad-params", f"[[agent]] {agent.name}: no group {agent.group!r}") from None
    return pw.pw_uid, gid


def account_env(user: str | None) -> dict[str, str]:
    """HOME, USER and LOGNAME of the run's account, not pulsed's."""
    if user is None:
        return {}
    pw = pwd.getpwnam(user)
    return {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}


def run_task_add(effect: Effect, ctx: EffectContext) -> dict:
    """A new pending task (params project, title, prompt, priority), created by the effect's origin
    (a rule that hands a failure to an agent). Not idempotent: at most one task per effect."""
    p = effect.params
    home = ctx.home
    conn = eventsdb.open_events(home / "events.db", "FULL")
    try:
        state = tasks.create(conn, p["project"], p["title"], p["prompt"], p.get("priority", 0),
                             source=f"{SOURCE}:{effect.origin or 'unknown'}")
    finally:
        conn.close()
    return {"task_id": state.id}


def _account_uid(effect: Effect, config: ExecutorConfig) -> list[int]:
    """The uid the interrupted run's agent ran as, when it had its own account and is still configured."""
    try:
        account = run_account(run_agent_of(effect, config))
    except (EffectFailed, ValueError):
        return []
    return [account[0]] if account else []


def settle_interrupted(effect: Effect, conn, config: ExecutorConfig) -> None:
    """Called by the executor when it settles an orphan (its claimer died), once the orphan's
    process group is gone and before the effect is put back or failed: what an interrupted
    effect of this kind leaves behind is undone. agent-run: the task goes back to pending
    (task-failed, reason interrupted, retried after [tasks] retry_base_s like any failure), only
    if this run still holds it; a task this host took
    from the fleet is given up instead, so the fleet offers it again (after a host's death
    another host may have run it already: it must not run here again). Safe to repeat."""
    if effect.kind != EffectKind.AGENT_RUN:
        return
    left = runcgroup.find(effect.id)        # what the run left outside its group, before it is put back
    if left is not None:
        remove_cgroup(left)
    stop_marked(effect.id)                  # where it had no cgroup: by the mark in its environment
    remove_scratch(effect.id, {os.getuid(), *_account_uid(effect, config)})
    settle_spend(conn, effect, config, {}, interrupted=True)    # its cost unknown: the reservation stands
    task = _task_param(effect)
    if not task:
        return
    from_fleet = eventsdb.search_events(conn, types=[TaskEvent.CREATED], source="fleet", target=task, limit=1)
    try:
        if from_fleet:
            tasks.record(conn, task, TaskEvent.GIVEN_UP, SOURCE, run=effect.id, by=SOURCE,
                         reason="interrupted: the executor died while the agent ran; back to the fleet")
            log.warning("%s: its run %s was interrupted; given back to the fleet", task, effect.id)
            return
        # it waits retry_base_s like any failure: what the run left (its writes' effects) settles first
        tasks.record(conn, task, TaskEvent.FAILED, SOURCE, config.tasks.max_failures, run=effect.id,
                     retry=(config.tasks.retry_base_s, config.tasks.retry_max_s),
                     reason="interrupted", error="interrupted: the executor died while the agent ran")
        log.warning("%s: its run %s was interrupted; back to pending", task, effect.id)
    except tasks.IllegalTransition:
        pass                       # the run had ended, or never began: nothing to give back


# -- the kinds, plugged into pulse.effects.registry (setup.cfg's pulse.effect_kinds) -------------------

class AgentRunParams(msgspec.Struct):
    task_id: str | int | None = None                         # "task-7" or 7; unset: the effect's target
    agent: str | None = None                                 # an [[agent]] name; unset: the first with a free slot
    timeout_s: Seconds | None = None                         # at most the agent's timeout_s


class TaskAddParams(msgspec.Struct):
    project: Annotated[str, msgspec.Meta(min_length=1)]
    title: Annotated[str, msgspec.Meta(min_length=1)]
    prompt: Annotated[str, msgspec.Meta(min_length=1)]
    priority: int = 0


AGENT_RUN = Kind(
    EffectKind.AGENT_RUN, "Runs a configured [[agent]] on a task, at most `concurrency` runs of an agent at "
    "once; the task is acked or failed with the agent's result. A run that would cross a spend limit "
    "(`[[agent]] budget`, `[budget]`) is not started: it stays pending, its task waiting, reason budget.",
    AgentRunParams, run_agent, False, "the task id", admit=SLOTS.admit,
    release=SLOTS.release, reserve=reserve_spend, settle_orphan=settle_interrupted, starts_process=True,
    resource="task:{target}", subject=run_subject)
TASK_ADD = Kind(
    EffectKind.TASK_ADD, "Adds a pending task for the agents (a rule handing over what it could not fix); "
    "the assignment rule hands it out like any other.",
    TaskAddParams, run_task_add, False, "what the task is about")
