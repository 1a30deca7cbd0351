"""The watcher process: built-in watchers sense the host (Percept).

Until the pipeline lands it runs the harness alone: ready, heartbeat, clean stop.
It connects to the tick's wake socket, which it will ring when a vital says so.
"""

import zmq

from pulse.harness import Worker


class Watcher(Worker):
    name = "watcher"

    def open(self) -> None:
        self.wake = self.socket(zmq.PUSH, self.paths.endpoint("wake"), bind=False, SNDHWM=4, IMMEDIATE=1)

    def close(self) -> None:
        self.wake.close()
