"""A worker is one row of the child spec table (pulse.core.childspecs): what the forkserver
preloads, the config slice pulsed sends, the [timings] retry key and its default, and the status
field its heartbeat fills all agree with that table, and a row added to it alone brings all of
them with it."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from pulse.core import config as configmod
from pulse.core.childspecs import CHILD_SPECS, RETRIED
from pulse.core.config.keys import unwrapped
from pulse.core.wire import controlmsgs
from pulse.supervisor.forkserver import PRELOAD
from pulse.workers.harness import Worker

# The fields of `pulsectl status --json` that pulsed composes itself; every other one is a
# worker's, named by exactly one child spec.
PULSED_COMPOSES = {"version", "supervisor", "workers", "engine_commit", "processes", "files", "fresh", "dirs"}


def test_the_forkserver_preloads_each_workers_module_and_runs_its_class():
    assert list(PRELOAD) == list(CHILD_SPECS)
    for name, spec in CHILD_SPECS.items():
        module, cls = PRELOAD[name]
        worker = getattr(importlib.import_module(module), cls)
        assert issubclass(worker, Worker) and worker.name == name, spec.entry


def test_each_worker_gets_the_slice_its_spec_names():
    assert list(configmod.SLICES) == list(CHILD_SPECS)
    for name, spec in CHILD_SPECS.items():
        kind = configmod.SLICES[name]
        assert kind.__name__ == spec.config
        fields = {f.name: f.type for f in msgspec.structs.fields(kind)}
        assert {"timings", "log"} <= set(fields), f"{spec.config}: the harness reads timings and log"
        timing_keys = {f.name for f in msgspec.structs.fields(fields["timings"])}
        assert set(configmod.EVERY_WORKER) <= timing_keys, spec.config
        configmod.slice_of(configmod.Config(), name)   # cut from a default Config


def test_every_retry_key_is_a_timing_with_its_specs_default_and_pulsed_reads_it():
    timings = {f.name: f for f in msgspec.structs.fields(configmod.Timings)}
    supervisor = {f.name for f in msgspec.structs.fields(configmod.SupervisorTimings)}
    assert [s.name for s in RETRIED] == [n for n, s in CHILD_SPECS.items() if not s.core]
    for spec in RETRIED:
        assert timings[spec.retry_key].default == spec.retry_after_failed_s == 600, spec.name
        assert unwrapped(timings[spec.retry_key].type) is float and spec.retry_key in supervisor
    # and no such key is left over from a worker that has no row
    assert {k for k in timings if k.endswith("_retry_after_failed_s")} == {s.retry_key for s in RETRIED}


def test_the_retry_keys_stay_what_config_toml_says():
    config = configmod.decode("[timings]\nweb_retry_after_failed_s = 7\neventlog_retry_after_failed_s = 8\n", "t")
    supervisor = configmod.slice_of(config, "supervisor").timings
    assert (supervisor.web_retry_after_failed_s, supervisor.eventlog_retry_after_failed_s) == (7, 8)
    assert supervisor.engine_retry_after_failed_s == 600
    assert configmod.env_overrides({"PULSE_FLEET_RETRY_AFTER_FAILED_S": "2.5"}) == {"fleet_retry_after_failed_s": 2.5}
    assert "# telemetry_retry_after_failed_s = 600" in configmod.default_toml()


def test_every_worker_field_of_status_is_named_by_one_spec_whose_worker_fills_it():
    named = [s.status for s in CHILD_SPECS.values() if s.status]
    assert len(named) == len(set(named))
    assert {f.name for f in msgspec.structs.fields(controlmsgs.Status)} == PULSED_COMPOSES | set(named)
    for name, spec in CHILD_SPECS.items():
        if spec.status:
            module, cls = PRELOAD[name]
            worker = getattr(importlib.import_module(module), cls)
            assert worker.status_extras is not Worker.status_extras, f"{name} fills {spec.status} but sends no extras"


def test_a_worker_under_a_flag_is_one_pulsed_reads():
    tables = {f.name: f.type for f in msgspec.structs.fields(configmod.SupervisorConfig)}
    for spec in CHILD_SPECS.values():
        if spec.enabled_by:
            table, key = spec.enabled_by.split(".")
            assert key in {f.name for f in msgspec.structs.fields(tables[table])}, spec.enabled_by


# A new worker as a contributor would add it: its module in pulse/workers/ (here a temporary folder
# that joins pulse.workers' path, so the module is pulse.workers.probeworker and leaves no file in
# the tree) and a row of the table. The row goes into the table's own source, read and run in place
# of the module (a sitecustomize, so every process of the test sees it: pulsed, the forkserver,
# pulsectl) and nothing else is changed: whatever the worker needs must follow from that row, and
# docs/architecture.md's list of modules, from its docstring (scripts/gen_docs.py regenerates it).
NEW_ROW = ('    ChildSpec("probe", "pulse.workers.probeworker:ProbeWorker", "TelemetryConfig", retry_after_failed_s=42),')
SITECUSTOMIZE = textwrap.dedent("""\
    import importlib.util, os, sys, types
    import pulse.workers
    pulse.workers.__path__.append(os.path.join(os.path.dirname(__file__), "workers"))
    found = importlib.util.find_spec("pulse.core.childspecs")
    source = open(found.origin).read()
    anchor = ")}\\n\\n# Groups of names"
    assert source.count(anchor) == 1, "the end of CHILD_SPECS moved: update this test"
    module = types.ModuleType("pulse.core.childspecs")
    module.__file__ = found.origin
    sys.modules[module.__name__] = module
    exec(compile(source.replace(anchor, %r + "\\n" + anchor), found.origin, "exec"), module.__dict__)
    """) % NEW_ROW
PROBE_WORKER = textwrap.dedent("""\
    \"\"\"The probe: a worker that is its harness and nothing more.\"\"\"

    from pulse.workers.harness import Worker


    class ProbeWorker(Worker):
        name = "probe"
    """)


def with_new_row(tmp_path) -> dict[str, str]:
    """The environment under which every Python process sees the probe worker's row and module."""
    folder = tmp_path / "newrow"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (folder / "workers").mkdir()
    (folder / "workers" / "probeworker.py").write_text(PROBE_WORKER)
    return {"PYTHONPATH": str(folder)}


DERIVED = textwrap.dedent("""\
    import importlib.util
    import msgspec
    from pulse.core import childspecs, config
    from pulse.supervisor import child, forkserver
    print(childspecs.STEERABLE[-1], childspecs.LOG_SOURCES[-1], childspecs.SUPERVISED[-1])
    print(forkserver.PRELOAD["probe"])
    print(config.SLICES["probe"].__name__)
    print({f.name: f.default for f in msgspec.structs.fields(config.Timings)}["probe_retry_after_failed_s"])
    timings = config.slice_of(config.decode("[timings]\\nprobe_retry_after_failed_s = 9\\n", "t"), "supervisor").timings
    print(timings.probe_retry_after_failed_s, child.retry_after_failed_s(childspecs.CHILD_SPECS["probe"], timings))
    spec = importlib.util.spec_from_file_location("gen_docs", %r)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    workers = gen.module_tables().split("#### `pulse/workers/`")[1].split("####")[0]
    print([row for row in workers.splitlines() if "probe" in row])
    """) % str(Path(__file__).resolve().parents[1] / "scripts" / "gen_docs.py")


def test_a_new_row_brings_its_preload_slice_retry_key_and_groups(tmp_path):
    env = dict(os.environ, **with_new_row(tmp_path))
    proc = subprocess.run([sys.executable, "-c", DERIVED], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["probe probe probe", "('pulse.workers.probeworker', 'ProbeWorker')",
                                        "TelemetryConfig", "42", "9.0 9.0",
                                        "['| `probeworker` | The probe: a worker that is its harness and nothing more. |']"]


@pytest.mark.daemon
def test_pulsed_runs_restarts_and_retries_a_worker_that_is_a_row_and_a_module(pulsed, tmp_path):
    env = with_new_row(tmp_path)
    pulsed.start(env={**env, "PULSE_TEST_INJECT": "probe:crash-before-ready*6",
                      "PULSE_PROBE_RETRY_AFTER_FAILED_S": "1"}, wait=False)
    # crashes 1-5 restart it, the 6th fails it, and its own retry key brings start 7, which is healthy
    always = [name for name, spec in CHILD_SPECS.items() if spec.listed and not spec.enabled_by]   # the table's, not a copy
    probe = pulsed.wait_running((*always, "probe"), timeout=30)
    assert [w.name for w in probe.workers] == [*always, "probe"]
    assert [e["data"]["retry_in_s"] for e in pulsed.events("worker-failed", "probe")] == [1]
    assert pulsed.events("worker-restarted", "probe")[-1]["data"]["reason"] == "retry-after-failed"
    shown = json.loads(pulsed.ctl("status", "--json", env=env).stdout)
    assert [w["name"] for w in shown["workers"]][-1] == "probe"
    out = pulsed.ctl("restart", "probe", env=env)      # an operator may name it
    assert out.returncode == 0 and "probe: running" in out.stdout, out.stdout + out.stderr
