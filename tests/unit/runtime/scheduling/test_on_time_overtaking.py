"""Issue #13: the admission-order estimate on one KV lane counts later arrivals of other tenants tagged ahead of a
waiting request (§5.3), up to half its slack (§7.2 at risk) — :mod:`calculet.runtime.scheduling.overtaking`.

Decisions in virtual time, no sleeps: the pure pieces by hand, then the planner's estimate on a one-lane harness
where one tenant is backlogged and the other is not.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from calculet.runtime.scheduling.overtaking import (RATE_WINDOW_S, SLACK_SHARE, Overtaking, fixed_point_wait,
                                                    window_starts)
from tests.unit.runtime.scheduling.test_on_time_order import build, planner


def test_the_fixed_point_stretches_the_wait_until_each_tenants_window_is_full():
    assert fixed_point_wait(10.0, []) == 10.0
    assert fixed_point_wait(10.0, [(0.5, 1e9)]) == pytest.approx(20.0, abs=2e-3)     # W = 10 + W/2
    assert fixed_point_wait(10.0, [(0.5, 3.0)]) == pytest.approx(13.0, abs=1e-9)     # capped at its window
    assert fixed_point_wait(10.0, [(0.5, 3.0), (0.25, 1e9)]) == pytest.approx(13.0 / 0.75, abs=2e-3)
    assert fixed_point_wait(10.0, [(2.0, 4.0)]) == pytest.approx(14.0)               # faster than served: the cap


def test_the_accepted_rate_decays_with_its_window():
    o = Overtaking()
    o.accepted("a", 120.0, 0.0)
    assert o.rate("a", 0.0) == pytest.approx(120.0 / RATE_WINDOW_S)
    assert o.rate("a", RATE_WINDOW_S) == pytest.approx(120.0 / RATE_WINDOW_S / math.e)
    o.accepted("a", 60.0, RATE_WINDOW_S)
    assert o.rate("a", RATE_WINDOW_S) == pytest.approx((120.0 / math.e + 60.0) / RATE_WINDOW_S)
    assert o.rate("b", 5.0) == 0.0


def _overtaking(rate_a: float) -> Overtaking:
    o = Overtaking()
    o.accepted("a", rate_a * RATE_WINDOW_S, 100.0)  # a's accepted cost per second at t=100
    return o


def test_only_other_tenants_with_tags_below_the_candidates_overtake_it():
    o = _overtaking(0.5)
    o.accepted("b", 1e6, 100.0)                     # the candidate's own tenant never overtakes it
    others = [("a", 400.0, 1.0), ("b", 0.0, 1.0)]
    # b's candidate tagged 1 000, a's window from 400: 600 cost, at 0.01 s per cost unit -> up to 6 s; a's
    # accepted 0.5 cost/s is 0.005 s of lane per second of wait: W = 20 / (1 - 0.005)
    delay = o.delay("b", 1000.0, 20.0, 0.01, 1e9, 100.0, others)
    assert delay == pytest.approx(20.0 / 0.995 - 20.0, abs=2e-3)
    assert o.delay("b", 300.0, 20.0, 0.01, 1e9, 100.0, others) == 0.0  # a's last waiting tag is past it
    assert o.delay("b", 1000.0, 0.0, 0.01, 1e9, 100.0, others) == 0.0  # it does not wait: nobody gets ahead


def test_the_delay_takes_half_the_slack_at_most():
    o = _overtaking(50.0)                           # a arrives faster than the lane serves: the window binds
    others = [("a", 0.0, 1.0)]
    assert o.delay("b", 1000.0, 20.0, 0.01, 1e9, 100.0, others) == pytest.approx(10.0)  # the whole window
    assert o.delay("b", 1000.0, 20.0, 0.01, 8.0, 100.0, others) == pytest.approx(SLACK_SHARE * 8.0)
    assert o.delay("b", 1000.0, 20.0, 0.01, -1.0, 100.0, others) == 0.0  # already late: at risk at once


def test_a_tenant_with_nothing_waiting_opens_its_window_at_its_virtual_start():
    starts = window_starts({"a": 1.0, "b": 3.0}, {"b": 70.0}, lambda tenant: {"a": 40.0, "b": 50.0}[tenant])
    assert starts == [("a", 40.0, 1.0), ("b", 70.0, 3.0)]


def _one_lane_backlog() -> tuple[Any, list[int], list[int]]:
    """One KV lane (B1), tenant a (weight 1) sends a backlog of long requests, then b (weight 3) short ones."""
    h = build(lanes=1, sizes=(1,))
    a = [h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000).request_id for _ in range(8)]
    b = [h.submit(prompt=16, new=8, tenant="b", deadline_ms=600_000).request_id for _ in range(3)]
    return h, a, b


def test_on_one_lane_the_backlogged_tenants_estimate_counts_the_other_tenants_later_arrivals():
    """a's waiting requests carry a's backlog in their tags; b, which had sent work before, keeps sending: its
    later arrivals are tagged before a's last, so a's last is estimated later than the queue's order alone says.
    b's own candidates are tagged before a's queue and get no delay. Mutants caught: the delay dropped (the
    estimate equals the order's), applied on every tenant (b's differ), or its sign flipped."""
    h, a, b = _one_lane_backlog()
    p = planner(h)
    seen = _spy_order_estimates(p)
    last_a = h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000).request_id
    last_b = h.submit(prompt=16, new=8, tenant="b", deadline_ms=600_000).request_id
    in_order_a, in_order_b = seen[last_a], seen[last_b]
    assert in_order_a is not None and in_order_b is not None
    assert all(h.state(i) == "waiting_admission" for i in [*a[1:], *b, last_a, last_b])
    assert h.rec(last_a).estimated_finish > in_order_a + 1e-6
    assert h.rec(last_b).estimated_finish == in_order_b


def test_with_lanes_the_estimate_is_the_queue_orders_and_no_rate_is_kept():
    """B16 with 16 sequences: the lanes free at the per-token time, which varies far more than the term (issue #13:
    calculet-b4 steady at 1x, P90 32 -> 42 % with it), so the estimate is the order's and the submit path keeps no
    rate for it (#20: no call per B>1 submit). Mutant caught: the rates kept on every submit."""
    h = build()
    p = planner(h)
    seen = _spy_order_estimates(p)
    for i in range(24):
        h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000)
    last = h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000).request_id
    assert h.state(last) == "waiting_admission" and seen[last] is not None
    assert h.rec(last).estimated_finish == seen[last]
    assert p.overtaking.rate("a", h.clock.now()) == 0.0


def _spy_order_estimates(p: Any) -> dict[int, float | None]:
    """Each request's admission-order estimate, as the planner computed it before any overtaking term."""
    order = p._admission_order_estimate
    seen: dict[int, float | None] = {}

    def spy(rec, job, now, model, records):  # type: ignore[no-untyped-def]
        seen[rec.request_id] = value = order(rec, job, now, model, records)
        return value

    p._admission_order_estimate = spy
    return seen
