"""The executor process: claims effects and carries them out (Execute).

Until the pipeline lands it runs the harness alone. It already owns the
doorbell socket and its DEALER to the engine's RPC socket (engine executors).
"""

import zmq

from pulse import wire
from pulse.harness import Worker


class Executor(Worker):
    name = "executor"

    def open(self) -> None:
        self.doorbell = self.socket(zmq.PULL, self.paths.endpoint("doorbell"), bind=True, handler=self.on_doorbell)
        self.engine = self.socket(zmq.DEALER, self.paths.endpoint("engine"), bind=False, IMMEDIATE=1)

    def on_doorbell(self) -> None:
        message = self.receive(self.doorbell.recv(), wire.Doorbell, "doorbell")
        if message is not None:
            self.log.debug("doorbell from %s", message.source)

    def close(self) -> None:
        self.doorbell.close()
        self.engine.close()
