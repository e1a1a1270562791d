"""The simulated VirtualDevice: one per process, device-global configure, submit validation, time modes."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    BufferInUse,
    CalRT,
    Calbin,
    DeviceAlreadyExists,
    DeviceBusy,
    DeviceInvalidArgument,
    DeviceInvalidState,
    DeviceNotFound,
    DeviceTimeout,
    JobKind,
    KvManager,
    OperationNotSupported,
    ReturnCode,
    VirtualDevice,
    verify_result,
)
from calculet.adapters.calrt import MaskContract
from calculet.adapters.sim import (
    CostModel,
    SimCalRT,
    SimConfig,
    SimSession,
    TimeMode,
    open_sim,
    package_dir,
)
from calculet.adapters.sim.build import build_package
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim.faults import InjectedFault, FaultRule
from calculet.adapters.sim.model import pseudo_next_token
from calculet.errors import DefinitionError
from calculet.clock import FakeClock
from calculet.machines.job import JobEngine

PROMPT = [256, *b"batching"]


def test_sim_implements_the_calrt_protocols(current: SimSession) -> None:
    assert isinstance(current.runtime, CalRT)
    assert isinstance(current.device, VirtualDevice)
    assert isinstance(current.calbin, Calbin)
    assert isinstance(current.kv, KvManager)


@pytest.mark.req("R3.4", "R3.2")
def test_only_one_physical_virtual_device_per_process() -> None:
    rt = SimCalRT(SimConfig(clock=FakeClock()))
    dev = rt.create_virtual_device()
    with pytest.raises(DeviceAlreadyExists) as exc:
        rt.create_virtual_device()
    assert exc.value.rc is ReturnCode.ALREADY_EXISTS
    stats = rt.statistics()
    assert (stats.live_devices, stats.devices_created, stats.devices_refused) == (1, 1, 1)
    dev.close()
    dev.close()
    assert rt.statistics().live_devices == 0
    again = rt.create_virtual_device()
    assert rt.statistics().live_devices == 1 and again is not dev
    again.close()


@pytest.mark.req("R1.8", "R3.6")
def test_a_second_physical_device_index_is_refused_as_c4() -> None:
    rt = SimCalRT(SimConfig(clock=FakeClock()))
    with pytest.raises(OperationNotSupported, match="one physical device per process"):
        rt.create_virtual_device(physical_index=1)


@pytest.mark.req("R1.7", "R13.2.2", "R13.1.2", "R12.6", "R12.9")
def test_second_model_is_refused_and_time_switching_needs_full_teardown(future: SimSession) -> None:
    dev, kv, calbin = future.device, future.kv, future.calbin
    baseline = dev.statistics().memory.used_bytes
    with pytest.raises(OperationNotSupported, match="co-resident") as exc:
        dev.create_calbin(package_dir("current"))
    assert exc.value.rc is ReturnCode.NOT_SUPPORTED
    assert dev.statistics().memory.used_bytes == baseline, "a refused load leaves no reservation behind"

    driver = HostDriver(dev, calbin, kv)
    seq = kv.allocate_sequence()
    assert driver.prefill(seq, PROMPT).ok
    with pytest.raises(DeviceInvalidState, match="buffer"):
        dev.destroy_calbin(calbin)
    driver.close()
    with pytest.raises(DeviceInvalidState, match="KvManager"):
        dev.destroy_calbin(calbin)
    with pytest.raises(DeviceInvalidState, match="free them first"):
        dev.destroy_kv_manager(kv)
    kv.free_sequence(seq)
    dev.destroy_kv_manager(kv)
    dev.destroy_calbin(calbin)
    stats = dev.statistics()
    assert (stats.calbins, stats.kv_managers, stats.buffers, stats.memory.used_bytes) == (0, 0, 0, 0)

    other = dev.create_calbin(package_dir("current"))
    dev.configure(other)
    kv2 = dev.create_kv_manager(other)
    assert HostDriver(dev, other, kv2).check_golden(other.golden[0]).ok


@pytest.mark.req("R11.14", "R13.1.2")
def test_configure_is_device_global_even_when_models_may_coreside(tmp_path: Path) -> None:
    """With a vendor-declared co-residency contract two calbins load, but configure stays global."""
    src = package_dir("current")
    data = json.loads((src / "manifest.json").read_text())
    data["capabilities"]["model_coresidency"] = {"value": True, "source": "vendor", "tier": "C0"}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(src / "weights.bin", tmp_path / name / "weights.bin")
        data["name"] = f"model-{name}"
        (tmp_path / name / "manifest.json").write_text(json.dumps(data))
    with SimCalRT(SimConfig(clock=FakeClock())).create_virtual_device() as dev:
        a = dev.create_calbin(tmp_path / "a")
        b = dev.create_calbin(tmp_path / "b")
        dev.configure(a)
        with pytest.raises(DeviceInvalidState, match="device-global"):
            dev.configure(b)
        dev.reset_configuration()
        dev.configure(b)
        assert b.configured_profiles == (1,) and a.configured_profiles == ()


@pytest.mark.req("R8.4")
def test_several_profiles_need_multi_profile_residency() -> None:
    with SimCalRT(SimConfig(clock=FakeClock())).create_virtual_device() as dev:
        calbin = dev.create_calbin(package_dir("current", profiles=[1, 4]))
        with pytest.raises(OperationNotSupported, match="multi-profile residency"):
            dev.configure(calbin)
        dev.configure(calbin, [1])
        kv = dev.create_kv_manager(calbin)
        with pytest.raises(DeviceInvalidArgument, match="B4 is not configured"):
            dev.allocate_job_buffers(calbin, JobKind.DECODE, 4)
        assert HostDriver(dev, calbin, kv).check_golden(calbin.golden[1]).ok


@pytest.mark.req("R1.2", "R1.3", "R15.14")
def test_current_product_runs_one_b1_job_at_a_time_on_ping_only(current: SimSession) -> None:
    dev, kv = current.device, current.kv
    driver = HostDriver(dev, current.calbin, kv)
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    with pytest.raises(OperationNotSupported, match="PONG"):
        dev.submit(driver.prefill_job(a, PROMPT, engine=JobEngine.PONG))
    ticket = dev.submit(driver.prefill_job(a, PROMPT))
    other = dataclasses.replace(driver.prefill_job(b, PROMPT),
                                buffers=dev.allocate_job_buffers(current.calbin, JobKind.PREFILL))
    with pytest.raises(DeviceBusy) as exc:
        dev.submit(other)
    assert exc.value.rc is ReturnCode.DEVICE_BUSY
    assert dev.wait(ticket.job_id, 1.0).ok
    assert dev.wait(dev.submit(other).job_id, 1.0).ok
    assert dev.statistics().submit_refused == {ReturnCode.NOT_SUPPORTED: 1, ReturnCode.DEVICE_BUSY: 1}


@pytest.mark.req("R6.5")
def test_chunked_prefill_needs_the_incremental_prefill_capability(current: SimSession, future: SimSession) -> None:
    for session, allowed in ((current, False), (future, True)):
        driver = HostDriver(session.device, session.calbin, session.kv)
        seq = session.kv.allocate_sequence()
        assert driver.prefill(seq, PROMPT[:4]).ok
        if allowed:
            assert driver.prefill(seq, PROMPT[4:]).ok
            assert session.kv.committed_length(seq) == len(PROMPT)
        else:
            with pytest.raises(OperationNotSupported, match="incremental prefill"):
                driver.prefill(seq, PROMPT[4:])
            assert session.kv.committed_length(seq) == 4


@pytest.mark.req("R9.2.4", "R9.2.1", "R7.1.4", "R7.3.1", "R7.4.4")
def test_submit_refuses_malformed_lanes_before_anything_runs(future: SimSession) -> None:
    dev, kv = future.device, future.kv
    driver = HostDriver(dev, future.calbin, kv)
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    assert driver.prefill(a, PROMPT).ok and driver.prefill(b, PROMPT).ok
    good = driver.decode_job(4, [(a, 5), (b, 6)])
    cases = {
        "position": good._replace(positions=np.array([3, len(PROMPT), 0, 0])),
        "two valid lanes": good._replace(seq_ids=(a, a, 0, 0)),
        "never pad with token 0": good._replace(token_ids=np.array([5, 6, 0, -1])),
        "outside vocab": good._replace(token_ids=np.array([5, 999, -1, -1])),
        "no valid lane": good._replace(lane_valid=np.zeros(4, dtype=np.uint8)),
        "no sequence": good._replace(seq_ids=(a, NO_SEQUENCE, 0, 0)),
        "lane_valid must be 0/1": good._replace(lane_valid=np.array([1, 2, 0, 0], dtype=np.uint8)),
    }
    for needle, job in cases.items():
        with pytest.raises(DeviceInvalidArgument, match=needle):
            dev.submit(job)
    with pytest.raises(DeviceNotFound):
        dev.submit(good._replace(seq_ids=(a, b, 999, 0)))
    assert kv.committed_length(a) == kv.committed_length(b) == len(PROMPT)
    assert dev.statistics().submitted == 2
    assert verify_result(good, dev.submit(good), dev.wait_any(1.0)[0]).ok


@pytest.mark.req("R7.3.3")
def test_profile_without_mask_contract_cannot_run_partial_batches(tmp_path: Path) -> None:
    build_package(tmp_path, variant="future", profiles=[1, 4], batched_mask=MaskContract.NONE)
    with SimCalRT(SimConfig(clock=FakeClock())).create_virtual_device() as dev:
        calbin = dev.create_calbin(tmp_path)
        dev.configure(calbin)
        kv = dev.create_kv_manager(calbin)
        driver = HostDriver(dev, calbin, kv)
        seqs = [kv.allocate_sequence() for _ in range(4)]
        for s in seqs:
            assert driver.prefill(s, PROMPT).ok
        with pytest.raises(DeviceInvalidArgument, match="no mask contract"):
            driver.decode(4, [(seqs[0], 1), (seqs[1], 2)])
        assert driver.decode(4, [(s, 3) for s in seqs]).ok


@pytest.mark.req("R14.3")
def test_a_buffer_is_bound_until_its_job_completes(future: SimSession) -> None:
    dev, kv = future.device, future.kv
    driver = HostDriver(dev, future.calbin, kv)
    a, b = kv.allocate_sequence(), kv.allocate_sequence()
    job_a = driver.prefill_job(a, PROMPT)
    ticket = dev.submit(job_a)
    with pytest.raises(BufferInUse) as exc:
        dev.submit(dataclasses.replace(driver.prefill_job(b, PROMPT), engine=JobEngine.PONG))
    assert exc.value.rc is ReturnCode.BUFFER_IN_USE
    with pytest.raises(BufferInUse):
        dev.free_job_buffers(job_a.buffers)
    assert dev.statistics().buffers_bound == 2
    assert dev.wait(ticket.job_id, 1.0).ok
    dev.free_job_buffers(job_a.buffers)
    with pytest.raises(DeviceNotFound):
        dev.read_buffer(job_a.buffers.output)


def test_virtual_time_follows_the_cost_model_and_poll(future: SimSession) -> None:
    dev, kv, clock = future.device, future.kv, future.clock
    driver = HostDriver(dev, future.calbin, kv)
    seq = kv.allocate_sequence()
    ticket = dev.submit(driver.prefill_job(seq, PROMPT))
    due = dev.next_completion_time()
    assert due is not None and due == pytest.approx(dev.cost.prefill_s(len(PROMPT)))
    assert dev.poll() == [] and [t.job_id for t in dev.inflight()] == [ticket.job_id]
    clock.set(due - 1e-9)
    assert dev.poll() == []
    clock.set(due)
    (result,) = dev.poll()
    assert result.job_id == ticket.job_id and result.completed_at == pytest.approx(due)
    assert dev.next_completion_time() is None and dev.poll() == []
    assert dev.wait_any(0.5) == [] and clock.now() == pytest.approx(due + 0.5), "waiting consumes virtual time"
    with pytest.raises(DeviceNotFound, match="already collected"):
        dev.wait(ticket.job_id, 1.0)


def test_virtual_wait_timeout_advances_the_clock_and_keeps_the_job(future: SimSession) -> None:
    dev, kv, clock = future.device, future.kv, future.clock
    driver = HostDriver(dev, future.calbin, kv)
    ticket = dev.submit(driver.prefill_job(kv.allocate_sequence(), PROMPT))
    due = dev.next_completion_time()
    assert due is not None
    with pytest.raises(DeviceTimeout) as exc:
        dev.wait(ticket.job_id, due / 4)
    assert exc.value.rc is ReturnCode.TIMEOUT and clock.now() == pytest.approx(due / 4)
    assert dev.wait(ticket.job_id, due).ok and clock.now() == pytest.approx(due)
    assert dev.statistics().wait_timeouts == 1


def test_real_time_mode_completes_jobs_on_the_device_worker() -> None:
    cfg = SimConfig(time_mode=TimeMode.REAL, cost=CostModel.tiny())
    with open_sim("future", config=cfg) as session:
        dev, kv = session.device, session.kv
        driver = HostDriver(dev, session.calbin, kv, timeout_s=10.0)
        seq = kv.allocate_sequence()
        caller = threading.current_thread()
        assert driver.prefill(seq, PROMPT).ok
        tickets = [dev.submit(driver.decode_job(4, [(seq, 7)], engine=JobEngine.PING))]
        results = dev.wait_any(10.0)
        assert [r.job_id for r in results] == [t.job_id for t in tickets]
        assert any(t.name.startswith("calrt-sim-dev") for t in threading.enumerate() if t is not caller)
        dev.faults.add(FaultRule(InjectedFault.TIMEOUT))
        hung = dev.submit(driver.decode_job(1, [(seq, 9)]))
        with pytest.raises(DeviceTimeout):
            dev.wait(hung.job_id, 0.05)
        assert dev.statistics().inflight_never_completing == 1
    with pytest.raises(DefinitionError, match="FakeClock"):
        SimConfig(time_mode=TimeMode.REAL, clock=FakeClock()).resolved_clock()


def test_numerics_off_mode_keeps_lengths_tags_and_deterministic_tokens() -> None:
    with open_sim("future", config=SimConfig(clock=FakeClock(), numerics=False)) as session:
        dev, kv = session.device, session.kv
        driver = HostDriver(dev, session.calbin, kv)
        seqs = [kv.allocate_sequence() for _ in range(3)]
        firsts = [driver.prefill(s, PROMPT[: 3 + i]) for i, s in enumerate(seqs)]
        for i, r in enumerate(firsts):
            assert r.lanes[0].logits is None
            assert r.lanes[0].greedy_token == pseudo_next_token(PROMPT[2 + i], 2 + i)
        res = driver.decode(8, [(s, 11) for s in seqs])
        for i, lane in enumerate(res.lanes[:3]):
            assert lane.greedy_token == pseudo_next_token(11, 3 + i) and lane.kv_len == 4 + i
        assert kv.inspect(seqs[0]).k is None and kv.committed_length(seqs[2]) == 6
        outcome = driver.check_golden(session.calbin.golden[0])
        assert not outcome.ok and "numerics off" in outcome.detail


def test_every_component_reports_frozen_statistics(future: SimSession) -> None:
    dev = future.device
    driver = HostDriver(dev, future.calbin, future.kv)
    driver.prefill(future.kv.allocate_sequence(), PROMPT)
    stats = [future.runtime.statistics(), dev.statistics(), future.kv.statistics(), future.calbin.statistics(),
             dev.faults.statistics(), dev.memory.statistics(), dev.cost.statistics(), driver.statistics()]
    assert future.calbin.model is not None
    stats.append(future.calbin.model.statistics())
    for s in stats:
        assert dataclasses.is_dataclass(s)
        field = dataclasses.fields(s)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(s, field, None)
    assert dev.statistics().completed == {ReturnCode.OK: 1}
    assert future.calbin.statistics().prefill_tokens == len(PROMPT)
