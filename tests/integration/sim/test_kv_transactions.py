"""KV transactions on the simulated NPU: inactive lanes, failed jobs, ping/pong independence.

§7.3: an inactive lane writes no KV. §9.2: committed_len grows only when device and output
succeed; a failed job leaves KV as it was. §14: two in-flight jobs have independent buffers and
independent KV transactions. §7.4: a device failure fails the whole batch unless the vendor
declares lane-level isolation.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.calrt import NO_SEQUENCE, JobResult, KvSeqId, ReturnCode, verify_result
from calculet.adapters.sim import InjectedFault, FaultRule, SimCalRT, SimConfig, SimSession, open_sim, package_dir
from calculet.adapters.host_driver import HostDriver
from calculet.clock import FakeClock
from calculet.machines.job import JobEngine


@pytest.fixture
def future() -> Iterator[SimSession]:
    with open_sim("future") as s:
        yield s


def prefilled(driver: HostDriver, n: int, seed: int = 0) -> list[KvSeqId]:
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n):
        seq = driver.kv.allocate_sequence()
        prompt = [256, *rng.integers(0, 256, size=int(rng.integers(3, 30))).tolist()]
        assert driver.prefill(seq, prompt).ok
        seqs.append(seq)
    return seqs


@pytest.mark.req("R18.6", "R7.1.4", "R9.2.4")
def test_inactive_lanes_kv_is_byte_identical_after_a_batch(future: SimSession) -> None:
    driver = HostDriver(future.device, future.calbin, future.kv)
    kv = future.kv
    seqs = prefilled(driver, 5)
    active, parked = seqs[:3], seqs[3:]
    before_parked = {s: kv.inspect(s).backing_sha256 for s in parked}
    lengths = {s: kv.committed_length(s) for s in active}
    active_lanes = (0, 2, 5)
    inactive_seqs = [NO_SEQUENCE, parked[0], NO_SEQUENCE, parked[1], NO_SEQUENCE, NO_SEQUENCE, NO_SEQUENCE,
                     NO_SEQUENCE]
    tokens = {s: 1 for s in active}
    for step in range(3):
        layout: list[tuple[KvSeqId, int] | None] = [None] * 8
        for lane, s in zip(active_lanes, active, strict=True):
            layout[lane] = (s, tokens[s])
        job = driver.decode_job(8, layout, inactive_seqs=inactive_seqs)
        assert list(job.positions[[0, 2, 5]]) == [lengths[s] + step for s in active]
        assert list(job.token_ids[[1, 3, 4, 6, 7]]) == [-1] * 5, "inactive lanes carry the fill token, not 0"
        ticket = future.device.submit(job)
        result = future.device.wait(ticket.job_id, 1.0)
        assert result.ok and verify_result(job, ticket, result).ok
        assert result.counters.kv_tokens_written == 3
        for lane in (1, 3):
            assert not result.lanes[lane].valid and result.lanes[lane].seq_id == inactive_seqs[lane]
        for lane, s in zip(active_lanes, active, strict=True):
            token = result.lanes[lane].greedy_token
            assert token is not None
            tokens[s] = token
    for s in parked:
        assert kv.inspect(s).backing_sha256 == before_parked[s]
    for s in active:
        assert kv.committed_length(s) == lengths[s] + 3


@pytest.mark.req("R9.3.1", "R9.2.5", "R7.4.5", "R18.12")
@pytest.mark.parametrize("kind", [InjectedFault.CCU_FAULT, InjectedFault.DMA_UNKNOWN, InjectedFault.TIMEOUT])
def test_a_failed_batch_commits_nothing_in_any_lane(future: SimSession, kind: InjectedFault) -> None:
    driver = HostDriver(future.device, future.calbin, future.kv)
    kv, dev = future.kv, future.device
    seqs = prefilled(driver, 4, seed=3)
    before = {s: (kv.inspect(s).backing_sha256, kv.committed_length(s)) for s in seqs}
    dev.faults.add(FaultRule(kind, engine=JobEngine.PING))
    ticket = dev.submit(driver.decode_job(4, [(s, 9) for s in seqs]))
    if kind is InjectedFault.TIMEOUT:
        assert dev.wait_any(10.0) == [] and [t.job_id for t in dev.inflight()] == [ticket.job_id]
    else:
        (result,) = dev.wait_any(1.0)
        assert result.rc.name == kind.name
        assert all(lane.rc is result.rc and lane.logits is None for lane in result.lanes)
        assert result.counters.kv_tokens_written == 0
    after = {s: (kv.inspect(s).backing_sha256, kv.committed_length(s)) for s in seqs}
    assert after == before


@pytest.mark.req("R14.3", "R14.4", "R14.10")
def test_ping_and_pong_jobs_have_independent_buffers_and_transactions(future: SimSession) -> None:
    driver = HostDriver(future.device, future.calbin, future.kv)
    kv, dev = future.kv, future.device
    seqs = prefilled(driver, 8, seed=5)
    ping_seqs, pong_seqs = seqs[:4], seqs[4:]
    before = {s: (kv.inspect(s).backing_sha256, kv.committed_length(s)) for s in seqs}
    dev.faults.add(FaultRule(InjectedFault.CCU_FAULT, engine=JobEngine.PONG))
    ping_job = driver.decode_job(4, [(s, 1) for s in ping_seqs], engine=JobEngine.PING)
    pong_job = driver.decode_job(4, [(s, 2) for s in pong_seqs], engine=JobEngine.PONG)
    ids = {ping_job.buffers.input.buffer_id, ping_job.buffers.output.buffer_id,
           pong_job.buffers.input.buffer_id, pong_job.buffers.output.buffer_id}
    assert len(ids) == 4, "each in-flight job has its own InputBuf/OutputBuf"
    ping, pong = dev.submit(ping_job), dev.submit(pong_job)
    results: dict[int, JobResult] = {}
    while len(results) < 2:
        results.update({r.job_id: r for r in dev.wait_any(1.0)})
    assert results[ping.job_id].ok and results[pong.job_id].rc is ReturnCode.CCU_FAULT
    for s in ping_seqs:
        assert kv.committed_length(s) == before[s][1] + 1
    for s in pong_seqs:
        assert (kv.inspect(s).backing_sha256, kv.committed_length(s)) == before[s]
    out = dev.read_buffer(ping_job.buffers.output)
    for lane, s in enumerate(ping_seqs):
        logits = results[ping.job_id].lanes[lane].logits
        assert logits is not None and results[ping.job_id].lanes[lane].seq_id == s
        np.testing.assert_array_equal(out[lane], logits)


def isolated_package(tmp_path: Path) -> Path:
    """The future package with lane-level failure isolation declared by a (hypothetical) vendor."""
    src = package_dir("future")
    data = json.loads((src / "manifest.json").read_text())
    data["capabilities"]["lane_failure_isolation"] = {"value": True, "source": "vendor", "tier": "C2"}
    shutil.copy(src / "weights.bin", tmp_path / "weights.bin")
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.req("R7.4.6")
def test_lane_level_isolation_only_when_the_contract_declares_it(tmp_path: Path) -> None:
    with SimCalRT(SimConfig(clock=FakeClock())).create_virtual_device() as dev:
        calbin = dev.create_calbin(isolated_package(tmp_path))
        assert calbin.capabilities.lane_failure_isolation.value
        dev.configure(calbin)
        kv = dev.create_kv_manager(calbin)
        driver = HostDriver(dev, calbin, kv)
        seqs = prefilled(driver, 4, seed=9)
        lengths = [kv.committed_length(s) for s in seqs]
        dev.faults.add(FaultRule(InjectedFault.CCU_FAULT, lanes=(1,)))
        result = driver.decode(4, [(s, 4) for s in seqs])
        assert result.rc is ReturnCode.CCU_FAULT
        assert [lane.rc for lane in result.lanes] == [ReturnCode.OK, ReturnCode.CCU_FAULT, ReturnCode.OK,
                                                      ReturnCode.OK]
        assert [kv.committed_length(s) for s in seqs] == [n + (i != 1) for i, n in enumerate(lengths)]
        assert result.counters.kv_tokens_written == 3
