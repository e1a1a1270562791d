"""A new request admitted at once (issue #20) is admitted exactly as the fair queue would have admitted it.

``Scheduler._admit_now`` skips the fair queue's push, peek and pop for a request that arrives when
nothing else waits and the budget has room (``AdmissionController.admissible_at_once``), and admits it by
one request event (``admit_now``) without taking and giving back waiting budget. These tests
drive the same operations through a scheduler that takes that path and one forced through the queue,
and require the same decisions, states, virtual finishes, lanes, prefill order and statistics after
every operation — including the cases the shortcut must refuse (a tenant at its active limit, the
long-prefill quota, no free lane, the sequence and KV-token budgets, a request already waiting).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.admission import AdmissionController, Decision
from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness

TENANTS = [{"name": "a", "max_active_sequences": 2, "api_key_sha256": "a" * 64},
           {"name": "b", "weight": 3, "api_key_sha256": "b" * 64}, {"name": "default"}]


def _harness(lanes: int) -> Harness:
    return Harness.build(sizes=(1,), lanes=lanes, kv_tokens=200, tenants=TENANTS,
                         admission={"max_sequences": lanes, "max_waiting_requests": 64,
                                    "long_prefill_quota": {"max_admitted": 1, "max_waiting": 8}},
                         queues={"short_prefill_max_tokens": 16, "medium_prefill_max_tokens": 32})


def _queued_only(monkeypatch: pytest.MonkeyPatch, h: Harness) -> None:
    """This harness's controller never admits at once: every new request goes through the fair queue."""
    monkeypatch.setattr(h.scheduler.admission, "admissible_at_once", lambda rec, free_lanes: False)


def _view(h: Harness) -> Any:
    """Everything an admission decides, as plain values (requests by id)."""
    s = h.scheduler
    recs = sorted(s.registry.live(), key=lambda r: r.request_id)
    stats = s.admission.statistics()
    return ([(r.request_id, r.state, r.virtual_finish, None if r.lease is None else r.lease.lane,
              None if r.lease is None else r.lease.seq_id, r.prefill_class) for r in recs],
            stats.waiting_requests, stats.active_sequences, stats.active_kv_tokens, stats.outcomes,
            stats.blocked, stats.parked_flows, s.admission.wfq.service(), s.admission.wfq.global_tag(),
            s.kv.budget_totals(), s.prefill.statistics())


OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "step", "cancel", "confirm"]),
                         st.sampled_from(["a", "b", "default"]), st.sampled_from([4, 16, 24, 40]),
                         st.sampled_from([1, 2, 8, 60]), st.integers(0, 50)), max_size=40)


@pytest.mark.req("R5.1.2", "R5.3.3")
@settings(max_examples=60)
@given(ops=OPS, lanes=st.sampled_from([1, 2, 4]))
def test_admitting_at_once_decides_as_the_fair_queue_does(ops: list[tuple[str, str, int, int, int]], lanes: int):
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, queued = _harness(lanes), _harness(lanes)
        _queued_only(monkeypatch, queued)
        for op, tenant, prompt, new, pick in ops:
            assert fast.play(op, tenant, prompt, new, pick) == queued.play(op, tenant, prompt, new, pick)
            assert _view(fast) == _view(queued)


def test_a_request_into_an_empty_queue_with_room_is_admitted_without_the_queue():
    h = _harness(2)
    pushes = []
    queue = h.scheduler.admission._queue
    original = queue.push
    queue.push = lambda flow, item: pushes.append(flow) or original(flow, item)  # type: ignore[method-assign]
    first = h.submit(8, 4, "b")
    assert first.outcome.decision is Decision.ADMIT and pushes == []
    assert h.rec(first.request_id).virtual_finish == h.scheduler.admission.wfq.global_tag()  # its tag, served
    h.submit(8, 4, "b")
    third = h.submit(8, 4, "b")  # no lane left: queued, through the fair queue
    assert third.outcome.decision is Decision.QUEUE and len(pushes) == 1
    assert h.scheduler.admission.statistics().blocked == {"kv_lane": 1}


def test_the_shortcut_refuses_whenever_something_waits_or_a_limit_holds():
    h = _harness(4)
    admission: AdmissionController = h.scheduler.admission
    h.submit(8, 4, "a")
    h.submit(8, 4, "a")
    parked = h.submit(8, 4, "a")  # tenant a at its active limit: queued (and parked), not admitted at once
    assert parked.outcome.decision is Decision.QUEUE and admission.statistics().parked_flows == 1
    rec = h.rec(parked.request_id)
    assert not admission.admissible_at_once(rec, h.kv.free_lanes)  # it waits itself: the queue is not empty
    other = h.submit(8, 4, "b")  # a parked request still counts as waiting: b goes through the queue, admitted
    assert other.outcome.decision is Decision.ADMIT
    long_one = h.submit(40, 4, "default")  # through the queue too (a waits), admitted: the last lane
    assert long_one.outcome.decision is Decision.ADMIT and h.kv.free_lanes == 0
    h.scheduler.cancel(parked.request_id)  # nothing waits now; no lane is free
    h.scheduler.cancel(other.request_id)  # a lane frees once its release is confirmed
    h.confirm_all()
    late = h.submit(40, 4, "default")  # the long-prefill quota (1 admitted) holds it: queued, parked
    assert late.outcome.decision is Decision.QUEUE and h.kv.free_lanes == 1  # a lane is free, the quota is not


def test_decode_batches_follow_the_same_admissions(monkeypatch: pytest.MonkeyPatch):
    fast, queued = _harness(4), _harness(4)
    _queued_only(monkeypatch, queued)
    for h in (fast, queued):
        for i in range(6):
            h.submit(8 + i, 3, ["a", "b", "default"][i % 3])
        h.prefill_all()
    assert _view(fast) == _view(queued)
    for _ in range(5):
        batches = []
        for h in (fast, queued):
            plan = h.step()
            batches.append([lane.request_id for lane in plan.work.active] if isinstance(plan.work, DecodeBatch)
                           else None)
            if plan.work is not None:
                h.run(plan)
            h.confirm_all()
        assert batches[0] == batches[1]
        assert _view(fast) == _view(queued)


@pytest.mark.req("R5.1.2", "R10.3")
def test_an_admission_at_once_is_one_event_and_never_holds_waiting_budget(monkeypatch: pytest.MonkeyPatch):
    """Mutants caught: bind then admit fired (two moves seen), the waiting budget taken on the way (accept)."""
    h = _harness(2)
    admission = h.scheduler.admission
    moves: list[tuple[str, str]] = []
    listener = h.scheduler.registry._listener
    monkeypatch.setattr(h.scheduler.registry, "_listener",
                        lambda rec, source, target: moves.append((source, target)) or listener(rec, source, target))
    monkeypatch.setattr(admission, "accept", lambda rec: pytest.fail("an admission at once took waiting budget"))
    first = h.submit(8, 4, "b")
    rec = h.rec(first.request_id)
    assert first.outcome.decision is Decision.ADMIT and moves == [("new", "prefill_ready")]
    assert rec.machine.last_transition.name == "admit_now@new" and rec.generation == h.scheduler.generation
    stats = admission.statistics()
    assert (stats.waiting_requests, stats.waiting_prompt_tokens, stats.active_sequences, stats.active_kv_tokens) == \
        (0, 0, 1, 12)
