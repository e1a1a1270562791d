"""Issue #13: the admission-order estimate counts later arrivals of other tenants tagged ahead of a waiting request
(§5.3), in their own lane seconds over the lanes, up to a quarter of its slack (§7.2 at risk) and half its wait —
:mod:`calculet.runtime.scheduling.overtaking`.

Decisions in virtual time, no sleeps: the pure pieces by hand, then the planner's estimate on a one-lane and a
16-lane harness where one tenant is backlogged and the other is not.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.runtime.scheduling.overtaking import RATE_WINDOW_S, Overtaking, fixed_point_wait
from tests.unit.runtime.scheduling.test_on_time_order import build, planner


def test_the_fixed_point_stretches_the_wait_until_each_tenants_window_is_full():
    assert fixed_point_wait(10.0, []) == 10.0
    assert fixed_point_wait(10.0, [(0.5, 1e9)]) == pytest.approx(20.0, abs=2e-3)     # W = 10 + W/2
    assert fixed_point_wait(10.0, [(0.5, 3.0)]) == pytest.approx(13.0, abs=1e-9)     # capped at its window
    assert fixed_point_wait(10.0, [(0.5, 3.0), (0.25, 1e9)]) == pytest.approx(13.0 / 0.75, abs=2e-3)
    assert fixed_point_wait(10.0, [(2.0, 4.0)]) == pytest.approx(14.0)               # faster than served: the cap


def test_the_accepted_rates_decay_with_their_window():
    o = Overtaking({"a": 1.0, "b": 1.0})
    o.accepted("a", 120.0, 6.0, 0.0)
    assert o.rate("a", 0.0) == pytest.approx(120.0 / RATE_WINDOW_S)
    assert o.lane_rate("a", 0.0) == pytest.approx(6.0 / RATE_WINDOW_S)
    assert o.rate("a", RATE_WINDOW_S) == pytest.approx(120.0 / RATE_WINDOW_S / math.e)
    assert o.lane_rate("a", RATE_WINDOW_S) == pytest.approx(6.0 / RATE_WINDOW_S / math.e)
    o.accepted("a", 60.0, 3.0, RATE_WINDOW_S)
    assert o.rate("a", RATE_WINDOW_S) == pytest.approx((120.0 / math.e + 60.0) / RATE_WINDOW_S)
    assert o.lane_rate("a", RATE_WINDOW_S) == pytest.approx((6.0 / math.e + 3.0) / RATE_WINDOW_S)
    assert o.rate("b", 5.0) == 0.0 and o.lane_rate("b", 5.0) == 0.0


def windows(*starts: tuple[str, float]) -> tuple[dict[str, float], Any]:
    """``delay``'s (last waiting tags, virtual start) of tenants given as (tenant, window start): every window from a
    last waiting tag (the virtual start is never read)."""
    def unread(tenant: str) -> float:
        raise AssertionError(f"{tenant} has a last waiting tag: its virtual start is not read")
    return dict(starts), unread


def _overtaking(rate_a: float, lane_s_per_cost: float = 0.01) -> Overtaking:
    o = Overtaking({"a": 1.0, "b": 1.0})
    cost = rate_a * RATE_WINDOW_S  # a's accepted cost per second at t=100, each cost unit holding a lane this long
    o.accepted("a", cost, cost * lane_s_per_cost, 100.0)
    return o


def test_only_other_tenants_with_tags_below_the_candidates_overtake_it():
    o = _overtaking(0.5)
    o.accepted("b", 1e6, 1e4, 100.0)                # the candidate's own tenant never overtakes it
    others = windows(("a", 400.0), ("b", 0.0))
    # b's candidate tagged 1 000, a's window from 400: 600 cost, at a's 0.01 s of lane per cost unit -> up to 6 s;
    # a's accepted 0.5 cost/s is 0.005 s of lane per second of wait: W = 20 / (1 - 0.005)
    delay = o.delay("b", 1000.0, 20.0, 1, 1e9, 100.0, *others)
    assert delay == pytest.approx(20.0 / 0.995 - 20.0, abs=2e-3)
    assert o.delay("b", 300.0, 20.0, 1, 1e9, 100.0, *others) == 0.0  # a's last waiting tag is past it
    assert o.delay("b", 1000.0, 0.0, 1, 1e9, 100.0, *others) == 0.0  # it does not wait: nobody gets ahead


def test_the_other_tenants_work_is_counted_in_its_own_lane_seconds_over_the_lanes():
    """Issue #13 session 11: a tenant of long prompts and short outputs costs much in §5.3 units and little lane time;
    its work is read in its own lane seconds, not at the candidate's rate. Mutants caught: the rate read in cost
    units (the two tenants' delays equal), the lanes ignored (the 4-lane delay equals the 1-lane one)."""
    others = windows(("a", 0.0))
    light = _overtaking(50.0, lane_s_per_cost=0.001)  # 50 cost/s at 1 ms a unit: 0.05 s of lane a second
    heavy = _overtaking(25.0, lane_s_per_cost=0.01)   # 0.25 s of lane a second (under the wait's cap)
    assert light.delay("b", 1e6, 20.0, 1, 1e9, 100.0, *others) == pytest.approx(20.0 / 0.95 - 20.0, abs=2e-3)
    assert heavy.delay("b", 1e6, 20.0, 1, 1e9, 100.0, *others) == pytest.approx(20.0 / 0.75 - 20.0, abs=2e-3)
    assert heavy.delay("b", 1e6, 20.0, 4, 1e9, 100.0, *others) == pytest.approx(20.0 / 0.9375 - 20.0, abs=2e-3)
    # the window spreads over the lanes too: 1 000 cost at 0.01 s is 10 s of lane, 2.5 s on each of 4
    flood = _overtaking(5000.0)
    assert flood.delay("b", 1000.0, 20.0, 4, 1e9, 100.0, *others) == pytest.approx(2.5)


def test_the_delay_takes_a_share_of_the_slack_and_of_the_wait_at_most():
    """Issue #13 session 15: the overtakers' work is capped by a quarter of the slack and half the queue-order wait.
    Mutants caught: the wait's cap dropped (8 s instead of 4 s for the 8 s wait), the slack's share back at half
    (4 s instead of 2 s for 8 s of slack)."""
    o = _overtaking(50.0)                           # a arrives faster than the lane serves: the window binds
    others = windows(("a", 0.0))
    assert o.delay("b", 1000.0, 20.0, 1, 1e9, 100.0, *others) == pytest.approx(10.0)  # the whole window (= half of 20)
    assert o.delay("b", 1000.0, 20.0, 1, 8.0, 100.0, *others) == pytest.approx(2.0)   # a quarter of the slack
    # an 8 s wait: W = 8 + min(W / 2, 10) -> 16, 8 s of overtaking predicted; half the wait is 4 s
    assert o.delay("b", 1000.0, 8.0, 1, 1e9, 100.0, *others) == pytest.approx(4.0)
    assert o.delay("b", 1000.0, 20.0, 1, -1.0, 100.0, *others) == 0.0  # already late: at risk at once


def test_a_tenant_with_nothing_waiting_opens_its_window_at_its_virtual_start():
    """a has no request waiting: its window opens at its virtual start (40), not at a last waiting tag. Mutant caught:
    the window opened at 0 for a tenant with nothing waiting (the 35-tag candidate then overtaken)."""
    o = _overtaking(0.5)
    starts = {"a": 40.0, "b": 50.0}
    assert o.delay("b", 1000.0, 20.0, 1, 1e9, 100.0, {"b": 70.0}, starts.__getitem__) == \
        pytest.approx(20.0 / 0.995 - 20.0, abs=2e-3)
    assert o.delay("b", 35.0, 20.0, 1, 1e9, 100.0, {"b": 70.0}, starts.__getitem__) == 0.0


def test_the_delay_walks_only_the_tenants_with_accepted_work():
    """Issue #20: 1 000 configured tenants, 2 of them sending: the delay reads the window of the one other tenant with
    accepted work, not of all 999 (a queued submit walked every configured tenant: 0.4-0.6 ms). Its value is the
    one tenant's term. Mutant caught: the walk over every configured tenant (999 virtual starts read)."""
    names = [f"t{i}" for i in range(1000)]
    o = Overtaking(dict.fromkeys(names, 1.0))
    o.accepted("t7", 30.0, 0.3, 100.0)     # 0.5 cost/s, 0.01 s of lane per cost unit
    o.accepted("t500", 1e6, 1e4, 100.0)    # the candidate's tenant: never its own overtaker
    read: list[str] = []

    def start(tenant: str) -> float:
        read.append(tenant)
        return 400.0

    delay = o.delay("t500", 1000.0, 20.0, 1, 1e9, 100.0, {}, start)
    assert read == ["t7"]
    assert delay == pytest.approx(20.0 / 0.995 - 20.0, abs=2e-3)


def test_the_terms_are_summed_in_configuration_order_whatever_the_order_of_first_acceptance():
    """The fixed point sums float terms: in the order of the configured tenants (as the walk over every configured
    tenant did), not of their first acceptance, so the estimate is the same to the last bit. Mutant caught: the
    tenants walked in order of first acceptance (the windows then read c, a, b)."""
    o = Overtaking(dict.fromkeys("abcd", 1.0))
    for name in ("c", "a", "b"):
        o.accepted(name, 30.0, 0.3, 100.0)
    read: list[str] = []

    def start(tenant: str) -> float:
        read.append(tenant)
        return 400.0

    o.delay("d", 1000.0, 20.0, 1, 1e9, 100.0, {}, start)
    assert read == ["a", "b", "c"]


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


def test_with_sixteen_lanes_the_backlogged_tenants_estimate_counts_the_other_tenants_later_arrivals():
    """B16 with 16 sequences: the queue's order binds as on one lane, and a's last waiting request is estimated
    later than the order alone says once b, tagged before it, keeps arriving (issue #13 session 11: calculet-b16
    steady 4x, the backlogged tenant's signed wait error -18 -> -3 %). Mutants caught: the term gated to one lane
    again (equal to the order's), the rates not kept with lanes (equal too), b's own estimate delayed."""
    h = build()
    p = planner(h)
    seen = _spy_order_estimates(p)
    for _ in range(24):
        h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000)
    for _ in range(3):
        h.submit(prompt=16, new=8, tenant="b", deadline_ms=600_000)
    last_a = h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000).request_id
    last_b = h.submit(prompt=16, new=8, tenant="b", deadline_ms=600_000).request_id
    assert h.state(last_a) == "waiting_admission" and seen[last_a] is not None and seen[last_b] is not None
    assert p.overtaking.lane_rate("b", h.clock.now()) > 0
    assert p.report.planned_finish(h.rec(last_a)) > seen[last_a] + 1e-6  # the planner's own: B16 reports the rollout
    assert p.report.planned_finish(h.rec(last_b)) == seen[last_b]


def test_where_the_decode_order_binds_no_rate_is_kept():
    """More sequences than one step decodes (B1 with 4 KV lanes): the estimate is the EDF plan's, not the queue
    order's, so the submit path keeps no rate for it (#20: no call per submit there). Mutant caught: the rates kept
    on every submit."""
    h = build(lanes=4, sizes=(1,))
    p = planner(h)
    for _ in range(8):
        h.submit(prompt=16, new=60, tenant="a", deadline_ms=600_000)
    assert p.overtaking.rate("a", h.clock.now()) == 0.0 and p.overtaking.lane_rate("a", h.clock.now()) == 0.0


def _spy_order_estimates(p: Any) -> dict[int, float | None]:
    """Each request's admission-order estimate, as the planner computed it before any overtaking term."""
    order = p._admission_order_estimate
    seen: dict[int, float | None] = {}

    def spy(rec, job, now, model, records, *cost):  # type: ignore[no-untyped-def]
        seen[rec.request_id] = value = order(rec, job, now, model, records, *cost)
        return value

    p._admission_order_estimate = spy
    return seen


def _reference_fixed_point(wait: float, terms: list[tuple[float, float]]) -> float:
    """``fixed_point_wait`` as the module stated it before #20: ``sum(min(a * w, b) ...)`` per iteration."""
    w = wait
    for _ in range(64):
        nxt = wait + sum(min(a * w, b) for a, b in terms)
        if nxt - w < 1e-3:
            return nxt
        w = nxt
    return w


@given(wait=st.floats(0.0, 1e4), terms=st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 1e4)), max_size=12))
def test_the_written_out_fixed_point_is_the_sum_of_minima_to_the_last_bit(wait: float,
                                                                          terms: list[tuple[float, float]]):
    """#20: the fixed point's sum written out (no generator, no ``min`` call per term) adds the same values in the same
    order: equal, not approximately. Mutants caught: the terms summed in reverse, ``max`` for ``min``."""
    assert fixed_point_wait(wait, terms) == _reference_fixed_point(wait, terms)


def test_a_heavier_tenants_window_holds_more_of_its_work():
    """§5.3: a tenant of weight 2 gets twice the cost per unit of virtual time, so its window below the candidate's tag
    holds twice the work: 1 000 tags at 0.01 s of lane per cost unit over 4 lanes is 2.5 s at weight 1, 5 s at
    weight 2 (the window binds: a arrives far faster than the lanes serve). The weight is the configured one the
    delay was built with. Mutant caught: the weight dropped from the window."""
    heavy = Overtaking({"a": 2.0, "b": 1.0})
    cost = 5000.0 * RATE_WINDOW_S
    heavy.accepted("a", cost, cost * 0.01, 100.0)
    assert heavy.delay("b", 1000.0, 20.0, 4, 1e9, 100.0, *windows(("a", 0.0))) == pytest.approx(5.0)
