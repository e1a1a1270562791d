"""The front's request lengths are made once per snapshot and request shape (issue #13, session 22:
:meth:`EarlyAdmission._shape`): a new snapshot, whose lanes or device model moved, is decided on its own figures, and
the kept shapes stay bounded (:data:`SHAPES_PER_SNAPSHOT`).

Virtual time, the sans-io scheduler driven by hand (the harness of ``test_admission_snapshot``). Mutants caught (each
checked to fail here): the shapes kept across snapshots (keyed by the shape alone: the second snapshot's idle lane
is read with the first's busy one, and a request that fits it is refused); the shapes never dropped (one entry per
shape ever seen). A shape keyed without its new tokens is caught by ``test_the_front_refuses_what_the_engine_refuses_
with_the_same_retry_after`` (its 40-token "never" after two 11-token refusals on one snapshot).
"""

from __future__ import annotations

import pytest

from calculet.runtime.engine.admission_snapshot import SHAPES_PER_SNAPSHOT, EarlyAdmission
from calculet.runtime.engine.early_refusal import EarlyRefusal
from tests.unit.runtime.engine.test_admission_snapshot import _decide, _harness, _snapshot


@pytest.mark.req("R5.2.2")
def test_a_new_snapshot_is_decided_on_its_own_lanes_not_on_the_lengths_kept_for_the_last() -> None:
    h = _harness()
    for _ in range(3):  # the device busy until ~3 s: an 11-token request is late behind them
        assert not h.submit(prompt=8, new=11).outcome.rejected
    busy = _snapshot(h)
    assert busy is not None
    front = EarlyAdmission()
    assert isinstance(_decide(front, busy, h, 8, 11), EarlyRefusal)
    idle = busy._replace(generation=busy.generation + 1, free=tuple(h.clock.now() for _ in busy.free))
    assert _decide(front, idle, h, 8, 11) is None  # it fits the idle lane: forwarded
    assert front.statistics().forwarded["fits"] == 1


def test_the_shapes_kept_for_a_snapshot_are_bounded() -> None:
    h = _harness()
    for _ in range(3):
        assert not h.submit(prompt=8, new=11).outcome.rejected
    snap = _snapshot(h)
    front = EarlyAdmission()
    for prompt in range(1, 2 * SHAPES_PER_SNAPSHOT + 2):
        _decide(front, snap, h, prompt, 11)
    assert 0 < len(front._shapes) <= SHAPES_PER_SNAPSHOT
