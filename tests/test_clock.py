"""pulse.core.clock's pure helpers."""

from pulse.core import clock


def test_a_polls_timeout_is_rounded_up_to_whole_ms_so_its_last_fraction_is_slept_not_spun():
    assert clock.poll_ms(0.0004) == 1           # rounded down, 0 would return at once, again and again
    assert clock.poll_ms(0.25) == 250
    assert clock.poll_ms(0.2501) == 251
    assert clock.poll_ms(0.0) == 0 and clock.poll_ms(-0.5) == 0     # a deadline passed: look now


def test_backoff_doubles_up_to_its_cap():
    assert [clock.backoff(n, 0.05, 0.4) for n in range(1, 6)] == [0.05, 0.1, 0.2, 0.4, 0.4]
