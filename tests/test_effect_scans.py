"""The executor's scans of the open effects cost what is open, not the history: on a real events.db,
open_effects and list_effects of open states read through the partial index effects_open, so a
store with a hundred times more ended effects costs them no more SQLite steps; a listing of every
state (`pulsectl effects`) reads only the rows it returns. Pure: no daemon."""

from __future__ import annotations

import pytest

from pulse.core.states import EffectState
from pulse.core.wire import enginerpc
from pulse.store import effectqueue, eventsdb
from pulse.store.connection import Transaction


def store_with(path, ended: int) -> object:
    """`ended` effects committed and acked, then two left open (one pending, one executing)."""
    conn = eventsdb.open_events(path)
    effects = [effectqueue.new_effect(enginerpc.Effect(kind="noop", target=f"t{i}", idempotent=True), "operator", 600)
               for i in range(ended + 2)]
    with Transaction(conn):
        for eff in effects:
            effectqueue.insert_effect(conn, eff, "test")
        conn.execute("UPDATE effects SET state = 'acked' WHERE id NOT IN (?, ?)", (effects[-1].id, effects[-2].id))
        conn.execute("UPDATE effects SET state = 'executing' WHERE id = ?", (effects[-1].id,))
    return conn


def steps(conn, read) -> int:
    """SQLite virtual-machine steps `read` takes: what it reads, independent of the machine's load."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0
    conn.set_progress_handler(tick, 1)
    try:
        read(conn)
    finally:
        conn.set_progress_handler(None, 0)
    return count[0]


READS = {
    "open, every state": lambda c: effectqueue.open_effects(c),
    "open, pending": lambda c: effectqueue.open_effects(c, EffectState.PENDING),
    "open, executing": lambda c: effectqueue.open_effects(c, EffectState.EXECUTING),
    "listed open": lambda c: effectqueue.list_effects(c, (EffectState.PENDING, EffectState.EXECUTING)),
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("effects")
    small, large = store_with(base / "small.db", 20), store_with(base / "large.db", 2_000)
    yield small, large
    small.close()
    large.close()


@pytest.mark.parametrize("name", READS)
def test_a_scan_of_the_open_effects_does_not_grow_with_the_ended_ones(stores, name):
    small, large = stores
    read = READS[name]
    assert read(small) and len(read(large)) == len(read(small))
    assert steps(large, read) <= steps(small, read) + 50      # a scan of every effect: thousands more


def test_open_effects_refuses_a_state_that_is_not_open(stores):
    with pytest.raises(ValueError, match="acked"):
        effectqueue.open_effects(stores[0], EffectState.ACKED)


def test_a_listing_of_every_state_reads_only_what_it_returns_newest_first(stores):
    small, large = stores
    listed = effectqueue.list_effects(large, limit=10)
    newest = large.execute("SELECT id, state FROM effects ORDER BY created DESC LIMIT 10").fetchall()
    assert [(e.id, state) for e, state, _ in listed] == newest
    assert {state for _, state, _ in listed} == {EffectState.ACKED, EffectState.PENDING, EffectState.EXECUTING}
    assert steps(large, lambda c: effectqueue.list_effects(c, limit=10)) <= \
        steps(small, lambda c: effectqueue.list_effects(c, limit=10)) + 50     # a sort of every effect: thousands more
