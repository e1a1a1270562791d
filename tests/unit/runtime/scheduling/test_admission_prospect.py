"""§5.2 "Queue: there is a prospect of obtaining resources before the deadline" and the measured step time."""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.estimates import StepTimer
from tests.unit.runtime.runtime_support import Harness


def _backlogged(queue_needs_prospect: bool = True) -> Harness:
    """One lane, 40 one-token requests queued, 20 served at one every 0.5 s: a measured backlog."""
    h = Harness.build(sizes=(1,), lanes=1, batch={"deadline_order": "at_risk"},  # the backlog rule (not on_time)
                      admission={"max_sequences": 1, "max_waiting_requests": 1000,
                                 "queue_needs_prospect": queue_needs_prospect})
    for _ in range(40):
        h.submit(prompt=20, new=1)
    for _ in range(20):
        plan = h.step()
        h.scheduler.submitted(plan.work.job_id)
        h.clock.advance(0.5)
        h.complete(plan.work)
        h.confirm_all()
    return h


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_a_request_without_a_prospect_before_its_deadline_is_refused_at_once():
    h = _backlogged()
    admission = h.scheduler.admission
    wait = admission.estimated_wait("default", h.clock.now())
    # 21 admitted, 19 of cost 28 wait ahead; virtual time advanced 28 per 0.5 s: 19 * 0.5 s
    assert wait == pytest.approx(9.5)
    hopeless = h.submit(prompt=20, new=1, deadline_ms=5_000)
    assert hopeless.outcome.http_status == 429
    assert "no prospect of service before the deadline" in hopeless.outcome.reason
    assert h.sinks[hopeless.request_id].outcome.http_status == 429
    # retry when the estimate would fit: 9.5 s wait + 0 s decode - 5 s left
    assert hopeless.outcome.retry_after_s == pytest.approx(4.5)
    hopeful = h.submit(prompt=20, new=1, deadline_ms=60_000)
    assert hopeful.outcome.decision.value == "queue"
    stats = admission.statistics()
    assert stats.no_prospect == 1 and stats.waiting_requests == 20


@pytest.mark.req("R5.2.2")
def test_an_open_ended_request_needs_only_the_prospect_of_starting():
    """A request that could not finish by its deadline anyway (max_new_tokens the rest of the context)
    may stop early: it is queued when it can start in time, refused only when it cannot."""
    h = _backlogged()
    h.scheduler.step_times.observe(0.1)                   # 0.1 s per decode step
    # 5 000 tokens x 0.1 s = 500 s > any deadline here; the estimated wait is 9.5 s
    assert h.submit(prompt=20, new=5_000, deadline_ms=60_000).outcome.decision.value == "queue"
    late = h.submit(prompt=20, new=5_000, deadline_ms=5_000)
    assert late.outcome.http_status == 429
    # a bounded request whose decode does not fit after the wait is refused
    assert h.submit(prompt=20, new=400, deadline_ms=45_000).outcome.http_status == 429


@pytest.mark.req("R5.2.2")
def test_prospect_check_can_be_switched_off_and_needs_a_backlog():
    h = _backlogged(queue_needs_prospect=False)
    assert h.submit(prompt=20, new=1, deadline_ms=5_000).outcome.decision.value == "queue"
    fresh = Harness.build(sizes=(1,), lanes=1, admission={"max_sequences": 1})
    # nothing measured yet: no estimate, so nothing is refused for want of one
    assert fresh.scheduler.admission.estimated_wait("default", 0.0) is None
    fresh.submit(prompt=20, new=1)
    assert fresh.submit(prompt=20, new=1, deadline_ms=1).outcome.decision.value == "queue"


def test_decode_step_time_is_measured_from_submission_to_completion():
    h = Harness.build(sizes=(1,), lanes=1)
    h.submit(prompt=20, new=3)
    plan = h.step()
    h.run(plan)                                    # the prefill: not a decode step
    assert h.scheduler.step_times.statistics().samples == 0
    plan = h.step()
    h.scheduler.submitted(plan.work.job_id)
    h.clock.advance(0.04)
    h.complete(plan.work)
    stats = h.scheduler.statistics().step_times
    assert stats.samples == 1 and stats.decode_step_s == pytest.approx(0.04)
    assert h.scheduler.decode.step_estimate_s == pytest.approx(0.04)


def test_step_timer_smooths_and_refuses_bad_parameters():
    timer = StepTimer(prior_s=0.1)
    assert timer.decode_step_s == 0.1
    assert timer.observe(0.08) == pytest.approx(0.08)          # the first sample replaces the prior
    assert timer.observe(0.16) == pytest.approx(0.09)          # then 1/8 of each new error
    assert timer.observe(-1.0) == pytest.approx(0.09)          # a clock step backwards is ignored
    with pytest.raises(ValueError):
        StepTimer(prior_s=-1)
    with pytest.raises(ValueError):
        StepTimer(smoothing=0)


@pytest.mark.req("R5.2.4")
def test_the_429_of_no_prospect_carries_the_estimate_as_retry_after():
    from calculet.server.errors import RETRY_AFTER_S, admission_error

    assert admission_error(429, "no prospect", retry_after_s=4.5).headers["Retry-After"] == "5"
    assert admission_error(429, "no prospect", retry_after_s=0.2).headers["Retry-After"] == str(RETRY_AFTER_S)
    assert admission_error(429, "queue full").headers["Retry-After"] == str(RETRY_AFTER_S)
    assert "Retry-After" not in admission_error(400, "too long", retry_after_s=3.0).headers
