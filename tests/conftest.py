"""Fixtures: a real pulsed on a temporary home, and a tracker that kills by pid what a test started."""

import psutil
import pytest

from support import Pulsed, Tracker

@pytest.fixture
def tracker():
    t = Tracker()
    yield t
    t.kill_all()


@pytest.fixture
def pulsed(tmp_path, tracker) -> Pulsed:
    """A pulsed, not yet started: call .start(env=...)."""
    p = Pulsed(tmp_path / "home", tracker)
    yield p
    if p.proc is not None:
        try:
            p.tree()
        except psutil.NoSuchProcess:
            pass
        if p.proc.poll() is None:
            p.proc.kill()
        p.proc.wait(10)
