"""One lane arithmetic (issue #13 item 2, :mod:`calculet.runtime.scheduling.lane_time`): a latest-deadline job placed at
the admission cache's tail (``_EdfCache.place``), judged by its fast refusal (``_EdfCache.tail_finish``) or by the
HTTP front (``LaneCost.finish`` on the snapshot's lanes) finishes exactly — ``==``, not within a tolerance — where the
planner's full EDF list schedule of the kept jobs and it puts it, and leaves the same lanes.

Why exact: a ``Retry-After`` is a ceiling of lane times, so a last-bit difference between the front's lanes and the
engine's moved it by 1 s (the lagging-engine property test, ``test_admission_snapshot.py``). Mutant caught (checked):
the cache's placement as it was written before (``free + steps × (step + handover) + prefill``, and ``now + steps ×
step + prefill`` on a free lane) — the finishes differ in the last bit on most draws.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob, edf_schedule
from calculet.runtime.scheduling.lane_time import LaneCost, lane_finish
from calculet.runtime.scheduling.on_time_cache import _EdfCache

JOB = st.tuples(st.integers(1, 900), st.integers(0, 200), st.floats(0.5, 60.0))
"""(prompt tokens, decode steps, deadline from now)."""

DEVICE = st.one_of(
    st.builds(DeviceModel, st.floats(0.01, 0.3)),  # B1: the prefill on the lane, no turnover
    st.builds(lambda step, token, slot, batch: DeviceModel(step, batch, token_s=token, slot_token_s=slot),
              st.floats(0.01, 0.3), st.floats(0.01, 0.5), st.floats(0.0, 0.9), st.sampled_from([2, 4, 16])),
).map(lambda m: DeviceModel(m.decode_step_s, m.compiled_batch, prefill_fixed_s=0.013, prefill_per_token_s=3.7e-4,
                            token_s=m.token_s, slot_token_s=m.slot_token_s))


@settings(max_examples=400, deadline=None)
@given(kept=st.lists(JOB, max_size=24), candidate=JOB, model=DEVICE, now=st.floats(0.0, 1e5))
def test_the_cache_the_fast_refusal_and_the_front_place_a_job_where_the_full_schedule_does(
        kept: list[tuple[int, int, float]], candidate: tuple[int, int, float], model: DeviceModel, now: float) -> None:
    assert model.prefill_on_lane  # the case the fast refusal and the front read (off a lane they forward)
    jobs = [PendingJob(i, tokens, steps, now + rel) for i, (tokens, steps, rel) in enumerate(kept)]
    latest = max((j.deadline for j in jobs if j.deadline is not None), default=now)
    tokens, steps, rel = candidate
    job = PendingJob(len(jobs), tokens, steps, latest + rel)  # the latest deadline: appended at the tail
    finish, free = edf_schedule([*jobs, job], now, model)
    cache = _EdfCache(jobs, now, model)
    lanes = list(cache.free)
    assert cache.tail_finish(job, now, model) == finish[job.id]
    assert LaneCost.of(model, tokens, steps).finish(lanes[0], now) == finish[job.id]
    placed = cache.place(tokens, steps, job.deadline, now, model)
    if finish[job.id] <= job.deadline and cache.min_slack >= 0:
        assert placed == finish[job.id] and sorted(cache.free) == sorted(free)


def test_a_lane_free_by_now_starts_the_job_now_without_the_turnover():
    """The rule itself: on a lane free by ``now`` a job holds it its length from ``now``; on a lane held past ``now``
    from when it frees, its length and the turnover summed first (the list schedule's order)."""
    assert lane_finish(3.0, 5.0, 2.0, 7.0) == 7.0 and lane_finish(5.0, 5.0, 2.0, 7.0) == 7.0
    assert lane_finish(6.0, 5.0, 2.0, 7.0) == 15.0
    assert lane_finish(0.1, 0.0, 0.2, 0.3) == 0.1 + (0.2 + 0.3) != (0.1 + 0.2) + 0.3
