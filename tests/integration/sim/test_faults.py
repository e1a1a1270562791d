"""Fault injection on the simulated NPU: every kind, its return code, and no late completion.

R19.2: every error code is visible. §14 degrade inputs (crosstalk, counter anomaly, DeviceBusy,
timeout) must be observable by the runtime from tags, counters and return codes alone. §12: a
timed-out job's buffers are never released or reused before recovery, so the job can never
complete late into a buffer the runtime has reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from calculet.adapters.calrt import (
    Anomaly,
    BufferInUse,
    DeviceBusy,
    DeviceInvalidState,
    DeviceNotFound,
    DeviceTimeout,
    JobKind,
    KvSeqId,
    ReturnCode,
    verify_result,
)
from calculet.adapters.sim import InjectedFault, FaultRule, SimConfig, SimSession, open_sim
from calculet.adapters.host_driver import HostDriver
from calculet.clock import FakeClock
from calculet.machines.job import JobEngine


@pytest.fixture
def future() -> Iterator[SimSession]:
    with open_sim("future") as s:
        yield s


def setup(session: SimSession, n: int = 4) -> tuple[HostDriver, list[KvSeqId]]:
    driver = HostDriver(session.device, session.calbin, session.kv)
    seqs = []
    for i in range(n):
        seq = session.kv.allocate_sequence()
        assert driver.prefill(seq, [256, 10 + i, 20 + i, 30 + i]).ok
        seqs.append(seq)
    return driver, seqs


@pytest.mark.req("R19.2", "R9.2.6", "R14.8")
def test_timeout_job_never_completes_and_wait_reports_timeout(future: SimSession) -> None:
    driver, seqs = setup(future)
    dev = future.device
    dev.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE))
    ticket = dev.submit(driver.decode_job(4, [(s, 1) for s in seqs]))
    assert dev.next_completion_time() is None
    with pytest.raises(DeviceTimeout) as exc:
        dev.wait(ticket.job_id, 5.0)
    assert exc.value.rc is ReturnCode.TIMEOUT
    future.clock.advance(3600.0)
    assert dev.poll() == [] and dev.statistics().inflight_never_completing == 1
    with pytest.raises(DeviceInvalidState, match="being written"):
        dev.submit(driver.decode_job(4, [(s, 1) for s in seqs], engine=JobEngine.PONG))
    other = future.kv.allocate_sequence()
    with pytest.raises(DeviceBusy, match="engine PING is running"):
        dev.submit(driver.prefill_job(other, [256, 1]))
    assert driver.prefill(other, [256, 1], engine=JobEngine.PONG).ok, "the other engine still works"


@pytest.mark.req("R19.2", "R15.17")
@pytest.mark.parametrize(("kind", "rc"), [(InjectedFault.CCU_FAULT, ReturnCode.CCU_FAULT),
                                          (InjectedFault.DMA_UNKNOWN, ReturnCode.DMA_UNKNOWN)])
def test_ccu_and_dma_faults_are_reported_and_block_the_device_until_reset(
        future: SimSession, kind: InjectedFault, rc: ReturnCode) -> None:
    driver, seqs = setup(future)
    dev = future.device
    dev.faults.add(FaultRule(kind))
    job = driver.decode_job(4, [(s, 1) for s in seqs])
    result = dev.wait(dev.submit(job).job_id, 1.0)
    assert result.rc is rc and not result.ok and "rule[0]" in result.message
    assert [lane.rc for lane in result.lanes] == [rc] * 4
    out = dev.read_buffer(job.buffers.output)
    assert np.isnan(out).all() if kind is InjectedFault.DMA_UNKNOWN else not np.isnan(out).any()
    with pytest.raises(DeviceInvalidState, match=rc.name) as exc:
        dev.submit(job)
    assert exc.value.rc is ReturnCode.INVALID_STATE
    assert dev.statistics().poisoned is rc and dev.statistics().completed[rc] == 1
    dev.reset_configuration()
    assert dev.statistics().poisoned is None and dev.statistics().resets == 1
    dev.configure(future.calbin)
    kv = dev.create_kv_manager(future.calbin)
    assert HostDriver(dev, future.calbin, kv).check_golden(future.calbin.golden[0]).ok


@pytest.mark.req("R19.2", "R14.8")
def test_device_busy_is_injected_at_submit(future: SimSession) -> None:
    driver, seqs = setup(future)
    dev = future.device
    dev.faults.add(FaultRule(InjectedFault.DEVICE_BUSY, job_kind=JobKind.DECODE, count=2))
    job = driver.decode_job(4, [(s, 1) for s in seqs])
    for _ in range(2):
        with pytest.raises(DeviceBusy, match="injected") as exc:
            dev.submit(job)
        assert exc.value.rc is ReturnCode.DEVICE_BUSY
    assert dev.statistics().inflight == 0 and dev.statistics().buffers_bound == 0
    assert dev.wait(dev.submit(job).job_id, 1.0).ok
    assert dev.statistics().submit_refused[ReturnCode.DEVICE_BUSY] == 2


@pytest.mark.req("R19.2", "R14.5", "R7.4.2")
def test_lane_crosstalk_swaps_outputs_with_their_tags_and_is_detected(future: SimSession) -> None:
    driver, seqs = setup(future)
    dev = future.device
    reference = driver.decode_job(4, [(s, 1) for s in seqs])
    dev.faults.add(FaultRule(InjectedFault.LANE_CROSSTALK, lanes=(0, 2)))
    ticket = dev.submit(reference)
    result = dev.wait(ticket.job_id, 1.0)
    assert result.rc is ReturnCode.OK, "crosstalk is silent at the return-code level"
    check = verify_result(reference, ticket, result)
    assert check.has(Anomaly.CROSSTALK) and not check.has(Anomaly.COUNTERS)
    assert (result.lanes[0].lane, result.lanes[0].seq_id) == (2, seqs[2])
    assert (result.lanes[2].lane, result.lanes[2].seq_id) == (0, seqs[0])
    # The KV transaction itself was correct: each sequence advanced by one token.
    assert all(future.kv.committed_length(s) == 5 for s in seqs)


@pytest.mark.req("R19.2", "R14.6")
def test_wrong_status_counters_are_detected(future: SimSession) -> None:
    driver, seqs = setup(future)
    dev = future.device
    prev = dev.wait(dev.submit(driver.decode_job(4, [(s, 1) for s in seqs])).job_id, 1.0).counters.engine_sequence
    dev.faults.add(FaultRule(InjectedFault.BAD_COUNTERS))
    job = driver.decode_job(4, [(s, 2) for s in seqs])
    ticket = dev.submit(job)
    result = dev.wait(ticket.job_id, 1.0)
    assert result.rc is ReturnCode.OK
    check = verify_result(job, ticket, result, previous_engine_sequence=prev)
    assert check.has(Anomaly.COUNTERS) and not check.has(Anomaly.CROSSTALK)
    assert len(check.anomalies) == 3


@pytest.mark.req("R12.10", "R12.11", "R9.2.6", "R14.10")
def test_timed_out_job_never_completes_late_into_a_reused_buffer(future: SimSession) -> None:
    driver, seqs = setup(future, 2)
    dev, kv, clock = future.device, future.kv, future.clock
    # The 3rd decode job on engine PONG times out.
    dev.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, engine=JobEngine.PONG, nth=3))
    for step in range(2):
        assert driver.decode(4, [(seqs[0], 1)], engine=JobEngine.PONG).ok
    stuck_job = driver.decode_job(4, [(seqs[0], 1)], engine=JobEngine.PONG)
    stuck = dev.submit(stuck_job)
    healthy = dev.submit(driver.decode_job(4, [(seqs[1], 1)], engine=JobEngine.PING))
    with pytest.raises(DeviceTimeout):
        dev.wait(stuck.job_id, 2.0)
    assert [r.job_id for r in dev.poll()] == [healthy.job_id], "the other engine's job drains normally"

    # Before recovery the stuck job's buffers can be neither reused nor freed, nor its KV touched.
    retry = stuck_job._replace(seq_ids=(seqs[1], 0, 0, 0),
                                positions=np.array([kv.committed_length(seqs[1]), 0, 0, 0]))
    with pytest.raises(BufferInUse):
        dev.submit(retry._replace(engine=JobEngine.PING))
    with pytest.raises(BufferInUse):
        dev.free_job_buffers(stuck_job.buffers)
    with pytest.raises(DeviceInvalidState):
        kv.free_sequence(seqs[0])
    assert dev.statistics().buffers_bound == 2

    # Recovery: reset discards the job; its buffers die with the configuration.
    dev.reset_configuration()
    with pytest.raises(DeviceInvalidState, match="discarded by a reset"):
        dev.wait(stuck.job_id, 1.0)
    with pytest.raises(DeviceNotFound):
        dev.read_buffer(stuck_job.buffers.output)
    dev.configure(future.calbin)
    kv2 = dev.create_kv_manager(future.calbin)
    fresh = HostDriver(dev, future.calbin, kv2)
    seq = kv2.allocate_sequence()
    assert fresh.prefill(seq, [256, 1, 2]).ok
    job = fresh.decode_job(4, [(seq, 3)], engine=JobEngine.PONG)
    mine = dev.wait(dev.submit(job).job_id, 1.0)
    clock.advance(3600.0)
    assert dev.poll() == [] and dev.wait_any(10.0) == []
    assert dev.statistics().inflight == 0 and dev.statistics().discarded_by_reset == 1
    out = dev.read_buffer(job.buffers.output)
    assert mine.lanes[0].logits is not None
    np.testing.assert_array_equal(out[0], mine.lanes[0].logits)
    assert not out[1:].any(), "nothing but this job's lane was ever written into the reused buffer"


@pytest.mark.req("R19.2", "R17.3.6")
def test_random_faults_replay_from_a_seed_and_every_code_is_counted() -> None:
    rates = {InjectedFault.CCU_FAULT: 0.05, InjectedFault.DEVICE_BUSY: 0.1, InjectedFault.LANE_CROSSTALK: 0.1,
             InjectedFault.BAD_COUNTERS: 0.1}

    def run(seed: int) -> list[str]:
        cfg = SimConfig(clock=FakeClock(), fault_seed=seed, fault_rates=rates, fault_requires_reset=False)
        events: list[str] = []
        with open_sim("future", config=cfg) as s:
            dev = s.device
            driver = HostDriver(dev, s.calbin, s.kv)
            dev.faults.clear()  # prefill the sequences without faults, then turn them on
            seqs = setup(s, 4)[1]
            dev.faults.set_random(seed, rates)
            tokens = {q: 1 for q in seqs}
            for _ in range(60):
                job = driver.decode_job(4, [(q, tokens[q]) for q in seqs])
                try:
                    ticket = dev.submit(job)
                except DeviceBusy:
                    events.append("busy")
                    continue
                result = dev.wait(ticket.job_id, 1.0)
                check = verify_result(job, ticket, result)
                events.append(f"{result.rc.name}:{','.join(sorted({a.value for a, _ in check.anomalies}))}")
                for lane in result.lanes:
                    if lane.rc is ReturnCode.OK and lane.valid and lane.greedy_token is not None:
                        tokens[KvSeqId(lane.seq_id)] = lane.greedy_token
            stats = dev.statistics()
            assert stats.submit_refused.get(ReturnCode.DEVICE_BUSY, 0) == events.count("busy")
            assert sum(stats.completed.values()) == len(events) - events.count("busy") + 4
        return events

    first = run(11)
    assert first == run(11)
    assert {"busy", "OK:", "OK:crosstalk", "OK:counters"} <= set(first)
    assert any(e.startswith("CCU_FAULT") for e in first)
