"""Last-known-good config, end to end: a real pulsed starts a real process that reads its
JSON config (and re-reads it, as a gateway that hot-reloads does) and exits 1 when it is broken.
Healthy → its config kept known good → an edit breaks it → it crash-loops → the known-good file is
restored, the broken one kept in objects/ → healthy again: one restore, never of a file never kept.
By hand: `pulsectl process config NAME`, `--pin`, `--restore`."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time

from pulse.store import objects
from support import init_home, notifications, scrape, wait_for

FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100", "PULSE_EXECUTOR_SCAN_INTERVAL_MS": "100"}

# The process: its config is every file named on its command line that exists; each must be a JSON
# object with an integer "port". Broken at the start, or after a change it reads: exit 1.
APP = r'''
import json, os, sys, time
log, paths = sys.argv[1], sys.argv[2:]

def config():
    seen = {}
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            data = json.loads(text)
            if not isinstance(data.get("port"), int):
                raise ValueError(f"{path}: port must be an integer")
            seen[path] = text
    return seen

def say(**what):
    with open(log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ts": time.time(), **what}) + "\n")

try:
    current = config()
except ValueError as err:
    say(ok=False, error=str(err))
    print(f"bad config: {err}", flush=True)
    sys.exit(1)
say(ok=True)
while True:
    time.sleep(0.05)
    try:
        current = config()
    except ValueError as err:
        say(ok=False, error=str(err), reloaded=True)
        print(f"bad config on reload: {err}", flush=True)
        sys.exit(1)
'''

GOOD = b'{\n  "port": 18789,\n  "name": "gateway"\n}\n'
BROKEN = b'{\n  "port": "18789",\n  "name": "gateway"\n}\n'


class Rig:
    """The process's files and its log, in the test's own directory (so its command line is unique)."""

    def __init__(self, pulsed, tmp_path, good_after_s: float = 1.0, survival: str = ""):
        self.pulsed, self.dir = pulsed, tmp_path
        self.script, self.log = tmp_path / "app.py", tmp_path / "starts.jsonl"
        self.app, self.extra, self.told = tmp_path / "app.json", tmp_path / "extra.json", tmp_path / "notify.jsonl"
        self.script.write_text(APP)
        self.app.write_bytes(GOOD)
        init_home(pulsed.home)
        (pulsed.home / "config.toml").write_text(textwrap.dedent(f"""
            [[process]]
            name = "app"
            match = "app.py {self.log}"
            restart = [{json.dumps(sys.executable)}, "{self.script}", "{self.log}", "{self.app}", "{self.extra}"]
            config = ["{self.app}", "{self.extra}"]
            config_good_after_s = {good_after_s}
            config_rollback_window_s = 120

            [survival]
            process_backoff_base_s = 0.2
            {survival}

            [[notify]]
            kind = "file"
            path = "{self.told}"
        """))

    def starts(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def effects(self, kind: str) -> list[dict]:
        return [e for e in self.pulsed.events("effect") if e["data"]["kind"] == kind and e["target"] == "app"]

    def ends(self, kind: str, type_: str = "effect-acked") -> list[dict]:
        return [e for e in self.pulsed.events(type_) if e["data"].get("kind") == kind and e["target"] == "app"]

    def running(self, after: float = 0.0) -> dict:
        """A start that read a good config after `after`, still alive past its restart's grace."""
        def check():
            good = [s for s in self.starts() if s["ok"] and s["ts"] > after]
            if not good:
                return None
            self.pulsed.tracker.add(good[-1]["pid"])
            acked = [e for e in self.pulsed.events("effect-acked") if e["data"].get("pid") == good[-1]["pid"]]
            return {**good[-1], "acked": acked[0]} if acked else None
        return wait_for(check, 20, what="the process running on a good config")

    def kept(self, n: int = 1) -> list[dict]:
        return wait_for(lambda: self.ends("keep-config")[n - 1:] and self.ends("keep-config"), 20,
                        what=f"keep-config acked {n} time(s)")


def test_an_edit_that_breaks_the_process_is_undone_once_and_the_broken_copy_kept(pulsed, tmp_path):
    rig = Rig(pulsed, tmp_path)
    pulsed.start(env=FAST)
    first = rig.running()
    (kept,) = rig.kept()
    # Known good: app.json as it was; extra.json did not exist, so it is not in it.
    assert kept["data"]["files"] == {str(rig.app): {"sha256": objects.file_state(rig.app)["sha256"],
                                                    "ref": objects.ref(objects.file_state(rig.app)["sha256"]),
                                                    "size": len(GOOD)}}
    assert objects.get(pulsed.home / "objects", kept["data"]["files"][str(rig.app)]["ref"]) == GOOD

    # The edit: extra.json appears (valid), and app.json breaks. The process reads it and exits 1;
    # restarted, it exits 1 again: a crash loop.
    rig.extra.write_bytes(b'{"port": 1, "note": "added after the known good"}')
    edited_at = time.time()
    rig.app.write_bytes(BROKEN)
    (restored,) = wait_for(lambda: rig.ends("restore-config"), 30, what="the known-good config restored")
    back = rig.running(after=restored["ts"])
    healthy_at = back["acked"]["ts"]

    # What happened, in order: the process died on the edit, one restart on the broken file failed,
    # then the restore (of app.json alone), then the restart that brought it back.
    bad = [s for s in rig.starts() if not s["ok"]]
    assert bad[0]["reloaded"] and bad[0]["pid"] == first["pid"] and all(s["ts"] > edited_at for s in bad)
    restarts = [e["data"]["params"]["why"] for e in rig.effects("restart-process") if e["ts"] > edited_at]
    assert restarts[0] == "dead" and restarts[-1] == "config-restored"
    (restore,) = rig.effects("restore-config")
    assert restore["data"]["origin"] == "survival" and restore["data"]["params"]["why"] == "crash-loop"
    assert list(restore["data"]["params"]["files"]) == [str(rig.app)]      # never a file it did not keep
    (entry,) = restored["data"]["files"]
    assert entry["path"] == str(rig.app) and entry["restored"]
    assert objects.get(pulsed.home / "objects", entry["broken"]) == BROKEN   # the broken copy, named in the event
    assert rig.app.read_bytes() == GOOD
    assert rig.extra.read_bytes() == b'{"port": 1, "note": "added after the known good"}'

    # Told, with what it undid as a unified diff and where the operator's version is kept.
    (told,) = wait_for(lambda: notifications(rig.told, "config-rollback"), 10, what="the notification")
    assert f'--- {rig.app} (as it was: undone)\n+++ {rig.app} (known good: restored)' in told["message"]
    assert '-  "port": "18789",\n+  "port": 18789,' in told["message"]
    assert told["diff"] == entry["undone"] and told["summary"] == entry["diff"]
    assert f"What was there is kept: {rig.app} as {entry['kept']}." in told["message"]
    assert open(entry["kept"], "rb").read() == BROKEN

    # Healthy again, and it stays so: no second restore, no more restarts. Healthy on app.json and
    # extra.json for config_good_after_s, both are known good now.
    n = len(rig.effects("restart-process"))
    again = rig.kept(2)[-1]
    assert sorted(again["data"]["files"]) == sorted([str(rig.app), str(rig.extra)]) and again["ts"] > restored["ts"]
    pulsed.wait_samples("config:app", 20)
    assert len(rig.effects("restore-config")) == 1 and len(rig.effects("restart-process")) == n
    assert pulsed.vital("process-alive:app", lambda d: d["alive"] and d["pid"] == back["pid"])

    print(f"\nbroken edit → known good restored: {restored['ts'] - edited_at:.2f} s; "
          f"→ restarted and past its start grace: {healthy_at - edited_at:.2f} s "
          f"(its good start {back['ts'] - edited_at:.2f} s after the edit)")

    # Status, /metrics and the report say it too.
    def config_in_status():
        c = pulsed.status().processes[0].config
        return c if c is not None and c.restore_state == "acked" and c.kept_at > restored["ts"] else None
    shown_config = wait_for(config_in_status, 10, what="the restore and the new known good in status")
    assert [(f.path, f.state) for f in shown_config.files] == [(str(rig.app), "known-good"), (str(rig.extra), "known-good")]
    assert shown_config.restore_why == "crash-loop" and not shown_config.pinned
    assert shown_config.restored_at == restore["ts"] or abs(shown_config.restored_at - restore["ts"]) < 1
    (document,) = json.loads(pulsed.ctl("status", "--json").stdout)["processes"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", document["config"]["restored_at"])   # ISO, as every time
    table = pulsed.ctl("status").stdout
    assert "CONFIG" in table and "known good; restored " in table and "(crash-loop, acked)" in table
    metrics = scrape(pulsed)
    assert 'pulse_process_config_restores_total{process="app"} 1.0' in metrics
    assert 'pulse_process_config_changed{process="app"} 0.0' in metrics
    report = json.loads(pulsed.ctl("report", "--json", "--analyst", "deterministic").stdout)
    (card,) = [c for c in report["role_analysis"] if c["role"] == "survival"]
    assert card["figures"]["config_restores"] == 1

    # `pulsectl process config` says what happened.
    shown = pulsed.ctl("process", "config", "app")
    assert shown.returncode == 0, shown.stderr
    assert "known good kept by survival" in shown.stdout
    assert f"{rig.app}: known good" in shown.stdout and f"{rig.extra}: known good" in shown.stdout
    assert "last restore:" in shown.stdout and entry["kept"] in shown.stdout


def test_a_file_never_kept_is_never_restored_however_the_process_fares(pulsed, tmp_path):
    rig = Rig(pulsed, tmp_path)
    pulsed.start(env=FAST)
    rig.running()
    rig.kept()
    rig.extra.write_bytes(b'{"port": "none"}')          # never kept: it did not exist when app.json was
    wait_for(lambda: notifications(rig.told, "process-fatal"), 30, what="processWatchdog holding it fatal")
    assert len([s for s in rig.starts() if not s["ok"]]) >= 3
    assert rig.effects("restore-config") == []
    assert rig.extra.read_bytes() == b'{"port": "none"}' and rig.app.read_bytes() == GOOD


def test_an_operator_pins_and_restores_by_hand(pulsed, tmp_path):
    rig = Rig(pulsed, tmp_path, good_after_s=3600)       # survival keeps nothing within this test
    pulsed.start(env=FAST)
    first = rig.running()
    nothing = pulsed.ctl("process", "config", "app", "--restore")
    assert nothing.returncode == 1 and "nothing of app was kept as known good" in nothing.stderr
    shown = pulsed.ctl("process", "config", "app").stdout
    assert "nothing kept as known good yet" in shown and f"{rig.app}: never kept (never restored)" in shown

    pinned = pulsed.ctl("process", "config", "app", "--pin")
    assert pinned.returncode == 0 and pinned.stdout.split()[-1] == "acked", pinned.stdout + pinned.stderr
    (pin,) = rig.effects("keep-config")
    assert pin["data"]["origin"] == "operator"
    assert "known good pinned by an operator" in pulsed.ctl("process", "config", "app").stdout

    # A valid edit the process takes (it does not exit), then restored by hand: written back, and
    # processWatchdog restarts the process so that it reads it.
    rig.app.write_bytes(b'{"port": 1}\n')
    shown = pulsed.ctl("process", "config", "app")
    assert f"{rig.app}: changed since known good" in shown.stdout and '+{"port": 1}' in shown.stdout
    done = pulsed.ctl("process", "config", "app", "--restore")
    assert done.returncode == 0 and done.stdout.split()[-1] == "acked", done.stdout + done.stderr
    assert rig.app.read_bytes() == GOOD
    (restore,) = rig.effects("restore-config")
    assert restore["data"]["origin"] == "operator" and restore["data"]["params"]["why"] == "operator"
    back = rig.running(after=first["ts"])
    assert back["pid"] != first["pid"]
    assert [e["data"]["params"]["why"] for e in rig.effects("restart-process")][-1] == "config-restored"
    (told,) = wait_for(lambda: notifications(rig.told, "config-rollback"), 10, what="the notification")
    assert "restored by an operator" in told["message"] and '-{"port": 1}' in told["diff"]
    assert pulsed.ctl("process", "config", "nope").returncode == 2
