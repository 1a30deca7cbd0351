"""The forkserver's preload leaves a worker nothing to import or to read from source on its way to
Ready: what a restart does before Ready is what pulsed's kill → ready time is made of."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Each always-running worker is forked from a preloaded process, as the forkserver forks it, and runs
# its real way to Ready (harness.run: its config, its databases, its sockets) in a fresh home; the
# probe stops it where it would send Ready and says what it imported and read on the way. The home's
# own engine modules (pulse_engine) are the one exception: the engine loads them afresh at each start.
PROBE = textwrap.dedent("""\
    import inspect, json, os, sys, tempfile
    from pathlib import Path
    from pulse.supervisor import forkserver
    forkserver.preload()
    from pulse.core import config as configmod, procs
    from pulse.core.childspecs import CHILD_SPECS
    from pulse.core.home import Paths
    from pulse.core.wire import spawnmsgs
    from pulse.store.provision import ensure_home
    from pulse.workers import harness
    procs.set_title("pulse: probe")                          # as the forkserver does before it forks

    class AtReady(BaseException):
        pass

    def at_ready(self, wakeup_fd, after_ready):
        raise AtReady

    def unread(*args, **kwargs):
        raise AssertionError("read a source file after the preload")

    root = Path(tempfile.mkdtemp(prefix="pulse-preload-"))
    paths = Paths(root / "home", root / "run")
    ensure_home(paths.home)
    paths.runtime.mkdir(mode=0o700)
    config = configmod.load(paths.home / "config.toml")
    harness.Harness.loop = at_ready
    inspect.getsource = unread
    late = {}
    for name, spec in CHILD_SPECS.items():
        if spec.enabled_by is not None:
            continue
        module, cls = forkserver.PRELOAD[name]
        start = spawnmsgs.Spawn(name, 1, configmod.encode_slice(config, name), str(paths.runtime),
                                str(paths.home), 0.0, "probe")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            before = set(sys.modules)
            try:
                harness.run(start, getattr(sys.modules[module], cls), os.getppid())
                outcome = "never reached Ready"
            except AtReady:
                outcome = sorted(m for m in set(sys.modules) - before if not m.startswith("pulse_engine"))
            except BaseException as err:
                outcome = f"failed: {err!r}"
            os.write(w, json.dumps(outcome).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as said:
            late[name] = json.loads(said.read() or b'"died"')
        os.waitpid(pid, 0)
    import shutil
    shutil.rmtree(root)
    print(json.dumps(late))
    """)


def test_a_workers_way_to_ready_imports_nothing_and_reads_no_source():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    late = __import__("json").loads(proc.stdout.splitlines()[-1])
    assert set(late) >= {"eventlog", "watcher", "tick", "executor", "engine"}, late
    assert all(imported == [] for imported in late.values()), f"after the preload: {late}\n{proc.stderr[-3000:]}"
