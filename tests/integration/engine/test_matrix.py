"""§18 NPU integration matrix, row by row, through the whole engine on the simulated NPU.

Hardware R-ids (R18.x) are covered here only as **simulated evidence**: the simulated NPU
computes a real (tiny) transformer, so tokens, KV writes, lane masks and faults are real
numbers, but nothing here proves anything about the Calculet NPU (§20, R20.7). Each test
drives the engine's actor code in virtual time (``EngineDriver``); "reference" tokens are the
same request run alone on B1 on the current product, themselves checked against the manifest's
golden vectors (``test_engine_support``).
"""

from __future__ import annotations

from typing import Any

import pytest

from calculet.adapters.calrt import JobKind
from calculet.adapters.sim import InjectedFault, FaultRule, SimCalRT, SimConfig, package_dir
from calculet.errors import ConfigError
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.scheduling.registry import CancelResult
from calculet.runtime.execution.golden import GoldenFailed
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.streams.writer import StreamFinish
from tests.integration.engine.support import (
    assert_clean,
    engine_config,
    make_driver,
    reference,
    request,
    submit_all,
)

PREFILL_FIRST = {"decode_weight": 1, "short_prefill_weight": 64}
"""WRR weights that run every queued prefill before the first decode: batches fill completely."""


def decode_jobs(runtime: Any) -> list[Any]:
    return [j for j in runtime.jobs if j.kind == "decode"]


@pytest.mark.req("R18.1", "R18.2", "R3.1", "R6.1")
@pytest.mark.parametrize("batch", [1, 4, 8, 16])
def test_single_sequence_prefill_and_decode_on_every_profile(batch: int) -> None:
    """One sequence: one prefill with the whole prompt, then decode on the B-lane profile (simulated)."""
    variant = "current" if batch == 1 else "future"
    driver, runtime = make_driver(variant, profiles=[1, batch] if batch > 1 else [1])
    [stream] = submit_all(driver, [request(0, 8)])
    driver.run_until_idle()
    result = stream.result(0)
    assert result.raw_tokens == reference(0, 8) and result.finish_reason is StreamFinish.LENGTH
    prefills = [j for j in runtime.jobs if j.kind == "prefill"]
    assert len(prefills) == 1 and {j.compiled_batch for j in decode_jobs(runtime)} == {batch}
    assert all(len(j.seqs) == 1 for j in decode_jobs(runtime))
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R3.1")
def test_one_request_passes_every_component_in_order() -> None:
    """§3: API → registry → admission → prefill scheduler → executor → completion → sampler → stream."""
    driver, _ = make_driver("current", options=EngineOptions(trace_components=True, monitor_mode=None))
    [stream] = submit_all(driver, [request(1, 2)])
    driver.run_until_idle()
    assert stream.result(0).outcome.state == "completed"
    trace = [component for component, rid in driver.core.trace or [] if rid == 1]
    first = ["api", "registry", "admission", "prefill_scheduler", "executor", "completion", "sampler", "stream"]
    assert trace[: len(first)] == first
    assert trace[len(first):] == ["decode_scheduler", "executor", "completion", "sampler", "stream"]
    driver.stop()


@pytest.mark.req("R18.3", "R18.4", "R18.7")
@pytest.mark.parametrize("batch", [1, 4])
def test_two_sequences_alternate(batch: int) -> None:
    """Two sequences of different lengths: on B1 their decode steps alternate (software
    alternation, R18.7); on B4 they share each batch. Both match their reference (simulated).
    The default ``on_time`` order decodes B1's kept requests by deadline (issue #13), so the B1
    case asks for rotation with an ITL target, the way a latency-bound service runs it."""
    variant = "current" if batch == 1 else "future"
    admission = {"itl_target_ms": 60_000} if batch == 1 else {}
    driver, runtime = make_driver(variant, profiles=[1, batch] if batch > 1 else [1], queues=PREFILL_FIRST,
                                  admission=admission)
    streams = submit_all(driver, [request(0, 6), request(5, 6)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in streams] == [reference(0, 6), reference(5, 6)]
    jobs = decode_jobs(runtime)
    if batch == 1:
        order = [j.seqs[0] for j in jobs]
        assert all(a != b for a, b in zip(order, order[1:])), f"B1 decode steps did not alternate: {order}"
    else:
        assert all(len(j.seqs) == 2 for j in jobs)
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.5", "R7.4.1", "R7.4.3", "R7.1.2")
@pytest.mark.parametrize("batch", [4, 8, 16])
def test_filling_lanes_one_to_b(batch: int) -> None:
    """For each n in 1..B, a batch with n active lanes gives every lane its reference tokens (simulated)."""
    for n in range(1, batch + 1):
        driver, runtime = make_driver("future", profiles=[1, batch], queues=PREFILL_FIRST,
                                      admission={"max_sequences": max(16, batch)})
        streams = submit_all(driver, [request(i, 4) for i in range(n)])
        driver.run_until_idle()
        for i, stream in enumerate(streams):
            assert stream.result(0).raw_tokens == reference(i, 4), f"B{batch} with {n} lanes: lane of request {i}"
        assert {len(j.seqs) for j in decode_jobs(runtime)} == {n}
        assert {j.compiled_batch for j in decode_jobs(runtime)} == {batch}
        assert_clean(driver)
        driver.stop()


@pytest.mark.req("R18.6", "R7.3.1", "R14.4")
def test_inactive_lanes_and_unbatched_sequences_write_no_kv() -> None:
    """Partial B4 batches (6 sequences, B4): after every job, every sequence that was not an active
    lane of it is byte-identical, and every active lane grew by exactly its tokens (simulated)."""
    driver, runtime = make_driver("future", profiles=[1, 4], admission={"max_sequences": 6})
    streams = submit_all(driver, [request(i, 5) for i in range(6)])
    session = driver.core.session
    checked = 0
    while not driver.core.idle():
        driver.dispatch()
        kv = session.kv
        before = {int(s): kv.inspect(s) for s in session.live_sequences()}  # type: ignore[attr-defined]
        count = len(runtime.jobs)
        driver.schedule()
        new = runtime.jobs[count:]
        nxt = driver.next_event_time()
        if nxt is not None:
            driver.clock.set(max(nxt, driver.clock.now()))
        driver.dispatch()
        for job in new:
            if job.completed_at is None or job.rc != "OK":
                continue
            grown = 1 if job.kind == "decode" else None
            for seq, view in before.items():
                if not kv.exists(seq):  # type: ignore[attr-defined]
                    continue
                after = kv.inspect(seq)  # type: ignore[attr-defined]
                if seq in job.seqs:
                    if grown is not None:
                        assert after.committed_len == view.committed_len + grown
                else:
                    assert after.backing_sha256 == view.backing_sha256, f"seq {seq} changed outside its lane"
            checked += 1
    partial = [j for j in decode_jobs(runtime) if len(j.seqs) < j.compiled_batch]
    assert partial and checked >= len(runtime.jobs) - 1
    assert [s.result(0).raw_tokens for s in streams] == [reference(i, 5) for i in range(6)]
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.7", "R18.8", "R9.2.4")
def test_mixed_sequence_lengths_in_one_batch() -> None:
    """Prompts of 2 to 44 tokens decode together in B8 (positions = each lane's committed length)."""
    indices = [4, 11, 2, 5, 9, 0, 3, 6]
    driver, runtime = make_driver("future", profiles=[1, 8], queues=PREFILL_FIRST)
    streams = submit_all(driver, [request(i, 5) for i in indices])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in streams] == [reference(i, 5) for i in indices]
    assert {len(j.seqs) for j in decode_jobs(runtime)} == {8}
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.9", "R4.4", "R4.3")
def test_cancel_while_queued_completes_at_once() -> None:
    driver, _ = make_driver("current", admission={"max_sequences": 1})
    first, second = submit_all(driver, [request(0, 4), request(1, 4)])
    assert driver.core.scheduler.registry.get(2).state == "waiting_admission"
    cancelled = driver.cancel(2)
    assert cancelled.result is CancelResult.CANCELLED and second.closed
    result = second.result(0)
    assert result.finish_reason is StreamFinish.CANCELLED and result.raw_tokens == ()
    assert driver.cancel(2).result is CancelResult.ALREADY_TERMINAL
    driver.run_until_idle()
    assert first.result(0).raw_tokens == reference(0, 4)
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.9", "R18.10", "R4.5", "R7.4.3")
@pytest.mark.parametrize("batch", [1, 4])
def test_cancel_while_running_drains_the_batch(batch: int) -> None:
    """Cancel a request whose lane is in a submitted batch: the job drains, that lane's result is
    dropped, the other lanes finish with their reference tokens, nothing leaks (simulated)."""
    variant = "current" if batch == 1 else "future"
    driver, runtime = make_driver(variant, profiles=[1, batch] if batch > 1 else [1], queues=PREFILL_FIRST)
    streams = submit_all(driver, [request(i, 8) for i in range(batch)])
    victim = 1
    while True:
        driver.dispatch()
        driver.schedule()
        jobs = decode_jobs(runtime)
        rec = driver.core.scheduler.registry.get(victim)
        if jobs and jobs[-1].completed_at is None and len(jobs) >= 3 and rec.state == "decode_running":
            break
        driver.clock.set(driver.next_event_time())
    seen = streams[victim - 1].statistics().raw_tokens
    assert seen >= 1
    inflight_before = driver.core.executor.inflight()
    assert driver.cancel(victim).result is CancelResult.PENDING
    assert driver.core.executor.inflight() == inflight_before == 1, "the job stays on the device"
    driver.run_until_idle()
    result = streams[victim - 1].result(0)
    assert result.finish_reason is StreamFinish.CANCELLED and len(result.raw_tokens) == seen
    assert result.raw_tokens == reference(victim - 1, 8)[:seen]
    for i, stream in enumerate(streams):
        if i != victim - 1:
            assert stream.result(0).raw_tokens == reference(i, 8)
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.11", "R18.12", "R7.4.5", "R9.2.6", "R9.2.5", "R19.2")
@pytest.mark.parametrize(("variant", "kind"), [("current", InjectedFault.TIMEOUT), ("current", InjectedFault.CCU_FAULT),
                                               ("future", InjectedFault.TIMEOUT), ("future", InjectedFault.CCU_FAULT)])
def test_timeout_and_ccu_fault_recover_every_lane(variant: str, kind: InjectedFault) -> None:
    """A fault in the 2nd decode job: every lane of it goes Unknown (quarantined until the reset),
    every request of it fails with the return code, the generation recovers (reset where the
    contract verifies it, restart where not) and serves correctly again (simulated)."""
    batch = 4 if variant == "future" else 1
    driver, runtime = make_driver(variant, profiles=[1, batch] if batch > 1 else [1], queues=PREFILL_FIRST,
                                  options=EngineOptions(job_timeout_s=0.5, monitor_mode=None))
    runtime.device.faults.add(FaultRule(kind, job_kind=JobKind.DECODE, nth=2))
    kv = driver.core.kv
    at_recovery: list[list[str]] = []
    runtime.hooks.before_recovery = lambda: at_recovery.append([kv.lane(i).state for i in range(kv.lanes)])
    streams = submit_all(driver, [request(i, 6) for i in range(batch)])
    driver.run_until_idle()
    runtime.hooks.before_recovery = None
    rc = "TIMEOUT" if kind is InjectedFault.TIMEOUT else "CCU_FAULT"
    assert at_recovery and at_recovery[0].count("unknown") == batch, at_recovery
    for stream in streams:
        result = stream.result(0)
        assert result.outcome.state == "failed" and result.finish_reason is StreamFinish.ERROR
        assert rc in result.outcome.detail and result.outcome.http_status == 500
    recovery = driver.statistics().recovery
    assert recovery.state == "healthy" and recovery.faults == {kind.value: 1}
    assert (recovery.resets, recovery.restarts) == ((1, 0) if variant == "future" else (0, 1))
    assert_clean(driver)
    again = submit_all(driver, [request(i, 6) for i in range(batch)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in again] == [reference(i, 6) for i in range(batch)]
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.13", "R18.14", "R14.1", "R14.3", "R14.2")
def test_ping_pong_two_jobs_each_with_b_lanes() -> None:
    """Two B4 jobs in flight at once, one per engine, with disjoint buffers; all lanes correct.
    (R14.2's overlap needs a device trace; here the simulator's cost model states it.)"""
    driver, runtime = make_driver("future", profiles=[1, 4], inflight=2, queues=PREFILL_FIRST,
                                  admission={"max_sequences": 8})
    streams = submit_all(driver, [request(i, 6) for i in range(8)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in streams] == [reference(i, 6) for i in range(8)]
    jobs = decode_jobs(runtime)
    pairs = [(a, b) for a, b in zip(jobs, jobs[1:]) if b.inflight_before == 1 and a.completed_at is not None
             and b.submitted_at < a.completed_at]
    assert pairs, "no two decode jobs were ever in flight together"
    for a, b in pairs:
        assert {a.engine, b.engine} == {"ping", "pong"}
        assert len(a.seqs) == len(b.seqs) == 4 and not set(a.seqs) & set(b.seqs)
        assert not set(a.buffers) & set(b.buffers)
    assert runtime.max_overlap() == 2 and not driver.statistics().executor.degrade.degraded
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R18.15", "R18.16", "R12.5", "R12.6", "R12.7", "R12.9", "R3.3", "R11.7")
@pytest.mark.parametrize("variant", ["current", "future"])
def test_repeated_load_and_unload_returns_to_baseline(variant: str) -> None:
    """Bring a session up and down 20 times on one device, then 5 engines with a request each:
    device memory, calbins, KvManagers, buffers and sequences are back at the baseline every time
    (simulated; ResetConfiguration only where the contract verifies it)."""
    clock = FakeClock()
    runtime = SimCalRT(SimConfig(clock=clock))
    device = runtime.create_virtual_device()
    config = engine_config(profiles=[1, 4] if variant == "future" else [1])
    baseline = device.statistics()
    for _ in range(20):
        session = RuntimeSession(device, package_dir(variant), config, generation=1).create()
        assert session.statistics().state == "ready" and device.statistics().calbins == 1
        session.destroy()
        stats = device.statistics()
        assert (stats.calbins, stats.kv_managers, stats.buffers, stats.inflight) == (0, 0, 0, 0)
        assert stats.memory.used_bytes == baseline.memory.used_bytes
    assert device.statistics().resets == (20 if variant == "future" else 0)
    device.close()
    for _ in range(5):
        driver = EngineDriver(config, runtime, package_dir(variant), clock=clock,
                              options=EngineOptions(monitor_mode=None))
        [stream] = submit_all(driver, [request(0, 4)])
        driver.run_until_idle()
        assert stream.result(0).raw_tokens == reference(0, 4)
        driver.stop()
        assert runtime.statistics().live_devices == 0


@pytest.mark.req("R11.12", "R15.19", "R11.9", "R11.8")
def test_a_failed_bring_up_leaves_the_device_clean() -> None:
    clock = FakeClock()
    runtime = SimCalRT(SimConfig(clock=clock, numerics=False))
    device = runtime.create_virtual_device()
    with pytest.raises(ConfigError, match="B8"):
        RuntimeSession(device, package_dir("current"), engine_config(profiles=[1, 8]), generation=1).create()
    with pytest.raises(GoldenFailed, match="no logits"):
        RuntimeSession(device, package_dir("current"), engine_config(), generation=1).create()
    stats = device.statistics()
    assert (stats.calbins, stats.kv_managers, stats.buffers, stats.memory.used_bytes) == (0, 0, 0, 0)
    device.close()
