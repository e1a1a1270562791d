"""Cost model arithmetic (incl. ping/pong overlap) and fault-rule matching."""

from __future__ import annotations

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import CostModel, FaultInjector, InjectedFault, FaultRule, SimSession
from calculet.adapters.host_driver import HostDriver
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine


def test_decode_cost_grows_with_compiled_batch_and_throughput_with_lanes() -> None:
    cost = CostModel.reference()
    assert cost.decode_s(1) == pytest.approx(0.0425)
    assert cost.decode_s(16) > cost.decode_s(8) > cost.decode_s(4) > cost.decode_s(1)
    tps = [cost.device_bound_tokens_per_s(b) for b in (1, 4, 8, 16)]
    assert tps == sorted(tps) and tps[0] == pytest.approx(1 / 0.0425)
    assert cost.device_bound_tokens_per_s(16, active_lanes=4) == pytest.approx(4 / cost.decode_s(16))
    assert cost.prefill_s(100) == pytest.approx(0.005 + 0.06)
    assert CostModel.instant().device_bound_tokens_per_s(4) == float("inf")


@pytest.mark.parametrize(("overlap", "expected"), [(1.0, 1.5), (0.0, 3.0), (0.5, 2.25)])
def test_pingpong_overlap_factor(overlap: float, expected: float) -> None:
    """A 1.5 s job starting at 0 while the other engine is busy until 1.5 s."""
    cost = CostModel(0, 0, 0, 0, overlap)
    assert cost.finish_time(0.0, 1.5, 1.5) == pytest.approx(expected)
    assert cost.finish_time(2.0, 1.5, 1.5) == pytest.approx(3.5), "no overlap once the other engine is idle"
    assert cost.finish_time(0.0, 1.5, None) == pytest.approx(1.5)


def test_cost_model_rejects_nonsense() -> None:
    with pytest.raises(DefinitionError):
        CostModel(0, 0, -1, 0, 0.5)
    with pytest.raises(DefinitionError):
        CostModel(0, 0, 0, 0, 1.5)


@pytest.mark.req("R14.1")
def test_ping_and_pong_jobs_overlap_on_the_device_per_the_cost_model(future: SimSession) -> None:
    dev, kv = future.device, future.kv
    driver = HostDriver(dev, future.calbin, kv)
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    assert driver.prefill(a, [1, 2, 3]).ok and driver.prefill(b, [4, 5, 6]).ok
    t0 = future.clock.now()
    ping = dev.submit(driver.decode_job(8, [(a, 7)], engine=JobEngine.PING))
    pong = dev.submit(driver.decode_job(8, [(b, 8)], engine=JobEngine.PONG))
    d = dev.cost.decode_s(8)
    expected_pong = dev.cost.finish_time(t0, d, t0 + d)
    results = {r.job_id: r for r in dev.wait_any(1.0)}
    assert set(results) == {ping.job_id}
    assert results[ping.job_id].completed_at == pytest.approx(t0 + d)
    (late,) = dev.wait_any(1.0)
    assert late.job_id == pong.job_id and late.completed_at == pytest.approx(expected_pong)
    assert t0 + d < expected_pong < t0 + 2 * d, "partial overlap (factor 0.5)"
    assert {r.engine for r in (results[ping.job_id], late)} == {JobEngine.PING, JobEngine.PONG}


def test_rule_fires_on_the_nth_matching_submit_only() -> None:
    inj = FaultInjector([FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, engine=JobEngine.PONG, nth=3)])
    decisions = []
    for engine in (JobEngine.PONG, JobEngine.PING, JobEngine.PONG, JobEngine.PONG, JobEngine.PONG):
        decisions.append(inj.decide(JobKind.DECODE, engine, [0]))
    assert decisions.count(None) == 4 and decisions[3] is not None and decisions[3].kind is InjectedFault.TIMEOUT
    assert inj.decide(JobKind.PREFILL, JobEngine.PONG, [0]) is None
    assert inj.statistics().injected[InjectedFault.TIMEOUT] == 1 and inj.statistics().decisions == 6


def test_rule_windows_and_crosstalk_applicability() -> None:
    inj = FaultInjector([FaultRule(InjectedFault.BAD_COUNTERS, nth=2, count=0),
                         FaultRule(InjectedFault.LANE_CROSSTALK, lanes=(1, 3))])
    assert inj.decide(JobKind.DECODE, JobEngine.PING, [0, 1]) is None  # crosstalk rule needs lanes 1 and 3
    first = inj.decide(JobKind.DECODE, JobEngine.PING, [0, 1, 2, 3])
    assert first is not None and first.kind is InjectedFault.BAD_COUNTERS, "earlier rule wins"
    third = inj.decide(JobKind.DECODE, JobEngine.PING, [0, 1, 2, 3])
    assert third is not None and third.kind is InjectedFault.BAD_COUNTERS
    inj.clear()
    assert inj.decide(JobKind.DECODE, JobEngine.PING, [0, 1]) is None
    with pytest.raises(DefinitionError):
        FaultRule(InjectedFault.LANE_CROSSTALK, lanes=(1,))
    with pytest.raises(DefinitionError):
        FaultRule(InjectedFault.TIMEOUT, nth=0)


def test_random_faults_replay_exactly_from_a_seed() -> None:
    rates = {InjectedFault.CCU_FAULT: 0.2, InjectedFault.DEVICE_BUSY: 0.1, InjectedFault.LANE_CROSSTALK: 0.1}

    def run(seed: int) -> list[InjectedFault | None]:
        inj = FaultInjector(seed=seed, rates=rates)
        out = []
        for _ in range(200):
            d = inj.decide(JobKind.DECODE, JobEngine.PING, [0, 1, 2])
            out.append(None if d is None else d.kind)
        return out

    assert run(7) == run(7) and run(7) != run(8)
    kinds = set(run(7))
    assert {InjectedFault.CCU_FAULT, InjectedFault.DEVICE_BUSY, InjectedFault.LANE_CROSSTALK, None} <= kinds
    with pytest.raises(DefinitionError):
        FaultInjector(seed=1, rates={InjectedFault.TIMEOUT: 2.0})


def test_armed_says_whether_decide_can_inject_anything() -> None:
    """``FaultInjector.armed`` is what the null device's plan asks instead of calling ``decide`` (issue #20).
    Mutants caught: ``armed`` not set by ``add`` or ``set_random``, not cleared by ``clear``, or true for rates that
    are all zero (which inject nothing: the null plan would be left for nothing)."""
    inj = FaultInjector()
    assert not inj.armed
    inj.set_random(1, {InjectedFault.TIMEOUT: 0.0})
    assert not inj.armed
    inj.set_random(1, {InjectedFault.TIMEOUT: 0.5})
    assert inj.armed
    inj.clear()
    assert not inj.armed
    inj.add(FaultRule(InjectedFault.BAD_COUNTERS, nth=2))
    assert inj.armed
    assert FaultInjector([FaultRule(InjectedFault.BAD_COUNTERS)]).armed
    assert FaultInjector(seed=3, rates={InjectedFault.CCU_FAULT: 0.1}).armed
