"""The tick process: snapshot → rule chain → effects (Understand).

Until the pipeline lands it runs the harness alone. It already owns the wake
socket (any process may ring it) and its DEALER to the engine's RPC socket.
"""

import zmq

from pulse import wire
from pulse.harness import Worker


class Tick(Worker):
    name = "tick"

    def open(self) -> None:
        self.wake = self.socket(zmq.PULL, self.paths.endpoint("wake"), bind=True, handler=self.on_wake)
        self.engine = self.socket(zmq.DEALER, self.paths.endpoint("engine"), bind=False, IMMEDIATE=1)
        self.doorbell = self.socket(zmq.PUSH, self.paths.endpoint("doorbell"), bind=False, SNDHWM=4, IMMEDIATE=1)

    def on_wake(self) -> None:
        message = self.receive(self.wake.recv(), wire.Wake, "wake")
        if message is not None:
            self.log.debug("woken by %s (%s)", message.source, message.reason)

    def close(self) -> None:
        for sock in (self.wake, self.engine, self.doorbell):
            sock.close()
