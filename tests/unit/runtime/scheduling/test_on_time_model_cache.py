"""Issue #20: the on_time screen's per-submit inputs are built once per change, and decide as when built per call.

``OnTimePolicy.model()`` keeps its DeviceModel until a timer measures a sample, the profile set or the
engines change; admission's margin-slowed model is kept while the model and the margin are the same;
a request becomes a ``PendingJob`` without re-checking values the request machine and the config
checked where they entered. These tests hold the caches to the model built afresh from the timers.
"""

from __future__ import annotations

import dataclasses

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob
from calculet.runtime.scheduling.on_time import OnTimePolicy
from tests.unit.runtime.runtime_support import Harness, profile_set

STEP = 0.1


def fresh(policy: OnTimePolicy) -> DeviceModel | None:
    """The device model built from the timers now, as ``model()`` built it on every call before #20."""
    planner = policy.planner
    profiles = policy._profiles()
    if profiles is None or planner.step_times.decode_step_s <= 0:
        return None
    fixed, per_token = planner.prefill_times.cost()
    return DeviceModel(planner.step_times.decode_step_s, profiles.largest.compiled_batch,
                       policy._engines(), fixed, per_token, profiles.prefill_chunk_tokens,
                       planner.step_times.token_s, planner.step_times.period_high_s, planner.step_times.slot_token_s)


def on_time(h: Harness) -> OnTimePolicy:
    policy = h.scheduler.on_time
    assert policy is not None
    return policy


def test_the_model_is_kept_until_a_timer_measures_and_then_rebuilt():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP)
    policy = on_time(h)
    first = policy.model()
    assert first is not None and first is policy.model() and first == fresh(policy)
    h.scheduler.step_times.observe(0.3, lanes=1, compiled=1, decoding=1, now=1.0)
    stepped = policy.model()
    assert stepped is not first and stepped == fresh(policy) and stepped.decode_step_s > first.decode_step_s
    assert stepped is policy.model()
    h.scheduler.prefill_times.observe(32, 0.02)
    prefilled = policy.model()
    assert prefilled is not stepped and prefilled == fresh(policy) and prefilled.prefill_per_token_s > 0


def test_a_new_profile_set_or_engine_count_rebuilds_the_model():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP)
    policy = on_time(h)
    b1 = policy.model()
    assert b1 is not None and b1.compiled_batch == 1
    h.scheduler.generations.profiles = profile_set((1, 4), h.scheduler.config)  # the next generation's
    b4 = policy.model()
    assert b4 is not None and b4.compiled_batch == 4 and b4 == fresh(policy)
    assert policy.planner.device(4, 2, None) == dataclasses.replace(b4, engines=2)  # ping/pong: two in flight
    policy._engines = lambda: 2  # the policy's own key (#20: model() without the planner's call) sees it too
    b4x2 = policy.model()
    assert b4x2 is not None and b4x2.engines == 2 and b4x2 == fresh(policy) and b4x2 is policy.model()


def test_the_admission_model_follows_the_margin():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP)
    planner = on_time(h).planner
    model = on_time(h).model()
    assert model is not None
    kept = planner.admitting_model(model)
    assert kept is planner.admitting_model(model) and kept == model.slowed(1.0 + planner.errors.margin)
    planner.errors.missed()  # a miss raises the margin
    slowed = planner.admitting_model(model)
    assert slowed is not kept and slowed == model.slowed(1.0 + planner.errors.margin)
    assert slowed.decode_step_s > kept.decode_step_s


def test_a_trusted_job_is_the_checked_job_and_checks_stay_where_values_enter():
    trusted = PendingJob.trusted(7, 16, 99, 12.5, 2.0)
    checked = PendingJob(7, 16, 99, 12.5, 2.0)
    assert trusted == checked and hash(trusted) == hash(checked) and repr(trusted) == repr(checked)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trusted.decode_steps = 1  # type: ignore[misc]
    with pytest.raises(ValueError):
        PendingJob(7, -1, 99)
    with pytest.raises(ValueError):
        PendingJob(7, 1, 99, weight=0.0)


def test_while_serving_the_kept_model_is_always_the_one_built_from_the_timers():
    """A B1 device played by hand (each job STEP of fake time): after every submit and every completion
    the cached model equals a fresh one, and the estimates admission gives are the fresh model's."""
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP, admission={"max_sequences": 16})
    policy = on_time(h)
    admitted = 0
    for i in range(40):
        if i % 3 == 0:
            sub = h.submit(prompt=8 + i, new=6, deadline_ms=30_000)
            admitted += not sub.outcome.rejected
            assert policy.model() == fresh(policy)
        plan = h.step()
        if plan.work is not None:
            h.scheduler.submitted(plan.work.job_id)
            h.clock.advance(STEP * (2 if isinstance(plan.work, DecodeBatch) else 1))
            h.complete(plan.work)
            h.confirm_all()
        else:
            h.clock.advance(STEP)
        assert policy.model() == fresh(policy)
    assert admitted >= 10 and h.scheduler.step_times.samples > 5 and h.scheduler.prefill_times.samples > 5


def test_a_request_of_a_tenant_with_a_ttft_target_is_refused_when_it_waits_past_it_and_others_are_not():
    """The screen skips the TTFT tests for a tenant without a target (#20) and still arms them for one with."""
    from tests.unit.runtime.runtime_support import make_config

    config = make_config(batch={"profiles": [1]}, admission={"max_sequences": 1, "initial_margin": 0.0},
                         tenants=[{"name": "default", "weight": 1.0},
                                  {"name": "slo", "weight": 1.0, "api_key_sha256": "0" * 64, "ttft_target_ms": 500}])
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP, config=config)
    first = h.submit(prompt=8, new=50, deadline_ms=60_000)
    plain = h.submit(prompt=8, new=4, deadline_ms=60_000)
    timed = h.submit(prompt=8, new=4, tenant="slo", deadline_ms=60_000)
    assert not (first.outcome.rejected or plain.outcome.rejected or timed.outcome.rejected)
    assert h.state(plain.request_id) == h.state(timed.request_id) == "waiting_admission"
    h.clock.advance(0.6)  # past the 500 ms target: the first request still holds the only sequence
    h.step()
    assert h.state(plain.request_id) == "waiting_admission"
    outcome = h.sinks[timed.request_id].outcome
    assert outcome.http_status == 429 and "time-to-first-token" in outcome.detail


def _place_reference(cache: object, job: PendingJob, now: float, model: DeviceModel) -> tuple[object, ...]:
    """``_EdfCache.place`` as written before #20 trimmed it, on copies: (finish, free, min_slack, latest); its finish
    summed as the planner's list schedule sums it (``start + (prefill + steps × step)``, issue #13's one lane
    arithmetic, :func:`~calculet.runtime.scheduling.lane_time.lane_finish`; no turnover on these models)."""
    import heapq
    import math

    free, min_slack, latest, on_lane = list(cache.free), cache.min_slack, cache.latest, cache.on_lane  # type: ignore[attr-defined]
    deadline = math.inf if job.deadline is None else job.deadline
    if deadline < latest:
        return None, sorted(free), min_slack, latest
    prefill = model.prefill_s(job.prefill_tokens)
    shift = 0.0 if on_lane else prefill
    if shift > min_slack + 1e-12:
        return None, sorted(free), min_slack, latest
    start = max(free[0] + shift, now + shift)
    finish = start + ((prefill if on_lane else 0.0) + job.decode_steps * model.lane_step_s)
    if finish > deadline + 1e-12:
        return None, sorted(free), min_slack, latest
    if shift:
        free = [t + shift for t in free]
    heapq.heapreplace(free, finish)
    return finish, sorted(free), min(min_slack - shift, deadline - finish), deadline


def test_placing_at_the_tail_of_the_cached_schedule_gives_what_it_gave_before_it_was_trimmed():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from calculet.runtime.scheduling.on_time_planner import _EdfCache

    times = st.floats(0.0, 50.0, allow_nan=False)

    @settings(max_examples=300, deadline=None)
    @given(kept=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 40), st.one_of(st.none(), times)), max_size=12),
           jobs=st.lists(st.tuples(st.sampled_from([0, 16, 48]), st.integers(0, 40), st.one_of(st.none(), times),
                                   st.booleans()), min_size=1, max_size=8),
           batch=st.sampled_from([1, 2, 4]), token_s=st.sampled_from([0.0, 0.15]), now=times, later=times)
    def check(kept: list, jobs: list, batch: int, token_s: float, now: float, later: float) -> None:
        """Prompt lengths repeat and the model switches (admission's margin moved) between placements: the
        lane step and prefill place keeps from its last call (#20) are the model's own."""
        model = DeviceModel(0.1, batch, 1, 0.01, 0.001, None, token_s)
        models = (model, model.slowed(1.5))
        cache = _EdfCache([PendingJob(i, p, d, dl) for i, (p, d, dl) in enumerate(kept)], now, model)
        now += later  # admission places at a later instant than the plan it caches
        for k, (p, d, dl, slowed) in enumerate(jobs):
            job = PendingJob(100 + k, p, d, dl)
            model = models[slowed]
            expected = _place_reference(cache, job, now, model)
            got = cache.place(job.prefill_tokens, job.decode_steps, job.deadline, now, model)
            assert (got, sorted(cache.free), cache.min_slack, cache.latest) == expected

    check()


def test_an_accepted_fit_is_still_a_frozen_dataclass_fit():
    """``Fit`` takes :func:`~calculet.records.quick_init`'s constructor (#20: one per admitted ``submit()``): equal,
    with an equal hash and repr, to the dataclass's own, and still frozen; ``admit`` answers with the estimate it
    sets."""
    from calculet.runtime.scheduling.finish_estimate import Fit

    for finish in (None, 0.0, 12.5):
        fit = Fit(True, None, finish)
        expected = object.__new__(Fit)
        for name, value in (("ok", True), ("retry_at", None), ("finish", finish)):
            object.__setattr__(expected, name, value)
        assert fit == expected and hash(fit) == hash(expected) and repr(fit) == repr(expected)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fit.ok = False  # type: ignore[misc]
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP)
    policy = on_time(h)
    sub = h.submit(prompt=8, new=6, deadline_ms=30_000)
    rec = h.rec(sub.request_id)
    assert not sub.outcome.rejected and rec.estimated_finish is not None
    # the admitted request screened again: its Fit carries the estimate it sets
    fit = policy.planner.admit(rec, h.clock.now(), policy.model(), h.scheduler.registry.live)
    assert fit == Fit(True, None, rec.estimated_finish) and fit.finish is not None
