"""AdmissionController (§5.1–5.2, §5.3 limits, §6 long-task quota): outcomes and every budget limit."""

from __future__ import annotations

import pytest

from calculet.config import CapacityBudget
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.admission import Decision, ModelAvailability
from calculet.runtime.scheduling.prefill import PrefillWork
from tests.unit.runtime.runtime_support import Harness, profile_set


def decisions(subs):
    return [s.outcome.decision for s in subs]


@pytest.mark.req("R5.1.1")
def test_capacity_budget_has_the_spec_fields():
    assert [f for f in CapacityBudget.__dataclass_fields__] == [
        "max_sequences", "max_kv_tokens", "max_waiting_requests", "max_waiting_prompt_tokens", "max_inflight_jobs"]
    h = Harness.build(sizes=(1,), lanes=4, kv_tokens=5000)
    assert h.scheduler.admission.budget == CapacityBudget(4, 5000, 128, 262_144, 1)


@pytest.mark.req("R5.2.1")
def test_admit_enters_the_prefill_queue():
    h = Harness.build(sizes=(1,), lanes=4)
    sub = h.submit(prompt=600, new=10)
    assert sub.outcome.decision is Decision.ADMIT and sub.outcome.http_status is None
    assert h.state(sub.request_id) == "prefill_ready"
    assert h.scheduler.prefill.nonempty() == {"medium"}


@pytest.mark.req("R5.1.2", "R5.2.2")
def test_max_sequences_queues_then_admits_when_a_sequence_ends():
    h = Harness.build(sizes=(1,), lanes=8, admission={"max_sequences": 2})
    subs = [h.submit(prompt=8, new=2) for _ in range(3)]
    assert decisions(subs) == [Decision.ADMIT, Decision.ADMIT, Decision.QUEUE]
    assert h.state(subs[2].request_id) == "waiting_admission"
    assert h.scheduler.admission.active == 2
    assert h.scheduler.admission.statistics().blocked["max_sequences"] >= 1
    h.drive()
    assert all(h.sinks[s.request_id].outcome.state == "completed" for s in subs)
    assert h.scheduler.idle()


@pytest.mark.req("R5.1.2", "R5.1.3")
def test_kv_token_budget_is_tracked_by_the_service_not_the_runtime_hint():
    # the KV pool has free lanes (canAllocate would say yes), but the token budget is full
    h = Harness.build(sizes=(1,), lanes=8, kv_tokens=100)
    a = h.submit(prompt=40, new=20)
    b = h.submit(prompt=30, new=20)
    assert decisions([a, b]) == [Decision.ADMIT, Decision.QUEUE]
    assert h.kv.free_lanes == 7
    stats = h.scheduler.admission.statistics()
    assert stats.active_kv_tokens == 60 and stats.waiting_requests == 1
    assert set(stats.blocked) == {"max_kv_tokens"}
    h.drive()
    assert h.sinks[b.request_id].outcome.state == "completed"


@pytest.mark.req("R5.1.2")
def test_a_free_kv_lane_is_needed_too():
    h = Harness.build(sizes=(1,), lanes=1, admission={"max_sequences": 4})
    a, b = h.submit(prompt=8, new=2), h.submit(prompt=8, new=2)
    assert decisions([a, b]) == [Decision.ADMIT, Decision.QUEUE]
    assert h.scheduler.admission.statistics().blocked == {"kv_lane": 1}   # §16 KV lane wait
    h.drive()
    assert h.sinks[b.request_id].outcome.state == "completed"


@pytest.mark.req("R5.1.2", "R5.2.4", "R15.3")
def test_max_waiting_requests_rejects_with_429():
    h = Harness.build(sizes=(1,), lanes=1)
    subs = [h.submit(prompt=8, new=2) for _ in range(1 + 128 + 1)]
    assert subs[0].outcome.decision is Decision.ADMIT
    assert decisions(subs[1:129]) == [Decision.QUEUE] * 128
    assert subs[129].outcome.decision is Decision.REJECT_CAPACITY and subs[129].outcome.http_status == 429
    outcome = h.sinks[subs[129].request_id].outcome
    assert outcome.state == "failed" and outcome.finish_reason is FinishReason.REJECTED and outcome.http_status == 429


@pytest.mark.req("R5.1.2", "R5.2.4", "R15.4")
def test_max_waiting_prompt_tokens_rejects_with_429():
    h = Harness.build(sizes=(1,), lanes=1, max_seq=131_072)
    h.submit(prompt=8, new=2)
    assert h.submit(prompt=100_000, new=2).outcome.decision is Decision.QUEUE
    assert h.submit(prompt=100_000, new=2).outcome.decision is Decision.QUEUE
    sub = h.submit(prompt=62_145, new=2)
    assert sub.outcome.decision is Decision.REJECT_CAPACITY and "262144" in sub.outcome.reason
    assert h.submit(prompt=62_144, new=2).outcome.decision is Decision.QUEUE


@pytest.mark.req("R5.1.2", "R1.2", "R15.14")
def test_max_inflight_jobs_bounds_planned_jobs():
    h = Harness.build(sizes=(1,), lanes=4)
    for _ in range(3):
        h.submit(prompt=8, new=2)
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)
    second = h.step()
    assert second.work is None and second.reason == "no in-flight slot"
    h.complete(plan.work)
    assert h.step().work is not None


@pytest.mark.req("R5.2.3", "R5.1.4")
@pytest.mark.parametrize("prompt,new,why", [(1025, 1, "exceeds the context"), (1000, 25, "exceeds the context"),
                                            (1024, 1, "exceeds the context")])
def test_context_overflow_is_rejected_with_400(prompt, new, why):
    h = Harness.build(sizes=(1,), lanes=2, max_seq=1024)
    sub = h.submit(prompt=prompt, new=new)
    assert sub.outcome.decision is Decision.REJECT_INVALID and sub.outcome.http_status == 400
    assert why in sub.outcome.reason
    assert h.sinks[sub.request_id].outcome.http_status == 400
    assert h.submit(prompt=1000, new=24).outcome.decision is Decision.ADMIT


@pytest.mark.req("R5.1.4")
def test_a_kv_need_beyond_the_whole_budget_is_rejected_not_queued_forever():
    h = Harness.build(sizes=(1,), lanes=2, kv_tokens=500)
    sub = h.submit(prompt=450, new=51)
    assert sub.outcome.decision is Decision.REJECT_INVALID and "KV budget" in sub.outcome.reason


def test_bad_token_counts_and_unknown_tenants_are_rejected_with_400():
    h = Harness.build(sizes=(1,), lanes=2)
    sub = h.submit(prompt=0, new=2)
    assert sub.request_id == 0 and sub.outcome.http_status == 400
    assert h.sinks[0].outcome.http_status == 400
    assert h.submit(prompt=4, new=2, tenant="nobody").outcome.decision is Decision.REJECT_INVALID
    assert h.submit(prompt=4, new=2, deadline_ms=0).outcome.decision is Decision.REJECT_INVALID


@pytest.mark.req("R5.2.5", "R12.2")
@pytest.mark.parametrize("availability", [ModelAvailability.DRAINING, ModelAvailability.RECOVERING,
                                          ModelAvailability.FAILED])
def test_unavailable_model_rejects_with_503(availability):
    h = Harness.build(sizes=(1,), lanes=2)
    h.scheduler.set_model(1, availability)
    sub = h.submit(prompt=8, new=2)
    assert sub.outcome.decision is Decision.REJECT_UNAVAILABLE and sub.outcome.http_status == 503
    assert h.sinks[sub.request_id].outcome.http_status == 503


def test_a_loading_model_queues_requests_until_ready():
    h = Harness.build(sizes=(1,), lanes=2, ready=False)
    sub = h.submit(prompt=8, new=2)
    assert sub.outcome.decision is Decision.QUEUE and h.state(sub.request_id) == "waiting_model"
    too_big = h.submit(prompt=8000, new=100)
    assert too_big.outcome.decision is Decision.QUEUE
    h.scheduler.set_model(1, ModelAvailability.READY, profile_set((1,), max_seq=4096))
    assert h.state(sub.request_id) == "prefill_ready"
    assert h.sinks[too_big.request_id].outcome.http_status == 400  # the generation's context is smaller
    h.drive()
    assert h.sinks[sub.request_id].outcome.state == "completed"


@pytest.mark.req("R5.2.2", "R15.5", "R4.5")
def test_queued_request_past_its_deadline_fails_and_frees_its_budget():
    h = Harness.build(sizes=(1,), lanes=1)
    first = h.submit(prompt=8, new=2)
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)          # on the device: the only slot and lane
    queued = h.submit(prompt=8, new=2)
    explicit = h.submit(prompt=8, new=2, deadline_ms=1000)
    assert h.scheduler.admission.waiting == 2
    h.clock.advance(1.0)
    assert h.step().work is None
    assert h.sinks[explicit.request_id].outcome.finish_reason is FinishReason.DEADLINE
    assert h.sinks[explicit.request_id].outcome.http_status == 504
    h.clock.set(119.999)
    h.step()
    assert h.state(queued.request_id) == "waiting_admission"
    h.clock.set(120.0)          # admission.deadline_default_ms = 120000
    h.step()
    assert h.state(queued.request_id) == "failed"
    assert h.state(first.request_id) == "prefill_running"   # running: only flagged, the job drains
    h.complete(plan.work)
    assert h.sinks[first.request_id].outcome.finish_reason is FinishReason.DEADLINE
    assert h.sinks[first.request_id].tokens == []
    stats = h.scheduler.admission.statistics()
    assert stats.waiting_requests == 0 and stats.waiting_prompt_tokens == 0 and stats.timeouts == 2
    h.confirm_all()
    assert h.scheduler.idle()


@pytest.mark.req("R5.3.6")
def test_tenant_active_sequence_limit_throttles_only_that_tenant():
    tenants = [{"name": "a", "max_active_sequences": 1, "api_key_sha256": "a" * 64}, {"name": "b"}]
    h = Harness.build(sizes=(1,), lanes=8, tenants=tenants)
    a1, a2 = h.submit(prompt=8, new=2, tenant="a"), h.submit(prompt=8, new=2, tenant="a")
    b1, b2 = h.submit(prompt=8, new=2, tenant="b"), h.submit(prompt=8, new=2, tenant="b")
    assert decisions([a1, a2, b1, b2]) == [Decision.ADMIT, Decision.QUEUE, Decision.ADMIT, Decision.ADMIT]
    h.drive()
    assert all(h.sinks[s.request_id].outcome.state == "completed" for s in (a1, a2, b1, b2))


@pytest.mark.req("R5.3.6")
def test_tenant_waiting_token_limit_rejects_with_429():
    tenants = [{"name": "a", "max_waiting_tokens": 100, "api_key_sha256": "a" * 64}, {"name": "b"}]
    h = Harness.build(sizes=(1,), lanes=1, tenants=tenants)
    h.submit(prompt=8, new=2, tenant="b")                       # takes the only lane
    assert h.submit(prompt=60, new=2, tenant="a").outcome.decision is Decision.QUEUE
    sub = h.submit(prompt=41, new=2, tenant="a")
    assert sub.outcome.decision is Decision.REJECT_CAPACITY
    assert h.submit(prompt=40, new=2, tenant="a").outcome.decision is Decision.QUEUE
    assert h.submit(prompt=500, new=2, tenant="b").outcome.decision is Decision.QUEUE


@pytest.mark.req("R5.3.6", "R17.1.7")
def test_tenant_qps_token_bucket_on_the_fake_clock():
    tenants = [{"name": "a", "qps": 10.0, "api_key_sha256": "a" * 64}, {"name": "b"}]
    h = Harness.build(sizes=(1,), lanes=64, admission={"max_sequences": 64}, tenants=tenants)
    burst = [h.submit(prompt=8, new=2, tenant="a") for _ in range(11)]
    assert sum(s.outcome.decision is Decision.REJECT_CAPACITY for s in burst) == 1  # burst = 10
    assert h.submit(prompt=8, new=2, tenant="b").outcome.decision is Decision.ADMIT
    h.clock.advance(0.099)
    assert h.submit(prompt=8, new=2, tenant="a").outcome.decision is Decision.REJECT_CAPACITY
    h.clock.advance(0.001)
    assert h.submit(prompt=8, new=2, tenant="a").outcome.decision is Decision.ADMIT
    assert h.scheduler.admission.statistics().tenants["a"].rejected_qps == 2


@pytest.mark.req("R6.11")
def test_long_prefill_quota_bounds_admitted_and_waiting_long_prefills():
    h = Harness.build(sizes=(1,), lanes=16, admission={"long_prefill_quota": {"max_admitted": 1, "max_waiting": 2}})
    longs = [h.submit(prompt=5000, new=2) for _ in range(4)]
    assert decisions(longs) == [Decision.ADMIT, Decision.QUEUE, Decision.QUEUE, Decision.REJECT_CAPACITY]
    short = h.submit(prompt=100, new=2)
    assert short.outcome.decision is Decision.ADMIT  # a parked long flow does not block others
    peak = 0
    for _ in range(200):
        stats = h.scheduler.admission.statistics()
        assert stats.long_admitted <= 1 and stats.long_waiting <= 2
        peak = max(peak, stats.long_admitted)
        plan = h.step()
        if plan.work is None:
            break
        h.run(plan)
        h.confirm_all()
    assert peak == 1
    assert all(h.sinks[s.request_id].outcome.state == "completed" for s in longs[:3])


def test_admission_statistics_count_outcomes():
    h = Harness.build(sizes=(1,), lanes=1)
    h.submit(prompt=8, new=2)
    h.submit(prompt=8, new=2)
    h.submit(prompt=9000, new=2)
    outcomes = h.scheduler.admission.statistics().outcomes
    assert outcomes == {"admit": 1, "queue": 1, "reject_invalid": 1}


def test_prefill_class_of_the_admitted_request_is_its_whole_prompt():
    h = Harness.build(sizes=(1,), lanes=2)
    sub = h.submit(prompt=4097, new=2)
    plan = h.step()
    assert isinstance(plan.work, PrefillWork) and plan.work.queue == "long" and plan.work.tokens == 4097
