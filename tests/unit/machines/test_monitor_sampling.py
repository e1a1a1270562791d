"""Sampled invariant monitors: the production default of ``monitoring`` (issue #20).

In production one transition in ``sample_every`` is checked, drawn at random; the test suite
checks every one (``MONITOR.every_event``, set in ``tests/conftest.py``). A corruption is still
found by a sampled monitor, at a later checked event of the corrupted instance.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calculet.config import default_config
from calculet.machines import RequestMachine
from calculet.machines.monitor import MONITOR


@pytest.fixture
def sampling_allowed() -> Iterator[None]:
    MONITOR.every_event = False
    try:
        yield
    finally:
        MONITOR.every_event = True
        MONITOR.configure(enabled=True, mode="raise")


def _decode_life(steps: int, budget: int = 0) -> RequestMachine:
    room = max(budget, steps + 2)
    r = RequestMachine.create(prompt_tokens=4, max_new_tokens=room, max_seq=room + 16)
    r.fire("bind", gen=1)
    r.fire("admit")
    r.fire("submit_prefill", job=1)
    r.fire("prefill_done", job=1, ok=True, stop=False)
    for job in range(2, steps + 2):
        r.fire("submit_decode", job=job)
        r.fire("decode_done", job=job, ok=True, stop=False)
    return r


def test_the_shipped_default_monitors_one_event_in_256():
    monitoring = default_config().monitoring
    assert monitoring.invariants is True and monitoring.sample_every == 256


def test_one_event_in_n_is_checked_on_average(sampling_allowed: None):
    MONITOR.configure(enabled=True, mode="count", sample_every=16)
    MONITOR.reset()
    _decode_life(2000)  # 4004 events
    checks = MONITOR.statistics().checks
    assert 4004 / 16 * 0.7 < checks < 4004 / 16 * 1.3
    assert MONITOR.statistics().sample_every == 16


def test_the_test_suite_checks_every_event_whatever_the_configuration():
    MONITOR.configure(enabled=True, mode="count", sample_every=16)
    MONITOR.reset()
    _decode_life(50)  # 104 events
    assert MONITOR.statistics().checks == 104
    assert MONITOR.sample_every == 1


def test_a_sampled_monitor_still_finds_a_corruption(sampling_allowed: None):
    MONITOR.configure(enabled=True, mode="count", sample_every=16)
    MONITOR.reset()
    r = _decode_life(1, budget=1000)
    object.__setattr__(r, "closes", 1)  # a close nobody performed: terminal_closed_once breaks
    for job in range(100, 300):
        r.fire("submit_decode", job=job)
        r.fire("decode_done", job=job, ok=True, stop=False)
    assert MONITOR.statistics().violations[("RequestMachine", "terminal_closed_once")] >= 1


def test_sample_every_below_one_is_refused():
    with pytest.raises(ValueError, match="sample_every"):
        MONITOR.configure(enabled=True, sample_every=0)
