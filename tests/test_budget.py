"""A rule cannot flood the host: the engine's effects are budgeted, each effect is tagged with the
rule that added it, and the outcomes of the tick's own effects wake it at most so often."""

from __future__ import annotations

import asyncio

from pulse.core.wire.enginerpc import Effect, Snapshot
from pulse.rules import budget, onion
from support import engine_rule, init_home, notifications, wait_for


def engine(kind="notify", target="x", **params) -> Effect:
    return Effect(kind=kind, target=target, params=params, origin="engine")


def test_identical_engine_effects_within_the_window_are_committed_once():
    one = engine(message="disk")
    kept, dropped = budget.admit([one, engine(message="disk"), engine(message="other")], [], 100.0, 60, 120)
    assert kept == [one, engine(message="other")] and len(dropped) == 1
    # committed 30 s ago: still the same one; 61 s ago: a new one
    recent = [(70.0, budget.fingerprint(one))]
    assert budget.admit([one], recent, 100.0, 60, 120)[0] == []
    assert budget.admit([one], recent, 131.0, 60, 120)[0] == [one]
    # the last identical one failed: retrying it is not a flood
    assert budget.admit([one], recent, 100.0, 60, 120, retryable={budget.fingerprint(one)})[0] == [one]


def test_at_most_per_min_engine_effects_a_minute_and_other_origins_always_pass():
    recent = [(50.0 + i, f"old-{i}") for i in range(118)]
    fresh = [engine(message=str(i)) for i in range(5)]
    survival = Effect(kind="notify", target="y", origin="survival")
    kept, dropped = budget.admit([*fresh, survival], recent, 100.0, 60, 120)
    assert kept == [*fresh[:2], survival]
    assert [why for _, why in dropped] == ["over 120 engine effects a minute"] * 3
    assert budget.culprits(dropped) == {"the engine's rules": "over 120 engine effects a minute"}


def test_the_engine_chain_tags_each_effect_with_the_rule_that_added_it():
    async def inner_rule(prev, curr, inner):
        effects, tick_ms = await inner(prev, curr)
        return effects + [Effect(kind="noop")], tick_ms

    async def outer_rule(prev, curr, inner):
        effects, tick_ms = await inner(prev, curr)
        return effects + [Effect(kind="notify", params={"rule": "mine"}), Effect(kind="exec")], tick_ms

    chain = onion.compose([outer_rule, inner_rule], onion.nothing, tag=True)
    effects, _ = asyncio.run(chain(None, Snapshot(tick=1, ts=0.0)))
    assert [e.params.get("rule") for e in effects] == [
        "test_the_engine_chain_tags_each_effect_with_the_rule_that_added_it.<locals>.inner_rule",
        "mine",   # a rule that names itself keeps its name
        "test_the_engine_chain_tags_each_effect_with_the_rule_that_added_it.<locals>.outer_rule"]
    untagged, _ = asyncio.run(onion.compose([outer_rule], onion.nothing)(None, Snapshot(tick=1, ts=0.0)))
    assert "rule" not in untagged[-1].params


NAIVE = """
from pulse.engine.api import Effect

def shout(prev, curr, inner):
    return [Effect(kind="notify", target="disk", params={"message": "disk is filling"})], 50

RULES = [shout]
"""


def test_a_rule_that_notifies_every_tick_sends_one_notification_and_is_named(pulsed, tmp_path):
    notes = tmp_path / "notes.jsonl"
    engine_rule(pulsed, "shout", NAIVE)
    (pulsed.home / "config.toml").write_text(f'[store]\nerror_repeat_s = 0.5\n\n[[notify]]\nkind = "file"\npath = "{notes}"\n')
    pulsed.start(env={"PULSE_TICK_MS": "100", "PULSE_TICK_MS_MIN": "50"})
    error = wait_for(lambda: [e for e in pulsed.events("error") if "effect budget" in e["data"]["message"]],
                     15, what="the flood recorded")[0]
    assert "'shout'" in error["data"]["message"] and error["target"] == "engine"
    wait_for(lambda: notifications(notes, "engine-budget"), 10, what="the operator told")
    ticks = len(pulsed.ticks())
    wait_for(lambda: len(pulsed.ticks()) >= ticks + 20, 20, what="twenty more ticks of the flood")
    assert len(notifications(notes, "shout")) == 1
    assert len(notifications(notes, "engine-budget")) == 1
    # one error, coalesced: a first event, then at most one per error_repeat_s with the count since
    coalesced = [e for e in pulsed.events("error") if "effect budget" in e["data"]["message"]]
    assert [e["data"]["count"] for e in coalesced if not e["data"].get("repeat")] == [1]
    assert sum(e["data"]["count"] for e in coalesced) > len(coalesced)


def test_outcomes_of_the_ticks_own_effects_wake_it_at_most_every_outcome_wake_min_ms(pulsed):
    """Each noop's outcome rings the tick; with a slow default tick, those wakes alone set the pace."""
    engine_rule(pulsed, "busy", """
        from pulse.engine.api import Effect

        def busy(prev, curr, inner):
            return [Effect(kind="noop", target=str(curr.tick))], 60000

        RULES = [busy]
    """)
    init_home(pulsed.home)
    (pulsed.home / "config.toml").write_text("[tick]\noutcome_wake_min_ms = 400\n")
    pulsed.start(env={"PULSE_TICK_MS": "60000", "PULSE_TICK_MS_MAX": "60000", "PULSE_TICK_MS_MIN": "50"})
    pulsed.wait_running()
    assert pulsed.ctl("emit", "noop").returncode == 0   # its outcome wakes the tick; the engine now runs
    wait_for(lambda: len(pulsed.ticks()) >= 6, 20, what="ticks paced by outcomes")
    starts = [t["data"]["started_mono"] for t in pulsed.ticks()][2:]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps and min(gaps) >= 0.38, gaps
