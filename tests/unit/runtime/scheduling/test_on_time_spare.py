"""Issue #13: the overload selection sheds to make room, not a request that delays nobody kept.

Sans-io and virtual time (FakeClock, device played by hand); the pure rule (:func:`spare_harmless`)
on plain jobs, and its effect on the scheduler: a request the estimate turns late after one slow step
is no longer shed when nobody else needs its lane, and still is when someone does.
"""

from __future__ import annotations

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob, on_time_selection
from calculet.runtime.scheduling.on_time_spare import spare_harmless
from tests.unit.runtime.runtime_support import Harness

STEP = 0.1


def test_a_late_job_holding_a_lane_nobody_kept_needs_is_spared():
    """B4: A (decoding, 30 steps left, deadline 2.9 s) is late by the estimate; B and C run on other lanes."""
    model = DeviceModel(STEP, compiled_batch=4)
    a = PendingJob(1, 0, 30, deadline=2.9)
    b = PendingJob(2, 0, 10, deadline=5.0)
    c = PendingJob(3, 8, 10, deadline=5.0)
    jobs = [a, b, c]
    selection = on_time_selection(jobs, 0.0, model)
    assert selection.shed == (1,)
    assert spare_harmless(jobs, selection.shed, lambda i: True, 0.0, model) == (1,)
    # still waiting for a sequence: nothing to spare (it holds no lane)
    assert spare_harmless(jobs, selection.shed, lambda i: i != 1, 0.0, model) == ()


def test_a_late_job_whose_lane_a_kept_job_needs_is_still_shed():
    """B1: A (late on its own) ahead of B in EDF order would push B past its deadline: A goes."""
    model = DeviceModel(STEP)
    a = PendingJob(1, 0, 30, deadline=2.9)
    b = PendingJob(2, 0, 10, deadline=3.5)
    selection = on_time_selection([a, b], 0.0, model)
    assert selection.shed == (1,)
    assert spare_harmless([a, b], selection.shed, lambda i: True, 0.0, model) == ()
    # with slack enough for both, B stays on time behind A: A is spared
    roomy = PendingJob(2, 0, 10, deadline=4.5)
    selection = on_time_selection([a, roomy], 0.0, model)
    assert spare_harmless([a, roomy], selection.shed, lambda i: True, 0.0, model) == (1,)


def _drive(h: Harness, slow_step: int, slow_s: float, until: float = 100.0) -> None:
    """A B1 device whose jobs take STEP, except the ``slow_step``-th job (a host hiccup): ``slow_s``."""
    jobs = 0
    while h.clock.now() < until and len(h.scheduler.registry):
        plan = h.step()
        work = plan.work
        if work is None:
            h.clock.advance(max(1e-3, (plan.wake_at or h.clock.now() + STEP) - h.clock.now()))
            continue
        h.scheduler.submitted(work.job_id)
        jobs += 1
        h.clock.advance(slow_s if jobs == slow_step else STEP)
        h.complete(work)
        h.confirm_all()


@pytest.mark.req("R7.2.2")
def test_one_slow_step_does_not_shed_a_request_that_delays_nobody():
    """41 tokens (prefill + 40 steps = 4.1 s on time), deadline 5.5 s; the 11th job takes 1.5 s. The smoothed
    step then says 29 steps need ~8 s (late): shedding it would free a lane nobody waits for. The device
    is fast again and it finishes at 5.5 s: kept, it completes on time."""
    h = Harness.build(sizes=(1,), lanes=4, step_estimate_s=STEP)
    rid = h.submit(prompt=8, new=41, deadline_ms=5_500).request_id
    _drive(h, slow_step=11, slow_s=1.5)
    outcome = h.sinks[rid].outcome
    assert outcome.state == "completed" and outcome.generated_tokens == 41
    assert h.scheduler.statistics().on_time.shed_admitted == 0


@pytest.mark.req("R7.2.2")
def test_one_slow_step_still_sheds_the_request_whose_lane_an_on_time_one_needs():
    """The same hiccup with a second request queued behind on the one lane (deadline 7 s, 2.1 s of work):
    kept, the first would push it late by the estimate, so the first is shed; the second, late by the same
    estimate but delaying nobody, is spared and finishes (before issue #13's rule both were shed)."""
    h = Harness.build(sizes=(1,), lanes=4, step_estimate_s=STEP)
    first = h.submit(prompt=8, new=41, deadline_ms=5_500).request_id
    second = h.submit(prompt=8, new=21, deadline_ms=7_000).request_id
    _drive(h, slow_step=11, slow_s=1.5)
    assert h.sinks[second].outcome.state == "completed"
    shed = h.sinks[first].outcome
    assert shed.state != "completed" and shed.finish_reason is FinishReason.DEADLINE
    assert h.scheduler.statistics().on_time.shed_admitted >= 1
