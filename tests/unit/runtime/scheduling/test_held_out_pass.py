"""A blocked admission pass answered again without one decides and counts as the pass would (issue #20).

``AdmissionController.next_admissible`` ends on the head of the §5.3 queue when a budget holds it out (a KV
lane, §5.1's sequences or KV tokens). Every queued ``submit()`` is followed by a pass; while the queue's head
(``FairQueue.version``), the free lanes and the counters the checks read stay as they were, that pass would end
the same way, and is answered from the last one (counted as blocked by the same budget). These tests drive the
same operations through a scheduler that answers so and one whose queue never lets it (its version moves at every
read), and require the same decisions, states, tags, lanes and statistics after every operation: new flows
whose head goes first, parked flows (a tenant's active limit, the long-prefill quota), cancels, ends, releases.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.admission import Decision
from calculet.runtime.scheduling.fairness import FairQueue
from tests.unit.runtime.runtime_support import Harness

TENANTS = [{"name": "a", "max_active_sequences": 2, "api_key_sha256": "a" * 64},
           {"name": "b", "weight": 3, "api_key_sha256": "b" * 64}, {"name": "default"}]


def _harness(lanes: int, sequences: int) -> Harness:
    return Harness.build(sizes=(1,), lanes=lanes, kv_tokens=200, tenants=TENANTS,
                         admission={"max_sequences": sequences, "max_waiting_requests": 64,
                                    "long_prefill_quota": {"max_admitted": 1, "max_waiting": 8}},
                         queues={"short_prefill_max_tokens": 16, "medium_prefill_max_tokens": 32})


class _Unsettled(FairQueue[Any]):
    """A fair queue whose version moves at every read: no pass is ever answered from the last one."""

    _ticks = itertools.count()
    version = property(lambda self: next(self._ticks), lambda self, value: None)  # type: ignore[assignment]


def _always_passes(h: Harness) -> None:
    h.scheduler.admission._queue.__class__ = _Unsettled


def _view(h: Harness) -> Any:
    """Everything an admission decides, as plain values (requests by id)."""
    s = h.scheduler
    recs = sorted(s.registry.live(), key=lambda r: r.request_id)
    stats = s.admission.statistics()
    return ([(r.request_id, r.state, r.virtual_finish, None if r.lease is None else r.lease.lane)
             for r in recs], stats.waiting_requests, stats.active_sequences, stats.active_kv_tokens,
            stats.outcomes, stats.blocked, stats.parked_flows, s.admission.wfq.service(),
            s.admission.wfq.global_tag(), s.kv.budget_totals())


OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "submit", "step", "cancel", "confirm"]),
                         st.sampled_from(["a", "b", "default"]), st.sampled_from([4, 16, 24, 40, 120]),
                         st.sampled_from([1, 2, 8, 60]), st.integers(0, 50)), max_size=50)


@pytest.mark.req("R5.3.4", "R5.3.6")
@settings(max_examples=80)
@given(ops=OPS, shape=st.sampled_from([(1, 1), (2, 4), (4, 2), (4, 4)]))
def test_a_pass_answered_from_the_last_one_decides_and_counts_as_a_pass(
        ops: list[tuple[str, str, int, int, int]], shape: tuple[int, int]):
    """Mutants caught: the version not moved by a push that makes a flow contend (a newcomer tagged ahead of the
    blocked head, which fits, is not admitted), nor by a discard (a cancelled head keeps blocking), the answer kept
    across a release (the budget freed, nobody admitted), the answered pass not counted as blocked."""
    lanes, sequences = shape
    kept, passes = _harness(lanes, sequences), _harness(lanes, sequences)
    _always_passes(passes)
    for op, tenant, prompt, new, pick in ops:
        results = [h.play(op, tenant, prompt, new, pick) for h in (kept, passes)]
        if op == "submit":
            results = [(sub.request_id, sub.outcome) for sub in results]
        assert results[0] == results[1]
        assert _view(kept) == _view(passes)


def test_a_queued_submit_behind_a_blocked_head_of_its_own_flow_makes_no_pass():
    """One lane, busy: b's requests queue behind b's head, held out by the lane. Each further submit of b leaves the
    queue's head as it was, so its pass is the last one's answer (no peek), counted as blocked all the same; a
    newcomer of another flow may go first and is looked at. Mutant caught: the answer dropped (a peek per submit)."""
    h = _harness(1, 1)
    first = h.submit(8, 4, "b")
    assert first.outcome.decision is Decision.ADMIT
    queue = h.scheduler.admission._queue
    peeks = []
    original = queue.peek
    queue.peek = lambda: peeks.append(1) or original()  # type: ignore[method-assign]
    assert h.submit(8, 4, "b").outcome.decision is Decision.QUEUE
    looked = len(peeks)
    assert looked >= 1  # b's flow started contending: its head is looked at
    for _ in range(5):
        assert h.submit(8, 4, "b").outcome.decision is Decision.QUEUE
    assert len(peeks) == looked
    assert h.scheduler.admission.statistics().blocked == {"kv_lane": 6}
    h.submit(8, 4, "default")  # a new flow: its head may go first, so the pass is made
    assert len(peeks) > looked
