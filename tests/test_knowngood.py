"""Last-known-good config of a [[process]], without a daemon: the config keys and their errors, the
watcher's samples, processWatchdog's decisions as a pure function of snapshots, the known-good
record folded from events, and the keep-config and restore-config kinds on real files.
(tests/test_config_rollback.py runs the whole loop with a real pulsed and a real process.)"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import subprocess
import textwrap
import time

import msgspec
import psutil
import pytest

from pulse.core import config as configmod
from pulse.core.config import ConfigError
from pulse.core.states import EffectState
from pulse.core.wire.enginerpc import Effect, KnownGood, Outcome, ProcessExit, Snapshot, Vital
from pulse.core.wire.eventmsgs import Event
from pulse.effects import configfiles, registry
from pulse.effects.kinds import EffectContext, EffectFailed
from pulse.rules import onion, survival
from pulse.sensing.builtin import ConfigFiles, ProcessAlive
from pulse.store import objects
from support import wait_for

APP, EXTRA = "/srv/gw/app.json", "/srv/gw/extra.json"
GOOD, BROKEN, OTHER = "a" * 64, "b" * 64, "c" * 64


def load(text: str) -> configmod.Config:
    return configmod.validate(configmod.decode(textwrap.dedent(text).encode(), "config.toml"), "config.toml")


CONFIG = load(f"""
    [[process]]
    name = "gw"
    match = "gw"
    restart = ["gw"]
    config = ["{APP}", "{EXTRA}"]
    config_good_after_s = 60
    config_rollback_window_s = 600
    stop_exit_codes = [78]
""")
TICK = configmod.slice_of(CONFIG, "tick")


# -- config --------------------------------------------------------------------------------------------

def test_the_config_keys_have_their_stated_defaults():
    proc = load('[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\n').process[0]
    assert (proc.config, proc.config_good_after_s, proc.config_rollback_window_s) == ([], 60, 600)
    assert "config:*" in configmod.Config().tick.sense
    assert "config_rollback_window_s" in configmod.default_toml()


@pytest.mark.parametrize("body, says", [
    ('config = ["etc/gw.json"]', "$.process[0].config[0]: must be an absolute path, got 'etc/gw.json'"),
    ('config = ["/etc/gw/"]', "$.process[0].config[0]: names a directory"),
    ('config = ["/etc/gw.json", "/etc/./gw.json"]', "$.process[0].config: a file is listed twice"),
    ('config = ["/etc/gw.json"]\nconfig_good_after_s = 0', "$.process[0].config_good_after_s must be greater than 0"),
    ('config = ["/etc/gw.json"]\nconfig_rollback_window_s = -1',
     "$.process[0].config_rollback_window_s must be greater than 0"),
    ('config = "/etc/gw.json"', "$.process[0].config: Expected `array`"),
])
def test_bad_config_keys_say_what_and_where(body, says):
    with pytest.raises(ConfigError) as err:
        load(f'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\n{body}\n')
    assert says in str(err.value) and str(err.value).startswith("config.toml")


def test_config_files_need_a_process_pulse_can_restart():
    with pytest.raises(ConfigError, match=r"\$.process\[0\].config: needs a restart argv"):
        load('[[process]]\nname = "gw"\nmatch = "gw"\nconfig = ["/etc/gw.json"]\n')


# -- the watcher ---------------------------------------------------------------------------------------

def test_the_watcher_samples_each_file_and_wakes_the_tick_when_one_changes(tmp_path):
    app, gone = tmp_path / "app.json", tmp_path / "gone.json"
    app.write_text('{"port": 1}')
    proc = load(f'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\nconfig = ["{app}", "{gone}"]\n').process[0]
    watcher = ConfigFiles(proc, 100)
    first = watcher.collect()
    assert watcher.key == "config:gw"
    assert first["files"][str(app)]["sha256"] == hashlib.sha256(b'{"port": 1}').hexdigest()
    assert first["files"][str(app)]["ctime"] == os.stat(app).st_ctime
    assert first["files"][str(gone)]["missing"] is True
    second = watcher.collect()
    assert second["files"][str(gone)]["missing_since"] == first["files"][str(gone)]["missing_since"]
    assert not watcher.should_wake([Vital("config:gw", 1, first), Vital("config:gw", 2, second)])
    app.write_text('{"port": 2}')
    third = watcher.collect()
    assert watcher.should_wake([Vital("config:gw", 2, second), Vital("config:gw", 3, third)])
    assert not watcher.should_wake([Vital("config:gw", 3, third)])      # a first sample is no change


# -- processWatchdog -----------------------------------------------------------------------------------

def config_vital(ts: float, app: dict | None = None, extra: dict | None = None) -> Vital:
    return Vital("config:gw", ts, {"files": {APP: app or {"sha256": GOOD, "size": 10, "ctime": 100.0},
                                             EXTRA: extra or {"missing": True, "missing_since": 50.0}}})


def alive(ts: float, since: float) -> Vital:
    return Vital("process-alive:gw", ts, {"alive": True, "pid": 41, "since": since})


def dead(ts: float) -> Vital:
    """Dead for 5 s: past the wait for the keeper's exit fact (gw has stop_exit_codes)."""
    return Vital("process-alive:gw", ts, {"alive": False, "pid": None, "dead_since": ts - 5, "last_pid": 41})


KEPT = KnownGood(files={APP: GOOD}, kept_at=300.0)


def snap(ts: float, *vitals: Vital, **fields) -> Snapshot:
    return Snapshot(tick=1, ts=ts, vitals={v.key: v for v in vitals}, **fields)


def run(curr: Snapshot, cfg=TICK):
    return asyncio.run(onion.compose([survival.process_watchdog(cfg)], onion.nothing)(None, curr))[0]


def kinds(effects):
    return [(e.kind, e.target) for e in effects]


def test_a_process_healthy_long_enough_since_a_start_after_the_last_edit_has_its_config_kept():
    kept = run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0)))
    assert kinds(kept) == [("keep-config", "gw")]
    assert kept[0].params == {"files": {APP: GOOD}} and kept[0].idempotent      # a missing file is not kept
    assert run(snap(259.0, alive(258.0, since=200.0), config_vital(258.0))) == []   # not 60 s yet
    # Started before the edit (ctime 100 > start 90): it may never have read these files.
    assert run(snap(1000.0, alive(999.0, since=90.0), config_vital(999.0))) == []
    # The files are the known-good ones already; one pending; one failed a moment ago.
    assert run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0), known_good={"gw": KEPT})) == []
    pending = Effect(kind="keep-config", target="gw", id="k1")
    assert run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0), pending=[pending])) == []
    failed = Outcome("k0", "keep-config", EffectState.FAILED, 990.0, "changed")
    assert run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0), outcomes={"gw": [failed]})) == []
    assert kinds(run(snap(1051.0, alive(1050.0, since=200.0), config_vital(1050.0), outcomes={"gw": [failed]})))
    # A file it cannot read: nothing sure to keep.
    assert run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0, extra={"error": "Permission denied"}))) == []


def test_the_start_that_counts_is_the_precise_one():
    """psutil's create_time (`since`) may read up to a second early; `started` is to the tick: a start
    150 ms after an edit (ctime 100) read the edited files."""
    early = Vital("process-alive:gw", 999.0, {"alive": True, "pid": 41, "since": 99.5, "started": 100.15})
    assert kinds(run(snap(1000.0, early, config_vital(999.0)))) == [("keep-config", "gw")]
    before = Vital("process-alive:gw", 999.0, {"alive": True, "pid": 41, "since": 99.5, "started": 99.95})
    assert run(snap(1000.0, before, config_vital(999.0))) == []


def test_a_process_alive_sample_says_when_the_process_started_to_the_tick(tracker):
    started = time.time()
    proc = subprocess.Popen(["sleep", "60.2121"])
    tracker.add(proc.pid)
    # Popen returns once the exec began; the kernel shows the new argv a moment later
    wait_for(lambda: psutil.Process(proc.pid).cmdline() == ["sleep", "60.2121"], 10, what="the argv")
    watcher = ProcessAlive(load('[[process]]\nname = "s"\nmatch = "^sleep 60.2121$"\n').process[0], 100)
    data = watcher.collect()
    assert data["pid"] == proc.pid and data["since"] == psutil.Process(proc.pid).create_time()
    assert abs(data["started"] - started) < 0.1, (data["started"] - started, data["since"] - started)


def test_a_process_with_a_health_probe_is_kept_only_while_every_probe_passes():
    cfg = configmod.slice_of(load(f"""
        [[process]]
        name = "gw"
        match = "gw"
        restart = ["gw"]
        config = ["{APP}"]
        health = {{ url = "http://127.0.0.1:1/", every_s = 10, failures = 3, start_period_s = 15 }}
    """), "tick")

    def probes(*oks):
        return {"health:gw": [Vital("health:gw", 200.0 + 10 * i, {"ok": ok}) for i, ok in enumerate(oks, 1)]}
    base = (alive(300.0, since=200.0), config_vital(300.0))
    assert kinds(run(snap(300.0, *base, history=probes(*[True] * 8)), cfg)) == [("keep-config", "gw")]
    assert run(snap(300.0, *base, history=probes(True, True, False, True, True, True, True, True)), cfg) == []
    # A failure within start_period_s of the start does not count; no probe since the 60 s: not yet.
    assert kinds(run(snap(300.0, *base, history=probes(False, *[True] * 7)), cfg)) == [("keep-config", "gw")]
    assert run(snap(300.0, *base, history=probes(True, True, True)), cfg) == []


def crash_loop(ts: float = 1000.0, **fields) -> Snapshot:
    """gw's app.json changed at 900 (ctime), a restart since failed, and it is dead again."""
    failed = Outcome("r1", "restart-process", EffectState.FAILED, 950.0, "exit code 1")
    fields.setdefault("outcomes", {"gw": [failed]})
    fields.setdefault("known_good", {"gw": KEPT})
    return snap(ts, dead(ts - 0.5), config_vital(ts - 0.5, app={"sha256": BROKEN, "size": 9, "ctime": 900.0}), **fields)


def test_a_crash_loop_after_an_edit_restores_the_known_good_files_instead_of_restarting():
    effects = run(crash_loop())
    assert kinds(effects) == [("restore-config", "gw")]
    assert effects[0].params == {"files": {APP: f"sha256:{GOOD}"}, "why": "crash-loop", "changed_at": 900.0}
    assert registry.params_problem(effects[0]) is None


def test_the_first_failure_after_an_edit_is_restarted_as_usual():
    assert [e.params["why"] for e in run(crash_loop(outcomes={}))] == ["dead"]
    older = Outcome("r0", "restart-process", EffectState.ACKED, 850.0)        # before the edit
    assert kinds(run(crash_loop(outcomes={"gw": [older]}))) == [("restart-process", "gw")]


def test_no_restore_outside_the_window_or_twice_for_one_change_or_of_a_file_never_kept():
    assert kinds(run(crash_loop(ts=1600.0))) == [("restart-process", "gw")]      # 700 s after the edit
    once = msgspec.structs.replace(KEPT, restore_id="x", restore_at=960.0, restore_state=EffectState.ACKED,
                                   restore_ended_at=961.0, restored=[APP], restarted=True)
    assert kinds(run(crash_loop(known_good={"gw": once}))) == [("restart-process", "gw")]
    # Only extra.json, never kept, changed: nothing to restore.
    failed = Outcome("r1", "restart-process", EffectState.FAILED, 950.0, "exit code 1")
    never = snap(1000.0, dead(999.5), config_vital(999.5, extra={"sha256": OTHER, "size": 3, "ctime": 900.0}),
                 outcomes={"gw": [failed]}, known_good={"gw": KEPT})
    assert kinds(run(never)) == [("restart-process", "gw")]
    # Nothing kept at all: never restored.
    assert kinds(run(crash_loop(known_good={}))) == [("restart-process", "gw")]


def test_a_restore_is_waited_for_then_followed_by_a_restart_and_one_notification():
    pending = Effect(kind="restore-config", target="gw", id="x")
    assert run(crash_loop(pending=[pending])) == []          # no restart while it writes the files back
    done = msgspec.structs.replace(KEPT, restore_id="x", restore_at=960.0, restore_why="crash-loop",
                                   restore_state=EffectState.ACKED,
                                   restore_ended_at=961.0, restored=[APP],
                                   restore_summary=f"{APP}: -1 +1 lines\n-{{\n+{{\"port\": 1}}")
    effects = run(crash_loop(known_good={"gw": done}))
    assert kinds(effects) == [("restart-process", "gw"), ("notify", "gw")]
    assert effects[0].params == {"why": "config-restored", "restore": "x"}
    told = effects[1].params
    assert told["rule"] == "config-rollback" and told["diff"] == done.restore_summary and told["files"] == [APP]
    assert "-1 +1 lines" in told["message"] and "kept in objects/" in told["message"]
    assert told["message"].startswith(f"{APP}: changed, and the process crash-looped on it; written back as kept")
    # With what it undid (a unified diff) and where the operator's version is kept: both said
    undone = f"--- {APP} (as it was: undone)\n+++ {APP} (known good: restored)\n@@ -1 +1 @@\n-{{\n+{{\"port\": 1}}"
    kept = {APP: "/home/pulse/objects/ab/cdef"}
    telling = msgspec.structs.replace(done, restore_undone=undone, restore_kept=kept)
    told = run(crash_loop(known_good={"gw": telling}))[1].params
    assert told["diff"] == undone and told["summary"] == done.restore_summary and told["kept"] == kept
    assert f"What was there is kept: {APP} as /home/pulse/objects/ab/cdef." in told["message"]
    assert told["message"].endswith(undone)
    # Told already, and the restart committed: nothing more, however the process fares.
    restarted = msgspec.structs.replace(done, restarted=True)
    assert kinds(run(crash_loop(known_good={"gw": restarted}, notified={"config-rollback:gw": 962.0}))) \
        == [("restart-process", "gw")]
    assert run(crash_loop(known_good={"gw": restarted}, notified={"config-rollback:gw": 962.0}))[0].params["why"] \
        == "dead"


def test_a_failed_restore_is_said_once_and_the_usual_restarts_go_on():
    failed = msgspec.structs.replace(KEPT, restore_id="x", restore_at=960.0, restore_state=EffectState.FAILED,
                                     restore_ended_at=961.0, restore_summary="restoring /srv/gw/app.json: denied")
    effects = run(crash_loop(known_good={"gw": failed}))
    assert kinds(effects) == [("notify", "gw"), ("restart-process", "gw")]
    assert "denied" in effects[0].params["message"]
    assert kinds(run(crash_loop(known_good={"gw": failed}, notified={"config-rollback:gw": 962.0}))) \
        == [("restart-process", "gw")]


def test_staying_unhealthy_after_an_edit_restores_too():
    cfg = configmod.slice_of(load(f"""
        [[process]]
        name = "gw"
        match = "gw"
        restart = ["gw"]
        config = ["{APP}"]
        health = {{ url = "http://127.0.0.1:1/", every_s = 1, failures = 2 }}
    """), "tick")
    helped_not = Outcome("r1", "restart-process", EffectState.ACKED, 950.0)
    probes = [Vital("health:gw", t, {"ok": False}) for t in (990.0, 991.0, 992.0)]
    curr = snap(993.0, alive(992.5, since=951.0), config_vital(992.5, app={"sha256": BROKEN, "ctime": 900.0}),
                history={"health:gw": probes}, outcomes={"gw": [helped_not]}, known_good={"gw": KEPT})
    effects = run(curr, cfg)
    assert kinds(effects) == [("restore-config", "gw")] and effects[0].params["why"] == "unhealthy"


def test_an_exit_saying_my_config_is_bad_after_an_edit_restores_at_once():
    exited = ProcessExit(pid=41, ts=960.0, code=78)
    effects = run(crash_loop(outcomes={}, exits={"gw": exited}))
    assert kinds(effects) == [("restore-config", "gw")] and effects[0].params["why"] == "stop-exit-code"
    before = ProcessExit(pid=41, ts=890.0, code=78)     # before the edit: left down, as its code asks
    assert kinds(run(crash_loop(outcomes={}, exits={"gw": before}))) == [("notify", "gw")]


def test_a_paused_process_is_neither_kept_nor_restored():
    assert run(crash_loop(paused={"gw": 5000.0})) == []
    assert run(snap(1000.0, alive(999.0, since=200.0), config_vital(999.0), paused={"gw": 5000.0})) == []


# -- the known-good record ----------------------------------------------------------------------------

def event(type_: str, ts: float, **data) -> Event:
    return Event(type=type_, source="executor", target="gw", data=data, ts=ts)


def test_the_record_is_folded_from_the_effects_events():
    book: dict[str, KnownGood] = {}
    kept = {"files": {APP: {"sha256": GOOD, "ref": f"sha256:{GOOD}", "size": 10}}, "pinned": False}
    for ev in [event("effect-acked", 10.0, effect_id="k", kind="keep-config", **kept),
               event("effect-failed", 11.0, effect_id="k2", kind="keep-config", reason="changed"),
               event("effect", 20.0, id="x", kind="restore-config", params={"why": "operator"})]:
        configfiles.fold(book, ev)
    seen = book["gw"]
    assert (seen.files, seen.kept_at, seen.restore_id, seen.restore_at, seen.restore_why, seen.restore_state) == (
        {APP: GOOD}, 10.0, "x", 20.0, "operator", None)
    configfiles.fold(book, event("effect", 20.5, id="r", kind="restart-process", params={}))
    assert not book["gw"].restarted                  # committed while the restore ran: not its restart
    configfiles.fold(book, event("effect-acked", 21.0, effect_id="x", kind="restore-config", restored=[APP],
                                 diff="d", files=[], undone="u", kept={APP: "/k"}))
    assert (book["gw"].restore_state, book["gw"].restored, book["gw"].restore_summary) == ("acked", [APP], "d")
    assert (book["gw"].restore_undone, book["gw"].restore_kept) == ("u", {APP: "/k"})
    assert seen.restore_state is None                # a snapshot's record is never changed under it
    configfiles.fold(book, event("effect", 22.0, id="r2", kind="restart-process", params={}))
    assert book["gw"].restarted
    configfiles.fold(book, event("effect-acked", 30.0, effect_id="p", kind="keep-config",
                                 files={APP: {"sha256": OTHER}}, pinned=True))
    assert book["gw"].files == {APP: OTHER} and book["gw"].pinned and book["gw"].restore_id == "x"


# -- the kinds, on real files ---------------------------------------------------------------------------

def context(tmp_path, *paths) -> EffectContext:
    cfg = load(f'[[process]]\nname = "gw"\nmatch = "gw"\nrestart = ["gw"]\nconfig = {list(map(str, paths))!r}\n'
               .replace("'", '"'))
    return EffectContext(configmod.slice_of(cfg, "executor"), tmp_path / "objects", 5.0)


def test_keep_config_copies_what_was_judged_good_and_nothing_edited_since(tmp_path):
    app, extra = tmp_path / "app.json", tmp_path / "extra.json"
    app.write_bytes(b'{"port": 1}\n')
    ctx = context(tmp_path, app, extra)
    digest = hashlib.sha256(app.read_bytes()).hexdigest()
    done = configfiles.run_keep(Effect(kind="keep-config", target="gw", params={"files": {str(app): digest}}), ctx)
    assert done["files"][str(app)]["ref"] == f"sha256:{digest}" and not done["pinned"]
    assert objects.get(ctx.objects, f"sha256:{digest}") == b'{"port": 1}\n'
    app.write_bytes(b"{")
    with pytest.raises(EffectFailed) as err:
        configfiles.run_keep(Effect(kind="keep-config", target="gw", params={"files": {str(app): digest}}), ctx)
    assert err.value.reason == "changed"
    pinned = configfiles.run_keep(Effect(kind="keep-config", target="gw"), ctx)     # a pin: as it is now
    assert pinned["pinned"] and list(pinned["files"]) == [str(app)] and pinned["missing"] == [str(extra)]
    with pytest.raises(EffectFailed) as err:
        configfiles.run_keep(Effect(kind="keep-config", target="gw", params={"files": {"/etc/passwd": digest}}), ctx)
    assert err.value.reason == "bad-params" and "not one of the config files" in err.value.error


def test_restore_config_writes_the_copies_back_keeping_what_it_replaces(tmp_path):
    app, extra = tmp_path / "app.json", tmp_path / "extra.json"
    ctx = context(tmp_path, app, extra)
    good = objects.put(ctx.objects, b'{\n  "port": 1,\n  "name": "gw"\n}\n')
    app.write_bytes(b'{\n  "port": "oops",\n  "name": "gw"\n}\n')
    os.chmod(app, 0o640)
    extra.write_bytes(b"untouched")
    done = configfiles.run_restore(Effect(kind="restore-config", target="gw", params={"files": {str(app): good}}), ctx)
    assert app.read_bytes() == b'{\n  "port": 1,\n  "name": "gw"\n}\n' and extra.read_bytes() == b"untouched"
    assert stat.S_IMODE(os.stat(app).st_mode) == 0o640
    (entry,) = done["files"]
    assert objects.get(ctx.objects, entry["broken"]) == b'{\n  "port": "oops",\n  "name": "gw"\n}\n'
    assert entry["diff"] == f'{app}: -1 +1 lines\n-  "port": "oops",\n+  "port": 1,'
    # what it undid, as a unified diff, and where the operator's version is kept: a file they can open
    assert entry["undone"].splitlines() == [f"--- {app} (as it was: undone)", f"+++ {app} (known good: restored)",
                                            "@@ -1,4 +1,4 @@", " {", '-  "port": "oops",', '+  "port": 1,',
                                            '   "name": "gw"', " }"]
    assert entry["kept"] == str(objects.path_of(ctx.objects, entry["broken"]))
    assert open(entry["kept"], "rb").read() == b'{\n  "port": "oops",\n  "name": "gw"\n}\n'
    assert done["undone"] == entry["undone"] and done["kept"] == {str(app): entry["kept"]}
    assert done["restored"] == [str(app)] and done["diff"] == entry["diff"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".app.json.pulse-")]   # no temporary left
    again = configfiles.run_restore(Effect(kind="restore-config", target="gw", params={"files": {str(app): good}}), ctx)
    assert again["restored"] == [] and again["files"][0]["restored"] is False


def test_restore_config_never_writes_a_file_that_is_not_configured_or_a_copy_it_does_not_hold(tmp_path):
    app = tmp_path / "app.json"
    app.write_bytes(b"broken")
    ctx = context(tmp_path, app)
    good = objects.put(ctx.objects, b"good")
    stranger = tmp_path / "other.json"
    with pytest.raises(EffectFailed) as err:
        configfiles.run_restore(Effect(kind="restore-config", target="gw", params={"files": {str(stranger): good}}),
                                ctx)
    assert err.value.reason == "bad-params" and not stranger.exists()
    with pytest.raises(EffectFailed) as err:
        configfiles.run_restore(Effect(kind="restore-config", target="gw",
                                       params={"files": {str(app): f"sha256:{OTHER}"}}), ctx)
    assert err.value.reason == "missing-object" and app.read_bytes() == b"broken"


def test_restore_config_replaces_a_symlinks_target_and_recreates_a_deleted_file_privately(tmp_path):
    real, link, gone = tmp_path / "real.json", tmp_path / "link.json", tmp_path / "gone.json"
    real.write_bytes(b"broken")
    link.symlink_to(real)
    ctx = context(tmp_path, link, gone)
    good = objects.put(ctx.objects, b"good")
    done = configfiles.run_restore(Effect(kind="restore-config", target="gw",
                                          params={"files": {str(link): good, str(gone): good}}), ctx)
    assert link.is_symlink() and real.read_bytes() == b"good" and gone.read_bytes() == b"good"
    assert stat.S_IMODE(os.stat(gone).st_mode) == 0o600
    assert [f.get("broken") is None for f in done["files"]] == [False, True]
    assert "was missing" in done["diff"]


def test_what_a_restore_undid_is_a_unified_diff_bounded_in_lines_and_bytes():
    before = "\n".join(f"line {i}" for i in range(200)).encode()
    after = "\n".join(f"LINE {i}" if i % 2 else f"line {i}" for i in range(200)).encode()
    undone = configfiles.undone_diff("/x", before, after)
    lines = undone.splitlines()
    assert lines[:3] == ["--- /x (as it was: undone)", "+++ /x (known good: restored)", "@@ -1,200 +1,200 @@"]
    assert len(lines) == configfiles.UNDONE_LINES + 1 and lines[-1].endswith("more diff lines left out")
    wide = configfiles.undone_diff("/x", b"\n".join([b"a" * 100] * 200), b"\n".join([b"b" * 100] * 200))
    assert len(wide.encode()) <= configfiles.UNDONE_BYTES + 100 and wide.splitlines()[-1].endswith("left out")
    assert all(len(line) <= configfiles.DIFF_LINE_CHARS for line in
               configfiles.undone_diff("/x", b"a" * 500, b"b" * 500).splitlines())
    deep = "/" + "d" * 150 + "/config.yaml"      # a long path still names its file and the side it is
    assert configfiles.undone_diff(deep, b"a", b"b").splitlines()[:2] == [f"--- {deep} (as it was: undone)",
                                                                          f"+++ {deep} (known good: restored)"]
    assert configfiles.undone_diff("/x", None, b"good") == "/x: was missing; the known-good copy was written back (4 bytes)"
    assert "binary" in configfiles.undone_diff("/x", b"\xff\x00", b"ok")


def test_the_diff_summary_is_a_few_short_lines():
    before = "\n".join(f"line {i}" for i in range(20)).encode()
    after = "\n".join(f"LINE {i}" if i % 2 else f"line {i}" for i in range(20)).encode()
    summary = configfiles.diff_summary("/x", before, after)
    lines = summary.splitlines()
    assert lines[0] == "/x: -10 +10 lines" and lines[-1] == "… 14 more changed lines" and len(lines) == 8
    assert configfiles.diff_summary("/x", b"a" * 500, b"b" * 500).splitlines()[1].endswith("…")
    assert configfiles.diff_summary("/x", b"\xff\x00", b"ok") == "/x: binary, 2 bytes → 2 bytes"
