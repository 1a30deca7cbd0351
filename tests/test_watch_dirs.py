"""Directories that only grow ([[watch.dir]], dirGuard, trim-dir).

The pure half: the config, the plan, the effect on real files in-process, hostile ones included
(a directory swapped for a link between two looks, a file renamed while the trim runs). The other
half runs a real pulsed: 10,000 small files kept within bounds while a writer keeps writing (its
open file untouched), and a few huge (sparse) files, old files and an archive, links among them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pulse.core import config as configmod
from pulse.core import dirscan, safepath
from pulse.core.home import Paths
from pulse.core.wire.enginerpc import Effect, Outcome, Snapshot, Vital
from pulse.effects import dirs, kinds, registry
from pulse.rules import onion, survival
from pulse.sensing.builtin import LISTED_DIRS, WatchedDir
from pulse.store import objects
from support import init_home, scrape, wait_for

MB = 1024 * 1024
OLD = 1_000_000_000.0            # 2001: older than any max_age here


def config(text: str) -> configmod.Config:
    return configmod.validate(configmod.decode(textwrap.dedent(text).encode(), "test"), "test")


def dir_toml(path, name="out", **keys) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f'[[watch.dir]]\nname = "{name}"\npath = "{path}"\n{extra}'


def make(path: Path, size: int = 10, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x" * size)
    finally:
        os.close(fd)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def shm():
    """A directory on tmpfs: ten thousand files are made and removed there in well under a second,
    where a loaded disk takes many (the test is of Pulse, not of the disk)."""
    base = Path(tempfile.mkdtemp(prefix="pulse-test-dirs-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    yield base
    shutil.rmtree(base, ignore_errors=True)


# -- config ---------------------------------------------------------------------------------------------

def test_keys_and_their_defaults():
    watch = config(dir_toml("/srv/out/*", max_files=10, max_age="7d")).watch.dir[0]
    assert (watch.max_mb, watch.max_files, watch.max_age, watch.oldest) == (None, 10, "7d", "delete")
    assert dirscan.bounds_of(watch) == (None, 10, 7 * 86400)
    assert configmod.Config().watch.dir == [] and "dir:*" in configmod.TickSettings().sense
    assert "# [[watch.dir]]" in configmod.default_toml()


@pytest.mark.parametrize("keys, named", [
    ({}, "set at least one of max_mb, max_files, max_age"),
    ({"max_files": 0}, "$.watch.dir[0].max_files"),
    ({"max_mb": 0}, "$.watch.dir[0].max_mb"),
    ({"max_age": "a week"}, "$.watch.dir[0].max_age"),
    ({"max_files": 1, "oldest": "zip"}, "$.watch.dir[0].oldest"),
    ({"max_files": 1, "keep": 3}, "$.watch.dir[0].keep"),
])
def test_bad_keys_are_named(keys, named):
    with pytest.raises(configmod.ConfigError) as err:
        config(dir_toml("/srv/out", **keys))
    assert named in str(err.value)


@pytest.mark.parametrize("path, problem", [
    ("out/*", "must be an absolute directory or glob"),
    ("/srv/../etc", "must not contain '..'"),
    ("/", "not / itself"),
])
def test_a_path_is_absolute_stays_where_it_points_and_is_not_root(path, problem):
    with pytest.raises(configmod.ConfigError) as err:
        config(dir_toml(path, max_files=1))
    assert "$.watch.dir[0].path" in str(err.value) and problem in str(err.value)
    with pytest.raises(configmod.ConfigError, match=r"\$\.watch\.dir: names must be unique"):
        config(dir_toml("/a", max_files=1) + dir_toml("/b", max_files=1))


# -- the plan -------------------------------------------------------------------------------------------

def entry(rel, size, mtime, ino):
    return dirscan.Entry(rel, size, mtime, 1, ino, None)


def test_the_plan_takes_the_oldest_first_and_stops_as_soon_as_the_bounds_hold():
    files = [entry(f"f{i}", 100, 1000.0 + i, i) for i in range(10)]
    chosen, holds = dirscan.plan(files, dirscan.Bounds(None, 7, None), 2000.0, set())
    assert [e.rel for e in chosen] == ["f0", "f1", "f2"] and holds
    chosen, holds = dirscan.plan(files, dirscan.Bounds(450, None, None), 2000.0, set())
    assert [e.rel for e in chosen] == ["f0", "f1", "f2", "f3", "f4", "f5"] and holds
    chosen, holds = dirscan.plan(files, dirscan.Bounds(None, None, 995.5), 2000.0, set())
    assert [e.rel for e in chosen] == ["f0", "f1", "f2", "f3", "f4"] and holds     # older than 995.5 s
    # held open for writing: never chosen, still counted; the next oldest goes instead
    chosen, holds = dirscan.plan(files, dirscan.Bounds(None, 9, None), 2000.0, {(1, 0)})
    assert [e.rel for e in chosen] == ["f1"] and holds
    chosen, holds = dirscan.plan(files, dirscan.Bounds(None, None, 995.5), 2000.0, {(1, 0)})
    assert "f0" not in [e.rel for e in chosen] and not holds     # the open old file keeps it over max_age
    assert dirscan.plan(files, dirscan.Bounds(None, 10, None), 2000.0, set()) == ([], True)


# -- the rule -------------------------------------------------------------------------------------------

RULES = config(dir_toml("/srv/jobs/*", name="jobs", max_files=10))


def guard(curr: Snapshot):
    tick = configmod.slice_of(RULES, "tick")
    return asyncio.run(onion.compose([survival.dir_guard(tick)], onion.nothing)(None, curr))


def dir_sample(ts: float, *dirs: dict) -> dict:
    return {"dir:jobs": [Vital("dir:jobs", ts, {"dirs": list(dirs)})]}


def test_dir_guard_trims_a_directory_over_a_bound_once_per_sample_after_its_last_trim():
    over, within = {"path": "/srv/jobs/a", "files": 12, "over": ["max_files"]}, {"path": "/srv/jobs/b", "files": 3, "over": []}
    history = dir_sample(999.0, over, within)
    effects, _ = guard(Snapshot(tick=1, ts=1000.0, history=history))
    assert [(e.kind, e.target, e.params) for e in effects] == [
        ("trim-dir", "/srv/jobs/a", {"watch": "jobs", "why": "max_files", "rule": "dir-guard"})]
    assert effects[0].idempotent
    assert guard(Snapshot(tick=2, ts=1000.0, history=history, pending=effects))[0] == []
    trimmed = {"/srv/jobs/a": [Outcome("x", "trim-dir", "acked", 999.5)]}
    assert guard(Snapshot(tick=3, ts=1000.0, history=history, outcomes=trimmed))[0] == []   # not sampled since


def test_dir_guard_backs_off_a_failing_trim_says_so_once_and_notifies_a_refused_directory():
    history = dir_sample(999.9, {"path": "/srv/jobs/a", "files": 12, "over": ["max_files"]})
    failed = {"/srv/jobs/a": [Outcome("x", "trim-dir", "failed", 999.5, "still-over")]}
    effects, tick_ms = guard(Snapshot(tick=1, ts=1000.0, history=history, outcomes=failed))
    assert [(e.kind, e.target) for e in effects] == [("notify", "/srv/jobs/a")] and "still-over" in effects[0].params["message"]
    assert tick_ms == 501                                 # process_backoff_base_s (1 s) after the failure
    effects, _ = guard(Snapshot(tick=2, ts=1000.6, history=history, outcomes=failed,
                                notified={"dir-guard:/srv/jobs/a": 1000.0}))
    assert [(e.kind, e.target) for e in effects] == [("trim-dir", "/srv/jobs/a")]
    refused = dir_sample(999.0, {"path": "/srv/jobs/home", "refused": "the Pulse home, inside it, or holding it"})
    effects, _ = guard(Snapshot(tick=3, ts=1000.0, history=refused))
    assert [(e.kind, e.target) for e in effects] == [("notify", "/srv/jobs/home")]
    assert guard(Snapshot(tick=4, ts=1000.0, history=refused, notified={"dir-guard:/srv/jobs/home": 999.5}))[0] == []


# -- the effect, in-process, on real files --------------------------------------------------------------

def context(tmp_path: Path, toml: str, timeout_s: float = 30) -> kinds.EffectContext:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    cfg = configmod.slice_of(config(toml), "executor")
    return kinds.EffectContext(cfg, home / "objects", timeout_s, paths=Paths(home, tmp_path / "run"))


def trim(target, ctx, watch="out") -> dict:
    effect = Effect(kind="trim-dir", target=str(target), params={"watch": watch})
    assert registry.params_problem(effect) is None
    return dirs.run_trim_dir(effect, ctx)


def test_links_inside_are_never_followed_and_what_they_point_at_survives(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    for i in range(5):
        make(out / f"f{i}", mtime=OLD + i)
    victim = make(outside / "precious", mtime=OLD - 10)
    make(outside / "deep" / "old", mtime=OLD - 10)
    (out / "link").symlink_to(victim)                   # the oldest, if a link counted
    (out / "sub").symlink_to(outside / "deep")          # a directory elsewhere
    sample = WatchedDir(configmod.DirWatch(name="out", path=str(out), max_files=2), 1000).collect()
    assert sample["dirs"] == [{"path": str(out), "files": 5, "bytes": 50, "oldest": OLD, "over": ["max_files"]}]
    assert (sample["matched"], sample["files"], sample["over"], sample["oldest_mtime"]) == (1, 5, 1, OLD)
    done = trim(out, context(tmp_path, dir_toml(out, max_files=2)))
    assert (done["removed"], done["files_left"]) == (3, 2)
    assert sorted(p.name for p in out.iterdir()) == ["f3", "f4", "link", "sub"]
    assert victim.exists() and (outside / "deep" / "old").exists()


def test_a_glob_of_many_directories_lists_every_one_over_a_bound_and_counts_them_all(tmp_path):
    n = 2 * LISTED_DIRS + 30
    for i in range(n):
        for j in range(3 if i % 2 else 1):               # the odd ones are over max_files
            make(tmp_path / "jobs" / f"job-{i:03d}" / f"run-{j}.md", mtime=OLD + j)
    sample = WatchedDir(configmod.DirWatch(name="jobs", path=f"{tmp_path}/jobs/*", max_files=2), 1000).collect()
    listed = {d["path"] for d in sample["dirs"]}
    over = {str(tmp_path / "jobs" / f"job-{i:03d}") for i in range(1, n, 2)}
    assert over <= listed and len(listed) == len(over) + LISTED_DIRS
    assert (sample["matched"], sample["over"], sample["files"]) == (n, len(over), n // 2 + 3 * (n // 2))


def test_nesting_deeper_than_max_depth_is_not_walked(tmp_path):
    out = tmp_path / "out"
    deep = out.joinpath(*["d"] * (dirscan.MAX_DEPTH + 5))
    make(out.joinpath(*["d"] * dirscan.MAX_DEPTH) / "last-walked")
    make(deep / "too-deep")
    sample = WatchedDir(configmod.DirWatch(name="out", path=str(out), max_files=5), 1000).collect()
    assert sample["dirs"][0]["files"] == 1


def test_a_directory_swapped_for_a_link_between_two_looks_is_refused(tmp_path):
    # The agent's own directory (uid 65534 owns it): what it places there is never followed as root.
    agent = tmp_path / "agent"
    out, elsewhere = agent / "out", tmp_path / "elsewhere"
    for i in range(4):
        make(out / f"f{i}", mtime=OLD + i)
        make(elsewhere / f"e{i}", mtime=OLD + i)
    make(out / "sub" / "s0", mtime=OLD - 5)
    for p in (agent, out, *out.iterdir(), out / "sub" / "s0"):
        os.chown(p, 65534, 65534)
    watch = configmod.DirWatch(name="out", path=str(out), max_files=1)
    ctx = context(tmp_path, dir_toml(out, max_files=1))
    assert [d["over"] for d in WatchedDir(watch, 1000).collect()["dirs"]] == [["max_files"]]
    out.rename(agent / "gone")
    (agent / "out").symlink_to(elsewhere)
    os.chown(agent / "out", 65534, 65534, follow_symlinks=False)
    assert WatchedDir(watch, 1000).collect()["dirs"] == []         # the next look: nothing matches
    with pytest.raises(kinds.EffectFailed) as err:
        trim(out, ctx)
    assert err.value.reason == "refused" and "is not a directory [[watch.dir]] 'out' matches" in err.value.error
    assert sorted(p.name for p in elsewhere.iterdir()) == ["e0", "e1", "e2", "e3"]
    # Swapped back, it is trimmed with the agent's rights (a forked child as uid 65534).
    (agent / "out").unlink()
    (agent / "gone").rename(out)
    done = trim(out, ctx)                                # and the subdirectory it emptied goes too
    assert done["removed"] == 4 and sorted(p.name for p in out.iterdir()) == ["f3"]


def test_a_name_that_no_longer_holds_the_planned_file_is_left(tmp_path):
    out = tmp_path / "out"
    for i in range(6):
        make(out / f"f{i}", mtime=OLD + i)
    top = safepath.open_dir(str(out))
    try:
        chosen, _ = dirscan.plan(dirscan.files(top), dirscan.Bounds(None, 2, None), time.time(), set())
        assert [e.rel for e in chosen] == ["f0", "f1", "f2", "f3"]
        (out / "f0").rename(out / "renamed")             # moved while the trim runs
        (out / "f1").unlink()
        make(out / "f1", size=99)                        # another file put in its place
        t = dirs.Trim(top, context(tmp_path, dir_toml(out, max_files=2)), configmod.DirWatch(name="out", path=str(out)))
        t.delete(chosen)
        t.close()
    finally:
        os.close(top.fd)
    assert [e.rel for e in t.removed] == ["f2", "f3"] and t.skipped == 2
    assert sorted(p.name for p in out.iterdir()) == ["f1", "f4", "f5", "renamed"] and (out / "f1").stat().st_size == 99


def test_files_renamed_all_through_a_trim_never_fail_it_nor_lead_outside(tmp_path, shm):
    out, outside = shm / "out", tmp_path / "outside"
    for i in range(2000):
        make(out / f"f{i:04d}", mtime=OLD + i)
    make(outside / "keep", mtime=OLD - 1)
    stop = threading.Event()

    def shuffle():                                       # the oldest files, renamed back and forth
        n = 0
        while not stop.is_set():
            for i in range(20):
                a, b = out / f"f{i:04d}", out / f"moved{i:04d}"
                try:
                    os.rename(a, b) if n % 2 == 0 else os.rename(b, a)
                except FileNotFoundError:
                    pass
            n += 1
    mover = threading.Thread(target=shuffle)
    mover.start()
    try:
        try:
            done = trim(out, context(tmp_path, dir_toml(out, max_files=100)))
        except kinds.EffectFailed as err:                # a renamed file may be skipped: still-over, said so
            assert err.reason == "still-over", err.error
            done = err.data
    finally:
        stop.set()
        mover.join()
    assert done["removed"] >= 1800 and done["held_open"] == 0
    # a name missed by the listing, or renamed between the plan and its unlink, is left: 20 each at most
    assert len(list(out.iterdir())) <= 100 + 2 * 20 and (outside / "keep").exists()


def test_archive_keeps_each_file_in_objects_and_records_it_before_removing_it(tmp_path):
    out = tmp_path / "out"
    make(out / "a" / "old.md", size=3000, mtime=OLD)
    make(out / "new.md", size=10)
    recorded = []
    ctx = context(tmp_path, dir_toml(out, max_age="1h", oldest="archive"))
    ctx.record = lambda type_, data: recorded.append((type_, data, (out / "a" / "old.md").exists()))
    done = trim(out, ctx)
    assert (done["removed"], done["archived"], done["bytes_freed"]) == (1, 1, 3000)
    ((type_, data, still_there),) = recorded
    assert type_ == "dir-archived" and still_there               # recorded before the file was removed
    (kept,) = data["files"]
    assert (kept["path"], kept["bytes"], kept["mtime"]) == (str(out / "a" / "old.md"), 3000, OLD)
    assert objects.get(ctx.objects, kept["object"]) == b"x" * 3000
    assert sorted(p.name for p in out.iterdir()) == ["new.md"]   # the emptied subdirectory went too


def test_a_file_open_for_writing_is_left_and_the_trim_says_what_kept_it_over(tmp_path):
    out = tmp_path / "out"
    held, read_only = make(out / "held.log", mtime=OLD), make(out / "read.log", mtime=OLD + 1)
    make(out / "closed.log", mtime=OLD + 2)
    writing, reading = os.open(held, os.O_WRONLY | os.O_APPEND), os.open(read_only, os.O_RDONLY)
    try:
        with pytest.raises(kinds.EffectFailed) as err:
            trim(out, context(tmp_path, dir_toml(out, max_age="1h")))
    finally:
        os.close(writing)
        os.close(reading)
    assert err.value.reason == "still-over" and "1 file(s) open for writing" in err.value.error
    assert (err.value.data["removed"], err.value.data["held_open"]) == (2, 1)   # one only read: not held
    assert sorted(p.name for p in out.iterdir()) == ["held.log"]


def test_a_hard_link_to_another_accounts_file_is_never_read_into_an_archive(tmp_path):
    agent = tmp_path / "agent"
    out = agent / "out"
    secret = make(tmp_path / "root-only" / "secret", size=42, mtime=OLD)
    os.chmod(secret, 0o600)
    make(out / "mine.md", mtime=OLD + 1)
    os.link(secret, out / "looks-old.md")                # placed where the agent writes, root's all the same
    for p in (agent, out, out / "mine.md"):
        os.chown(p, 65534, 65534)
    ctx = context(tmp_path, dir_toml(out, max_age="1h", oldest="archive"))
    with pytest.raises(kinds.EffectFailed) as err:
        trim(out, ctx)
    assert err.value.reason == "still-over" and (err.value.data["archived"], err.value.data["skipped"]) == (1, 1)
    assert sorted(p.name for p in out.iterdir()) == ["looks-old.md"] and secret.read_bytes() == b"x" * 42
    assert not [p for p in ctx.objects.rglob("*") if p.is_file() and p.read_bytes() == b"x" * 42]


def test_put_fd_streams_a_file_into_objects_as_put_would_and_gc_takes_a_stray_copy(tmp_path):
    root, data = tmp_path / "objects", os.urandom(objects.CHUNK + 12345)   # more than one chunk
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    try:
        assert objects.put_fd(root, fd) == (objects.put(tmp_path / "other", data), len(data))
        with pytest.raises(TimeoutError):
            objects.put_fd(root, fd, deadline=time.monotonic() - 1)
    finally:
        os.close(fd)
    assert objects.get(root, objects.put(root, data)) == data
    assert not list(root.glob(objects.TMP_PREFIX + "*"))                  # the timed-out copy is gone
    stray = root / f"{objects.TMP_PREFIX}left-by-a-crash"
    stray.write_bytes(b"half")
    objects.gc(root, {objects.put(root, data).removeprefix("sha256:")}, 60, now=time.time() + 120)
    assert not stray.exists() and objects.get(root, objects.put(root, data)) == data


def test_the_home_is_never_trimmed(tmp_path):
    ctx = context(tmp_path, dir_toml(tmp_path / "home", max_files=1))
    with pytest.raises(kinds.EffectFailed) as err:
        trim(tmp_path / "home", ctx)
    assert err.value.reason == "refused" and "Pulse home" in err.value.error
    sample = WatchedDir(configmod.DirWatch(name="own", path=str(tmp_path), max_files=1), 1000, tmp_path / "home").collect()
    assert sample["dirs"][0]["refused"]


# -- end to end: a real pulsed ----------------------------------------------------------------------------

# Holds one file open for writing, made the oldest, and keeps adding 1 KB files (each closed) until
# the stop file appears. Its script's path holds the test's tmp_path: a command line of its own.
WRITER = """
import os, sys, time
out, stop = sys.argv[1], sys.argv[2]
held = os.open(os.path.join(out, "held.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(held, b"open for writing\\n")
os.utime(held, (1e9 - 100, 1e9 - 100))
print("ready", flush=True)
n = 0
while not os.path.exists(stop):
    n += 1
    fd = os.open(os.path.join(out, f"new-{n:07d}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"y" * 1024)
    os.close(fd)
    if n % 20 == 0:
        time.sleep(0.05)
"""


def write_config(pulsed, text: str) -> None:
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text(textwrap.dedent(text))


def ended(pulsed, kind: str) -> list[dict]:
    return [e for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed") and e["data"].get("kind") == kind]


def open_effects(pulsed, kind: str) -> list[str]:
    done = {e["data"]["effect_id"] for e in pulsed.events() if e["type"] in ("effect-acked", "effect-failed",
                                                                           "effect-expired")}
    return [e["data"]["id"] for e in pulsed.events("effect") if e["data"]["kind"] == kind and e["data"]["id"] not in done]


def on_disk(out: Path) -> tuple[int, int]:
    """(files, bytes) in `out` now; a file a running trim removes while they are counted is not."""
    sizes = []
    for p in out.iterdir():
        try:
            sizes.append(p.stat().st_size)
        except FileNotFoundError:
            pass
    return len(sizes), sum(sizes)


def test_ten_thousand_files_are_kept_within_bounds_while_a_writer_keeps_writing(pulsed, tmp_path, tracker, shm):
    out = shm / "out"
    out.mkdir()
    for i in range(10_000):
        make(out / f"old-{i:05d}", size=100, mtime=OLD + i)
    write_config(pulsed, f"""
        [[watch.dir]]
        name = "sessions"
        path = "{out}"
        max_files = 4000
        max_mb = 2
    """)
    script, stop = tmp_path / f"dirwriter-{tmp_path.name}.py", tmp_path / "stop"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(out), str(stop)], stdout=subprocess.PIPE, text=True)
    tracker.add(writer.pid)
    assert writer.stdout.readline().strip() == "ready"
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "300"})
    wait_for(lambda: len([e for e in ended(pulsed, "trim-dir") if e["type"] == "effect-acked"]) >= 3, 90,
             interval=0.2, what="three trims while the writer writes")
    assert (out / "held.log").read_bytes() == b"open for writing\n"      # the oldest, but open: untouched
    stop.touch()                                         # closed now, it is the oldest file: fair game
    assert writer.wait(10) == 0
    wait_for(lambda: (lambda n, b: n <= 4000 and b <= 2 * MB)(*on_disk(out)) and not open_effects(pulsed, "trim-dir"),
             60, interval=0.2, what="the directory within bounds once the writer stopped, no trim running")
    files, size = on_disk(out)
    trims = ended(pulsed, "trim-dir")
    acked = [e["data"] for e in trims if e["type"] == "effect-acked"]
    assert not [e for e in trims if e["type"] == "effect-failed"]
    assert all(d["path"] == str(out) and d["oldest"] == "delete" for d in acked)
    assert all(d["held_open"] >= 1 for d in acked[:3])
    assert str(out / "old-00000") in acked[0]["first_removed"][:1]      # oldest first, held.log skipped
    removed, freed = sum(d["removed"] for d in acked), sum(d["bytes_freed"] for d in acked)
    assert removed >= 6000
    took = ", ".join(f"{d['took_s']} s" for d in acked)
    print(f"\n{removed} files removed in {len(acked)} trims, which took {took}")

    # Status (table and JSON), /metrics and the report show the watch and what its trims did.
    (view,) = wait_for(lambda: [d for d in pulsed.status().dirs if d.last_trim_state == "acked" and d.files == files],
                       10, what="the directory in status")
    assert (view.name, view.path, view.max_files, view.max_mb, view.dirs, view.over) == ("sessions", str(out), 4000, 2, 1, 0)
    assert view.oldest_mtime == pytest.approx(min(p.stat().st_mtime for p in out.iterdir()))
    assert "WATCHED DIR" in pulsed.ctl("status").stdout
    (shown,) = json.loads(pulsed.ctl("status", "--json").stdout)["dirs"]
    assert shown["name"] == "sessions" and shown["oldest_mtime"].endswith("Z")
    exposed = {(s.name, tuple(s.labels.items())): s.value for family in text_string_to_metric_families(scrape(pulsed))
               for s in family.samples}
    assert exposed["pulse_watched_dir_files_removed_total", (("watch", "sessions"),)] == removed
    assert exposed["pulse_watched_dir_bytes_freed_total", (("watch", "sessions"),)] == freed
    assert exposed["pulse_watched_dir_files", (("watch", "sessions"),)] == files
    assert exposed["pulse_watched_dirs_over_bounds", (("watch", "sessions"),)] == 0
    report = json.loads(pulsed.ctl("report", "--json", "--analyst", "deterministic").stdout)
    (card,) = [c for c in report["role_analysis"] if c["role"] == "survival"]
    assert card["figures"]["dirs_trimmed"] == len(acked) and card["figures"]["dir_files_removed"] == removed
    (said,) = [h for h in report["highlights"] if h["text"].startswith("watched directories kept within bounds")]
    assert f"{out} trimmed {len(acked)} times (over " in said["text"] and f"{removed} files" in said["text"], said
    assert trims[0]["id"] in said["event_ids"]                                     # it cites the trims


def test_huge_files_old_files_and_an_archive_with_links_among_them(pulsed, tmp_path):
    huge, aged, outside = tmp_path / "huge", tmp_path / "aged", tmp_path / "outside"
    for i in range(4):                                   # 4 × 1 GiB, sparse: nothing written
        with open(make(huge / f"dump-{i}", size=0), "r+b") as f:
            f.truncate(1024 * MB)
        os.utime(huge / f"dump-{i}", (OLD + i, OLD + i))
    make(aged / "cron" / "job-1" / "old.md", size=500, mtime=OLD)
    make(aged / "cron" / "job-1" / "new.md", size=7)
    make(aged / "older.md", size=200, mtime=OLD + 1)
    precious = make(outside / "precious.md", size=300, mtime=OLD - 1)
    make(outside / "dir" / "also.md", size=300, mtime=OLD - 1)
    (aged / "link.md").symlink_to(precious)
    (aged / "cron" / "elsewhere").symlink_to(outside / "dir")
    write_config(pulsed, f"""
        [[watch.dir]]
        name = "dumps"
        path = "{huge}"
        max_mb = 2500

        [[watch.dir]]
        name = "cron-output"
        path = "{aged}"
        max_age = "1h"
        oldest = "archive"
    """)
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_WATCHER_INTERVAL_MS": "100"})
    wait_for(lambda: len(ended(pulsed, "trim-dir")) >= 2 and not open_effects(pulsed, "trim-dir"), 30,
             what="both directories trimmed")
    assert sorted(p.name for p in huge.iterdir()) == ["dump-2", "dump-3"]          # 2 GiB ≤ 2500 MiB
    assert sorted(str(p.relative_to(aged)) for p in aged.rglob("*")) == [
        "cron", "cron/elsewhere", "cron/job-1", "cron/job-1/new.md", "link.md"]
    assert precious.read_bytes() == b"x" * 300 and (outside / "dir" / "also.md").exists()
    by_watch = {e["data"]["watch"]: e for e in ended(pulsed, "trim-dir")}
    assert by_watch["dumps"]["type"] == "effect-acked" and by_watch["dumps"]["data"]["bytes_freed"] == 2048 * MB
    assert by_watch["cron-output"]["type"] == "effect-acked"
    assert (by_watch["cron-output"]["data"]["removed"], by_watch["cron-output"]["data"]["archived"]) == (2, 2)
    kept = {f["path"]: f for e in pulsed.events("dir-archived") for f in e["data"]["files"]}
    assert set(kept) == {str(aged / "cron" / "job-1" / "old.md"), str(aged / "older.md")}
    assert objects.get(pulsed.home / "objects", kept[str(aged / "older.md")]["object"]) == b"x" * 200
    assert kept[str(aged / "older.md")]["mtime"] == OLD + 1
    # ... and put back (here elsewhere: where it was, it is older than max_age and would go again),
    # as a new file with its mtime and mode, never over one that exists
    back = tmp_path / "back.md"
    restored = pulsed.ctl("store", "restore-archived", str(aged / "older.md"), "--to", str(back))
    assert restored.returncode == 0, restored.stderr
    assert back.read_bytes() == b"x" * 200 and back.stat().st_mtime == OLD + 1 and back.stat().st_mode & 0o777 == 0o644
    again = pulsed.ctl("store", "restore-archived", str(aged / "cron" / "job-1" / "old.md"), "--to", str(back))
    assert again.returncode == 1 and "exists; restore it elsewhere with --to" in again.stderr and back.stat().st_size == 200
    assert pulsed.ctl("store", "restore-archived", str(aged / "never.md")).returncode == 1
    # Nothing more to do: no further trims while the bounds hold.
    pulsed.wait_samples("dir:cron-output", 5)
    assert len(ended(pulsed, "trim-dir")) == 2 and len(pulsed.status().dirs) == 2
