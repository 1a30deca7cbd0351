"""The forkserver's preload leaves a worker nothing to import or to read from source on its way to
Ready: what a restart does before Ready is what pulsed's kill → ready time is made of."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""\
    import inspect, sys
    from pulse.supervisor import forkserver
    forkserver.preload()
    before = set(sys.modules)

    def unread(*args, **kwargs):
        raise AssertionError("read a source file after the preload")
    inspect.getsource = unread

    from pulse.agents import tasks
    from pulse.gate import durable, tools  # the executor's gate thread, at each start
    from pulse.engine import repo                           # the engine's open()
    from pulse.workers import tick
    tick.tick_projection(123.0)                             # the tick's open(): its projections' versions
    tasks.book_projection("tick.tasks", ["an-agent"], forget_ended=True)
    late = sorted(set(sys.modules) - before)
    assert not late, f"imported after the preload: {late}"
    """)


def test_a_workers_way_to_ready_imports_nothing_and_reads_no_source():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
