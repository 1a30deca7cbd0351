"""The engine process: the only process that imports the agent's engine code.

It binds the engine RPC socket (ROUTER). Requests carry an id and an absolute
deadline; expired ones are dropped unanswered. Until the pipeline lands it
answers Ping alone. Before anything else it caps its own address space and
raises its oom_score_adj, so a memory blow-up in agent code kills the engine,
not the survival layer.
"""

import os
import resource
import time

import zmq

from pulse import wire
from pulse.harness import Worker


def limit_self(address_space_mb: int, oom_score_adj: int) -> None:
    if address_space_mb:
        limit = address_space_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(f"/proc/{os.getpid()}/oom_score_adj", "w") as f:
        f.write(str(oom_score_adj))


class Engine(Worker):
    name = "engine"

    def open(self) -> None:
        limit_self(self.config.engine.address_space_mb, self.config.engine.oom_score_adj)
        self.rpc = self.socket(zmq.ROUTER, self.paths.endpoint("engine"), bind=True, handler=self.on_request,
                               MAXMSGSIZE=1024 * 1024)

    def on_request(self) -> None:
        frames = self.rpc.recv_multipart()
        if len(frames) != 2:
            self.log.warning("dropped a malformed request on the engine socket: %d frames", len(frames))
            return
        identity, frame = frames
        request = self.receive(frame, wire.EngineRequest, "engine")
        if request is None:
            return
        if request.deadline < time.time():
            self.log.debug("dropped expired request %d", request.id)
            return
        self.rpc.send_multipart([identity, wire.encode(wire.Pong(request.id, os.getpid()))])

    def close(self) -> None:
        self.rpc.close()
