"""HealthRecovery (§12, §15 recovery), the §14 DegradeMonitor and result verification (crosstalk)."""

from __future__ import annotations


import numpy as np
import pytest

from calculet.adapters.calrt import (
    Anomaly,
    BufferHandle,
    BufferKind,
    DecodeJob,
    DeviceCapabilities,
    JobBuffers,
    JobKind,
    JobResult,
    JobTicket,
    LaneResult,
    PrefillJob,
    ReturnCode,
    StatusCounters,
)
from calculet.adapters.sim.build import capabilities_for
from calculet.config import DegradeConfig, RecoveryConfig
from calculet.clock import FakeClock
from calculet.runtime.execution.degrade import DegradeMonitor, DegradeReason
from calculet.runtime.execution.dispatch import fault_kind
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.execution.verification import check_result
from calculet.runtime.scheduling.completion import FaultKind
from calculet.runtime.execution.recovery import FaultReason, HealthRecovery, RecoveryAction
from calculet.machines.job import JobEngine


def recovery(max_resets: int = 2, *, verified: bool = True, restart_on_dma: bool = True) -> tuple[HealthRecovery,
                                                                                                   FakeClock]:
    clock = FakeClock()
    caps = capabilities_for("future") if verified else DeviceCapabilities.calrt_076_current()
    return HealthRecovery(RecoveryConfig(max_resets_per_10min=max_resets, restart_on_unknown_dma=restart_on_dma),
                          clock=clock, capabilities=caps), clock


@pytest.mark.req("R15.16")
def test_resets_are_limited_in_a_sliding_ten_minute_window() -> None:
    rec, clock = recovery(2)
    for t in (0.0, 100.0):
        clock.set(t)
        rec.report(FaultReason.TIMEOUT, "TIMEOUT")
        pending = rec.begin()
        assert pending is not None and pending.action is RecoveryAction.RESET
        rec.finished(pending, ok=True)
    clock.set(599.0)
    rec.report(FaultReason.CCU_FAULT, "CCU_FAULT")
    assert rec.budget_left() == 0 and rec.begin() is None, "two resets in the last 10 minutes"
    clock.set(600.5)
    assert rec.budget_left() == 1 and rec.begin() is not None, "the first reset left the window"
    stats = rec.statistics()
    assert (stats.resets, stats.budget_refusals, stats.faults) == (3, 1, {"timeout": 2, "ccu_fault": 1})


@pytest.mark.req("R15.16", "R5.2.5")
def test_past_the_budget_recovery_gives_up() -> None:
    rec, _ = recovery(0)
    rec.report(FaultReason.TIMEOUT, "TIMEOUT: job 3")
    assert rec.begin() is None
    detail = rec.give_up()
    assert rec.failed and "budget" in detail and "TIMEOUT" in detail and rec.statistics().state == "failed"


@pytest.mark.req("R15.17", "R12.7")
def test_the_action_follows_the_contract_and_the_configuration() -> None:
    verified, _ = recovery(verified=True)
    assert verified.action_for(FaultReason.TIMEOUT) is RecoveryAction.RESET
    assert verified.action_for(FaultReason.DMA_UNKNOWN) is RecoveryAction.RESTART
    assert verified.action_for(FaultReason.RESET_FAILED) is RecoveryAction.RESTART
    no_restart, _ = recovery(restart_on_dma=False)
    assert no_restart.action_for(FaultReason.DMA_UNKNOWN) is RecoveryAction.RESET
    unverified, _ = recovery(verified=False)
    assert unverified.action_for(FaultReason.CCU_FAULT) is RecoveryAction.RESTART, "no verified reset: restart"
    assert HealthRecovery.reason_for(ReturnCode.INVALID_STATE) is FaultReason.DEVICE_STATE


@pytest.mark.req("R14.9")
def test_a_failed_reset_escalates_to_a_restart_and_a_pending_reset_is_escalated() -> None:
    rec, clock = recovery(5)
    rec.report(FaultReason.TIMEOUT, "TIMEOUT")
    rec.report(FaultReason.DMA_UNKNOWN, "DMA_UNKNOWN")
    pending = rec.pending
    assert pending is not None and pending.action is RecoveryAction.RESTART
    assert pending.reasons == (FaultReason.TIMEOUT, FaultReason.DMA_UNKNOWN)
    rec, clock = recovery(5)
    rec.report(FaultReason.CCU_FAULT, "CCU_FAULT")
    first = rec.begin()
    assert first is not None
    clock.advance(0.25)
    rec.finished(first, ok=False)
    assert rec.pending is not None and rec.pending.action is RecoveryAction.RESTART
    second = rec.begin()
    assert second is not None
    rec.finished(second, ok=True)
    stats = rec.statistics()
    assert (stats.resets, stats.restarts, stats.failed_recoveries, stats.state) == (1, 1, 1, "healthy")


# ---------------------------------------------------------------------------------------------
# §14 degrade
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R14.7")
def test_p99_regression_beyond_the_threshold_degrades() -> None:
    monitor = DegradeMonitor(DegradeConfig(p99_regression_ratio=0.05), configured_inflight=2, min_samples=64)
    rng = np.random.default_rng(1)
    for x in rng.normal(10e-3, 1e-3, 200):
        assert not monitor.latency(float(x), overlapped=False)
    for x in rng.normal(10.2e-3, 1e-3, 200):  # within +5%
        assert not monitor.latency(float(x), overlapped=True)
    assert not monitor.degraded
    fired = [monitor.latency(float(x), overlapped=True) for x in rng.normal(14e-3, 1e-3, 2000)]
    assert any(fired) and monitor.degraded and monitor.effective_inflight == 1
    assert monitor.statistics().reason.startswith("p99_regression")


@pytest.mark.req("R14.8", "R14.10")
def test_consecutive_busy_or_timeouts_degrade_and_an_accepted_job_breaks_the_run() -> None:
    monitor = DegradeMonitor(DegradeConfig(consecutive_busy_or_timeout=3), configured_inflight=2)
    monitor.busy_or_timeout("DEVICE_BUSY")
    monitor.busy_or_timeout("DEVICE_BUSY")
    monitor.accepted()
    monitor.busy_or_timeout("TIMEOUT")
    monitor.busy_or_timeout("DEVICE_BUSY")
    assert not monitor.degraded
    assert monitor.busy_or_timeout("DEVICE_BUSY") and monitor.effective_inflight == 1
    assert not monitor.trigger(DegradeReason.CROSSTALK, "later"), "the degrade is sticky: fires once"
    assert monitor.statistics().triggers == {"busy_or_timeout": 1, "crosstalk": 1}


def test_without_ping_pong_nothing_is_degraded() -> None:
    monitor = DegradeMonitor(DegradeConfig(), configured_inflight=1)
    assert not monitor.trigger(DegradeReason.COUNTERS, "x") and monitor.effective_inflight == 1
    assert monitor.statistics().triggers == {"counters": 1}


def test_fault_kinds_of_return_codes() -> None:
    assert fault_kind(ReturnCode.OK) is FaultKind.NONE
    assert fault_kind(ReturnCode.CCU_FAULT) is FaultKind.CCU_FAULT
    assert fault_kind(ReturnCode.DMA_UNKNOWN) is FaultKind.DMA_UNKNOWN
    assert fault_kind(ReturnCode.INTERNAL) is FaultKind.ERROR


# ---------------------------------------------------------------------------------------------
# result verification (crosstalk design)
# ---------------------------------------------------------------------------------------------

V = 8


def buffers(base: int) -> JobBuffers:
    return JobBuffers(BufferHandle(base, BufferKind.INPUT, JobKind.DECODE, 4, 64),
                      BufferHandle(base + 1, BufferKind.OUTPUT, JobKind.DECODE, 4, 4 * V * 8))


def job() -> tuple[InflightJob, JobResult, np.ndarray]:
    spec = DecodeJob(generation=1, calbin_id=1, compiled_batch=4, engine=JobEngine.PING, buffers=buffers(10),
                     seq_ids=(5, 6, 7, 0), token_ids=np.array([1, 2, 3, -1]), positions=np.array([4, 9, 2, 0]),
                     lane_valid=np.array([1, 1, 1, 0], dtype=np.uint8))
    ticket = JobTicket(job_id=77, generation=1, kind=JobKind.DECODE, engine=JobEngine.PING, calbin_id=1,  # type: ignore[arg-type]
                       submitted_at=0.0)
    rows = np.arange(4 * V, dtype=np.float64).reshape(4, V)
    lanes = tuple(LaneResult(i, s, i < 3, ReturnCode.OK, int(p), int(p) + (1 if i < 3 else 0),
                             rows[i].copy() if i < 3 else None, int(np.argmax(rows[i])) if i < 3 else None)
                  for i, (s, p) in enumerate(zip((5, 6, 7, 0), (4, 9, 2, 0))))
    lanes = lanes[:3] + (LaneResult(3, 0, False, ReturnCode.OK, 0, 0, None, None),)
    result = JobResult(job_id=77, generation=1, kind=JobKind.DECODE, engine=JobEngine.PING, calbin_id=1,  # type: ignore[arg-type]
                       compiled_batch=4, rc=ReturnCode.OK, lanes=lanes,
                       counters=StatusCounters(engine_sequence=8, lanes_valid=3, tokens_processed=3,
                                               kv_tokens_written=3),
                       submitted_at=0.0, completed_at=1.0, output_buffer=spec.buffers.output)
    return InflightJob(1, ticket, None, spec, 5.0, False), result, rows  # type: ignore[arg-type]


@pytest.mark.req("R7.4.2")
def test_a_consistent_result_passes_every_check() -> None:
    inflight, result, rows = job()
    assert check_result(inflight, result, previous_engine_sequence=7, output_rows=rows) == []


@pytest.mark.req("R14.5", "R7.4.2")
def test_swapped_lanes_are_found_by_tags_and_by_the_output_buffer() -> None:
    inflight, result, rows = job()
    lanes = list(result.lanes)
    lanes[0], lanes[2] = lanes[2], lanes[0]
    swapped = rows.copy()
    swapped[[0, 2]] = swapped[[2, 0]]
    found = check_result(inflight, result._replace(lanes=tuple(lanes)), previous_engine_sequence=None,
                         output_rows=swapped)
    texts = [t for k, t in found if k is Anomaly.CROSSTALK]
    assert any("slot 0 carries lane 2" in t for t in texts)
    assert any("logits differ from OutputBuf" in t for t in texts)


@pytest.mark.req("R14.5")
def test_a_result_carrying_the_other_engines_buffer_is_crosstalk() -> None:
    inflight, result, rows = job()
    wrong = result._replace(output_buffer=buffers(20).output, engine=JobEngine.PONG)
    found = check_result(inflight, wrong, previous_engine_sequence=None, output_rows=rows)
    assert any(k is Anomaly.CROSSTALK and "OutputBuf 21" in t for k, t in found)


@pytest.mark.req("R14.5", "R7.4.2")
def test_a_lane_with_right_tags_but_another_sequences_content_is_found() -> None:
    inflight, result, rows = job()
    lanes = list(result.lanes)
    lanes[1] = lanes[1]._replace(position=2, kv_len=3)
    found = check_result(inflight, result._replace(lanes=tuple(lanes)), previous_engine_sequence=None,
                         output_rows=rows)
    assert any("echoes position 2" in t for _, t in found)
    lanes = list(result.lanes)
    lanes[3] = lanes[3]._replace(greedy_token=5)
    found = check_result(inflight, result._replace(lanes=tuple(lanes)), previous_engine_sequence=None,
                         output_rows=rows)
    assert any("inactive lane 3 returned output" in t for _, t in found)


@pytest.mark.req("R14.5", "R7.4.2")
def test_a_lane_whose_kv_length_is_not_its_position_plus_its_step_is_found() -> None:
    """The lane echo's KV check (verification check 3): a decode lane grows by one token, prefill's one lane by
    its chunk; one more or one less is crosstalk, and the step is the job's, not the lane's index (issue #20)."""
    inflight, result, rows = job()
    for lane, kv_len in ((1, 11), (1, 9), (2, 2)):
        lanes = list(result.lanes)
        lanes[lane] = lanes[lane]._replace(kv_len=kv_len)
        found = check_result(inflight, result._replace(lanes=tuple(lanes)),
                             previous_engine_sequence=None, output_rows=rows)
        position = (4, 9, 2)[lane]
        assert [t for _, t in found] == [f"lane {lane} reports KV length {kv_len}; position {position} + 1 "
                                         "was expected"]
    spec = PrefillJob(generation=1, calbin_id=1, engine=JobEngine.PING, buffers=buffers(10), seq_id=5,
                      tokens=np.array([3, 4, 5, 6]), start_position=8)
    ticket = JobTicket(job_id=78, generation=1, kind=JobKind.PREFILL, engine=JobEngine.PING, calbin_id=1,  # type: ignore[arg-type]
                       submitted_at=0.0)
    prefill = InflightJob(2, ticket, None, spec, 5.0, False)  # type: ignore[arg-type]
    for kv_len, expected in ((12, []), (9, ["lane 0 reports KV length 9; position 8 + 4 was expected"])):
        done = JobResult(job_id=78, generation=1, kind=JobKind.PREFILL, engine=JobEngine.PING, calbin_id=1,  # type: ignore[arg-type]
                         compiled_batch=1, rc=ReturnCode.OK,
                         lanes=(LaneResult(0, 5, True, ReturnCode.OK, 8, kv_len, None, 7),),
                         counters=StatusCounters(engine_sequence=1, lanes_valid=1, tokens_processed=4,
                                                 kv_tokens_written=4),
                         submitted_at=0.0, completed_at=1.0, output_buffer=spec.buffers.output)
        assert [t for _, t in check_result(prefill, done, previous_engine_sequence=None, output_rows=None)] == expected


@pytest.mark.req("R14.6")
def test_counter_anomalies_are_found() -> None:
    inflight, result, rows = job()
    bad = result._replace(counters=StatusCounters(engine_sequence=7, lanes_valid=4, tokens_processed=3,
                                                              kv_tokens_written=3))
    kinds = [k for k, _ in check_result(inflight, bad, previous_engine_sequence=7, output_rows=rows)]
    assert kinds.count(Anomaly.COUNTERS) == 2


# ---------------------------------------------------------------------------------------------
# the scheduler calls the engine's recovery uses (small additions to the sans-io core)
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R19.2", "R9.2.6")
def test_scheduler_fail_and_lost_kv_carry_the_detail_and_release_lanes() -> None:
    from tests.unit.runtime.runtime_support import Harness

    h = Harness.build(sizes=(1,), lanes=4)
    subs = [h.submit(prompt=8, new=4) for _ in range(3)]
    h.prefill_all()
    assert {h.state(s.request_id) for s in subs} == {"decode_ready"}
    assert h.scheduler.fail(subs[0].request_id, "INVALID_ARGUMENT: injected")
    assert h.sinks[subs[0].request_id].outcome.detail == "INVALID_ARGUMENT: injected"
    assert h.scheduler.fail_lost_kv("KV lost in device reset after CCU_FAULT") == 2
    for sub in subs[1:]:
        outcome = h.sinks[sub.request_id].outcome
        assert outcome.state == "failed" and "CCU_FAULT" in outcome.detail
    h.confirm_all()
    assert h.scheduler.idle()
    assert not h.scheduler.fail(subs[0].request_id, "again"), "an ended request is not failed twice"


@pytest.mark.req("R14.10")
def test_limit_inflight_affects_new_jobs_only() -> None:
    from tests.unit.runtime.runtime_support import Harness

    h = Harness.build(sizes=(1,), lanes=4, executor={"max_inflight": 2}, admission={"max_inflight_jobs": 2})
    for _ in range(3):
        h.submit(prompt=8, new=2)
    first = h.step()
    h.scheduler.submitted(first.work.job_id)  # type: ignore[union-attr]
    second = h.step()
    h.scheduler.submitted(second.work.job_id)  # type: ignore[union-attr]
    h.scheduler.limit_inflight(1)
    assert len(h.scheduler.jobs) == 2 and h.step().work is None, "both drain; no third job"
    h.complete(first.work)  # type: ignore[arg-type]
    assert h.step().work is None, "one still in flight: no new job"
    h.complete(second.work)  # type: ignore[arg-type]
    assert h.step().work is not None
    with pytest.raises(Exception, match="1 or 2"):
        h.scheduler.limit_inflight(3)
