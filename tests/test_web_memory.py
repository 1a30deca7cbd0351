"""The web worker's memory does not follow the history's length: a web worker started on
a long events.db, asked what a page asks by many clients at once, holds what one on a short history
held. Before, each of the server's threads (anyio's pool, up to 40) kept the SQLite page cache of the
reads it had served (2 MiB a connection, filled further the longer the history) in its own malloc
arena, and each new web worker sat higher as events.db grew. Real pulsed, real HTTP, real SQLite;
`scripts/web_memory.py` measures it at 5, 20 and 80 MiB."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from pathlib import Path

from pulse.agents import tasks
from pulse.core.wire import enginerpc, eventmsgs
from pulse.store import effectqueue, eventsdb
from pulse.workers.webserver import WEB_THREADS
from support import init_home, wait_for

MiB = 1024 * 1024
LONG_HISTORY_MIB = 40            # events.db the second web worker starts on (the first: a few KiB)
CLIENTS = 16                     # a page's requests at once: more than the pool's WEB_THREADS
ASKED = ("/api/tasks", "/api/gate", "/metrics", "/api/effects", "/api/events")
LOAD_S = 3.0
# What a web worker on 40 MiB of history may hold beyond one on none, under the same load: the
# longer answers of /api/tasks (it lists every task) and a fuller page cache. It held 20-30 MiB more.
MORE_ALLOWED_MIB = 6.0
NOT_POOL_THREADS = 6             # the harness, the server's loop, pyzmq's, a warm-up fold still running


def grow_history(home: Path, size_mib: float) -> None:
    """Noop effects (committed and ended in one transaction each 1,000) and a task created and closed per
    100 of them, until events.db holds `size_mib`: a history like the soak's, written fast."""
    conn = eventsdb.open_events(home / "events.db")
    try:
        while (home / "events.db").stat().st_size < size_mib * MiB:
            effects = [effectqueue.new_effect(enginerpc.Effect(kind="noop", target=f"t{i % 13}", idempotent=True),
                                              "operator", 600) for i in range(1_000)]
            effectqueue.commit_effects(conn, effects, "test", observe_only=True)
            for _ in range(10):
                task = tasks.create(conn, "memory", "a task", "nothing to do", source="test")
                tasks.record(conn, task.id, "task-closed", "test")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")     # the history's size is the main file's
    finally:
        conn.close()


def web_address(pulsed) -> tuple[str, int, str]:
    url = wait_for(lambda: pulsed.ctl("web", "url").stdout.strip(), 15, what="pulsectl web url")
    base, _, token = url.partition("/?token=")
    parts = urllib.parse.urlsplit(base)
    return parts.hostname, parts.port, token


def get(address: tuple[str, int, str], path: str) -> int:
    host, port, token = address
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def load(address: tuple[str, int, str], seconds: float) -> list[int]:
    """CLIENTS clients asking ASKED in turn for `seconds`; every answer's status."""
    answers: list[int] = []
    end = time.monotonic() + seconds

    def client(n: int) -> None:
        k = n
        while time.monotonic() < end:
            answers.append(get(address, ASKED[k % len(ASKED)]))
            k += 1
    clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    return answers


def anon_mib(pid: int) -> float:
    """The process's anonymous memory (heap, arenas, stacks): what could grow; code and mapped files cannot."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no Anonymous line in /proc/{pid}/smaps_rollup")


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def served(pulsed, address) -> tuple[float, int]:
    """Once the start-up fold is done (the first /metrics waits for it): the web worker's anonymous
    memory and threads after LOAD_S of CLIENTS clients."""
    assert get(address, "/metrics") == 200
    answers = load(address, LOAD_S)
    assert answers and set(answers) == {200}, sorted(set(answers))
    pid = pulsed.worker("web").pid
    return anon_mib(pid), threads_of(pid)


def test_a_web_worker_on_a_long_history_holds_what_one_on_a_short_history_held(pulsed, tmp_path):
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text('[web]\nenabled = true\nlisten = "127.0.0.1:0"\n')
    # the tick folds the 40 MiB written at once in one turn of its loop, which takes longer than the
    # tests' FAST hung_after_ms (1.5 s) on a busy machine: the default (10 s) lets it finish
    pulsed.start(env={"PULSE_HUNG_AFTER_MS": "10000"})
    first = pulsed.wait_running(("web",)).workers
    short_anon, short_threads = served(pulsed, web_address(pulsed))

    grow_history(pulsed.home, LONG_HISTORY_MIB)
    old_pid = next(w.pid for w in first if w.name == "web")
    assert pulsed.ctl("restart", "web").returncode == 0
    pulsed.wait_replaced("web", old_pid, timeout=30)
    long_anon, long_threads = served(pulsed, web_address(pulsed))

    figures = (f"anonymous memory {short_anon:.1f} MiB on a short history, {long_anon:.1f} MiB on "
               f"{LONG_HISTORY_MIB} MiB; threads {short_threads}, {long_threads}")
    print(figures)
    assert long_anon - short_anon < MORE_ALLOWED_MIB, figures
    assert max(short_threads, long_threads) <= WEB_THREADS + NOT_POOL_THREADS, figures


# -- what the web worker keeps, whatever the history (pure: no pulsed) ------------------------------

def ended_and_open_tasks(n: int) -> list:
    """`n` tasks, each created, assigned to agent `a`, run, acked and closed (every third given up
    after a failure instead), and two left open: one pending, one executing."""
    events, i = [], 0

    def ev(type_, task, **data):
        nonlocal i
        i += 1
        return eventmsgs.Event(id=i, ts=1_000 + i, type=type_, source="test", target=task, data=data)
    for k in range(1, n + 3):
        task = f"task-{k}"
        events += [ev("task-created", task, project="p", title=f"t{k}", prompt="x")]
        if k == n + 1:
            continue
        events += [ev("task-assigned", task, agent="a"), ev("task-executing", task, agent="a")]
        if k == n + 2:
            continue
        if k % 3:
            events += [ev("task-acked", task, result={"cost_usd": 0.5}), ev("task-closed", task)]
        else:
            events += [ev("task-failed", task, reason="boom"), ev("task-given-up", task, reason="boom")]
    return events


def test_the_tasks_page_keeps_the_open_tasks_and_the_newest_ended_and_counts_them_all():
    from pulse.web import taskboard
    history = ended_and_open_tasks(1_000)
    board, everything = taskboard.new_task_board(), tasks.TaskBook()
    board.fold(history)
    everything.fold(history)
    fold = board.agents
    assert len(fold.tasks) == 2 and len(fold.ended) == taskboard.SHOWN_ENDED
    assert [t.id for t in fold.ended.values()] == [f"task-{k}" for k in range(1_000 - taskboard.SHOWN_ENDED + 1, 1_001)]
    by_status: dict[str, int] = {}
    for state in everything.states.values():
        by_status[state.status] = by_status.get(state.status, 0) + 1
    assert fold.counts() == by_status and by_status["closed"] == 667
    assert fold.stats == everything.agents.stats        # each agent's record stays exact
    assert {t.id: t for t in fold.shown()} == {t.id: everything.states[t.id] for t in fold.shown()}


def test_the_pages_reads_keep_a_small_page_cache(tmp_path):
    from pulse.store.provision import ensure_home
    from pulse.web import site
    home = tmp_path / "home"
    ensure_home(home)
    conn = site.read_connection(home / "events.db")
    try:
        assert conn.execute("PRAGMA cache_size").fetchone()[0] == -site.READ_CACHE_KIB
        assert site.READ_CACHE_KIB <= 1024
    finally:
        conn.close()
