"""TenantQueue pops in the key order a heap would, whatever the arrival order (issue #20, R7.2.3)."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, strategies as st

from calculet.runtime.scheduling.ready_queue import TenantQueue

ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.sampled_from([0.0, 5.0, float("inf")]), st.integers(0, 6), st.integers(0, 3)),
    st.tuples(st.just("pop"), st.just(0.0), st.just(0), st.just(0)),
    st.tuples(st.just("kill"), st.just(0.0), st.integers(0, 50), st.just(0))), max_size=80)


@pytest.mark.req("R7.2.3")
@given(ops)
def test_the_queue_pops_exactly_what_a_heap_with_lazy_removal_pops(script: list[tuple[str, float, int, int]]) -> None:
    queue, heap, live = TenantQueue(), [], []
    seq = 0
    for op, priority, tag, finish in script:
        if op == "push":
            seq += 1
            entry = [priority, tag, finish, seq, object()]
            queue.push(entry)
            heapq.heappush(heap, entry)
            live.append(entry)
        elif op == "kill" and live:
            live[tag % len(live)][4] = None  # a discard: the entry is marked dead in both
        else:
            while heap and heap[0][4] is None:
                heapq.heappop(heap)
            head = queue.head()
            assert head is (heap[0] if heap else None)
            if head is not None:
                queue.take(head)
                heapq.heappop(heap)
                head[4] = None
    assert sorted(e[3] for e in queue if e[4] is not None) == sorted(e[3] for e in heap if e[4] is not None)


def test_entries_arriving_in_key_order_stay_in_the_fifo_part() -> None:
    queue = TenantQueue()
    for seq, tag in enumerate([0, 0, 3, 3, 7]):
        queue.push([float("inf"), tag, 0, seq, object()])
    queue.push([float("inf"), 1, 0, 9, object()])  # behind the last: kept in the heap part
    assert len(queue.fifo) == 5 and len(queue.heap) == 1 and len(queue) == 6
    order = []
    while (head := queue.head()) is not None:
        queue.take(head)
        order.append(head[3])
    assert order == [0, 1, 9, 2, 3, 4]


def test_an_entry_below_the_first_goes_to_the_fifo_front() -> None:
    """The sequence served by deadline comes back with the same deadline, below every other: the FIFO's front, not
    the heap (issue #20: a push, a ``head`` call and a pop per B1 step under on_time's deadline order)."""
    queue = TenantQueue()
    for seq, deadline in enumerate([5.0, 6.0, 7.0]):
        queue.push([deadline, 0, 0, seq, object()])
    served = queue.head()
    assert served is not None and served[0] == 5.0
    queue.take(served)
    queue.push([5.0, 1, 0, 9, object()])  # it comes back, its tag moved on
    assert not queue.heap and [e[3] for e in queue.fifo] == [9, 1, 2]
    assert queue.head() is queue.fifo[0]
