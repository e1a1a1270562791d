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


# ---------------------------------------------------------------------- replans on drift (issue #20)

def test_a_slower_step_within_the_plans_slack_decides_the_same():
    """The tolerance the plan records: every device time that much slower (just under it) gives the same
    shed set and the same at-risk prefix, so a drift inside it needs no replan; just past it may not."""
    import random
    from dataclasses import replace

    from calculet.runtime.scheduling.on_time_planner import at_risk_prefix, slack_ratio

    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        model = DeviceModel(STEP, compiled_batch=rng.choice((1, 4, 16)), prefill_per_token_s=0.001)
        jobs = [PendingJob(i, rng.choice((0, 16, 64)), rng.randint(1, 60), deadline=rng.uniform(1.0, 30.0))
                for i in range(rng.randint(1, 24))]
        selection = on_time_selection(jobs, 0.0, model)
        kept = [j for j in jobs if j.id in set(selection.keep)]
        prefix, slack = at_risk_prefix(kept, 0.0, model)
        tolerance = min(slack, slack_ratio(selection.finish, kept, 0.0))
        if not 0 < tolerance < 10:
            continue
        f = 1.0 + 0.999 * tolerance
        slower = replace(model, decode_step_s=STEP * f, prefill_per_token_s=0.001 * f)
        again = on_time_selection(kept, 0.0, slower)
        assert again.shed == ()
        assert at_risk_prefix(kept, 0.0, slower)[0] == prefix
        checked += 1
    assert checked > 50


@pytest.mark.req("R7.2.2")
def test_step_jitter_within_a_long_deadlines_slack_replans_only_on_events():
    """Steps alternate 0.1 s and 0.25 s (the smoothed step swings by more than 10 %): with a 120 s deadline
    nobody can become late, so the plan is redone only on events (admission, end), not on every drift."""
    h = Harness.build(sizes=(1,), lanes=4, step_estimate_s=STEP)
    rids = [h.submit(prompt=8, new=60, deadline_ms=120_000).request_id for _ in range(3)]
    jobs = 0
    while len(h.scheduler.registry):
        plan = h.step()
        work = plan.work
        if work is None:
            h.clock.advance(max(1e-3, (plan.wake_at or h.clock.now() + STEP) - h.clock.now()))
            continue
        h.scheduler.submitted(work.job_id)
        jobs += 1
        h.clock.advance(0.25 if (jobs // 8) % 2 else STEP)
        h.complete(work)
        h.confirm_all()
    assert all(h.sinks[r].outcome.state == "completed" for r in rids)
    # 3 admissions and 3 ends (and a prefill_ready each) mark the plan: about a dozen replans at most
    assert h.scheduler.statistics().on_time.replans <= 12


def test_a_job_the_plan_finishes_at_its_deadline_edge_is_at_risk_though_fair_share_finishes_it_early():
    """Issue #13 session 14 (:func:`near_deadline`): processor sharing finishes short jobs first, so the at-risk
    prefix misses a short job the EDF plan puts at the edge of its deadline, and its prefill waited behind cheaper
    prompts until the deadline. Two lanes: A and B (100 steps, deadline 10.1 s) hold them, C (5 steps, 11 s) follows
    at 10.5 s in the plan, 0.5 s to spare of 10.5 s left. Mutants caught: the test dropped from the replan (C not
    flagged), the slack compared the wrong way, or against the deadline's distance from 0 instead of the time left,
a job planned to end before now flagged."""
    from calculet.runtime.scheduling.on_time_spare import PLAN_SLACK_AT_RISK, at_risk_prefix, near_deadline
    from tests.unit.runtime.runtime_support import Harness

    model = DeviceModel(0.1, compiled_batch=2)
    jobs = [PendingJob(1, 0, 100, 10.1), PendingJob(2, 0, 100, 10.1), PendingJob(3, 0, 5, 11.0)]
    plan = on_time_selection(jobs, 0.0, model).finish
    assert plan == pytest.approx({1: 10.0, 2: 10.0, 3: 10.5})  # A, B, then C on a freed lane
    assert at_risk_prefix(jobs, 0.0, model)[0] == [1, 2]  # fair share: A and B late, C early
    assert near_deadline(jobs, plan, 0.0) == [1, 2, 3]  # A, B: 0.1 s of 10 s to spare is 1 % (< 10 %): in too
    assert near_deadline(jobs, {**plan, 1: 5.0, 2: 5.0}, 0.0) == [3]  # 5.1 s of 5 s to spare: not at risk
    assert near_deadline([PendingJob(4, 0, 5, None)], {4: 10.5}, 0.0) == []  # no deadline
    assert near_deadline([PendingJob(5, 0, 5, 10.4)], {5: 10.5}, 11.0) == []  # planned to end before now
    assert near_deadline([PendingJob(6, 0, 5, 30.0)], {6: 29.0}, 25.0) == []  # 1 s to spare of 4 s left: 25 %
    assert PLAN_SLACK_AT_RISK == 0.1

    h = Harness.build(sizes=(2,), lanes=2, step_estimate_s=0.1, batch={"select_thresholds": {2: 1}})
    ids = [h.submit(prompt=8, new=101, deadline_ms=10_100).request_id for _ in range(2)]
    short = h.submit(prompt=8, new=6, deadline_ms=11_000).request_id
    assert all(not h.rec(i).at_risk for i in [*ids, short])
    h.step()  # the tick replans
    assert h.rec(short).at_risk
