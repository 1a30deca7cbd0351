"""A uvicorn server on a thread and an event loop of its own, inside a worker whose main loop
heartbeats (the web worker, the telemetry worker): the worker is healthy only while that loop still
turns, so a server stuck in its own code is found hung as any worker is."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Callable

STOP_WAIT_S = 3.0              # a stop waits this long for the server's thread


class ServerThread:
    def __init__(self, server: Any, sock: socket.socket, beat_s: float, name: str,
                 before: Callable[[], None] | None = None):
        """`server` (a uvicorn.Server) serves on `sock`; `before` runs on its loop's thread first."""
        self.server, self.sock, self.beat_s, self.before = server, sock, beat_s, before
        self.turned = time.monotonic()       # the server's loop was last seen turning
        self.thread = threading.Thread(target=self.serve, name=name, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        async def main() -> None:
            async def turning() -> None:
                while True:
                    self.turned = time.monotonic()
                    await asyncio.sleep(self.beat_s / 2)
            if self.before is not None:
                self.before()
            beat = asyncio.create_task(turning())
            try:
                await self.server.serve(sockets=[self.sock])
            finally:
                beat.cancel()
        asyncio.run(main())

    def healthy(self) -> bool:
        return self.thread.is_alive() and time.monotonic() - self.turned < max(2 * self.beat_s, 1.0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_WAIT_S)
        self.sock.close()
