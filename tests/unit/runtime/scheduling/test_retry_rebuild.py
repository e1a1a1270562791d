"""Issue #20: ``RetrySlots`` rebuilds its lanes as before — every ghost in retry-time order, ties in arrival order.

Past ``limit`` ghosts every reservation rebuilds (the oldest is dropped each time); the rebuild's sort key and
placement were made C-level (issue #20: 104 -> 57 µs per refusal in a distinct-prompt burst). The retry times handed
out must be the ones the plain rebuild gave (the one reference, :class:`.retry_reference.PlainRetrySlots`). Mutants
caught: ghosts placed in arrival order rather than by retry time (no sort), ties broken the other way (an unstable or
reversed sort), a ghost placed at its retry time on a lane still busy past it (``at`` instead of ``max(at, lane)``).
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.on_time_retry import RetrySlots
from tests.unit.runtime.scheduling.retry_reference import PlainRetrySlots


reservation = st.tuples(st.sampled_from([0.5, 1.0, 2.0, 3.5]), st.floats(1.0, 30.0), st.floats(0.0, 6.0),
                        st.booleans(), st.sampled_from(["a", "b"]), st.booleans(), st.booleans())


@settings(max_examples=200, deadline=None)
@given(base=st.lists(st.floats(0.0, 8.0), max_size=4), limit=st.integers(1, 6),
       steps=st.lists(reservation, min_size=1, max_size=30))
def test_retry_times_are_those_of_the_plain_rebuild(base: list[float], limit: int, steps: list[tuple]) -> None:
    """Reservations with the kept schedule changing (``key``), admissions taking slots and time passing (expiry)
    between them, over and under the limit: the same retry time at each, and the same lanes."""
    fast, plain = RetrySlots(limit=limit), PlainRetrySlots(limit=limit)
    now, version = 0.0, 0
    for length, relative, lower, drained, tenant, replan, admit in steps:
        version += replan
        if admit:
            fast.admitted(tenant, now)
            plain.admitted(tenant, now)
        got = fast.reserve(list(base), version, now, length, relative, now + lower, tenant, drained)
        expected = plain.reserve(list(base), version, now, length, relative, now + lower, tenant, drained)
        assert got == expected and sorted(fast._free or []) == sorted(plain.free or [])
        now += math.floor(lower) / 2  # ties: several ghosts share a retry time when time stands still


@settings(max_examples=300, deadline=None)
@given(base=st.lists(st.sampled_from([0.0, 1.0, 5.0]), min_size=1, max_size=3),
       ghosts=st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.5, 2.0, 10.0])), max_size=8))
def test_the_rebuilt_lanes_are_those_of_the_plain_rebuild(base: list[float], ghosts: list[tuple[float, float]]) -> None:
    """The rebuild alone, ghosts sharing retry times on several lanes (the order among ties decides the lanes): the
    ghosts placed by reservations at their retry times (a deadline far off: each retry is its ``lower``), then the
    lanes rebuilt from ``base`` on both, the same heap."""
    fast, plain = RetrySlots(), PlainRetrySlots()
    for slots in (fast, plain):
        for at, length in ghosts:
            slots.reserve([0.0], 0, 0.0, length, 1e9, at, "t")
    assert [(g.retry_at, g.length) for g in fast.ghosts] == [(g.retry_at, g.length) for g in plain.ghosts] == ghosts
    fast._rebuild(list(base), 1, 0.0)
    plain.rebuild(list(base), 1, 0.0)
    assert fast._free == plain.free
