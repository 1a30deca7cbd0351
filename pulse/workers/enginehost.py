"""The engine process: the only process that imports the agent's engine code.

It loads the engine directory (failures recorded as `error` events naming file
and line; the rest still load), then serves the engine RPC socket (ROUTER):
RunChain runs the business rules (the onion's innermost layers) and replies
with effects; RunExecutor runs an engine executor in a thread and replies when
it is done. Requests carry an id and an absolute deadline; expired ones are
dropped unanswered. The engine's own watchers write vitals like the built-in
ones. Before anything else it caps its own address space and raises its
oom_score_adj, so a memory blow-up in agent code kills the engine, not the
survival layer. A rule that never returns blocks this loop, so the engine stops
heartbeating and pulsed replaces it (with a traceback in the log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import resource
import time
import traceback

import msgspec
import zmq

from pulse.core import client, procs
from pulse.core.home import dev_pidfd
from pulse.core.wakepipe import drain, poke
from pulse.core.wire import codec, controlmsgs, enginerpc
from pulse.engine import loader
from pulse.rules import onion
from pulse.store import errorruns, eventsdb, vitalsdb
from pulse.workers.harness import Worker

EXECUTOR_THREADS = 4


def limit_self(address_space_mb: int, oom_score_adj: int) -> None:
    if address_space_mb:
        limit = address_space_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(f"/proc/{os.getpid()}/oom_score_adj", "w") as f:
        f.write(str(oom_score_adj))


def loaded_commit(root) -> str | None:
    """The commit of the tree just loaded, "+dirty" if it differs (dev mode edits, or a hand edit)."""
    try:
        head = procs.run_git(root, "rev-parse", "HEAD", timeout=10)
        dirty = procs.run_git(root, "status", "--porcelain", timeout=10)
    except (OSError, procs.GitError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def short_traceback(err: BaseException, root: str) -> str:
    """The exception and the innermost frame inside the engine directory."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(root)]
    where = f" at {os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


class EngineWorker(Worker):
    name = "engine"

    def open(self) -> None:
        limit_self(self.config.engine.address_space_mb, self.config.engine.oom_score_adj)
        self.events = eventsdb.open_events(self.paths.events_db)
        # Staging while a `pulsectl dev` lives, and back to main as soon as it ends, however it ends
        # (SIGKILL runs no handler of its own): its pidfd becomes readable, and this engine asks to
        # be replaced.
        self.dev = dev_pidfd(self.paths)
        self.root = self.paths.engine if self.dev is None else self.paths.staging
        if self.dev is not None:
            self.handlers[self.dev] = self.on_dev_ended
        self.engine = loader.load(self.root)
        self.commit = loaded_commit(self.root)
        for error in self.engine.errors:
            self.record_error(f"failed to load {error.message}", target=f"engine:{error.file}",
                              file=error.file, line=error.line)
        self.log.info("loaded %d modules from %s: %d rules, %d watchers, %d executors, %d failed",
                      len(self.engine.modules), self.root, len(self.engine.rules), len(self.engine.watchers),
                      len(self.engine.executors), len(self.engine.errors))
        self.chain = onion.compose(self.engine.rules, onion.nothing, tag=True)
        self.loop = asyncio.new_event_loop()
        self.rpc = self.socket(zmq.ROUTER, self.paths.endpoint("engine"), bind=True, handler=self.on_request,
                               MAXMSGSIZE=16 * 1024 * 1024)
        self.pool = concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="engine-executor")
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.done_r, self.done_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.handlers[self.done_r] = self.on_executor_done
        self.runner = None
        if self.engine.watchers:
            from pulse.sensing.runner import WatcherRunner  # only an engine with watchers
            self.wake = self.socket(zmq.PUSH, self.paths.endpoint("wake"), bind=False, **client.DOORBELL)
            self.vitals = vitalsdb.open_vitals(self.paths.vitals_db)
            self.runner = WatcherRunner(self.engine.watchers, vitals_conn=self.vitals, events_conn=self.events,
                                        wake_sock=self.wake, source="engine", config=self.config, log=self.log)
            # One dict for both: the runner adds and drops fds as it goes, and the harness follows them.
            self.runner.handlers.update(self.handlers)
            self.handlers = self.runner.handlers

    def record_error(self, message: str, target: str = "engine", **data) -> None:
        """An error, coalesced (errorruns.record_error); and a log line for the first of its run and then at
        each power of ten, so pulse.log shows a rule that keeps raising without filling up."""
        store = self.config.store
        count = errorruns.record_error(self.events, "engine", target, message, coalesce_s=store.error_coalesce_s,
                                repeat_s=store.error_repeat_s, **data)
        if count == 1 or (count % 10 == 0 and str(count).strip("0") == "1"):
            self.log.error("%s%s", message, f" (×{count})" if count > 1 else "")

    def on_dev_ended(self) -> None:
        del self.handlers[self.dev]
        os.close(self.dev)
        self.log.info("pulsectl dev ended: asking pulsed to reload the engine onto main")
        try:
            client.request(self.paths, controlmsgs.RestartWorker(self.name), 3.0)
        except client.Unreachable as err:
            self.log.warning("could not ask for a reload (%s); the engine runs staging until restarted", err)

    # -- requests --------------------------------------------------------------------------------

    def on_request(self) -> None:
        frames = self.rpc.recv_multipart()
        if len(frames) != 2:
            self.log.warning("dropped a malformed frame on the engine socket: %d frames", len(frames))
            return
        identity, frame = frames
        request = self.receive(frame, enginerpc.EngineRequest, "engine")
        if request is None:
            return
        if request.deadline < time.time():
            self.log.debug("dropped expired request %d", request.id)
            return
        if isinstance(request, enginerpc.Ping):
            self.reply(identity, enginerpc.Pong(request.id, os.getpid()))
        elif isinstance(request, enginerpc.RunChain):
            self.reply(identity, self.run_chain(request))
        elif isinstance(request, enginerpc.RunExecutor):
            self.start_executor(identity, request)

    def reply(self, identity: bytes, message) -> None:
        try:
            frame = codec.encode(message)
        except (TypeError, ValueError, OverflowError) as err:   # agent code returned something unsendable
            self.record_error(f"engine reply cannot be sent: {err}")
            frame = codec.encode(type(message)(message.id, [], None, error=f"unsendable result: {err}")
                                if isinstance(message, enginerpc.ChainResult)
                                else enginerpc.ExecutorResult(message.id, ok=False, error=f"unsendable result: {err}"))
        self.rpc.send_multipart([identity, frame])

    def run_chain(self, request: enginerpc.RunChain) -> enginerpc.ChainResult:
        try:
            effects, tick_ms = self.loop.run_until_complete(self.chain(request.prev, request.curr))
        except Exception as err:
            message = short_traceback(err, str(self.root))
            self.record_error(f"rule raised {message}")
            return enginerpc.ChainResult(request.id, [], None, error=message)
        return enginerpc.ChainResult(request.id, effects, tick_ms)

    def start_executor(self, identity: bytes, request: enginerpc.RunExecutor) -> None:
        executor = self.engine.executors.get(request.effect.kind)
        if executor is None:
            self.reply(identity, enginerpc.ExecutorResult(request.id, ok=False, unknown_kind=True,
                                                     error=f"no engine executor for kind {request.effect.kind!r}"))
            return
        future = self.pool.submit(executor.run, request.effect)
        future.add_done_callback(lambda f: self._executor_done(identity, request, f))

    def _executor_done(self, identity: bytes, request: enginerpc.RunExecutor, future) -> None:
        """In the executor thread: hand the result to the main loop (only it uses the socket)."""
        try:
            result = enginerpc.ExecutorResult(request.id, ok=True, result=msgspec.to_builtins(future.result() or {}))
        except Exception as err:
            result = enginerpc.ExecutorResult(request.id, ok=False, error=short_traceback(err, str(self.root)))
        self.done.put((identity, request, result))
        poke(self.done_w)

    def on_executor_done(self) -> None:
        drain(self.done_r)
        while not self.done.empty():
            identity, request, result = self.done.get()
            if request.deadline < time.time():
                self.log.warning("engine executor %s finished after its deadline", request.effect.kind)
            self.reply(identity, result)

    # -- timers ----------------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        return self.runner.next_timer() if self.runner else None

    def on_timer(self, now: float) -> None:
        if self.runner:
            self.runner.on_timer(now)

    def close(self) -> None:
        if self.runner:
            self.runner.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.loop.close()
        self.rpc.close()
        self.events.close()
