"""``fair_share_finish`` without a call per job gives the per-job form's floats, bit for bit (issue #20, session 26).

Why: the replan reads it over every kept job (:func:`.on_time_spare.at_risk_prefix`) and its finishes decide who is at
risk and the plan's tolerance; the faster form must decide nothing differently. The reference below is the form it
replaced (the processor-sharing rule written job by job), kept here as the oracle.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob, fair_share_finish


def _reference(jobs: list[PendingJob], now: float, model: DeviceModel) -> dict[int, float]:
    clock, result, step = now, {}, model.lane_step_s
    for job in jobs:
        clock += model.prefill_s(job.prefill_tokens)
        if job.decode_steps == 0:
            result[job.id] = clock
    decoding = [j for j in jobs if j.decode_steps > 0]
    order = sorted(decoding, key=lambda j: j.decode_steps / j.weight)
    wmax_suffix = [0.0] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        wmax_suffix[k] = max(wmax_suffix[k + 1], order[k].weight)
    total_w = sum(j.weight for j in order)
    steps = virtual = 0.0
    for k, job in enumerate(order):
        target = job.decode_steps / job.weight
        steps += (target - virtual) / min(model.lanes / total_w, 1.0 / wmax_suffix[k])
        virtual = target
        total_w -= job.weight
        result[job.id] = clock + steps * step
    return result


_models = st.builds(DeviceModel, decode_step_s=st.floats(1e-4, 0.2), compiled_batch=st.sampled_from([1, 2, 4, 16]),
                    engines=st.sampled_from([1, 2]), prefill_fixed_s=st.floats(0.0, 0.05),
                    prefill_per_token_s=st.floats(0.0, 1e-3), prefill_chunk_tokens=st.sampled_from([None, 1, 64, 256]),
                    token_s=st.sampled_from([0.0, 0.01, 0.3]))
_jobs = st.lists(st.tuples(st.sampled_from([0, 0, 1, 17, 300]), st.integers(0, 200),
                           st.sampled_from([1.0, 1.0, 0.5, 2.0, 3.0])), max_size=40)


@given(_jobs, st.floats(0.0, 1e4), _models)
def test_fair_share_finish_is_the_per_job_form_bit_for_bit(rows: list[tuple[int, int, float]], now: float,
                                                           model: DeviceModel) -> None:
    jobs = [PendingJob(i, tokens, steps, None, weight) for i, (tokens, steps, weight) in enumerate(rows)]
    got, want = fair_share_finish(jobs, now, model), _reference(jobs, now, model)
    assert list(got.items()) == list(want.items())  # the same finishes, in the same order, to the last bit
