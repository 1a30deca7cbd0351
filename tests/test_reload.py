"""`pulsectl reload`: each worker reads one slice of the config, and a reload restarts exactly the
workers whose slice changed, so every change takes effect and nothing else is disturbed."""

from __future__ import annotations

import os
import subprocess
import textwrap
import typing

import msgspec
import pytest

from pulse.core import config as configmod
from support import init_home, notifications, wait_for

WORKERS = ("eventlog", "watcher", "tick", "executor", "engine")
FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100", "PULSE_INTENSITY_RESTARTS": "1000"}


def key_paths(kind: type, prefix: str = "") -> set[str]:
    """Every key of a config Struct, as dotted paths; an array of tables counts as one key."""
    out = set()
    for field in msgspec.structs.fields(kind):
        path = f"{prefix}{field.name}"
        inner = [t for t in typing.get_args(field.type) if t is not type(None)] or [field.type]
        if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], msgspec.Struct):
            out |= key_paths(inner[0], path + ".")
        else:
            out.add(path)
    return out


def test_every_key_of_the_config_is_read_by_some_process():
    read = set().union(*(key_paths(kind) for kind in [*configmod.SLICES.values(), configmod.SupervisorConfig]))
    # `schema` is the file's own version, read by decode() itself
    assert key_paths(configmod.Config) - read == {"schema"}
    assert read <= key_paths(configmod.Config)


def write_config(home, text: str) -> None:
    (home / "config.toml").write_text(textwrap.dedent(text))


def reload(pulsed) -> set[str]:
    """Reload, wait until every worker runs again, and return the workers it restarted."""
    out = pulsed.ctl("reload")
    assert out.returncode == 0, out.stdout + out.stderr
    named = {line.split(":")[0].strip() for line in out.stdout.splitlines()
             if ": restarted (pid " in line or ": restart begun" in line}
    # "begun" is only for the event writer, which status does not list: a listed worker's restart is
    # seen by its pid changing from the one the reload found
    assert all(line.startswith("  eventlog:") for line in out.stdout.splitlines() if ": restart begun" in line), out.stdout
    pulsed.wait_running(WORKERS)
    return named


NOTIFY_FILE = """
    [[notify]]
    kind = "file"
    path = "{notes}"
"""


def test_an_error_log_added_by_reload_is_escalated(pulsed, tmp_path):
    """The tick's errorEscalate must see the new log, not only the watcher."""
    log, notes = tmp_path / "app.log", tmp_path / "notes.jsonl"
    log.write_text("starting\n")
    init_home(pulsed.home)
    write_config(pulsed.home, NOTIFY_FILE.format(notes=notes))
    pulsed.start(env=FAST)
    write_config(pulsed.home, NOTIFY_FILE.format(notes=notes) + f"""
        [[watch.error_log]]
        name = "app"
        path = "{log}"
    """)
    assert {"watcher", "tick"} <= reload(pulsed)
    wait_for(lambda: pulsed.vital("error-log:app"), 10, what="the new log watched")
    with log.open("a") as f:
        f.write("ERROR the database went away\n")
    sent = wait_for(lambda: notifications(notes, "error-escalate"), 10, what="the escalation")
    assert sent[0]["target"] == "app"


def test_observe_only_flipped_by_reload_changes_what_survival_does(pulsed, tmp_path):
    marker = tmp_path / "restarted"
    process = f"""
        [survival]
        process_backoff_base_s = 0.1
        process_backoff_max_s = 0.2

        [[process]]
        name = "ghost"
        match = "^pulse-reload-ghost-{os.getpid()}$"
        restart = ["touch", "{marker}"]
    """
    init_home(pulsed.home)
    write_config(pulsed.home, "observe_only = true\n" + process)
    pulsed.start(env=FAST)
    wait_for(lambda: pulsed.events("effect-expired"), 10, what="a restart recorded, not run")
    assert not marker.exists()
    write_config(pulsed.home, "observe_only = false\n" + process)
    assert "tick" in reload(pulsed)
    wait_for(marker.exists, 10, what="the restart run once observe_only is off")


def test_a_typecheck_set_by_reload_runs_in_the_next_promote(pulsed, tmp_path):
    marker = tmp_path / "typechecked"
    init_home(pulsed.home)
    pulsed.start(env=FAST)
    write_config(pulsed.home, f"""
        [engine]
        typecheck = ["touch", "{marker}"]
    """)
    assert "executor" in reload(pulsed)
    staging = pulsed.home / "staging"
    (staging / "rules" / "extra.py").write_text("RULES = []\n")
    for args in (["add", "-A"], ["commit", "-q", "-m", "an extra module"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                       cwd=staging, check=True, capture_output=True, timeout=30)
    out = pulsed.ctl("emit", "engine-promote", "--wait", "60")
    assert out.returncode == 0, out.stdout + out.stderr
    assert marker.exists()


# One key of every table, and who must restart when it changes. Written out by hand, apart from
# the slices themselves: a slice that loses a table its worker reads fails here.
CHANGES = [
    ("[timings]\ntick_ms = 4000", {"tick"}),
    ("[timings]\nexecutor_concurrency = 4", {"executor"}),
    ("[timings]\nwatcher_interval_ms = 4000", {"watcher", "engine"}),
    ("[timings]\nstop_grace_ms = 4000", set()),                         # pulsed's own: applied in place
    ("[log]\nlevel = \"debug\"", set(WORKERS)),
    ("[engine]\ntypecheck = [\"true\"]", {"executor"}),
    ("[engine]\noom_score_adj = 700", {"engine"}),
    ("[[watch.error_log]]\nname = \"x\"\npath = \"/nonexistent/x.log\"", {"watcher", "tick"}),
    ("[tick]\nsense = [\"system-resource\"]", {"tick"}),
    ("[allow]\nkinds = [\"noop\"]", {"executor"}),
    ("[store]\nerror_coalesce_s = 60", {"watcher", "tick", "executor", "engine", "eventlog"}),
    ("[survival]\nnotify_every_s = 60", {"tick"}),
    ("[tasks]\nmax_failures = 2", {"executor"}),
    ("[[process]]\nname = \"p\"\nmatch = \"^never-such-process$\"", {"watcher", "tick", "executor"}),
    ("[[agent]]\nname = \"a\"\nargv = [\"true\"]", {"tick", "executor"}),
    ("[[notify]]\nkind = \"log\"\n[[notify]]\nkind = \"log\"", {"executor"}),
    ("observe_only = true", {"tick"}),
    ("[report]\ndaily_at = \"08:00\"", {"tick", "executor"}),
    ("[report]\nanalyst_timeout_s = 60", {"executor"}),
    ("[pulse]\nname = \"other\"", set()),                              # pulsed's own, read at start
    ("[gate]\nmax_string_bytes = 2048", {"executor"}),              # the executor serves the agents' gate
    ("[web]\nlisten = \"127.0.0.1:0\"", set()),                          # the web worker runs only when enabled
    ("[fleet]\npresence_interval_s = 4", set()),                          # so does the fleet worker
    ("[telemetry]\nflush_s = 2", set()),                                  # and the telemetry receiver
    ("[budget]\nusd_per_day = 50", {"tick", "executor"}),  # the tick's snapshot says who is over it; the
                                                          # executor reserves (web, fleet: only when enabled)
    ("[[schedule]]\nname = \"s\"\nevery = \"1h\"\ntask = { project = \"p\", title = \"t\", prompt = \"x\" }", {"tick"}),
]


def test_each_table_reloads_exactly_the_workers_that_read_it(pulsed):
    init_home(pulsed.home)
    pulsed.start()
    tables = {line.strip("[] ").split(".")[0] if line.startswith("[") else line.split(" ")[0]
              for text, _ in CHANGES for line in text.splitlines()[:1]}
    assert tables == {f.name for f in msgspec.structs.fields(configmod.Config)} - {"schema"}
    for text, expected in CHANGES:
        write_config(pulsed.home, text + "\n")
        assert reload(pulsed) == expected, text
        write_config(pulsed.home, "")
        assert reload(pulsed) == expected, f"back from {text}"
        effective = pulsed.ctl("config", "--effective")
        assert effective.returncode == 0, effective.stderr


@pytest.mark.parametrize("worker", WORKERS)
def test_a_worker_cannot_reach_beyond_its_slice(worker):
    whole = configmod.Config()
    part = configmod.decode_slice(worker, configmod.encode_slice(whole, worker))
    beyond = {f.name for f in msgspec.structs.fields(configmod.Config)} - set(part.__struct_fields__)
    assert beyond, f"{worker} reads every table"
    for name in beyond:
        assert not hasattr(part, name)
