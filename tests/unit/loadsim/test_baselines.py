"""Baselines (§1): B1 serial FCFS and software multi-slot round robin on the sim cost model."""

from __future__ import annotations

import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.baselines import (BASELINES, device_bound_limit, simulate_multi_slot,
                                        simulate_serial_fcfs)
from calculet.loadsim.workload import SimRequest, generate_requests, parse_workload

COST = CostModel.reference()
STEP = COST.decode_s(1)


def tiny_workload(**overrides: object):  # noqa: ANN201 - a Workload
    data = {
        "schema": "calculet-loadsim/v1", "name": "tiny", "seed": 11, "duration_s": 60,
        "arrivals": {"kind": "poisson", "rate_per_s": 0.1},
        "prompt_tokens": {"kind": "empirical", "values": [32, 200, 600]},
        "max_new_tokens": {"kind": "lognormal", "median": 16, "sigma": 0.5, "min": 2, "max": 64},
        "tenants": [{"name": "a"}, {"name": "b"}],
    }
    data.update(overrides)
    return parse_workload(data)


def req(arrival: float, prompt: int = 100, out: int = 3, *, deadline_ms: int | None = None,
        cancel_after_s: float | None = None, tenant: str = "a") -> SimRequest:
    return SimRequest(arrival, tenant, prompt, out, deadline_ms, cancel_after_s, "short")


def test_device_bound_limit_uses_the_cost_model() -> None:
    assert device_bound_limit(COST, 16) == pytest.approx(16 / (COST.decode_fixed_s + 16 * COST.decode_per_lane_s))
    assert device_bound_limit(COST, 1) == pytest.approx(1 / STEP)
    assert device_bound_limit(COST, 16) > device_bound_limit(COST, 1)
    for bad in (0, -4, 1.5, True):
        with pytest.raises(DefinitionError):
            device_bound_limit(COST, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["serial", "rr4"])
def test_every_request_completes_below_the_device_bound(policy: str) -> None:
    reqs = generate_requests(tiny_workload())
    assert len(reqs) >= 3
    run = simulate_serial_fcfs(reqs, COST) if policy == "serial" else simulate_multi_slot(reqs, COST, 4)
    assert [r.request_id for r in run.requests] == list(range(len(reqs)))
    for rec, r in zip(run.requests, reqs):
        assert rec.finish_reason == "length" and rec.generated_tokens == r.max_new_tokens
        assert rec.first_token_s is not None and rec.first_token_s >= rec.arrival_s
    summary = run.summary()
    assert summary.completed == len(reqs) and summary.rejected == 0
    assert 0 < summary.output_tokens_per_s < device_bound_limit(COST, 1) < device_bound_limit(COST, 16)
    assert summary.compiled_batches == {1: summary.batches} and summary.fill_ratio == 1.0
    assert summary.batches == sum(r.max_new_tokens - 1 for r in reqs)   # the prefill yields token 1


def test_serial_timing_is_prefill_then_every_decode_step() -> None:
    run = simulate_serial_fcfs([req(0.0, 100, 3), req(0.01, 50, 2)], COST)
    first, second = run.requests
    p1 = COST.prefill_s(100)
    assert first.service_start_s == 0.0
    assert first.token_times_s == pytest.approx((p1, p1 + STEP, p1 + 2 * STEP))
    assert second.service_start_s == pytest.approx(p1 + 2 * STEP)          # FCFS: waits for the first
    assert second.first_token_s == pytest.approx(p1 + 2 * STEP + COST.prefill_s(50))
    assert run.end_s == pytest.approx(second.token_times_s[-1])
    host = simulate_serial_fcfs([req(0.0, 100, 3)], COST, host_overhead_s=0.001)
    assert host.requests[0].token_times_s[-1] == pytest.approx(p1 + 2 * STEP + 0.003)


def test_serial_ttft_grows_with_load() -> None:
    w = tiny_workload(duration_s=200)
    p50, p99, throughput = [], [], []
    for scale in (0.5, 2.0, 5.0, 10.0):          # device utilisation ≈ 0.05 … 0.95
        s = simulate_serial_fcfs(generate_requests(w, load_scale=scale), COST).summary()
        assert s.ttft_s.p50 is not None and s.ttft_s.p99 is not None
        p50.append(s.ttft_s.p50)
        p99.append(s.ttft_s.p99)
        throughput.append(s.output_tokens_per_s)
    assert p50 == sorted(p50) and p99 == sorted(p99)
    assert p99[-1] > 5 * p99[0]
    assert max(throughput) < device_bound_limit(COST, 1)


def test_multi_slot_with_one_slot_is_serial_fcfs() -> None:
    """Two independent implementations (closed form, job by job) of the same policy agree."""
    w = tiny_workload(duration_s=120, deadline_ms={"kind": "lognormal", "median": 8000, "sigma": 1, "min": 500, "max": 60000},
                      cancellation={"probability": 0.3, "delay_s": {"kind": "lognormal", "median": 2, "sigma": 1, "min": 0.05, "max": 30}})
    reqs = generate_requests(w, load_scale=8.0)
    for limit in (None, 2):
        serial = simulate_serial_fcfs(reqs, COST, max_waiting_requests=limit)
        rr1 = simulate_multi_slot(reqs, COST, 1, max_waiting_requests=limit)
        assert len(serial.requests) == len(rr1.requests)
        for a, b in zip(serial.requests, rr1.requests):
            assert (a.admitted, a.rejection_reason, a.finish_reason, a.generated_tokens) == \
                   (b.admitted, b.rejection_reason, b.finish_reason, b.generated_tokens)
            assert a.token_times_s == pytest.approx(b.token_times_s)
            assert (a.finish_s, a.service_start_s) == pytest.approx((b.finish_s, b.service_start_s))
        assert [x.start_s for x in serial.batches] == pytest.approx([x.start_s for x in rr1.batches])
        reasons = serial.summary().finish_reasons
        assert reasons.get("cancelled", 0) > 0 and reasons.get("deadline", 0) > 0
    assert simulate_serial_fcfs(reqs, COST, max_waiting_requests=2).summary().rejected > 0


def test_multi_slot_round_robin_interleaves_slots() -> None:
    reqs = [req(0.0, 10, 4), req(0.0, 10, 4)]
    run = simulate_multi_slot(reqs, COST, 2)
    a, b = run.requests
    p = COST.prefill_s(10)
    # prefill A, decode A (alternation), prefill B, then decode steps alternate B, A, B, A, B
    assert a.first_token_s == pytest.approx(p)
    assert b.service_start_s == pytest.approx(p + STEP)
    assert b.first_token_s == pytest.approx(2 * p + STEP)
    gaps_a = [y - x for x, y in zip(a.token_times_s, a.token_times_s[1:])]
    assert gaps_a[1] == pytest.approx(p + 2 * STEP) and gaps_a[2] == pytest.approx(2 * STEP)
    assert max(b.wait_s for b in run.batches) > 0                     # lanes wait for their turn
    assert run.summary().output_tokens == 8


def test_multi_slot_trades_inter_token_latency_for_ttft_not_throughput() -> None:
    reqs = generate_requests(tiny_workload(duration_s=200), load_scale=8.0)
    serial = simulate_serial_fcfs(reqs, COST).summary()
    slots = simulate_multi_slot(reqs, COST, 4).summary()
    assert slots.ttft_s.p50 < serial.ttft_s.p50                     # type: ignore[operator]
    assert slots.itl_s.p99 > 2 * serial.itl_s.p99                   # type: ignore[operator]
    assert serial.itl_s.p99 == pytest.approx(STEP)
    assert slots.output_tokens == serial.output_tokens
    assert slots.output_tokens_per_s < device_bound_limit(COST, 1)


def test_expiry_while_waiting_and_while_running() -> None:
    reqs = [
        req(0.0, 100, 50),                                   # owns the device for ~2.1 s
        req(0.1, 100, 5, cancel_after_s=0.5),                 # cancelled while waiting
        req(0.2, 100, 50, deadline_ms=3000),                  # starts ~2.2 s, deadline at 3.2 s
    ]
    for run in (simulate_serial_fcfs(reqs, COST), simulate_multi_slot(reqs, COST, 1)):
        first, cancelled, late = run.requests
        assert first.finish_reason == "length"
        assert (cancelled.finish_reason, cancelled.finish_s, cancelled.generated_tokens) == ("cancelled", pytest.approx(0.6), 0)
        assert cancelled.service_start_s is None
        assert late.finish_reason == "deadline" and 0 < late.generated_tokens < 50
        assert all(t < 3.2 for t in late.token_times_s) and late.finish_s >= 3.2  # type: ignore[operator]
    ignored = simulate_serial_fcfs(reqs, COST, enforce_deadlines=False)
    assert ignored.requests[2].finish_reason == "length"


def test_capacity_rejection_and_argument_checks() -> None:
    reqs = [req(0.0), req(0.001), req(0.002), req(0.003)]
    run = simulate_serial_fcfs(reqs, COST, max_waiting_requests=1)
    assert [r.admitted for r in run.requests] == [True, True, False, False]
    assert run.summary().rejections_by_reason == {"reject_capacity": 2}
    with pytest.raises(DefinitionError):
        simulate_multi_slot(reqs, COST, 0)
    with pytest.raises(DefinitionError):
        simulate_serial_fcfs(reqs, COST, host_overhead_s=-1)
    with pytest.raises(DefinitionError):
        simulate_serial_fcfs([req(0.0, 10, 0)], COST)
    assert set(BASELINES) == {"b1-serial-fcfs", "multi-slot-rr"}


def test_instant_device_serves_at_arrival() -> None:
    reqs = generate_requests(tiny_workload())
    run = simulate_multi_slot(reqs, CostModel.instant(), 3)
    assert all(r.token_times_s and set(r.token_times_s) == {r.arrival_s} for r in run.requests)
