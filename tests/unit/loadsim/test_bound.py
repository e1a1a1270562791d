"""The offline on-time bound (issue #13 item 6): exact where it claims to be, never below a schedule."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.bound import TraceJob, device_model_from_cost, on_time_upper_bound
from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob, edf_finish

B1 = DeviceModel(decode_step_s=0.04, prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3)


def _simulate(trace: list[TraceJob], model: DeviceModel, policy: str) -> int:
    """On-time count of a non-preemptive-prefill, per-step-decode schedule (FCFS or EDF order).

    A request whose deadline has passed is dropped; prefills run before decode steps; a step
    serves up to ``lanes`` prefilled requests in policy order.
    """
    key = (lambda k: (trace[k].arrival_s, k)) if policy == "fcfs" else \
        (lambda k: (math.inf if trace[k].deadline_s is None else trace[k].deadline_s, k))
    left = [j.decode_steps for j in trace]
    prefilled = [False] * len(trace)
    live = set(range(len(trace)))
    t, on_time = 0.0, 0
    while live:
        for k in [k for k in live if trace[k].deadline_s is not None and trace[k].deadline_s < t]:
            live.discard(k)
        present = sorted((k for k in live if trace[k].arrival_s <= t), key=key)
        if not present:
            if live:
                t = min(trace[k].arrival_s for k in live)
            continue
        pending = [k for k in present if not prefilled[k]]
        batch = [] if pending else present[:model.lanes]
        t += model.prefill_s(trace[pending[0]].prompt_tokens) if pending else model.decode_step_s
        if pending:
            prefilled[pending[0]] = True
            batch = [pending[0]] if left[pending[0]] == 0 else []
        else:
            for k in batch:
                left[k] -= 1
        for k in batch:
            if left[k] == 0:
                live.discard(k)
                deadline = trace[k].deadline_s
                on_time += deadline is None or t <= deadline + 1e-9
    return on_time


burst_st = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40), st.floats(0.05, 4.0)), min_size=1, max_size=8)


@pytest.mark.req("R7.2.2")
@settings(max_examples=100)
@given(burst_st)
def test_b1_burst_bound_is_the_brute_force_optimum(raw: list[tuple[int, int, float]]) -> None:
    trace = [TraceJob(0.0, p, s, d) for p, s, d in raw]
    jobs = [PendingJob(i, p, s, d) for i, (p, s, d) in enumerate(raw)]
    best = max(len(c) for r in range(len(jobs) + 1) for c in itertools.combinations(jobs, r)
               if all(edf_finish(list(c), 0.0, B1)[j.id] <= j.deadline + 1e-9 for j in c))
    result = on_time_upper_bound(trace, B1)
    assert result.method == "moore-hodgson"
    assert result.bound == best


trace_st = st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, 300), st.integers(0, 30),
                              st.one_of(st.none(), st.floats(0.05, 3.0))), min_size=1, max_size=10)


@settings(max_examples=60)
@given(trace_st, st.sampled_from([1, 4]))
def test_bound_is_at_least_fcfs_and_edf(raw: list[tuple[float, int, int, float | None]], batch: int) -> None:
    model = DeviceModel(0.04, compiled_batch=batch, prefill_fixed_s=5e-3, prefill_per_token_s=0.6e-3)
    trace = [TraceJob(a, p, s, None if d is None else a + d) for a, p, s, d in raw]
    result = on_time_upper_bound(trace, model)
    assert result.bound <= len(trace)
    assert result.bound >= _simulate(trace, model, "fcfs")
    assert result.bound >= _simulate(trace, model, "edf")


@settings(max_examples=30)
@given(trace_st)
def test_lp_and_release_relaxations_never_fall_below_the_ilp(raw: list[tuple[float, int, int, float | None]]) -> None:
    trace = [TraceJob(a, p, s, None if d is None else a + d) for a, p, s, d in raw]
    ilp = on_time_upper_bound(trace, B1)
    lp = on_time_upper_bound(trace, B1, ilp_max_jobs=0)
    windowed = on_time_upper_bound(trace, B1, lp_max_jobs=0, cuts=4)
    assert lp.bound >= ilp.bound and windowed.bound >= ilp.bound
    assert windowed.method in ("moore-hodgson", "windowed", "release-relaxation")


def test_two_separate_bursts_add_up() -> None:
    burst = [TraceJob(0.0, 0, 25, 1.0)] * 3
    late = [TraceJob(10.0, 0, 25, 11.0)] * 3
    result = on_time_upper_bound(burst + late, DeviceModel(0.04))
    assert result.bound == 2 and result.method == "ilp"


def test_no_deadline_requests_always_count_and_impossible_ones_never() -> None:
    trace = [TraceJob(0.0, 0, 10, None), TraceJob(0.0, 0, 100, 1.0), TraceJob(0.0, 0, 10, 1.0)]
    assert on_time_upper_bound(trace, DeviceModel(0.04)).bound == 2


def test_cost_model_becomes_a_device_model() -> None:
    ref = CostModel.reference()
    assert device_model_from_cost(ref).decode_step_s == pytest.approx(0.0425)
    pp = device_model_from_cost(ref, 16, pingpong=True)
    assert pp.lanes == 32 and pp.decode_step_s == pytest.approx(2 * ref.decode_s(16) / 1.5)
    assert pp.prefill_s(100) == pytest.approx(ref.prefill_s(100) / 1.5)


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_ping_pong_work_is_never_more_than_the_simulated_device_spends(overlap: float) -> None:
    """Jobs of one duration alternating on two engines, each started as its engine frees
    (CostModel.finish_time, the simulator's rule): the bound's pooled work per job times the jobs
    done never exceeds the time they took. Mutant: a job as d / max(r, 0.5) per engine (exactly
    serial at r = 0.5, where the simulator does 1.5 jobs per d) — calculet-b1-pingpong finished more
    on time than that bound on steady, bursty, noisy-neighbour and long-prefill-storm."""
    cost = dataclasses.replace(CostModel.reference(), pingpong_overlap=overlap)
    model = device_model_from_cost(cost, 1, pingpong=True)
    d = cost.decode_s(1)
    work = model.decode_step_s / model.lanes  # device seconds per token of the bound (one lane per job)
    finishes = [cost.finish_time(0.0, d, None)]
    finishes.append(cost.finish_time(0.0, d, finishes[0]))
    for n in range(2, 40):
        finishes.append(cost.finish_time(finishes[n - 2], d, finishes[n - 1]))
    for n, finish in enumerate(finishes, 1):
        assert n * work <= finish + 1e-9
    assert finishes[-1] / len(finishes) == pytest.approx(d / (1 + overlap), rel=0.05)  # the bound is reached
