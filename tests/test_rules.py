"""The onion (pure): pass, bypass, decorate, transform, sync and async; and processWatchdog's memory."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from pulse.core import config as configmod
from pulse.core.wire.enginerpc import Effect, Outcome, ProcessRuns, ProcessStart, Snapshot, Vital
from pulse.rules import onion, survival


def run(chain, prev=None, curr=None):
    return asyncio.run(chain(prev, curr or Snapshot(tick=1, ts=100.0)))


async def innermost(prev, curr):
    return [Effect(kind="noop", target="inner")], 1000


def test_pass_sync_and_async():
    async def passes(prev, curr, inner):
        return await inner(prev, curr)

    def passes_sync(prev, curr, inner):
        return inner(prev, curr)        # a plain rule may hand back inner's coroutine
    assert run(onion.compose([passes, passes_sync], innermost)) == ([Effect(kind="noop", target="inner")], 1000)


def test_bypass_never_calls_inner():
    called = []

    async def inner(prev, curr):
        called.append(True)
        return [], None

    def bypass(prev, curr, inner):
        return [Effect(kind="noop", target="outer")], 50
    assert run(onion.compose([bypass], inner)) == ([Effect(kind="noop", target="outer")], 50)
    assert not called


def test_decorate_adds_and_filters_after_inner():
    async def add(prev, curr, inner):
        effects, ms = await inner(prev, curr)
        return effects + [Effect(kind="notify", target="x")], ms

    async def drop_noops(prev, curr, inner):
        effects, ms = await inner(prev, curr)
        return [e for e in effects if e.kind != "noop"], ms
    assert run(onion.compose([drop_noops, add], innermost)) == ([Effect(kind="notify", target="x")], 1000)
    # order matters: outermost first
    assert run(onion.compose([add, drop_noops], innermost)) == ([Effect(kind="notify", target="x")], 1000)


def test_transform_changes_what_inner_sees():
    seen = []

    async def inner(prev, curr):
        seen.append(curr.tick)
        return [], None

    async def renumber(prev, curr, inner):
        return await inner(prev, msgspec.structs.replace(curr, tick=curr.tick + 41))
    run(onion.compose([renumber], inner))
    assert seen == [42]


@pytest.mark.parametrize("bad", [None, ([], "soon"), ("effects", None), ([{"kind": "noop"}], None), ([], None, 1)])
def test_wrong_shapes_are_refused(bad):
    def rule(prev, curr, inner):
        return bad
    with pytest.raises(onion.RuleError):
        run(onion.compose([rule], innermost))


def config_with(**settings) -> configmod.Config:
    return configmod.decode(
        b"[[process]]\nname = 'gw'\nmatch = 'gw'\nrestart = ['true']\n"
        + "".join(f"[survival]\n{k} = {v}\n" for k, v in settings.items()).encode(), "test")


def snap(ts: float, alive: bool, vital_ts: float, outcomes=(), pending=(), notified=None) -> Snapshot:
    return Snapshot(tick=1, ts=ts, vitals={"process-alive:gw": Vital("process-alive:gw", vital_ts, {"alive": alive})},
                    outcomes={"gw": list(outcomes)}, pending=list(pending), notified=notified or {})


def watchdog(curr: Snapshot, inner=onion.nothing, **settings):
    return run(onion.compose([survival.process_watchdog(config_with(**settings))], inner), curr=curr)


def restart_outcome(state: str, ts: float) -> Outcome:
    return Outcome(effect_id=f"e{ts}", kind="restart-process", state=state, ts=ts, error=None if state == "acked" else "exit 1")


def test_watchdog_restarts_a_dead_process_once():
    effects, _ = watchdog(snap(10.0, alive=False, vital_ts=9.0))
    assert [(e.kind, e.target, e.origin) for e in effects] == [("restart-process", "gw", "survival")]
    assert watchdog(snap(10.0, alive=True, vital_ts=9.0)) == ([], None)
    # pending: not again; a death seen before the last restart ended: not again
    assert watchdog(snap(10.0, False, 9.0, pending=[Effect(kind="restart-process", target="gw")]))[0] == []
    assert watchdog(snap(10.0, False, 9.0, outcomes=[restart_outcome("acked", 9.5)]))[0] == []


def test_watchdog_leaves_what_the_inner_chain_handled():
    async def business(prev, curr):
        return [Effect(kind="restart-process", target="gw", origin="engine")], None
    effects, _ = watchdog(snap(10.0, False, 9.0), inner=business)
    assert [(e.kind, e.origin) for e in effects] == [("restart-process", "engine")]


failures = [restart_outcome("failed", t) for t in (1.0, 2.0, 3.0)]


def test_watchdog_backs_off_failed_starts_and_says_nothing_before_it_holds_them():
    # three restarts that failed (folded into the snapshot's runs): inside the backoff after the third
    # (1 s * 2**1 = 2 s after the death): no restart, no notification (max_restarts 5 says it, once),
    # wake when due; past it: the fourth attempt
    runs = {"gw": ProcessRuns(starts=[ProcessStart(t, False) for t in (1.0, 2.0, 3.0)])}
    curr = snap(4.0, False, 3.5, outcomes=failures)
    curr.runs = runs
    effects, tick_ms = watchdog(curr)
    assert effects == [] and tick_ms == 1501
    curr = snap(8.0, False, 3.5, outcomes=failures)
    curr.runs = runs
    effects, _ = watchdog(curr)
    assert [(e.kind, e.params["attempt"]) for e in effects] == [("restart-process", 4)]
    # a success ends the streak of failed outcomes (fileGuard's trims)
    assert survival.failure_streak(failures + [restart_outcome("acked", 9.0)], "restart-process") == []
