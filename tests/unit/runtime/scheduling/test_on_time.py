"""Issue #13 decisions of ``batch.deadline_order: on_time`` on the sans-io scheduler (FakeClock, device by hand)."""

from __future__ import annotations

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.estimates import PrefillTimer, StepTimer
from calculet.runtime.scheduling.finish_estimate import DeviceModel
from tests.unit.runtime.runtime_support import Harness

STEP = 0.1


def drive(h: Harness, *, until: float = 1_000.0, reset_at: float | None = None, reset_s: float = 0.0
          ) -> dict[int, float]:
    """Play a B1 device: every job takes STEP; optionally a device reset (jobs lost, ``reset_s`` down).
    Returns each request's close time."""
    closed: dict[int, float] = {}
    while h.clock.now() < until:
        plan = h.step()
        work = plan.work
        if work is None:
            if len(h.scheduler.registry) == 0:
                break
            h.clock.advance(max(1e-3, (plan.wake_at or h.clock.now() + STEP) - h.clock.now()))
        else:
            h.scheduler.submitted(work.job_id)
            h.clock.advance(STEP)
            if reset_at is not None and h.clock.now() >= reset_at:
                reset_at = None
                h.scheduler.device_reset("injected fault")
                h.clock.advance(reset_s)
            else:
                h.complete(work)
        h.confirm_all()
        for rid, sink in h.sinks.items():
            if sink.closes and rid not in closed:
                closed[rid] = h.clock.now()
    return closed


@pytest.mark.req("R5.2.2", "R5.2.4")
def test_admission_refuses_what_cannot_finish_with_a_computed_retry_after():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP, admission={"max_sequences": 16})
    # each request: 10 decode steps = 1 s on B1; ten of them finish by 10 s, one after the other
    subs = [h.submit(prompt=8, new=11, deadline_ms=10_000) for _ in range(10)]
    assert all(not s.outcome.rejected for s in subs)
    finishes = [h.rec(s.request_id).estimated_finish for s in subs]
    assert finishes == pytest.approx([float(i) for i in range(1, 11)])
    late = h.submit(prompt=8, new=11, deadline_ms=10_000)
    assert late.outcome.http_status == 429 and "no prospect of service" in late.outcome.reason
    assert late.outcome.retry_after_s == 1.0           # one request done: it would fit
    assert h.sinks[late.request_id].outcome.finish_reason is FinishReason.REJECTED
    assert h.scheduler.admission.statistics().no_prospect == 1
    assert h.scheduler.statistics().on_time.unfit == 1
    # an earlier deadline goes through the full EDF check: it would push the last one late
    early = h.submit(prompt=8, new=2, deadline_ms=500)
    assert early.outcome.http_status == 429 and h.scheduler.statistics().on_time.unfit == 2


@pytest.mark.req("R7.2.2")
def test_a_slowdown_sheds_before_device_time_and_the_kept_finish_on_time():
    """Ten admitted 1 s requests (deadline 10 s); the device turns out twice as slow: keep five."""
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP / 2)
    ids = [h.submit(prompt=8, new=11, deadline_ms=10_000).request_id for _ in range(10)]
    assert all(h.rec(i).estimated_finish is not None for i in ids)
    closed = drive(h)
    outcomes = {i: h.sinks[i].outcome for i in ids}
    done = [i for i, o in outcomes.items() if o.state == "completed"]
    assert len(done) >= 4 and all(closed[i] <= 10.0 + 1e-9 for i in done)
    for i, o in outcomes.items():
        if o.state != "completed":
            assert o.finish_reason is FinishReason.DEADLINE and o.generated_tokens <= 11 // 4, o
    assert h.scheduler.statistics().on_time.shed_admitted == 10 - len(done)


@pytest.mark.req("R7.2.2", "R7.4.5")
def test_a_fault_and_reset_mid_burst_replans_and_nobody_admitted_expires_silently():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP)
    ids = [h.submit(prompt=8, new=11, deadline_ms=12_000).request_id for _ in range(12)]
    replans = h.scheduler.statistics().on_time.replans
    closed = drive(h, reset_at=3.05, reset_s=2.0)
    assert h.scheduler.statistics().on_time.replans > replans + 1
    late_with_tokens = []
    for i in ids:
        o = h.sinks[i].outcome
        if o.state == "completed":
            assert closed[i] <= 12.0 + 1e-9
        elif o.finish_reason is FinishReason.DEADLINE:
            # shed early: ended before its deadline, not run until it expired
            if closed[i] >= 12.0 - 1e-9 or o.generated_tokens > 11 // 4:
                late_with_tokens.append(o)
        else:
            assert o.finish_reason is FinishReason.ERROR  # on the device at the fault
    assert not late_with_tokens
    assert h.scheduler.idle() or len(h.scheduler.registry) == 0


@pytest.mark.req("R5.3.1", "R7.2.2")
def test_tenant_weights_decide_who_is_kept_under_overload():
    tenants = [{"name": "heavy", "weight": 2.0, "api_key_sha256": "a" * 64}, {"name": "light", "weight": 1.0},
               {"name": "even", "weight": 1.0, "api_key_sha256": "b" * 64}]
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP / 2, tenants=tenants,
                      batch={"max_tenant_lane_share": 1.0})
    ids = {"heavy": [], "light": [], "even": []}
    for _ in range(4):
        for name in ids:
            ids[name].append(h.submit(prompt=8, new=11, tenant=name, deadline_ms=8_000).request_id)
    drive(h)
    done = {name: sum(h.sinks[i].outcome.state == "completed" for i in rids) for name, rids in ids.items()}
    assert sum(done.values()) >= 6
    assert done["heavy"] >= done["light"] and done["heavy"] >= done["even"]
    assert abs(done["light"] - done["even"]) <= 1       # equal weights: an equal share of what is kept


def test_estimated_finish_is_none_until_a_step_is_measured_and_old_orders_keep_none():
    h = Harness.build(sizes=(1,), lanes=4)
    rid = h.submit(prompt=8, new=4).request_id
    assert h.rec(rid).estimated_finish is None
    old = Harness.build(sizes=(1,), lanes=4, step_estimate_s=STEP, batch={"deadline_order": "at_risk"})
    assert old.rec(old.submit(prompt=8, new=4).request_id).estimated_finish is None
    assert old.scheduler.statistics().on_time is None


@pytest.mark.req("R5.2.2")
def test_the_itl_cap_holds_streams_back_until_the_step_is_measured_then_admits_a_rotation():
    h = Harness.build(sizes=(1,), lanes=16, admission={"itl_target_ms": 350})
    ids = [h.submit(prompt=8, new=30).request_id for _ in range(8)]
    assert h.scheduler.admission.active == 1            # step unknown: one rotation's worth (B1: 1)
    drive(h, until=1.0)
    # 0.1 s a step and 0.1 s a prefill (the next stream's, between two steps): 2 streams within 350 ms
    assert h.scheduler.admission.active == 2
    assert h.scheduler.statistics().on_time.decode_cap == 2
    assert all(h.state(i) != "failed" for i in ids)


def test_prefill_timer_fits_fixed_and_per_token_costs():
    timer = PrefillTimer()
    assert timer.cost() == (0.0, 0.0)
    timer.observe(100, 0.065)
    assert timer.cost() == pytest.approx((0.0, 0.00065))
    for tokens in (10, 200, 50, 400):
        timer.observe(tokens, 0.005 + 0.0006 * tokens)
    fixed, per = timer.cost()
    assert per == pytest.approx(0.0006, rel=0.1) and fixed == pytest.approx(0.005, abs=0.004)
    assert timer.statistics().samples == 5
    with pytest.raises(ValueError):
        PrefillTimer(smoothing=0)


@pytest.mark.req("R7.2.2", "R6.3")
def test_an_at_risk_prefill_takes_the_next_opportunity_ahead_of_the_wrr_and_its_class():
    """Issue #13 (seeds 82 and 107 of the random B1 bursts): a request the planner marks at risk is
    prefilled first — before the rotating decodes the WRR would serve and the prompts queued before it
    — unless an at-risk decode has an earlier deadline; the others keep the WRR and WFQ order."""
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP, admission={"max_sequences": 16})
    streams = [h.submit(prompt=8, new=40, deadline_ms=100_000).request_id for _ in range(3)]
    h.prefill_all()
    queued = [h.submit(prompt=8, new=40, deadline_ms=100_000).request_id for _ in range(3)]
    urgent = h.submit(prompt=8, new=6, deadline_ms=1_500).request_id   # EDF: 0.5 s; rotating: ~3 s
    assert h.rec(urgent).estimated_finish is not None
    plan = h.step()
    assert h.rec(urgent).at_risk and not any(h.rec(i).at_risk for i in streams + queued)
    assert not isinstance(plan.work, DecodeBatch) and plan.work.request_id == urgent
    assert h.scheduler.statistics().prefill.deadline_first == 1
    h.scheduler.submitted(plan.work.job_id)
    h.clock.advance(STEP)
    h.complete(plan.work)
    # its decode is at risk and earliest: every decode step serves it; the other prefills keep the WRR
    kinds = []
    while not h.sinks[urgent].outcomes:
        plan = h.step()
        kinds.append(plan.work.request_id if not isinstance(plan.work, DecodeBatch)
                     else [b.request_id for b in plan.work.active])
        h.scheduler.submitted(plan.work.job_id)
        h.clock.advance(STEP)
        h.complete(plan.work)
        h.confirm_all()
    assert kinds == [[urgent], [urgent], queued[0], [urgent], [urgent], queued[1], [urgent]]
    assert h.sinks[urgent].outcome.state == "completed" and h.clock.now() <= 1.5
    assert h.scheduler.statistics().prefill.deadline_first == 1


def test_the_step_timer_measures_the_wall_time_per_token_a_decoding_sequence_sees():
    """Issue #13, B>1: 8 sequences rotate on 4 of 8 lanes (a smaller profile) and a 50 ms prefill runs
    between 50 ms steps, so each gets a token every 0.2 s (Little's law); an idle gap is not counted, nor
    waiting beyond the widest batch (the lane schedule models it)."""
    timer = StepTimer()
    now = 0.0
    for _ in range(2000):
        timer.prefill_ran(0.05)
        now += 0.1
        timer.observe(0.05, lanes=4, compiled=8, decoding=8, now=now)
    assert timer.decode_step_s == pytest.approx(0.05)
    assert timer.token_s == pytest.approx(0.2)
    timer.observe(0.05, lanes=4, compiled=8, decoding=8, now=now + 60.0)     # a minute idle: one 50 ms step counted
    assert timer.token_s == pytest.approx(0.2, rel=0.01)
    assert timer.statistics().token_s == timer.token_s
    wide = StepTimer()
    for k in range(2000):
        wide.observe(0.05, lanes=8, compiled=8, decoding=32, now=0.05 * (k + 1))
    assert wide.token_s == pytest.approx(0.05)
    b16 = DeviceModel(0.05, compiled_batch=16, token_s=0.2)
    assert b16.lane_step_s == pytest.approx(0.2) and b16.itl_s(16) == pytest.approx(0.05)
    assert DeviceModel(0.05, token_s=0.2).lane_step_s == 0.05    # B1 charges each job's prefill itself
    assert DeviceModel(0.05, compiled_batch=16).lane_step_s == 0.05  # not measured yet


@pytest.mark.req("R7.2.2", "R7.2.3")
@pytest.mark.parametrize(("sizes", "sections", "by_deadline"), [
    ((1,), {}, True),                                             # B1, 16 sequences: the decode order binds
    ((1,), {"admission": {"itl_target_ms": 5_000}}, False),       # a latency target: the capped set rotates
    ((4,), {"admission": {"max_sequences": 4}}, False),           # every sequence in every step: admission binds
])
def test_the_kept_decode_by_deadline_only_where_the_device_is_the_narrower_stage(sizes, sections, by_deadline):
    """Issue #13: deadline-first decoding is what makes the EDF plan's estimates hold on B1; where each
    step holds every sequence (B16 with 16) the admission queue's order decides, and rotation stays."""
    h = Harness.build(sizes=sizes, lanes=16, step_estimate_s=STEP, **sections)
    for _ in range(3):
        h.submit(prompt=8, new=5)
    drive(h)
    assert h.scheduler.decode.deadline_first is by_deadline


@pytest.mark.req("R5.3.2", "R5.3.3")
def test_on_one_lane_a_short_request_is_estimated_ahead_of_the_other_tenants_long_ones():
    """Issue #13 (calculet-b1, one KV lane): WFQ admits by cost, so a short request of one tenant is served
    before a longer queued request of the other; its estimate follows that order (virtual finish tags),
    and the one of the tenant of long requests counts the short one ahead of it."""
    tenants = [{"name": "a", "weight": 1.0, "api_key_sha256": "a" * 64}, {"name": "b", "weight": 1.0}]
    h = Harness.build(sizes=(1,), lanes=1, step_estimate_s=STEP, admission={"max_sequences": 1}, tenants=tenants)
    first = h.submit(prompt=8, new=11, tenant="b").request_id            # on the lane: 1 s
    longs = [h.submit(prompt=8, new=31, tenant="b").request_id for _ in range(2)]   # 3 s each, waiting
    short = h.submit(prompt=8, new=3, tenant="a").request_id             # cost 11 against 39 and 78
    assert h.rec(first).estimated_finish == pytest.approx(1.0)
    assert h.rec(short).estimated_finish == pytest.approx(1.2)           # straight after the first
    assert all(h.rec(i).estimated_finish > 1.2 for i in longs)
    closed = drive(h)   # the played device takes STEP for a prefill too (not measured at admission)
    assert all(h.sinks[i].outcome.state == "completed" for i in (first, short, *longs))
    assert closed[first] == pytest.approx(1.1) and closed[short] == pytest.approx(1.4)
    assert closed[short] < min(closed[i] for i in longs)
