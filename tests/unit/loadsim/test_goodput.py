"""Goodput figures of a run (issue #13): records built by hand, the bound on the offered trace,
the estimator's error, and the decode-order policy variants the comparison runs."""

from __future__ import annotations

import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.analysis import SimRequestRecord
from calculet.loadsim.goodput import estimate_error, goodput_figures, offline_bound, trace_of
from calculet.loadsim.policies import PolicyError, deadline_orders, goodput_policies, parse_policies, run_policy
from calculet.loadsim.runner import PolicyRun
from calculet.loadsim.workload import SimRequest, load_preset

COST = CostModel.reference()


def _req(arrival: float, deadline_ms: int | None = 10_000, out: int = 4) -> SimRequest:
    return SimRequest(arrival, "t", 100, out, deadline_ms, None, "short")


def _served(i: int, req: SimRequest, finish: float, reason: str, tokens: int = 4,
            estimate: float | None = None) -> SimRequestRecord:
    times = tuple(req.arrival_s + 0.1 * (k + 1) for k in range(tokens))
    return SimRequestRecord.for_request(i, req, admitted=True, service_start_s=req.arrival_s,
                                        first_token_s=times[0] if times else None, token_times_s=times,
                                        finish_s=finish, finish_reason=reason, estimated_finish_s=estimate)


def test_on_time_means_completed_by_the_deadline() -> None:
    req = _req(1.0)
    assert _served(0, req, 11.0, "length").deadline_s == 11.0
    assert _served(0, req, 11.0, "length").on_time
    assert not _served(0, req, 11.5, "stop").on_time
    assert not _served(0, req, 5.0, "deadline", tokens=2).on_time
    assert _served(0, _req(1.0, None), 500.0, "stop").on_time  # no deadline: any completion


def test_baseline_figures_charge_waste_from_records() -> None:
    reqs = [_req(0.0), _req(0.0), _req(0.0)]
    records = (_served(0, reqs[0], 2.0, "length"), _served(1, reqs[1], 10.0, "deadline", tokens=3),
               SimRequestRecord.for_request(2, reqs[2], admitted=False, rejection_reason="reject_capacity"))
    run = PolicyRun("b1-serial-fcfs", records, (), 10.0, 0.1, prefill_jobs=2, prefill_work_s=1.0, decode_work_s=3.0)
    g = goodput_figures(run, COST, window_s=10.0)
    assert (g.on_time, g.late, g.offered, g.source) == (1, 0, 3, "records")
    assert g.goodput_per_s == pytest.approx(0.1) and g.on_time_fraction == pytest.approx(1 / 3)
    assert g.wasted_tokens == 3
    assert g.wasted_device_s == pytest.approx(COST.prefill_s(100) + 2 * COST.decode_s(1))
    assert g.wasted_share == pytest.approx(g.wasted_device_s / 4.0)
    assert g.estimate is None  # no estimates in the records: omitted, never invented


def test_estimate_error_is_relative_to_the_time_in_system() -> None:
    reqs = [_req(0.0), _req(0.0), _req(0.0), _req(0.0)]
    records = [_served(0, reqs[0], 2.0, "length", estimate=3.0),    # +50 %
               _served(1, reqs[1], 4.0, "length", estimate=3.0),    # -25 %
               _served(2, reqs[2], 4.0, "length", estimate=4.0),    # 0
               _served(3, reqs[3], 4.0, "deadline", estimate=1.0)]  # not completed: not judged
    e = estimate_error(records)
    assert e is not None and e.count == 3
    assert e.median_abs == pytest.approx(0.25) and e.median_signed == pytest.approx(0.0)
    assert e.p90_abs == pytest.approx(0.25 + 0.8 * 0.25)


def test_offline_bound_runs_on_the_offered_trace() -> None:
    burst = [_req(0.0, 3_000, out=32) for _ in range(4)]  # ~1.4 s each on B1: two fit in 3 s
    assert [j.decode_steps for j in trace_of(burst)] == [31] * 4
    b1 = offline_bound(burst, COST)
    assert (b1.bound, b1.method) == (2, "moore-hodgson")
    assert offline_bound(burst, COST, compiled_batch=16).bound == 4


def test_decode_order_variants_are_validated_by_the_configuration() -> None:
    default, values = deadline_orders()
    assert default in values and "strict" in values
    strict = parse_policies("calculet-b1@strict")[0]
    assert strict.deadline_order == "strict" and strict.profiles == (1,)
    assert strict.scheduler_config(load_preset("overload")).batch.deadline_order == "strict"
    names = goodput_policies()
    assert names[0] == "b1-serial-fcfs" and "calculet-b1-shared" in names and "calculet-b16@strict" in names
    assert "calculet-b1" not in names  # one KV lane: the orders cannot differ
    assert [p.name for p in parse_policies("goodput")] == list(names)
    with pytest.raises(PolicyError, match="deadline_order 'sooner'"):
        parse_policies("calculet-b16@sooner")
    with pytest.raises(PolicyError, match="unknown policy"):
        parse_policies("b1-serial-fcfs@strict")  # a baseline has no decode order


def test_the_bound_lets_a_lone_request_run_at_its_fastest_step() -> None:
    """A request alone on calculet-b16 runs at the B1 profile's step (42.5 ms), not B16's (80 ms); on ping/pong a
    lone job is not slowed by the other engine. Mutant: the chain at the largest profile's (ping/pong: slowed)
    step, which excluded such requests as never on time — `goodput --seed 12` B16 tight 0.5× had the bound at 239
    where `at_risk` finished 241 and strict EDF 240."""
    lone = [SimRequest(0.0, "default", 100, 100, 6_000, None, "short")]  # 99 steps: 4.2 s at 42.5 ms, 7.9 s at 80
    [b16] = parse_policies("calculet-b16")
    run = run_policy(b16, lone, load_preset("overload"), COST)
    assert [(r.on_time, r.finish_s < 4.5) for r in run.requests] == [(True, True)]
    assert offline_bound(lone, COST, compiled_batch=16, profiles=b16.profiles).bound == 1
    assert offline_bound(lone, COST, compiled_batch=16).bound == 0  # a device compiling B16 only: too slow
    wait = [_req(0.0, 9_000, out=100)]  # 7.9 s at 80 ms; 15.8 s at 160 ms (80 ms at overlap 0.5)
    assert offline_bound(wait, COST, compiled_batch=16, pingpong=True).bound == 1
