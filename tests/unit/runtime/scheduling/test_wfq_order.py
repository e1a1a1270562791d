"""The §5.3 admission order replayed from a snapshot (issue #13): the queue's own order, exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculet.runtime.scheduling.fairness import FairQueue, WeightedFairClock
from calculet.runtime.scheduling.wfq_order import QueuedRequest, admission_ranks

WEIGHTS = {"a": Fraction(1), "b": Fraction(2), "c": Fraction(1, 2)}
"""Binary fractions: a float cost / weight is exact, so the replay's ties are the queue's ties."""

ops = st.lists(st.one_of(st.tuples(st.just("push"), st.sampled_from(sorted(WEIGHTS)), st.booleans(),
                                   st.integers(1, 400)),
                         st.tuples(st.just("pop"), st.just(""), st.just(False), st.just(0))),
               min_size=1, max_size=40)


def _snapshot(clock: WeightedFairClock, entries: dict[int, tuple[list, tuple[str, bool], int]]) -> list[QueuedRequest]:
    """The live entries as the planner sees them: flow, age, cost per weight, a head's fixed tag."""
    out = []
    for rid, (entry, flow, cost) in entries.items():
        if entry[2] is None:
            continue
        tag = None if entry[0] is None else float(clock.to_fraction(entry[0]))
        out.append(QueuedRequest(rid, flow, entry[1], float(Fraction(cost) / WEIGHTS[flow[0]]), tag))
    return out


@pytest.mark.req("R5.3.2", "R5.3.3")
@given(ops, ops)
def test_the_ranks_are_the_order_the_fair_queue_pops_in(before: list, after: list) -> None:
    """Serve and queue at random (heads get tagged and keep their tags while others are served), then the
    replay of a snapshot ranks every waiting request exactly where the real queue pops it."""
    clock = WeightedFairClock(WEIGHTS, decode_weight=8)
    queue: FairQueue[int] = FairQueue(lambda flow, rid: clock.tag(flow[0], costs[rid]))
    costs: dict[int, int] = {}
    entries: dict[int, tuple[list, tuple[str, bool], int]] = {}

    def serve() -> int | None:
        head = queue.peek()
        if head is None:
            return None
        flow, tag, rid = head
        queue.pop()
        clock.served(flow[0], tag, costs[rid])
        return rid

    for op, tenant, long, cost in [*before, *after]:
        if op == "push":
            rid = len(costs)
            costs[rid] = cost
            entries[rid] = (queue.push((tenant, long), rid), (tenant, long), cost)
        else:
            serve()
    ranks = admission_ranks(_snapshot(clock, entries), float(clock.global_virtual_time()))
    popped = []
    while (rid := serve()) is not None:
        popped.append(rid)
    assert sorted(ranks, key=ranks.__getitem__) == popped


@pytest.mark.req("R5.3.3")
def test_a_head_keeps_the_tag_it_got_while_global_virtual_time_was_lower() -> None:
    """Issue #13's case: the other tenant's head, tagged long ago, goes before a newcomer of lower cost whose
    tag starts from today's global virtual time; re-tagging everyone from today would put the newcomer first."""
    old_head = QueuedRequest(1, ("b", False), 1, cost=2115.0, tag=36857.0)
    behind = QueuedRequest(2, ("b", False), 2, cost=1403.0)
    newcomer = QueuedRequest(3, ("a", False), 9, cost=1328.0)
    assert admission_ranks([old_head, behind, newcomer], 36157.0) == {1: 0, 3: 1, 2: 2}
    retagged = QueuedRequest(1, ("b", False), 1, cost=2115.0)
    assert admission_ranks([retagged, behind, newcomer], 36157.0)[3] == 0


def test_a_tenants_long_flow_is_its_own_fifo() -> None:
    """A tenant's short and long prompts are two flows: a later short one may go before an earlier long one."""
    long_first = QueuedRequest(1, ("a", True), 1, cost=900.0)
    short_later = QueuedRequest(2, ("a", False), 2, cost=100.0)
    assert admission_ranks([long_first, short_later], 0.0) == {2: 0, 1: 1}
    same_flow = QueuedRequest(2, ("a", True), 2, cost=100.0)
    assert admission_ranks([long_first, same_flow], 0.0) == {1: 0, 2: 1}
