"""Issue #13 (H13): refusals leave retry slots, are answered from the caches, and the ITL cap leaves
room for a prefill — sans-io, in virtual time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob, fits, on_time_selection
from calculet.runtime.scheduling.on_time_planner import RetrySlots, _EdfCache
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_on_time import STEP

REF_B1 = DeviceModel(decode_step_s=0.04, prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3)


def _play(h: Harness, retries: dict[float, list[int]], until: float) -> dict[int, object]:
    """Run a B1 device (every job STEP); at each retry instant submit that many identical requests
    again (prompt 8, 11 tokens, 5 s deadline). Returns the retries' submissions by instant."""
    due = sorted(retries.items())
    out: dict[int, object] = {}
    n = 0
    while h.clock.now() < until:
        while due and due[0][0] <= h.clock.now() + 1e-9:
            _, slots = due.pop(0)
            for _ in slots:
                out[n] = h.submit(prompt=8, new=11, deadline_ms=5_000)
                n += 1
        plan = h.step()
        if plan.work is None:
            h.clock.advance(STEP if due or len(h.scheduler.registry) else max(STEP, (due or [(until,)])[0][0]))
        else:
            h.scheduler.submitted(plan.work.job_id)
            h.clock.advance(STEP)
            h.complete(plan.work)
        h.confirm_all()
    return out


@pytest.mark.req("R5.2.4")
def test_fifty_identical_refusals_get_spread_retry_slots_and_a_retry_at_its_slot_fits():
    h = Harness.build(sizes=(1,), lanes=16, step_estimate_s=STEP, admission={"max_sequences": 64})
    _play(h, {0.0: [0, 1]}, until=3.0)                 # the prefill cost measured: 1.1 s a request (11 jobs)
    kept = [h.submit(prompt=8, new=11, deadline_ms=12_000) for _ in range(10)]  # the device busy for 11 s
    assert all(not s.outcome.rejected for s in kept)
    refused = [h.submit(prompt=8, new=11, deadline_ms=5_000) for _ in range(50)]
    assert all(s.outcome.http_status == 429 for s in refused)
    after = [s.outcome.retry_after_s for s in refused]
    assert after[0] == 8.0                              # 11 s of work ahead + 1.1 s, within 5 s: from 7.1 s
    assert all(b > a for a, b in zip(after, after[1:]))  # each placed behind the last one's slot
    ghosts = h.scheduler.on_time.planner.retry_slots.ghosts
    assert len(ghosts) == 50
    start = h.clock.now() + 11.0
    for g in ghosts:                                    # each slot fits its deadline
        start = max(start, g.retry_at)
        assert start + g.length <= g.retry_at + 5.0 + 1e-9
        start += g.length
    # the clients come back at their Retry-After: each is admitted and finishes on time
    base = h.clock.now()
    back = _play(h, {base + a: [k] for k, a in enumerate(after)}, until=base + after[-1] + 10.0)
    assert len(back) == 50
    admitted = [s for s in back.values() if not s.outcome.rejected]
    # the estimator does not see the step in flight when a retry arrives mid-step (≤ one step, 0.1 s):
    # the first such retries end one token short of their deadline, each late outcome raises the
    # admission margin (none at the start here), and from then on a retry the margin no longer admits
    # is refused with a new Retry-After instead of admitted and late
    outcomes = [h.sinks[s.request_id].outcome for s in admitted]
    late = [o for o in outcomes if o.finish_reason is FinishReason.DEADLINE]
    assert len(admitted) >= 0.9 * len(back) and len(late) <= 0.1 * len(admitted)
    assert all(o.generated_tokens >= 10 for o in late)


def test_a_retry_at_its_slot_fits_with_the_earlier_retries_admitted():
    """Estimator-level, B1: each refused candidate comes back at its retry time, the kept work and the
    earlier retries (admitted at theirs) run back to back; every one fits and finishes on time."""
    model = REF_B1
    kept = [PendingJob(i, 64, 24, 4.0 + 0.5 * i) for i in range(8)]
    cache = _EdfCache(kept, 0.0, model)
    slots = RetrySlots(limit=64)
    length = model.prefill_s(64) + 24 * model.decode_step_s
    retry = [slots.reserve(cache.free, 0, 0.0, length, 2.0, 0.0) for _ in range(30)]
    assert retry == sorted(retry) and retry[-1] > retry[0]
    busy = max(cache.free)                            # the device's end of work so far
    for k, t in enumerate(retry):
        ahead = max(0.0, busy - t)
        steps = round(ahead / model.decode_step_s)
        now_ahead = [PendingJob(1000, 0, steps, t + 2.0 - length)] if steps else []
        assert fits(PendingJob(k, 64, 24, t + 2.0), now_ahead, t, model).ok
        busy = max(busy, t) + length
        assert busy <= t + 2.0 + 1e-9


def test_ghosts_expire_after_grace_give_way_to_admitted_tenants_and_stay_bounded():
    slots = RetrySlots(grace_s=2.0, limit=3)
    for tenant in "abcd":
        slots.reserve([0.0], 0, 0.0, 1.0, 1.5, 0.0, tenant)
    assert [g.tenant for g in slots.ghosts] == ["b", "c", "d"]          # the oldest dropped beyond 3
    first = slots.ghosts[0].retry_at
    slots.admitted("c", now=slots.ghosts[1].retry_at - 2.5)              # not its slot yet: kept
    assert len(slots.ghosts) == 3
    slots.admitted("c", now=slots.ghosts[1].retry_at)
    assert [g.tenant for g in slots.ghosts] == ["b", "d"]
    slots.expire(first + 2.0)
    assert [g.tenant for g in slots.ghosts] == ["b", "d"]
    slots.expire(first + 2.1)
    assert [g.tenant for g in slots.ghosts] == ["d"]


_jobs = st.lists(st.tuples(st.integers(0, 256), st.integers(0, 60), st.floats(0.5, 12.0)), min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(jobs=_jobs, lanes=st.sampled_from([1, 2, 4]), c=st.tuples(st.integers(0, 256), st.integers(0, 60),
                                                                   st.floats(0.3, 12.0)),
       more=st.tuples(st.integers(0, 64), st.integers(0, 30), st.floats(0.0, 3.0)))
def test_cached_refusals_equal_the_full_computation(jobs, lanes, c, more) -> None:
    model = DeviceModel(0.04, compiled_batch=lanes, prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3,
                        token_s=0.05 if lanes > 1 else 0.0)
    admitted = [PendingJob(i, p, d, dl) for i, (p, d, dl) in enumerate(jobs)]
    keep = set(on_time_selection(admitted, 0.0, model).keep)
    kept = [j for j in admitted if j.id in keep]
    cand = PendingJob(99, c[0], c[1], c[2])
    full = fits(cand, kept, 0.0, model)
    # the tail cache: a latest-deadline candidate is refused from the cached lane schedule exactly when
    # the full computation refuses it
    tail = _EdfCache(kept, 0.0, model).tail_finish(cand, 0.0, model)
    if tail is not None:
        assert (tail > cand.deadline + 1e-12) == (not full.ok)
    # the refusal cache: an earlier deadline and no less work is refused too
    if not full.ok:
        harder = PendingJob(98, c[0] + more[0], c[1] + more[1], c[2] - more[2])
        assert not fits(harder, kept, 0.0, model).ok


def test_the_itl_cap_leaves_room_for_one_typical_prefill() -> None:
    assert REF_B1.max_streams_for_itl(0.2) == 5
    assert REF_B1.max_streams_for_itl(0.2, REF_B1.prefill_s(64)) == 3          # 43 ms of prefill: 3 × 40 ms
    assert REF_B1.max_streams_for_itl(0.2, 0.25) == 0                          # the prefill alone is over it
    b16 = DeviceModel(0.08, compiled_batch=16)
    assert b16.max_streams_for_itl(0.2, 0.05) == 16
    # every stream's token waits one rotation plus the prefill: within the target at the cap
    prefill = REF_B1.prefill_s(64)
    cap = REF_B1.max_streams_for_itl(0.2, prefill)
    assert REF_B1.itl_s(cap) + prefill <= 0.2 < REF_B1.itl_s(cap + 1) + prefill


_burst = st.lists(st.tuples(st.integers(1, 256), st.integers(0, 60), st.floats(0.0, 4.0)), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(jobs=_jobs, lanes=st.sampled_from([1, 2, 4]), on_lane=st.booleans(), burst=_burst)
def test_the_admission_cache_accepts_a_burst_exactly_as_fits_would(jobs, lanes, on_lane, burst) -> None:
    """The planner's claim for its admission cache (``on_time_cache._EPS``: "accepts exactly what ``fits``
    would", #13): a burst of latest-deadline candidates placed one after another at the tail of the cached
    schedule gets the answer, and the finish, ``fits`` gives against the kept set grown by each accepted one."""
    # B>1 charges prefills on their lanes once the per-token time is measured, else as a backlog before every lane
    model = DeviceModel(0.04, compiled_batch=lanes, prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3,
                        token_s=0.05 if lanes > 1 and on_lane else 0.0)
    admitted = [PendingJob(i, p, d, dl) for i, (p, d, dl) in enumerate(jobs)]
    keep = set(on_time_selection(admitted, 0.0, model).keep)
    kept = [j for j in admitted if j.id in keep]
    cache = _EdfCache(kept, 0.0, model)
    deadline = max((j.deadline for j in kept), default=0.5)
    for n, (prefill, decode, later) in enumerate(burst):
        deadline += later
        cand = PendingJob(100 + n, prefill, decode, deadline)
        placed = cache.place(cand.prefill_tokens, cand.decode_steps, cand.deadline, 0.0, model)
        full = fits(cand, kept, 0.0, model)
        assert (placed is not None) == full.ok
        if placed is None:
            continue
        assert placed == pytest.approx(full.finish, abs=1e-9)
        kept.append(cand)
