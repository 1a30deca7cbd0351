"""Files that must not fill the disk ([[watch.file]], fileGuard, rotate-file).

The pure half: the config, the watcher's sample of real files, the rules over snapshots, the
effect on real files in-process. The other half runs a real pulsed and a real writer process
that keeps appending through its own fd while its log is rotated under it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pulse.core import config as configmod
from pulse.core.home import Paths
from pulse.core.wire.enginerpc import Effect, Outcome, Snapshot, Vital
from pulse.effects import files, kinds, registry
from pulse.rules import onion, survival
from pulse.sensing.builtin import WatchedFile
from support import init_home, notifications, scrape, wait_for

MB = 1024 * 1024
FAST = {"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"}


def config(text: str) -> configmod.Config:
    return configmod.validate(configmod.decode(textwrap.dedent(text).encode(), "test"), "test")


def watch_toml(path, name="logs", **keys) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f'[[watch.file]]\nname = "{name}"\npath = "{path}"\n{extra}'


# -- config ---------------------------------------------------------------------------------------------

def test_every_key_has_its_default():
    watch = config(watch_toml("/var/log/*.log")).watch.file[0]
    assert (watch.max_mb, watch.action, watch.keep) == (1024, "rotate", 3)
    assert configmod.Config().watch.file == [] and configmod.Survival().disk_trim_min_mb == 1


@pytest.mark.parametrize("keys, named", [
    ({"action": "zip"}, "$.watch.file[0].action"),
    ({"keep": 0}, "$.watch.file[0].keep"),
    ({"max_mb": 0}, "$.watch.file[0].max_mb"),
    ({"every": 1}, "$.watch.file[0].every"),
])
def test_bad_keys_are_named(keys, named):
    with pytest.raises(configmod.ConfigError) as err:
        config(watch_toml("/var/log/*.log", **keys))
    assert named in str(err.value)


@pytest.mark.parametrize("path, problem", [
    ("logs/*.log", "must be an absolute glob"),
    ("/var/log/../../etc/*", "must not contain '..'"),
])
def test_a_path_must_be_an_absolute_glob_that_stays_where_it_points(path, problem):
    with pytest.raises(configmod.ConfigError) as err:
        config(watch_toml(path))
    assert "$.watch.file[0].path" in str(err.value) and problem in str(err.value)


def test_names_are_unique_and_fit_a_vital_key():
    with pytest.raises(configmod.ConfigError, match=r"\$\.watch\.file: names must be unique"):
        config(watch_toml("/a/*") + watch_toml("/b/*"))
    with pytest.raises(configmod.ConfigError, match=r"\$\.watch\.file\[0\]\.name"):
        config(watch_toml("/a/*", name="my logs"))


# -- the watcher's sample ---------------------------------------------------------------------------------

def test_the_sample_lists_regular_files_largest_first_and_never_follows_a_link(tmp_path):
    logs, home = tmp_path / "logs", tmp_path / "home"
    logs.mkdir()
    home.mkdir()
    (logs / "big.log").write_bytes(b"x" * 3000)
    (logs / "small.log").write_bytes(b"x" * 10)
    (logs / "big.log.1.gz").write_bytes(b"x" * 5000)                   # a copy a rotation keeps
    (logs / "dir.log").mkdir()                                         # not a file
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x" * 9000)
    (logs / "link.log").symlink_to(outside)                            # never followed
    (home / "own.log").write_bytes(b"x" * 100)
    (logs / "home.log").symlink_to(home / "own.log")
    watch = configmod.FileWatch(name="logs", path=f"{logs}/*.log*", max_mb=2000 / MB)
    sample = WatchedFile(watch, 1000, home).collect()
    assert [(f["path"], f["bytes"]) for f in sample["files"]] == [(f"{logs}/big.log", 3000), (f"{logs}/small.log", 10)]
    assert (sample["matched"], sample["over"], sample["total_bytes"], sample["max_bytes"]) == (2, 1, 3010, 2000)
    inside = WatchedFile(configmod.FileWatch(name="own", path=f"{home}/*.log"), 1000, home).collect()
    assert inside["files"] == [{"path": f"{home}/own.log", "bytes": 100, "refused": "inside the Pulse home"}]


def test_the_tick_is_rung_when_a_file_goes_over_not_while_it_stays_over():
    watcher = WatchedFile(configmod.FileWatch(name="logs", path="/x/*", max_mb=1), 1000)

    def sample(*sizes):
        return Vital("file:logs", 1.0, {"max_bytes": MB, "files": [{"path": f"/x/{i}", "bytes": s}
                                                                   for i, s in enumerate(sizes)]})
    assert watcher.should_wake([sample(2 * MB)])
    assert not watcher.should_wake([sample(2 * MB), sample(3 * MB)])
    assert watcher.should_wake([sample(2 * MB, 10), sample(2 * MB, 2 * MB)])
    assert not watcher.should_wake([sample(10), sample(20)])


# -- the rules ------------------------------------------------------------------------------------------

RULES = config("""
    [[watch.file]]
    name = "traces"
    path = "/srv/traces/*.jsonl"
    max_mb = 1
    keep = 2

    [[watch.file]]
    name = "audit"
    path = "/srv/audit/*.log"
    max_mb = 1
    action = "notify"

    [survival]
    disk_trim_min_mb = 0.5
""")


def run(rule, curr: Snapshot):
    tick = configmod.slice_of(RULES, "tick")
    return asyncio.run(onion.compose([rule(tick)], onion.nothing)(None, curr))


def files_sample(name: str, ts: float, *files: tuple[str, int], refused: str | None = None) -> list[Vital]:
    listed = [{"path": p, "bytes": b, **({"refused": refused} if refused else {})} for p, b in files]
    return [Vital(f"file:{name}", ts, {"files": listed, "max_bytes": MB})]


def snap(ts=1000.0, **fields) -> Snapshot:
    return Snapshot(tick=1, ts=ts, **fields)


def test_file_guard_rotates_a_file_over_max_mb_once_per_sample_after_its_last_trim():
    big = "/srv/traces/a.jsonl"
    history = {"file:traces": files_sample("traces", 999.0, (big, 2 * MB), ("/srv/traces/b.jsonl", MB // 2))}
    effects, _ = run(survival.file_guard, snap(history=history))
    assert [(e.kind, e.target) for e in effects] == [("rotate-file", big)]
    assert effects[0].params == {"watch": "traces", "action": "rotate", "keep": 2, "why": "max_mb", "bytes": 2 * MB,
                                 "rule": "file-guard"}
    # pending, or the sample is older than the last trim: not again
    assert run(survival.file_guard, snap(history=history, pending=effects))[0] == []
    trimmed = {big: [Outcome("x", "rotate-file", "acked", 999.5)]}
    assert run(survival.file_guard, snap(history=history, outcomes=trimmed))[0] == []


def test_file_guard_backs_off_a_failing_trim_and_says_so_once():
    big = "/srv/traces/a.jsonl"
    history = {"file:traces": files_sample("traces", 999.9, (big, 2 * MB))}
    failed = {big: [Outcome("x", "rotate-file", "failed", 999.5, "no-space")]}
    effects, tick_ms = run(survival.file_guard, snap(history=history, outcomes=failed))
    assert [(e.kind, e.target) for e in effects] == [("notify", big)] and "no-space" in effects[0].params["message"]
    assert tick_ms == 501   # the first retry waits process_backoff_base_s (1 s) after the failure
    effects, _ = run(survival.file_guard, snap(ts=1000.6, history=history, outcomes=failed,
                                               notified={f"file-guard:{big}": 1000.0}))
    assert [(e.kind, e.target) for e in effects] == [("rotate-file", big)]


def test_file_guard_only_notifies_for_action_notify_and_for_a_file_in_the_home():
    audit = "/srv/audit/x.log"
    history = {"file:audit": files_sample("audit", 999.0, (audit, 3 * MB)),
               "file:traces": files_sample("traces", 999.0, ("/srv/traces/own.jsonl", 3 * MB),
                                           refused="inside the Pulse home")}
    effects, _ = run(survival.file_guard, snap(history=history))
    assert sorted((e.kind, e.target) for e in effects) == [("notify", audit), ("notify", "/srv/traces/own.jsonl")]
    assert any("never trims it" in e.params["message"] for e in effects)
    notified = {f"file-guard:{e.target}": 999.5 for e in effects}
    assert run(survival.file_guard, snap(history=history, notified=notified))[0] == []   # rate-limited


def test_resource_guard_trims_watched_files_first_when_the_disk_is_high():
    full = {"system-resource": Vital("system-resource", 999.0, {"disk_pct": 95, "memory_pct": 10})}
    history = {"file:traces": files_sample("traces", 999.0, ("/srv/traces/a.jsonl", MB // 2 + 1),
                                           ("/srv/traces/b.jsonl", MB // 4)),
               "file:audit": files_sample("audit", 999.0, ("/srv/audit/x.log", 3 * MB))}
    effects, _ = run(survival.resource_guard, snap(vitals=full, history=history))
    # a.jsonl is over disk_trim_min_mb (0.5), b.jsonl is not, audit only notifies: the cleanup waits
    assert [(e.kind, e.target) for e in effects] == [("rotate-file", "/srv/traces/a.jsonl"), ("notify", "disk")]
    assert effects[0].params["why"] == "disk" and effects[0].params["rule"] == "resource-guard"
    effects, _ = run(survival.resource_guard, snap(vitals=full, history=history, pending=effects[:1]))
    assert [e.kind for e in effects] == ["notify"]                       # still trimming
    trimmed = {"/srv/traces/a.jsonl": [Outcome("x", "rotate-file", "acked", 999.5)]}
    effects, _ = run(survival.resource_guard, snap(vitals=full, history=history, outcomes=trimmed))
    assert [(e.kind, e.target) for e in effects] == [("cleanup", "disk"), ("notify", "disk")]
    memory = {"system-resource": Vital("system-resource", 999.0, {"disk_pct": 10, "memory_pct": 95})}
    assert [e.kind for e in run(survival.resource_guard, snap(vitals=memory, history=history))[0]] == ["cleanup"]


# -- the effect, in-process, on real files --------------------------------------------------------------

def context(tmp_path: Path, pattern: str, timeout_s: float = 10, **keys) -> kinds.EffectContext:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    cfg = configmod.slice_of(config(watch_toml(pattern, **keys)), "executor")
    return kinds.EffectContext(cfg, home / "objects", timeout_s, paths=Paths(home, tmp_path / "run"))


def rotate(target, ctx, **params) -> dict:
    effect = Effect(kind="rotate-file", target=str(target), params={"watch": "logs", **params})
    assert registry.params_problem(effect) is None
    return files.run_rotate_file(effect, ctx)


def test_rotate_keeps_keep_gzipped_copies_newest_first(tmp_path):
    log = tmp_path / "app.log"
    ctx = context(tmp_path, f"{tmp_path}/*.log", keep=2)
    for n in range(1, 5):
        log.write_bytes(f"round {n}\n".encode() * 1000)
        done = rotate(log, ctx)
        assert done["action"] == "rotate" and done["bytes"] == 8000 and log.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("app.log")) == \
        ["app.log", "app.log.1.gz", "app.log.2.gz"]
    assert gzip.decompress((tmp_path / "app.log.1.gz").read_bytes()) == b"round 4\n" * 1000
    assert gzip.decompress((tmp_path / "app.log.2.gz").read_bytes()) == b"round 3\n" * 1000
    assert done["copies_deleted"] == 1 and done["bytes_freed"] == 8000 - done["copy_bytes"] + done["deleted_bytes"]
    assert not list(tmp_path.glob(".*pulse-rotating*"))


def test_truncate_empties_in_place_and_keeps_nothing(tmp_path):
    log = tmp_path / "app.log"
    log.write_bytes(b"x" * 5000)
    inode = log.stat().st_ino
    done = rotate(log, context(tmp_path, f"{tmp_path}/*.log", action="truncate"))
    assert (done["action"], done["bytes"], done["bytes_freed"]) == ("truncate", 5000, 5000)
    assert log.stat().st_size == 0 and log.stat().st_ino == inode and not list(tmp_path.glob("*.gz"))


@pytest.mark.parametrize("make, why", [
    (lambda d: (d / "link.log").symlink_to(d / "real.txt"), "is a symlink"),
    (lambda d: (d / "dir.log").mkdir(), "is a directory"),
    (lambda d: os.mkfifo(d / "pipe.log"), "is a fifo"),
])
def test_anything_but_a_regular_file_is_refused_and_untouched(tmp_path, make, why):
    (tmp_path / "real.txt").write_bytes(b"keep me")
    make(tmp_path)
    target = next(p for p in tmp_path.iterdir() if p.name.endswith(".log"))
    with pytest.raises(kinds.EffectFailed) as err:
        rotate(target, context(tmp_path, f"{tmp_path}/*.log"))
    assert err.value.reason == "refused" and why in err.value.error
    assert (tmp_path / "real.txt").read_bytes() == b"keep me" and not list(tmp_path.glob("*.gz"))


def test_a_file_the_glob_does_not_match_or_inside_the_home_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_bytes(b"x" * 100)
    with pytest.raises(kinds.EffectFailed) as err:
        rotate(other, context(tmp_path, f"{tmp_path}/*.log"))
    assert err.value.reason == "refused" and "is not matched by [[watch.file]] 'logs'" in err.value.error
    own = tmp_path / "home" / "logs" / "pulse.log"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"x" * 100)
    with pytest.raises(kinds.EffectFailed) as err:
        rotate(own, context(tmp_path, f"{tmp_path}/home/logs/*.log"))
    assert err.value.reason == "refused" and "inside the Pulse home" in err.value.error and own.stat().st_size == 100
    with pytest.raises(kinds.EffectFailed) as err:
        files.run_rotate_file(Effect(kind="rotate-file", target=str(other), params={"watch": "nosuch"}),
                              context(tmp_path, f"{tmp_path}/*.txt"))
    assert err.value.reason == "bad-params" and "no [[watch.file]] named 'nosuch'" in err.value.error


def test_a_copy_that_cannot_be_made_in_time_leaves_the_file_as_it_was(tmp_path):
    log = tmp_path / "app.log"
    log.write_bytes(os.urandom(3 * MB))        # incompressible: more than one chunk to copy
    before = log.read_bytes()
    with pytest.raises(kinds.EffectFailed) as err:
        rotate(log, context(tmp_path, f"{tmp_path}/*.log", timeout_s=0.001))
    assert err.value.reason == "timeout" and log.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.log", "home"]


# -- end to end: a real pulsed, a real writer --------------------------------------------------------------

# Appends numbered lines of about 1 KB, about 1 MB a second, through the one fd it opens with O_APPEND,
# until the stop file appears. Its script's path holds the test's tmp_path: a command line of its own.
WRITER = """
import os, sys, time
path, stop = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
print(os.fstat(fd).st_ino, flush=True)
pad, n = "x" * 1000, 0
while not os.path.exists(stop):
    n += 1
    os.write(fd, f"{n:09d} {pad}\\n".encode())
    if n % 10 == 0:
        time.sleep(0.01)
"""
LINE = re.compile(rb"^([0-9]{9}) x{1000}$")


def write_config(pulsed, text: str) -> None:
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(text))


def acked(pulsed, kind: str) -> list[dict]:
    return [e for e in pulsed.events("effect-acked") if e["data"].get("kind") == kind]


def open_effects(pulsed, kind: str) -> list[str]:
    ended = {e["data"]["effect_id"] for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed",
                                                                            "effect-expired")}
    return [e["data"]["id"] for e in pulsed.events("effect") if e["data"]["kind"] == kind and e["data"]["id"] not in ended]


def line_numbers(data: bytes) -> list[int]:
    lines = data.split(b"\n")
    assert lines[-1] == b"", "every line is whole"
    numbers = []
    for line in lines[:-1]:
        m = LINE.match(line)
        assert m, f"a line that is not the writer's: {line[:40]!r}"       # no hole of zeros, no torn line
        numbers.append(int(m[1]))
    return numbers


def test_a_log_over_max_mb_is_rotated_while_its_writer_keeps_writing_through_its_fd(pulsed, tmp_path, tracker):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "trace.jsonl"
    write_config(pulsed, f"""
        [[watch.file]]
        name = "traces"
        path = "{logs}/*.jsonl"
        max_mb = 1
        keep = 2
    """)
    pulsed.start(env=FAST)
    script, stop = tmp_path / f"writer-{tmp_path.name}.py", tmp_path / "stop"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(log), str(stop)], stdout=subprocess.PIPE, text=True)
    tracker.add(writer.pid)
    inode = int(writer.stdout.readline())
    took = []
    for _ in range(4):
        crossed = wait_for(lambda: log.stat().st_size > MB and time.monotonic(), 20, interval=0.002,
                           what="the log over max_mb")
        rotated = wait_for(lambda: log.stat().st_size < MB // 2 and time.monotonic(), 20, interval=0.002,
                           what="the log rotated")
        took.append(rotated - crossed)
    wait_for(lambda: log.stat().st_size > MB // 10, 10, what="lines written since the last rotation")
    stop.touch()                                         # under max_mb: the log is left as it is now
    assert writer.wait(10) == 0
    wait_for(lambda: not open_effects(pulsed, "rotate-file"), 20, what="the last rotation ended")
    print(f"\nmax_mb crossed → rotated: {', '.join(f'{t * 1000:.0f} ms' for t in took)} "
          f"(watcher_interval_ms {FAST['PULSE_WATCHER_INTERVAL_MS']}, tick_ms {FAST['PULSE_TICK_MS']})")

    done = acked(pulsed, "rotate-file")
    assert len(done) >= 4 and not [e for e in pulsed.events("effect-failed") if e["data"].get("kind") == "rotate-file"]
    for event in done:
        data = event["data"]
        assert data["action"] == "rotate" and data["path"] == str(log) and data["bytes"] > MB
        assert 0 < data["bytes_freed"] == data["bytes"] - data["copy_bytes"] + data["deleted_bytes"]
    assert sorted(p.name for p in logs.iterdir()) == ["trace.jsonl", "trace.jsonl.1.gz", "trace.jsonl.2.gz"]
    assert log.stat().st_ino == inode                    # truncated in place: the writer's own file
    # The writer's later lines landed in the truncated file, at its start, right after what the copies hold.
    older, newer = (line_numbers(gzip.decompress(p.read_bytes())) for p in (logs / "trace.jsonl.2.gz",
                                                                           logs / "trace.jsonl.1.gz"))
    current = line_numbers(log.read_bytes())
    numbers = older + newer + current
    assert current and current[0] > newer[-1] > older[-1]
    assert numbers == sorted(set(numbers))
    lost = numbers[-1] - numbers[0] + 1 - len(numbers)
    assert lost <= 2, f"{lost} lines lost at two rotations"   # at most the line written between read and truncate
    print(f"lines {numbers[0]} … {numbers[-1]} in the two copies and the log, {lost} lost")

    # Status, /metrics and the report show the watch, its last trim and the bytes freed.
    freed = sum(e["data"]["bytes_freed"] for e in done)
    last_trim = max(e["ts"] for e in done)
    size = log.stat().st_size                            # its writer has stopped
    (watch,) = wait_for(lambda: [f for f in pulsed.status().files if f.last_trim_at and f.last_trim_at >= last_trim - 1
                                 and f.bytes == size], 10, what="the last trim and the log's size in status")
    assert (watch.name, watch.path, watch.action, watch.max_mb, watch.files) == ("traces", f"{logs}/*.jsonl", "rotate", 1, 1)
    assert watch.largest == str(log) and 0 < watch.largest_bytes == watch.bytes < MB and watch.over == 0
    assert watch.last_trim_state == "acked"
    table = pulsed.ctl("status").stdout
    assert "WATCHED FILE" in table and "traces" in table and f"{log}" in table
    exposed = {(s.name, tuple(s.labels.items())): s.value for family in text_string_to_metric_families(scrape(pulsed))
               for s in family.samples}
    assert exposed["pulse_watched_file_bytes_freed_total", (("watch", "traces"),)] == freed
    assert exposed["pulse_watched_files_over_max", (("watch", "traces"),)] == 0
    assert exposed["pulse_watched_file_bytes", (("watch", "traces"),)] == watch.bytes
    report = json.loads(pulsed.ctl("report", "--json", "--analyst", "deterministic").stdout)
    (card,) = [c for c in report["role_analysis"] if c["role"] == "survival"]
    assert card["figures"]["files_trimmed"] == len(done) and card["figures"]["mb_freed"] == round(freed / MB, 1)


def test_truncate_empties_the_file_and_notify_only_says_so(pulsed, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "audit").mkdir()
    cache, audit, notes = tmp_path / "cache" / "a.bin", tmp_path / "audit" / "b.log", tmp_path / "notes.jsonl"
    cache.write_bytes(b"c" * (2 * MB))
    audit.write_bytes(b"a" * (2 * MB))
    write_config(pulsed, f"""
        [[watch.file]]
        name = "cache"
        path = "{tmp_path}/cache/*"
        max_mb = 1
        action = "truncate"

        [[watch.file]]
        name = "audit"
        path = "{tmp_path}/audit/*.log"
        max_mb = 1
        action = "notify"

        [[notify]]
        kind = "file"
        path = "{notes}"
    """)
    pulsed.start(env=FAST)
    done = wait_for(lambda: acked(pulsed, "rotate-file"), 15, what="the truncate")
    assert len(done) == 1
    data = done[0]["data"]
    assert (data["action"], data["path"], data["bytes"], data["bytes_freed"]) == ("truncate", str(cache), 2 * MB, 2 * MB)
    assert cache.stat().st_size == 0 and sorted(p.name for p in cache.parent.iterdir()) == ["a.bin"]
    said = wait_for(lambda: [n for n in notifications(notes, "file-guard") if n["target"] == str(audit)], 15,
                    what="the notification about the audit log")
    assert "its action is notify" in said[0]["message"] and said[0]["bytes"] == 2 * MB
    pulsed.wait_ticks(5)
    assert audit.stat().st_size == 2 * MB
    assert [e["target"] for e in pulsed.events("effect") if e["data"]["kind"] == "rotate-file"] == [str(cache)]


def test_a_file_inside_the_home_is_never_trimmed(pulsed, tmp_path):
    own, notes = pulsed.home / "logs" / "pulse.log", tmp_path / "notes.jsonl"
    write_config(pulsed, f"""
        [[watch.file]]
        name = "own"
        path = "{pulsed.home}/logs/*.log"
        max_mb = 0.001

        [[notify]]
        kind = "file"
        path = "{notes}"
    """)
    pulsed.start(env=FAST)
    said = wait_for(lambda: notifications(notes, "file-guard"), 15, what="the notification about pulse.log")
    assert said[0]["target"] == str(own) and "inside the Pulse home: Pulse never trims it" in said[0]["message"]
    size = own.stat().st_size
    out = pulsed.ctl("emit", "rotate-file", "--target", str(own), "--param", "watch=own", "--wait", "10")
    assert out.returncode == 1 and "failed" in out.stdout and "inside the Pulse home" in out.stdout
    failed = [e for e in pulsed.events("effect-failed") if e["data"].get("kind") == "rotate-file"]
    assert len(failed) == 1 and failed[0]["data"]["reason"] == "refused"
    assert [e["data"]["origin"] for e in pulsed.events("effect") if e["data"]["kind"] == "rotate-file"] == ["operator"]
    assert own.stat().st_size >= size and not list(own.parent.glob("*.gz"))


def test_when_the_disk_is_high_resource_guard_trims_watched_files_before_cleaning_up(pulsed, tmp_path):
    (tmp_path / "logs").mkdir()
    big, small = tmp_path / "logs" / "big.log", tmp_path / "logs" / "small.log"
    big.write_bytes(b"b\n" * MB)
    small.write_bytes(b"s\n" * 1000)
    write_config(pulsed, f"""
        [[watch.file]]
        name = "logs"
        path = "{tmp_path}/logs/*.log"
        max_mb = 1000

        [survival]
        disk_pct = 0.01
        disk_trim_min_mb = 1
    """)
    pulsed.start(env=FAST)
    cleanup = wait_for(lambda: [e for e in pulsed.events("effect") if e["data"]["kind"] == "cleanup"], 15,
                       what="the cleanup")
    trimmed = acked(pulsed, "rotate-file")
    assert len(trimmed) == 1 and trimmed[0]["data"]["path"] == str(big) and trimmed[0]["id"] < cleanup[0]["id"]
    trim = next(e for e in pulsed.events("effect") if e["data"]["kind"] == "rotate-file")
    assert trim["data"]["params"]["why"] == "disk" and trim["data"]["params"]["rule"] == "resource-guard"
    assert big.stat().st_size == 0 and gzip.decompress((tmp_path / "logs" / "big.log.1.gz").read_bytes()) == b"b\n" * MB
    assert small.stat().st_size == 2000                   # under disk_trim_min_mb: left alone
