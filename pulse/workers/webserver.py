"""The web worker: the operator's page and /metrics (pulse.web), when `[web] enabled = true`.

Not core: like the engine, its crashes never escalate pulsed, and it writes nothing on the
survival path. uvicorn serves the app in a thread of its own with its own event loop; this
process's main loop (the harness) heartbeats only while that loop still turns (`healthy`), so
a hung server is replaced like any hung worker. It binds its socket before it says it is ready,
so `ready` means listening; the address it got (port 0 takes a free one) goes to pulsed with
each heartbeat, for `pulsectl web url`. The web stack is imported here, at open, never by the
forkserver or pulsed.
"""

from __future__ import annotations

import ctypes
import socket
import threading
import time

from pulse.core import config as configmod
from pulse.workers.harness import Worker
from pulse.workers.serverthread import ServerThread

# Imports inside functions: uvicorn (~140 ms) and the pages (~280 ms, python -X importtime) load in the
# web worker's own process when [web] runs it, not in the forkserver that preloads every worker's module.

# -- memory: what the web worker holds must not follow the history's length ---------------------
# The server runs the page's reads in a pool of threads (anyio's, 40 by default), and glibc gives each
# thread that allocates its own malloc arena (up to 8 per core), which keeps what was freed in it: every
# thread that once read much (a page cache, a fold's rows) kept it, so each new web worker sat higher as
# events.db grew. So: few threads, few arenas, and what is free handed back after the start-up fold (the
# one read of the whole history) and then every TRIM_EVERY_S.
WEB_THREADS = 8                  # the page's reads at once: each is one short indexed read
ARENAS = 2                       # malloc arenas: the server's loop and the harness, the pool shares them
TRIM_EVERY_S = 60.0              # hand freed memory back to the system this often (it costs < 1 ms)
M_ARENA_MAX = -8                 # mallopt's parameter number, from glibc's malloc.h


def libc():
    """glibc, for mallopt and malloc_trim; None elsewhere (musl has neither: nothing to do there)."""
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else None


def limit_arenas(lib, arenas: int) -> None:
    if lib is not None:
        lib.mallopt(M_ARENA_MAX, arenas)


def give_back(lib) -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim walks every arena)."""
    if lib is not None:
        lib.malloc_trim(0)



def limit_threads() -> None:
    """On the server's loop: at most WEB_THREADS threads for the routes' blocking work."""
    import anyio.to_thread
    anyio.to_thread.current_default_thread_limiter().total_tokens = WEB_THREADS

class WebWorker(Worker):
    name = "web"

    def open(self) -> None:
        import uvicorn

        from pulse.web.pages import make_app
        web = self.config.web
        host, port = configmod.listen_address(web.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, reuse_port=False)
        self.port = self.sock.getsockname()[1]
        self.scheme = "https" if web.tls_cert else "http"
        app, shared = make_app(self.paths, self.paths.web_token, self.config.timings.effect_deadline_s,
                               self.config.agent, self.config.budget, self.config.schedule, self.config.store)
        self.libc = libc()
        limit_arenas(self.libc, ARENAS)       # before the server's threads make theirs
        self.next_trim = time.monotonic() + TRIM_EVERY_S

        def warm_up() -> None:
            # fold the history for /metrics now, off the request path: the first scrape stays fast
            shared.count()
            # and leave a checkpoint of it: with nothing scraping /metrics, each start after a kill would
            # fold again all that came after the last one (from the archive, once retention moved it)
            shared.save_checkpoints()
            give_back(self.libc)              # the fold's rows and pages are free now: give them back
        threading.Thread(target=warm_up, name="metrics-warm-up", daemon=True).start()
        self.shared = shared
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", ssl_certfile=web.tls_cert,
            ssl_keyfile=web.tls_key, timeout_graceful_shutdown=1))
        self.serving = ServerThread(self.server, self.sock, self.config.timings.heartbeat_ms / 1000, "web-server",
                                    before=limit_threads)
        self.log.info("serving %s", self.url())

    def url(self) -> str:
        host, _ = configmod.listen_address(self.config.web.listen)
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{self.port}"

    def next_timer(self) -> float:
        return self.next_trim

    def on_timer(self, now: float) -> None:
        if now >= self.next_trim:
            give_back(self.libc)
            self.next_trim = now + TRIM_EVERY_S

    def status_extras(self) -> dict:
        return {"url": self.url()}

    def healthy(self) -> bool:
        return self.serving.healthy()

    def close(self) -> None:
        self.serving.stop()
        try:
            self.shared.save_checkpoints()
        except Exception as err:   # a stop must not fail on a checkpoint: the next start rebuilds
            self.log.warning("could not write the metrics' checkpoint: %s", err)
