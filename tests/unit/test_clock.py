"""The production clock and the fake one: both are read the same way (``clock.now()``)."""

from __future__ import annotations

import time

from calculet.clock import FakeClock, MonotonicClock


def test_the_monotonic_clock_reads_time_monotonic_and_never_goes_back() -> None:
    clock = MonotonicClock()
    before = time.monotonic()
    readings = [clock.now() for _ in range(1000)]
    after = time.monotonic()
    assert all(isinstance(r, float) for r in readings)
    assert before <= readings[0] and readings[-1] <= after
    assert readings == sorted(readings)


def test_the_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(5.0)
    assert clock.now() == clock.now() == 5.0
    clock.advance(0.25)
    assert clock.now() == 5.25
