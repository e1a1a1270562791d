"""Issue #13 (session 14): a freed lane is handed to the next job at the KV slot's per-token time.

On B>1 a request that takes a freed KV slot holds it while it waits for its prefill behind the other
newcomers' (§6 serves one prefill between decode steps), so a queue drains at the slot's per-token time
(:attr:`StepTimer.slot_token_s`: Little's law over the slots held), not at the decoding sequence's
(:attr:`StepTimer.token_s`). The lane schedules of admission, its cache and the overload selection charge
that difference on every job that takes a lane another job held (:attr:`DeviceModel.handover_s`); a job on
a lane free now keeps the sequence's time, and the reported admission-order estimate keeps the long window.
Virtual time only (no sleeps): the timer is fed completion instants, the estimator is pure.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.estimates import StepTimer
from calculet.runtime.scheduling.finish_estimate import (DeviceModel, PendingJob, admission_order_finish,
                                                         edf_finish, on_time_selection)
from calculet.runtime.scheduling.on_time_cache import _EdfCache
from tests.unit.runtime.runtime_support import Harness

STEP = 0.05


def played(holding: int | None, decoding: int, steps: int = 64) -> StepTimer:
    """A timer fed ``steps`` back-to-back decode steps of ``decoding`` sequences while ``holding`` hold a slot."""
    timer = StepTimer()
    if holding is not None:
        timer.holding = SimpleNamespace(active=holding)
    for k in range(steps):
        timer.observe(STEP, lanes=decoding, compiled=16, decoding=decoding, now=STEP * (k + 1))
    return timer


def test_the_slot_time_is_littles_law_over_the_slots_held():
    """16 slots held, 12 sequences decoding: a slot yields a token every 16/12 of a sequence's per-token time.
    Mutants caught: the slots held not read (slot time = per-token time), the held count not floored at the
    sequences decoding (a hook reading fewer than decode: a slot time below the per-token time)."""
    full = played(16, 12)
    assert full.token_s == pytest.approx(STEP)
    assert full.slot_token_s == pytest.approx(STEP * 16 / 12)
    assert full.statistics().slot_token_s == full.slot_token_s
    assert played(None, 12).slot_token_s == pytest.approx(STEP)  # no hook: the sequences decoding
    assert played(4, 12).slot_token_s == pytest.approx(STEP)     # never fewer slots than sequences decoding
    assert StepTimer().slot_token_s == 0.0                         # not measured


def test_the_handover_is_the_slot_time_over_the_lane_step_on_several_lanes_only():
    b16 = DeviceModel(0.05, compiled_batch=16, token_s=0.1, slot_token_s=0.13)
    assert b16.handover_s == pytest.approx(0.03)
    assert DeviceModel(0.05, compiled_batch=1, token_s=0.1, slot_token_s=0.13).handover_s == 0.0  # one lane
    assert DeviceModel(0.05, compiled_batch=16, slot_token_s=0.13).handover_s == 0.0  # per-token time not measured
    assert DeviceModel(0.05, compiled_batch=16, token_s=0.1, slot_token_s=0.08).handover_s == 0.0
    assert b16.slowed(1.5).handover_s == pytest.approx(0.045)  # admission's margin slows it with the rest


HANDED = DeviceModel(0.05, compiled_batch=2, token_s=0.1, slot_token_s=0.15)


def test_a_job_on_a_lane_another_job_held_decodes_at_the_slot_time():
    """Two lanes, three jobs of 10 steps: the first two start now at the sequence's 0.1 s, the third takes a
    freed lane at the slot's 0.15 s. Mutants caught: the handover on every job (the first two at 1.5 s) or on
    none (the third at 2.0 s), and the reported admission-order estimate taking it (2.5 s, not 2.0)."""
    jobs = [PendingJob(i, 0, 10, 10.0) for i in range(3)]
    finish = edf_finish(jobs, 0.0, HANDED)
    assert finish == pytest.approx({0: 1.0, 1: 1.0, 2: 2.5})
    assert admission_order_finish(jobs[2], "t", jobs[:2], {}, {}, 0.0, HANDED) == pytest.approx(2.0)


def test_the_overload_selection_sheds_what_the_handover_makes_late():
    """The third job's deadline 2.2 s: on time at the sequence's time (2.0 s), late at the slot's (2.5 s).
    Mutant caught: the selection's own lane schedule (``_select_lanes``) without the handover keeps it."""
    jobs = [PendingJob(0, 0, 10, 1.0), PendingJob(1, 0, 10, 1.0), PendingJob(2, 0, 10, 2.2)]
    assert on_time_selection(jobs, 0.0, HANDED).shed == (2,)
    assert on_time_selection(jobs, 0.0, DeviceModel(0.05, compiled_batch=2, token_s=0.1)).shed == ()


times = st.floats(0.0, 20.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(kept=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 40), st.one_of(st.none(), times)), max_size=10),
       placed=st.lists(st.tuples(st.sampled_from([0, 16, 48]), st.integers(0, 40), times), min_size=1, max_size=6),
       lanes=st.sampled_from([2, 4]), slot=st.sampled_from([0.1, 0.13, 0.2]), now=times)
def test_the_admission_cache_places_a_latest_deadline_job_where_the_lane_schedule_does(
        kept: list, placed: list, lanes: int, slot: float, now: float) -> None:
    """The cache (O(lanes) per ``submit()``) answers as ``edf_finish`` over the kept jobs and those placed so far,
    handover included. Mutants caught: ``place`` or ``tail_finish`` without the handover, or with it on a lane free
    now."""
    model = DeviceModel(0.05, lanes, 1, 0.01, 0.001, None, 0.1, 0.0, slot)
    jobs = [PendingJob(i, p, d, dl) for i, (p, d, dl) in enumerate(kept)]
    cache = _EdfCache(list(jobs), now, model)
    latest = max((j.deadline for j in jobs if j.deadline is not None), default=-math.inf)
    if any(j.deadline is None for j in jobs):
        return  # a job with no deadline is last in EDF: nothing is placed after it
    for k, (p, d, relative) in enumerate(placed):
        latest = max(latest, now + relative)
        job = PendingJob(100 + k, p, d, latest)
        expected = edf_finish([*jobs, job], now, model)[job.id]
        assert cache.tail_finish(job, now, model) == pytest.approx(expected, abs=1e-9)
        late_kept = cache.min_slack < 0  # a kept job planned late already: the cache leaves every answer to ``fits``
        got = cache.place(p, d, job.deadline, now, model)
        if expected > job.deadline + 1e-9:
            assert got is None
            continue
        if got is None:  # at the deadline within float accumulation: either answer is the estimator's
            assert late_kept or expected == pytest.approx(job.deadline, abs=1e-9)
            if late_kept:
                return
            continue
        assert got == pytest.approx(expected, abs=1e-9)
        jobs.append(job)


def test_the_on_time_policy_measures_the_slots_admission_holds():
    """The scheduler's step timer reads the admission budget's active count (``OnTimePolicy`` wires it): with
    requests waiting in PrefillReady beside the decoding ones, the slot time exceeds the per-token time. Mutant
    caught: the hook not installed (the slot time equals the per-token time)."""
    h = Harness.build(sizes=(4,), lanes=4, step_estimate_s=STEP)
    for _ in range(4):
        assert not h.submit(prompt=8, new=12, deadline_ms=60_000).outcome.rejected
    for _ in range(40):
        plan = h.step()
        if plan.work is None:
            h.clock.advance(STEP)
            continue
        h.scheduler.submitted(plan.work.job_id)
        h.clock.advance(STEP if isinstance(plan.work, DecodeBatch) else STEP / 5)
        h.complete(plan.work)
        h.confirm_all()
    stats = h.scheduler.statistics().step_times
    assert stats.samples > 5 and stats.token_s > 0
    assert stats.slot_token_s > stats.token_s * 1.05
