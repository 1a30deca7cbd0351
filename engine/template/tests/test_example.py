"""The engine's own tests, run by the promote gate."""

import asyncio

from rules.example import passthrough

from pulse.engine.api import Snapshot


def test_passthrough_asks_the_inner_rules():
    async def inner(prev, curr):
        return [], 1234
    assert asyncio.run(passthrough(None, Snapshot(tick=1, ts=0.0), inner)) == ([], 1234)
