"""The null device's per-token shortcuts (issue #20) keep the device's contract.

* ``DecodeJob.lanes`` (plain values converted once) can never disagree with the job's arrays: those are
  read-only copies, so neither the caller nor a reader can change one without the other.
* The DMA writes only the payload and zeroes what an earlier, longer payload left in the InputBuf: the
  buffer always holds exactly the current job's bytes followed by zeros (§14: each job's own input).
* A submit that finds no Wait/WaitAny caller skips the notify, and one that does wakes it (no lost wake-up).
* The device still refuses what it refused before the shortcuts: a position off the committed length
  (§9.2, R9.2.4) and an inactive lane padded with token 0 (§7.3).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from calculet.adapters.calrt import NO_SEQUENCE, DecodeJob, JobKind, ReturnCode
from calculet.adapters.host_driver import HostDriver
from calculet.adapters.sim import CostModel, SimConfig, SimSession, TimeMode, open_sim
from calculet.adapters.sim.submit_checks import payload
from calculet.errors import CalculetError
from calculet.machines.job import JobEngine


@pytest.fixture
def null() -> Iterator[tuple[SimSession, HostDriver]]:
    """The null device in real time (the one ``--sim-cost null`` serves on) and a host driver over it."""
    session = open_sim("future", config=SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null()))
    try:
        yield session, HostDriver(session.device, session.calbin, session.kv, generation=1)
    finally:
        session.device.close()


def test_decode_job_lanes_are_the_arrays_as_plain_values_and_the_arrays_are_frozen_copies() -> None:
    tokens = np.array([5, -1, 7], dtype=np.int32)
    positions = np.array([3, 0, 9], dtype=np.int32)
    valid = np.array([1, 0, 1], dtype=np.uint8)
    no_buffers: Any = None  # the job's own fields are what is checked here
    job = DecodeJob(generation=1, calbin_id=1, compiled_batch=3, engine=JobEngine.PING, buffers=no_buffers,
                    seq_ids=(11, 0, 12), token_ids=tokens, positions=positions, lane_valid=valid)
    assert job.lanes.tokens == (5, -1, 7) and job.lanes.positions == (3, 0, 9) and job.lanes.valid == (1, 0, 1)
    assert job.lanes.seqs == (11, 0, 12) and job.lanes.active == (0, 2) == job.active_lanes
    assert all(type(v) is int for v in (*job.lanes.tokens, *job.lanes.positions, *job.lanes.seqs))
    tokens[0] = 99  # the caller's array is not the job's
    assert job.token_ids[0] == 5 and job.lanes.tokens[0] == 5
    for arr in (job.token_ids, job.positions, job.lane_valid):
        with pytest.raises(ValueError):
            arr[0] = 1


def test_the_input_buffer_holds_exactly_the_current_payload_then_zeros(null: tuple[SimSession, HostDriver]) -> None:
    session, driver = null
    device = session.device
    a, b = session.kv.allocate_sequence(), session.kv.allocate_sequence()
    assert driver.prefill(a, [256, 72, 105, 33]).ok and driver.prefill(b, [256, 9]).ok
    in_buf = driver.buffers(JobKind.DECODE, 4).input

    def ran(lanes: list[tuple[int, int] | None]) -> bytes:
        job = driver.decode_job(4, lanes)  # type: ignore[arg-type]
        device.submit(job)
        assert all(r.ok for r in device.poll())
        data = payload(job)
        held = device.read_buffer(in_buf)
        assert bytes(held[: len(data)]) == data and not held[len(data):].any()
        return data

    long = ran([(a, 1), (b, 2), None, None])
    other = ran([(a, 3)])  # same profile and buffer: a payload of the same length, other bytes
    assert long != other
    prefill_in = driver.buffers(JobKind.PREFILL, 1).input
    for tokens in ([256, 1, 2, 3, 4, 5, 6, 7], [256, 8]):  # a long prefill payload, then a short one
        seq = session.kv.allocate_sequence()
        job = driver.prefill_job(seq, tokens)
        device.submit(job)
        assert all(r.ok for r in device.poll())
        held = device.read_buffer(prefill_in)
        data = payload(job)
        assert bytes(held[: len(data)]) == data and not held[len(data):].any()


def test_a_submit_wakes_a_waitany_caller_and_skips_the_notify_when_nobody_waits(
        null: tuple[SimSession, HostDriver]) -> None:
    session, driver = null
    device = session.device
    seq = session.kv.allocate_sequence()
    notified: list[int] = []
    real = device._cond.notify_all  # noqa: SLF001 - observing the device's condition
    device._cond.notify_all = lambda: notified.append(1) or real()  # type: ignore[method-assign]
    device.submit(driver.prefill_job(seq, [256, 72]))
    assert notified == [] and device.timeline.sleepers == 0  # nobody waits: no notify
    first = device.poll()
    assert [r.ok for r in first] == [True]
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.extend(device.wait_any(30.0)))
    waiter.start()
    while device.timeline.sleepers == 0:  # until the caller sleeps in WaitAny
        waiter.join(0.001)
    device.submit(driver.decode_job(1, [(seq, first[0].lanes[0].greedy_token)]))
    waiter.join(30)
    assert not waiter.is_alive() and len(got) == 1 and notified


@pytest.mark.req("R9.2.4")
def test_the_checks_still_refuse_a_position_off_the_committed_length_and_a_zero_padded_lane(
        null: tuple[SimSession, HostDriver]) -> None:
    session, driver = null
    device = session.device
    seq = session.kv.allocate_sequence()
    assert driver.prefill(seq, [256, 72, 105]).ok
    good = driver.decode_job(4, [(seq, 5)])
    off = DecodeJob(generation=1, calbin_id=good.calbin_id, compiled_batch=4, engine=JobEngine.PING,
                    buffers=good.buffers, seq_ids=good.seq_ids, token_ids=good.token_ids,
                    positions=np.array([2, 0, 0, 0], dtype=np.int32), lane_valid=good.lane_valid)
    with pytest.raises(CalculetError) as refused:
        device.submit(off)
    assert "committed length" in str(refused.value)
    zero = DecodeJob(generation=1, calbin_id=good.calbin_id, compiled_batch=4, engine=JobEngine.PING,
                     buffers=good.buffers, seq_ids=(good.seq_ids[0], NO_SEQUENCE, NO_SEQUENCE, NO_SEQUENCE),
                     token_ids=np.array([5, 0, 0, 0], dtype=np.int32), positions=good.positions,
                     lane_valid=good.lane_valid)
    with pytest.raises(CalculetError) as padded:
        device.submit(zero)
    assert "never pad with token 0" in str(padded.value)
    assert device.statistics().submit_refused[ReturnCode.INVALID_ARGUMENT] == 2
    device.submit(good)
    assert [r.ok for r in device.poll()] == [True]


def test_the_input_buffer_holds_the_last_accepted_job_and_a_refused_one_dmas_nothing(
        null: tuple[SimSession, HostDriver]) -> None:
    """The DMA is written when the InputBuf is read (``SimBuffer.pending``): read after several jobs, the buffer
    holds the last accepted one's bytes, never a refused job's. Mutants caught: a read that does not write the
    pending payload (zeros), an older pending payload kept over a newer one (the first job's bytes)."""
    session, driver = null
    device = session.device
    seq = session.kv.allocate_sequence()
    assert driver.prefill(seq, [256, 72, 105]).ok
    in_buf = driver.buffers(JobKind.DECODE, 4).input
    first = driver.decode_job(4, [(seq, 5)])
    device.submit(first)
    second = driver.decode_job(4, [(seq, 6)])  # the committed length moved: the next position
    device.submit(second)
    assert [r.ok for r in device.poll()] == [True, True]
    stale = driver.decode_job(4, [(seq, 7)])
    refused = DecodeJob(generation=1, calbin_id=stale.calbin_id, compiled_batch=4, engine=JobEngine.PING,
                        buffers=stale.buffers, seq_ids=stale.seq_ids, token_ids=stale.token_ids,
                        positions=np.array([1, 0, 0, 0], dtype=np.int32), lane_valid=stale.lane_valid)
    with pytest.raises(CalculetError):
        device.submit(refused)
    held = device.read_buffer(in_buf)
    data = payload(second)
    assert payload(first) != data != payload(refused)
    assert bytes(held[: len(data)]) == data and not held[len(data):].any()
    assert device.read_buffer(in_buf).tobytes() == held.tobytes()  # read twice: the same bytes


def test_submit_and_poll_are_still_vendor_boundaries(null: tuple[SimSession, HostDriver],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Submit is its own boundary (its try, where refusals are counted) and poll crosses one only when it has
    results: anything else escaping the device becomes a DeviceFault with rc INTERNAL, a refusal the error of its
    code, counted. Mutants caught: submit's try catching VendorError only (the KeyError escapes), the refusal not
    counted, poll's drain outside its try (the KeyError escapes)."""
    from calculet.adapters.calrt import VendorError, rc_of
    from calculet.errors import DeviceFault

    session, driver = null
    device = session.device
    seq = session.kv.allocate_sequence()
    job = driver.prefill_job(seq, [256, 72])

    def broken(*_args: object) -> None:
        raise KeyError("a bug inside the device layer")

    monkeypatch.setattr(device._gate, "admit", broken)  # noqa: SLF001 - a fault inside the device's submit
    with pytest.raises(DeviceFault) as internal:
        device.submit(job)
    assert internal.value.rc is ReturnCode.INTERNAL and "VirtualDevice.Submit" in str(internal.value)
    assert isinstance(internal.value.__cause__, KeyError)

    def busy(*_args: object) -> None:
        raise VendorError(ReturnCode.DEVICE_BUSY, "engine taken")

    monkeypatch.setattr(device._gate, "admit", busy)  # noqa: SLF001
    with pytest.raises(CalculetError) as refused:
        device.submit(job)
    assert rc_of(refused.value) is ReturnCode.DEVICE_BUSY and not isinstance(refused.value, VendorError)
    assert device.statistics().submit_refused[ReturnCode.DEVICE_BUSY] == 1
    monkeypatch.undo()
    device.submit(job)

    class Broken(dict):  # type: ignore[type-arg]  # the published results, unreadable: a bug inside the device
        def values(self) -> None:  # type: ignore[override]
            raise KeyError("a bug inside the device layer")

    monkeypatch.setattr(device.timeline, "done", Broken(device.timeline.done))
    with pytest.raises(DeviceFault) as drained:
        device.poll()
    assert drained.value.rc is ReturnCode.INTERNAL and "VirtualDevice.poll" in str(drained.value)
    monkeypatch.undo()
    assert [r.ok for r in device.poll()] == [True] and device.poll() == []
