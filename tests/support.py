"""Helpers for tests that start real pulsed processes in temporary homes.

Every wait is a condition with a deadline; every process a test starts is
killed by pid at teardown (psutil.Process checks its create time, so a
recycled pid is never hit).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from pulse.core import client
from pulse.core.home import Paths, write_web_token
from pulse.core.wire import controlmsgs

BIN = Path(sys.executable).parent
PULSED = str(BIN / "pulsed")
PULSECTL = str(BIN / "pulsectl")

# Fast timings for tests, through the documented PULSE_* overrides.
FAST = {
    "PULSE_HEARTBEAT_MS": "100",
    "PULSE_HUNG_AFTER_MS": "1500",
    "PULSE_SQLITE_BUSY_TIMEOUT_MS": "1000",
    "PULSE_READY_TIMEOUT_MS": "3000",
    "PULSE_STOP_GRACE_MS": "1000",
    "PULSE_RESTART_BACKOFF_BASE_MS": "50",
    "PULSE_RESTART_BACKOFF_MAX_MS": "400",
}


DAEMON_TEST = True    # conftest says, per test, whether it is marked `daemon` (and so may start pulsed)


def wait_exited(procs, timeout: float) -> list[psutil.Process]:
    """Wait until each of `procs` has exited, at most `timeout` s; those still running. A zombie has
    exited: an orphan's stays until init reaps it, which this machine's init does only every couple of
    seconds (psutil.wait_procs waited those out: ~2 s a teardown that killed a keeper)."""
    def running(proc: psutil.Process) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = [p for p in alive if running(p)]
    return alive


def kill_keepers(home: Path) -> None:
    """What restart-process started for this home (its keepers and their processes, and the keepers'
    server) outlives pulsed by design; a test's must not outlive the test. By pid, found by title."""
    keepers = [p for p in psutil.process_iter(["cmdline"])
               if (p.info["cmdline"] or [""])[0].startswith(("pulse: keep ", "pulse: keepers ("))
               and f"({home})" in p.info["cmdline"][0]]
    for keeper in keepers:
        try:
            victims = [*keeper.children(recursive=True), keeper]
        except psutil.Error:
            continue
        for proc in victims:
            try:
                proc.kill()
            except psutil.Error:
                pass
        wait_exited(victims, timeout=5)


MIN_POLL_S, MAX_POLL_S = 0.01, 0.05


def wait_for(condition, timeout: float = 10.0, interval: float | None = None, what: str = "condition"):
    """Poll `condition` until it returns something truthy; fail the test at the deadline.
    A costly check (a `pulsectl` run, a page's request) waits as long as it took before the next:
    polling takes at most half a core from the processes it waits for, on a 2-core machine. Without
    an `interval`, the checks start 10 ms apart and then come no more often than a tenth of the time
    waited so far (up to 50 ms): the suite is CPU-bound on 2 cores, and a wait of seconds polled every
    10 ms took CPU from the very processes it waited for, to see the answer at most 40 ms sooner."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        began = time.monotonic()
        value = condition()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        pause = interval if interval is not None else min(max(MIN_POLL_S, (now - start) / 10), MAX_POLL_S)
        time.sleep(min(max(pause, now - began), deadline - now))


def notifications(path: Path, rule: str) -> list[dict]:
    """The notifications a rule sent through a [[notify]] file channel at `path`."""
    if not path.exists():
        return []
    return [n for n in map(json.loads, path.read_text().splitlines()) if n.get("rule") == rule]


def init_home(home: Path) -> Paths:
    """`pulsectl init` once (the engine directory, config, stores), as a user would before editing it.
    A home not there yet is a copy of the run's golden home, which is what `pulsectl init` makes."""
    if not home.exists() and GOLDEN_HOME is not None:
        copy_golden_home(home)
    elif not (home / "engine").exists():
        subprocess.run([PULSECTL, "--home", str(home), "init"], check=True, capture_output=True, timeout=60)
    return Paths.for_client(home)


# A home as `pulsectl init` makes it, made once per run (per xdist worker) and copied for each test that
# needs a new home: `pulsectl init`, and pulsed's first run, spend half a second or more on the engine's
# git repository, its worktree and the scan for tools to guard, ~600 times a run. conftest sets the
# path; None: every home is made by `pulsectl init` (or pulsed) itself.
GOLDEN_HOME: Path | None = None
# The TMPDIR of every process a test starts (pulsed, and so an agent run's scratch directory), under
# the run's private directory: conftest sets it; this process's own tempfile still says /tmp.
CHILD_TMPDIR: Path | None = None
FRESH_HOME = False    # conftest says, per test, whether it is marked `fresh_home` (pulsed makes the home)


def runtime_dirs_in(work: Path) -> None:
    """Every pulsed this process starts keeps its runtime directory (sockets, its instance file and the
    registry beside it) under work/run, as conftest does for a test run: not under /tmp, where root
    without XDG_RUNTIME_DIR makes them and a SIGKILLed pulsed leaves its own behind. For the scripts
    that start pulseds outside pytest; work goes with the run."""
    (work / "run").mkdir(mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = str(work / "run")


def copy_golden_home(home: Path) -> None:
    """A new home equal to what `pulsectl init` makes there (a web token of its own included)."""
    if not (GOLDEN_HOME / "engine").exists():
        subprocess.run([PULSECTL, "--home", str(GOLDEN_HOME), "init"], check=True, capture_output=True, timeout=60)
    home.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(GOLDEN_HOME, home, symlinks=True)
    # The staging worktree and the engine's repository name each other by absolute path.
    (home / "staging" / ".git").write_text(f"gitdir: {home / 'engine' / '.git' / 'worktrees' / 'staging'}\n")
    (home / "engine" / ".git" / "worktrees" / "staging" / "gitdir").write_text(f"{home / 'staging' / '.git'}\n")
    write_web_token(Paths.for_client(home))


def engine_rule(pulsed: "Pulsed", name: str, body: str) -> None:
    """Put a rule module into the home's engine directory before pulsed starts."""
    init_home(pulsed.home)
    (pulsed.home / "engine" / "rules" / f"{name}.py").write_text(textwrap.dedent(body))


class Pulsed:
    """One real pulsed on a temporary home."""

    def __init__(self, home: Path, tracker: "Tracker", golden: bool = False):
        self.home = home
        self.tracker = tracker
        # started on a home not there yet: a copy of the golden home (the `pulsed` fixture's own home
        # only; a test marked fresh_home, or one that moved the home elsewhere, has pulsed make it)
        self.golden_for = home if golden else None
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    @property
    def paths(self) -> Paths:
        return Paths.for_client(self.home)

    def start(self, env: dict | None = None, args: tuple = (), wait: bool = True) -> "Pulsed":
        assert DAEMON_TEST, "a test that starts pulsed is a daemon test: mark it @pytest.mark.daemon"
        inherited = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        self.env = {**inherited, **FAST, **(env or {})}
        if self.home == self.golden_for and not FRESH_HOME and not self.home.exists() and GOLDEN_HOME is not None:
            copy_golden_home(self.home)
        self.log = open(self.home.parent / "pulsed.out", "ab")
        self.proc = subprocess.Popen([PULSED, "--home", str(self.home), *args], env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.tracker.add(self.proc.pid)
        if wait:
            self.wait_running()
        return self

    def request(self, message, timeout: float = 3.0) -> controlmsgs.Reply:
        return client.request(self.paths, message, timeout)

    def status(self) -> controlmsgs.Status:
        status = self.request(controlmsgs.GetStatus()).status
        self.tracker.add(*[w.pid for w in status.workers if w.pid])
        return status

    def worker(self, name: str) -> controlmsgs.WorkerStatus:
        return next(w for w in self.status().workers if w.name == name)

    def try_status(self) -> controlmsgs.Status | None:
        try:
            return self.status()
        except client.Unreachable:
            return None

    def wait_running(self, names=("watcher", "tick", "executor", "engine"), timeout: float = 15.0) -> controlmsgs.Status:
        """Its status, once `names` run; a pulsed that exited meanwhile fails at once, with what it said."""
        def check():
            st = self.try_status()
            if st is None and self.proc is not None and self.proc.poll() is not None:
                out = (self.home.parent / "pulsed.out").read_bytes()[-2000:].decode(errors="replace")
                pytest.fail(f"pulsed exited ({self.proc.returncode}) before {', '.join(names)} ran; it said:\n{out}")
            return st if st and all(w.state == "running" for w in st.workers if w.name in names) else None
        return wait_for(check, timeout, what=f"{', '.join(names)} running")

    def wait_state(self, name: str, state: str, timeout: float = 10.0) -> controlmsgs.WorkerStatus:
        def check():
            st = self.try_status()
            w = st and next(w for w in st.workers if w.name == name)
            return w if w and w.state == state else None
        return wait_for(check, timeout, what=f"{name} {state}")

    def wait_replaced(self, name: str, old_pid: int, timeout: float = 10.0, heartbeat: bool = True) -> controlmsgs.WorkerStatus:
        """Running (its Ready arrived) with a new pid, and heartbeating since: a new pid alone proves nothing."""
        def check():
            w = self.worker(name)
            if w.state == "running" and w.pid not in (None, old_pid):
                return w
            return None
        w = wait_for(check, timeout, what=f"{name} replaced (was pid {old_pid})")
        if heartbeat:
            self.wait_heartbeat(name, w.pid)
        return w

    def wait_heartbeat(self, name: str, pid: int, timeout: float = 5.0) -> None:
        """A heartbeat from `pid` sent after now: it is alive and looping."""
        t0 = time.monotonic()

        def check():
            before = time.monotonic()
            w = next((w for w in self.status().workers if w.pid == pid), None)
            return w is not None and w.heartbeat_age_s is not None and before - w.heartbeat_age_s > t0
        wait_for(check, timeout, what=f"a fresh heartbeat from {name} (pid {pid})")

    def events_written(self, timeout: float = 10.0) -> None:
        """Wait until the event writer has committed every lifecycle event pulsed has recorded
        so far (pulsed writes them asynchronously); at once if pulsed is not answering."""
        try:
            recorded = self.request(controlmsgs.GetStatus(), timeout=1.0).events_recorded
        except client.Unreachable:
            return
        wait_for(lambda: self.request(controlmsgs.GetStatus()).events_written >= recorded, timeout,
                 what=f"pulsed's first {recorded} lifecycle events written")

    def events(self, type: str | None = None, target: str | None = None, *, written: bool = True) -> list[dict]:
        """events.db's rows (of a type, for a target); first, unless `written=False`, every
        lifecycle event pulsed recorded until now."""
        if written and self.proc is not None and self.proc.poll() is None:
            self.events_written()
        if not (self.home / "events.db").exists():
            return []   # pulsed has not made it yet
        conn = sqlite3.connect(self.home / "events.db", timeout=5)
        try:
            rows = conn.execute("SELECT id, seq, ts, mono, type, source, target, data FROM events ORDER BY id")
            out = [dict(id=r[0], seq=r[1], ts=r[2], mono=r[3], type=r[4], source=r[5], target=r[6],
                        data=json.loads(r[7])) for r in rows]
        except sqlite3.OperationalError:   # being created by pulsed this very moment
            return []
        finally:
            conn.close()
        return [e for e in out if (type is None or e["type"] == type) and (target is None or e["target"] == target)]

    def ticks(self) -> list[dict]:
        """Every tick's record (the tick writes one vital per tick), oldest first."""
        path = self.home / "vitals.db"
        if not path.exists():
            return []
        conn = sqlite3.connect(path, timeout=5)
        try:
            rows = conn.execute("SELECT rowid, ts, data FROM vitals WHERE key = 'tick' ORDER BY rowid").fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()
        return [{"id": r[0], "ts": r[1], "data": json.loads(r[2])} for r in rows]

    def samples(self, key: str) -> int:
        path = self.home / "vitals.db"
        if not path.exists():
            return 0
        conn = sqlite3.connect(path, timeout=5)
        try:
            return conn.execute("SELECT COUNT(*) FROM vitals WHERE key = ?", (key,)).fetchone()[0]
        except sqlite3.OperationalError:
            return 0
        finally:
            conn.close()

    def wait_samples(self, key: str, n: int, timeout: float = 10.0) -> None:
        """n more samples of `key` from now: for "nothing more happens" checks, instead of a sleep."""
        start = self.samples(key)
        wait_for(lambda: self.samples(key) >= start + n, timeout, what=f"{n} more samples of {key}")

    def wait_ticks(self, n: int, timeout: float = 10.0) -> None:
        self.wait_samples("tick", n, timeout)

    def vitals_of(self, key: str) -> list[dict]:
        return vitals_of(self.home, key)

    def vital(self, key: str, check=lambda data: True):
        """The latest vital of `key` if `check(data)` holds, else None."""
        path = self.home / "vitals.db"
        if not path.exists():
            return None
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT data FROM vitals WHERE key = ? ORDER BY ts DESC LIMIT 1", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        finally:
            conn.close()
        data = json.loads(row[0]) if row else None
        return data if data is not None and check(data) else None

    def forkserver_pid(self) -> int:
        kids = psutil.Process(self.proc.pid).children()
        pid = next(p.pid for p in kids if "forkserver" in " ".join(p.cmdline()))
        self.tracker.add(pid)
        return pid

    def wait_spare(self, other_than: int | None = None, timeout: float = 10.0) -> psutil.Process:
        """The forkserver's spare (a fork waiting to be told which worker to be) once it has one,
        other than `other_than`; there is never more than one."""
        forkserver = psutil.Process(self.forkserver_pid())

        def spare():
            found = [p for p in forkserver.children() if comm(p.pid) == "pulse: spare"]
            assert len(found) <= 1, f"more than one spare: {found}"
            return found[0] if found and found[0].pid != other_than else None
        found = wait_for(spare, timeout, what="the forkserver's spare")
        self.tracker.add(found.pid)
        return found

    def tree(self) -> list[psutil.Process]:
        procs = [psutil.Process(self.proc.pid)] + psutil.Process(self.proc.pid).children(recursive=True)
        self.tracker.add(*[p.pid for p in procs])
        return procs

    def ctl(self, *args: str, timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
        return pulsectl(["--home", str(self.home), *args], timeout=timeout, env=dict(os.environ, **(env or {})))

    def terminate(self, timeout: float = 10.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        path = self.home / "logs" / "pulse.log"
        return path.read_text(errors="replace") if path.exists() else ""


def vitals_of(home: Path, key: str) -> list[dict]:
    """Every sample of `key` in `home`'s vitals.db, oldest first, each {"ts", **data}; none before the
    store is made."""
    path = home / "vitals.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT ts, data FROM vitals WHERE key = ? ORDER BY ts", (key,)).fetchall()
    except sqlite3.OperationalError:   # not migrated yet
        return []
    finally:
        conn.close()
    return [{"ts": ts, **json.loads(data)} for ts, data in rows]


class CtlZygote:
    """This test worker's tests/ctlzygote.py: pulsectl runs forked from a process that has imported
    pulsectl, one at a time (a lock: tests call it from threads too)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None

    def _started(self) -> socket.socket:
        if self.proc is None or self.proc.poll() is not None:
            if self.sock is not None:
                self.sock.close()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            # this worker's pid: unused by the zygote, it names its worker in its command line
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("ctlzygote.py")), str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            theirs.close()
            self.sock = ours
        return self.sock

    def _said(self, sock: socket.socket) -> dict:
        packet = sock.recv(4096)
        if not packet:
            raise RuntimeError(f"tests/ctlzygote.py (pid {self.proc.pid}) ended mid-request: see its stderr above")
        return json.loads(packet)

    def run(self, argv: list[str], env: dict, timeout: float, entry: str = "main") -> subprocess.CompletedProcess:
        """`pulsectl ARGV` through its entry point (entry "main") or its click group alone ("click").
        As subprocess.run: stdout and stderr read to their end (what the run started may hold them
        open after it exited), the run killed at the deadline if it has not exited, TimeoutExpired.
        An exchange cut short otherwise (pytest-timeout's alarm, ^C) ends the zygote and so its run,
        whose answers would otherwise be read as the next request's."""
        with self.lock:
            try:
                return self._exchange(argv, env, timeout, entry)
            except subprocess.TimeoutExpired:
                raise
            except BaseException:
                self.close(at_once=True)
                raise

    def _exchange(self, argv: list[str], env: dict, timeout: float, entry: str) -> subprocess.CompletedProcess:
        sock = self._started()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            request = {"argv": [PULSECTL, *argv], "env": env, "cwd": working_directory(), "entry": entry}
            socket.send_fds(sock, [json.dumps(request).encode()], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        said = {out_r: bytearray(), err_r: bytearray()}
        try:
            pid = self._said(sock)["pid"]
            code, open_pipes, timed_out = None, 2, False
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as sel:
                for fd in (out_r, err_r, sock):
                    sel.register(fd, selectors.EVENT_READ)
                while open_pipes or code is None:
                    ready = sel.select(deadline - time.monotonic())
                    if not ready:
                        timed_out = True
                        break
                    for key, _ in ready:
                        if key.fileobj is sock:
                            code = self._said(sock)["code"]     # reaped: its pid may be another's now
                            sel.unregister(sock)
                        elif chunk := os.read(key.fd, 65536):
                            said[key.fd] += chunk
                        else:
                            sel.unregister(key.fd)
                            open_pipes -= 1
        finally:
            os.close(out_r)
            os.close(err_r)
        stdout, stderr = said[out_r].decode(), said[err_r].decode()
        if timed_out:
            if code is None:
                os.kill(pid, signal.SIGKILL)              # not reaped yet: still the zygote's child
                self._said(sock)
            raise subprocess.TimeoutExpired([PULSECTL, *argv], timeout, stdout, stderr)
        return subprocess.CompletedProcess([PULSECTL, *argv], code, stdout, stderr)

    def close(self, at_once: bool = False) -> None:
        if self.proc is not None:
            self.sock.close()                             # EOF: it exits once its run has
            try:
                self.proc.wait(0 if at_once else 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc, self.sock = None, None


CTL_ZYGOTE = CtlZygote()


def working_directory() -> str | None:
    """This process's working directory; None when it was removed (a test's tmp dir gone): the run then
    starts where the zygote started, and a relative path is as meaningless there as in a removed one."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def pulsectl(argv: list[str], timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
    """`pulsectl ARGV`, as subprocess.run(capture_output=True, text=True) would give it, through this
    worker's CtlZygote: the same entry point, in a process of its own, without an interpreter's start
    and pulsectl's imports each time (~0.1 s of CPU of each of ~1,000 runs). An environment that
    changes how Python starts (PYTHONPATH and its kin: a sitecustomize that plugs a kind or a worker
    in) gets a fresh interpreter, the console script itself."""
    env = dict(os.environ) if env is None else env
    if any(env.get(key) != os.environ.get(key) for key in {*env, *os.environ} if key.startswith("PYTHON")):
        return subprocess.run([PULSECTL, *argv], capture_output=True, text=True, timeout=timeout, env=env)
    return CTL_ZYGOTE.run(argv, env, timeout)


def comm(pid: int) -> str:
    """/proc/PID/comm (a worker's name, 15 bytes at most); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


class Tracker:
    """Every pid a test saw; killed at teardown if still alive."""

    def __init__(self):
        self.procs: dict[int, psutil.Process] = {}

    def add(self, *pids: int) -> None:
        for pid in pids:
            if pid and pid not in self.procs:
                try:
                    self.procs[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    pass

    def kill_all(self) -> None:
        for proc in self.procs.values():
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


CHROMIUM = "/usr/bin/chromium"   # Debian's package: never a browser Playwright downloads


def browser_or_skip():
    """Playwright's sync API, or a skip; in CI (CI=true) a missing browser fails the test instead."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed (the test extra)"
    if missing is None and not os.path.exists(CHROMIUM):
        missing = f"no Chromium at {CHROMIUM}"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_playwright


def copy_home(template: Path, home: Path) -> None:
    """A copy of a prepared home (the long_history fixture's) to start a pulsed on."""
    shutil.copytree(template, home, symlinks=True, dirs_exist_ok=True)


def eventsdb_last_id(conn) -> int:
    from pulse.store import eventsdb
    return eventsdb.last_event_id(conn)


def scrape(pulsed: "Pulsed") -> str:
    """/metrics as the web worker would serve it now: folded from this home's events.db, over its live status."""
    from pulse.store import connection
    from pulse.web import metrics
    conn = connection.open_readonly(pulsed.home / "events.db")
    try:
        counts = metrics.rebuild_counts(conn, eventsdb_last_id(conn))
    finally:
        conn.close()
    return metrics.exposition(counts, pulsed.status(), {}).decode()
