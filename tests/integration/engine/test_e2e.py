"""End to end through the engine: token identity across B1/B16/ping-pong, §14 degrade triggers,
every return code visible (M0), the sync baseline (M1), recovery budget, stop/drain, real threads.

Hardware R-ids appear only as simulated evidence (the simulated NPU proves the software path,
not the device; §20).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from calculet.adapters.calrt import JobKind, JobResult, ReturnCode, StatusCounters
from calculet.adapters.sim import InjectedFault, FaultRule, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.errors import NotFound, Unavailable
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.admission import Decision
from calculet.clock import FakeClock
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions, ExecutionMode, GenerateRequest
from calculet.runtime.scheduling.registry import CancelResult
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamFinish, StreamWriter
from tests.integration.engine.support import (
    RecordingRuntime,
    assert_clean,
    engine_config,
    make_driver,
    reference,
    request,
    submit_all,
)
from calculet.machines.job import JobEngine

PREFILL_FIRST = {"decode_weight": 1, "short_prefill_weight": 64}


def mixed(i: int) -> GenerateRequest:
    """Half greedy, half seeded temperature sampling (top-k 20)."""
    return request(i % 16, 8, seed=1000 + i, temperature=0.8) if i % 2 else request(i % 16, 8)


def mixed_reference(i: int) -> tuple[int, ...]:
    return reference(i % 16, 8, 1000 + i, 0.8) if i % 2 else reference(i % 16, 8)


# ---------------------------------------------------------------------------------------------
# token identity
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R18.5", "R18.14", "R7.4.1", "R7.4.3", "R14.1")
def test_tokens_are_identical_alone_in_b16_and_under_ping_pong() -> None:
    """The tokens streamed for a request do not depend on where it ran: alone on B1, in a full
    B16 batch, or in one of two B16 jobs in flight under ping/pong (numpy model; greedy and
    seeded temperature sampling; simulated evidence)."""
    driver, runtime = make_driver("future", profiles=[1, 16], queues=PREFILL_FIRST)
    streams = submit_all(driver, [mixed(i) for i in range(16)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in streams] == [mixed_reference(i) for i in range(16)]
    assert {len(j.seqs) for j in runtime.jobs if j.kind == "decode"} == {16}
    driver.stop()

    driver, runtime = make_driver("future", profiles=[1, 16], inflight=2, queues=PREFILL_FIRST,
                                  admission={"max_sequences": 32})
    streams = submit_all(driver, [mixed(i) for i in range(32)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in streams] == [mixed_reference(i) for i in range(32)]
    decode = [j for j in runtime.jobs if j.kind == "decode"]
    assert runtime.max_overlap() == 2 and {len(j.seqs) for j in decode} == {16}
    assert {j.engine for j in decode} == {"ping", "pong"}
    assert_clean(driver)
    driver.stop()


# ---------------------------------------------------------------------------------------------
# §14 degrade
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R14.5", "R14.10", "R7.4.2", "R17.3.6")
def test_injected_crosstalk_under_ping_pong_degrades_and_no_wrong_token_is_streamed() -> None:
    """Swapped lanes in the 3rd decode job: detected before any of its tokens is sampled, the
    job's requests fail, ping/pong degrades for new jobs only (the job in flight on the other
    engine drains normally), and every stream holds only correct tokens (simulated)."""
    driver, runtime = make_driver("future", profiles=[1, 4], inflight=2, queues=PREFILL_FIRST,
                                  admission={"max_sequences": 8})
    runtime.device.faults.add(FaultRule(InjectedFault.LANE_CROSSTALK, job_kind=JobKind.DECODE, nth=3, lanes=(0, 2)))
    streams = submit_all(driver, [request(i, 8) for i in range(8)])
    driver.run_until_idle()
    degrade = driver.statistics().executor.degrade
    assert degrade.degraded and degrade.reason.startswith("crosstalk") and degrade.effective_inflight == 1
    failed = []
    for i, stream in enumerate(streams):
        result = stream.result(0)
        assert result.raw_tokens == reference(i, 8)[: len(result.raw_tokens)], f"wrong token in stream {i}"
        if result.outcome.state == "failed":
            failed.append(i)
            assert "crosstalk" in result.outcome.detail
        else:
            assert result.raw_tokens == reference(i, 8)
    assert len(failed) == 4, "exactly the four lanes of the crosstalk job fail"
    decode = [j for j in runtime.jobs if j.kind == "decode"]
    bad = decode[2]
    after = [j for j in runtime.jobs if j.submitted_at >= bad.completed_at]
    assert after and all(j.inflight_before == 0 for j in after), "new jobs go out one at a time"
    drained = [j for j in decode if j is not bad and j.submitted_at < bad.completed_at
               and (j.completed_at or 0) > bad.completed_at]
    assert drained and all(j.rc == "OK" for j in drained), "the other engine's job drained normally"
    assert_clean(driver)
    more = submit_all(driver, [request(i, 4) for i in range(8)])
    driver.run_until_idle()
    assert [s.result(0).raw_tokens for s in more] == [reference(i, 4) for i in range(8)]
    assert max(j.inflight_before for j in runtime.jobs if j.submitted_at > bad.completed_at) == 0
    driver.stop()


@pytest.mark.req("R14.6")
def test_a_status_counter_anomaly_degrades_and_the_job_output_is_not_used() -> None:
    driver, runtime = make_driver("future", profiles=[1, 4], inflight=2, queues=PREFILL_FIRST)
    runtime.device.faults.add(FaultRule(InjectedFault.BAD_COUNTERS, job_kind=JobKind.DECODE, nth=2))
    streams = submit_all(driver, [request(i, 6) for i in range(8)])
    driver.run_until_idle()
    stats = driver.statistics().executor
    assert stats.degrade.reason.startswith("counters") and stats.anomalies.get("counters", 0) >= 1
    outcomes = [s.result(0) for s in streams]
    assert sum(r.outcome.state == "failed" for r in outcomes) == 4
    for i, r in enumerate(outcomes):
        assert r.raw_tokens == reference(i, 6)[: len(r.raw_tokens)]
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R14.8", "R19.2")
def test_consecutive_device_busy_degrades_and_is_retried() -> None:
    driver, runtime = make_driver("future", profiles=[1, 4], inflight=2, queues=PREFILL_FIRST)
    runtime.device.faults.add(FaultRule(InjectedFault.DEVICE_BUSY, job_kind=JobKind.DECODE, nth=1, count=3))
    streams = submit_all(driver, [request(i, 5) for i in range(8)])
    driver.run_until_idle()
    stats = driver.statistics().executor
    assert stats.submit_rc["DEVICE_BUSY"] == 3 and stats.degrade.reason.startswith("busy_or_timeout")
    assert [s.result(0).raw_tokens for s in streams] == [reference(i, 5) for i in range(8)]
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R14.9", "R15.16")
def test_an_uncertain_recovery_restarts_and_degrades() -> None:
    """A ResetConfiguration that fails leaves the device in doubt: restart instead, degrade."""
    config = engine_config(profiles=[1, 4], inflight=2, queues=PREFILL_FIRST, recovery={"max_resets_per_10min": 5})
    driver, runtime = make_driver("future", config=config,
                                  options=EngineOptions(job_timeout_s=0.2, monitor_mode=None))
    runtime.device.faults.add(FaultRule(InjectedFault.CCU_FAULT, job_kind=JobKind.DECODE, nth=2))
    runtime.hooks.reset_fails = 1
    submit_all(driver, [request(i, 6) for i in range(8)])
    driver.run_until_idle()
    stats = driver.statistics()
    assert stats.executor.degrade.reason.startswith("uncertain_recovery")
    assert (stats.recovery.resets, stats.recovery.restarts, stats.recovery.failed_recoveries) == (1, 1, 1)
    assert len(runtime.devices) == 2 and stats.recovery.state == "healthy"
    assert_clean(driver)
    again = submit_all(driver, [request(0, 4)])
    driver.run_until_idle()
    assert again[0].result(0).raw_tokens == reference(0, 4)
    driver.stop()


# ---------------------------------------------------------------------------------------------
# M0: every return code visible
# ---------------------------------------------------------------------------------------------

SUBMIT_CODES = [ReturnCode.INVALID_ARGUMENT, ReturnCode.OUT_OF_MEMORY, ReturnCode.NOT_SUPPORTED, ReturnCode.NOT_FOUND,
                ReturnCode.ALREADY_EXISTS, ReturnCode.BUFFER_IN_USE, ReturnCode.INTERNAL, ReturnCode.INVALID_STATE]
SIM_FAULTS = {ReturnCode.TIMEOUT: InjectedFault.TIMEOUT, ReturnCode.CCU_FAULT: InjectedFault.CCU_FAULT,
              ReturnCode.DMA_UNKNOWN: InjectedFault.DMA_UNKNOWN}


@pytest.mark.req("R19.2", "R16.5", "R16.8", "R16.10")
@pytest.mark.parametrize("rc", [rc for rc in ReturnCode if rc is not ReturnCode.OK], ids=lambda rc: rc.name)
def test_every_return_code_reaches_the_request_the_log_and_a_counter(rc: ReturnCode,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """M0 "all error codes visible" (simulated): each CalRT code, injected where the device
    produces it, is in the failed request's error detail, in a log record and in the executor's
    submit/Wait counters. DEVICE_BUSY is retried, so its request succeeds: it shows in the log
    and the counter only. Request and job ids go to the log, never into a counter's labels."""
    driver, runtime = make_driver("current", numerics=False,
                                  options=EngineOptions(verify_golden=False, job_timeout_s=0.1, monitor_mode=None))
    if rc in SIM_FAULTS:
        runtime.device.faults.add(FaultRule(SIM_FAULTS[rc], job_kind=JobKind.DECODE, nth=1))
    elif rc is ReturnCode.DEVICE_BUSY:
        runtime.device.faults.add(FaultRule(InjectedFault.DEVICE_BUSY, job_kind=JobKind.DECODE, nth=1))
    else:
        runtime.hooks.submit_errors[2] = rc  # the first decode submit
    caplog.set_level(logging.INFO, logger="calculet")
    [stream] = submit_all(driver, [request(0, 4)])
    driver.run_until_idle()
    outcome = stream.result(0).outcome
    stats = driver.statistics().executor
    counted = stats.submit_rc.get(rc.name, 0) + stats.completion_rc.get(rc.name, 0)
    assert counted >= 1, (stats.submit_rc, stats.completion_rc)
    logged = [r for r in caplog.records if getattr(r, "rc", None) == rc.name or rc.name in r.getMessage()
              or rc.name in str(getattr(r, "detail", ""))]
    assert logged, [r.__dict__ for r in caplog.records]
    if rc is ReturnCode.DEVICE_BUSY:
        assert outcome.state == "completed"
    else:
        assert outcome.state == "failed" and outcome.finish_reason is FinishReason.ERROR
        assert rc.name in outcome.detail, outcome.detail
        assert outcome.http_status == 500
    assert all(isinstance(k, str) and not k.isdigit() for k in (*stats.submit_rc, *stats.completion_rc))
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R4.9", "R4.8")
def test_a_result_for_an_unknown_job_is_dropped_as_stale() -> None:
    driver, runtime = make_driver("current", numerics=False, options=EngineOptions(verify_golden=False,
                                                                                     monitor_mode=None))
    [stream] = submit_all(driver, [request(0, 3)])
    driver.run_until_idle()
    before = driver.statistics()
    real = stream.result(0)
    fake = JobResult(job_id=987654, generation=1, kind=JobKind.DECODE, engine=JobEngine.PING,  # type: ignore[arg-type]
                     calbin_id=1, compiled_batch=1, rc=ReturnCode.OK, lanes=(),
                     counters=StatusCounters(1, 1, 1, 1), submitted_at=0.0, completed_at=0.0,
                     output_buffer=None)  # type: ignore[arg-type]
    driver.core.on_results([fake])
    after = driver.statistics()
    assert after.executor.stale_results == before.executor.stale_results + 1
    assert after.finished == before.finished and real.outcome.state == "completed"
    assert_clean(driver)
    driver.stop()


# ---------------------------------------------------------------------------------------------
# recovery configuration (§15)
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R15.16", "R5.2.5", "R12.10")
def test_past_the_reset_budget_the_model_fails_and_admission_answers_503() -> None:
    config = engine_config(recovery={"max_resets_per_10min": 1})
    driver, runtime = make_driver("current", config=config, numerics=False,
                                  options=EngineOptions(verify_golden=False, job_timeout_s=0.1, monitor_mode=None))
    rule = FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2)
    runtime.device.faults.add(rule)
    first = submit_all(driver, [request(i, 6) for i in range(3)])
    driver.run_until_idle()
    assert driver.statistics().recovery.restarts == 1
    runtime.device.faults.add(rule)  # the restarted device faults too, inside the same 10 minutes
    second = submit_all(driver, [request(i, 6) for i in range(3)])
    driver.run_until_idle(max_time_s=5.0)
    stats = driver.statistics()
    assert stats.recovery.state == "failed" and stats.availability == "failed"
    assert stats.recovery.budget_refusals == 1
    for stream in first + second:
        assert stream.closed
    assert any("budget" in s.result(0).outcome.detail for s in second)
    late = StreamWriter()
    submission = driver.submit(request(0, 2), late)
    assert submission.outcome.decision is Decision.REJECT_UNAVAILABLE and late.result(0).outcome.http_status == 503
    assert driver.core.kv.statistics().unknown == 1, "the stuck job's lane stays quarantined"
    driver.stop()


@pytest.mark.req("R15.17", "R15.16")
@pytest.mark.parametrize("restart", [True, False])
def test_unknown_dma_restarts_when_configured(restart: bool) -> None:
    config = engine_config(profiles=[1, 4], queues=PREFILL_FIRST, recovery={"restart_on_unknown_dma": restart})
    driver, runtime = make_driver("future", config=config)
    runtime.device.faults.add(FaultRule(InjectedFault.DMA_UNKNOWN, job_kind=JobKind.DECODE, nth=1))
    streams = submit_all(driver, [request(i, 4) for i in range(2)])
    driver.run_until_idle()
    stats = driver.statistics().recovery
    assert (stats.restarts, stats.resets) == ((1, 0) if restart else (0, 1))
    assert len(runtime.devices) == (2 if restart else 1)
    assert all("DMA_UNKNOWN" in s.result(0).outcome.detail for s in streams)
    assert_clean(driver)
    driver.stop()


@pytest.mark.req("R15.14", "R1.2", "R1.3", "R15.15")
@pytest.mark.parametrize("fixed", [False, True])
def test_default_config_never_has_more_than_one_job_in_flight(fixed: bool) -> None:
    driver, runtime = make_driver("future", profiles=[1, 4], executor={"fixed_engine": fixed})
    submit_all(driver, [request(i, 5) for i in range(8)])
    driver.run_until_idle()
    assert runtime.max_overlap() == 1 and {j.engine for j in runtime.jobs} == {"ping"}
    driver.stop()


# ---------------------------------------------------------------------------------------------
# stop and drain
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R4.6", "R4.7", "R12.4")
@pytest.mark.parametrize("drain_s", [60.0, 0.002])
def test_stop_drains_and_every_accepted_request_ends_once(drain_s: float) -> None:
    """stop(): new requests get 503, accepted ones finish until the drain deadline, the rest are
    cancelled (running jobs drain); each sink closes exactly once; the device is released."""
    driver, runtime = make_driver("current", numerics=False, admission={"max_sequences": 4},
                                  options=EngineOptions(verify_golden=False, monitor_mode=None))
    streams = submit_all(driver, [request(i, 10) for i in range(12)])
    driver.advance(0.003)
    driver.core.begin_stop()
    late = StreamWriter()
    assert driver.submit(request(0, 2), late).outcome.decision is Decision.REJECT_UNAVAILABLE
    stats = driver.stop(drain_timeout_s=drain_s)
    reasons = [s.result(0).finish_reason for s in streams]
    assert all(s.statistics().closed and s.statistics().refused_closes == 0 for s in streams)
    if drain_s > 1:
        assert reasons == [StreamFinish.LENGTH] * 12
    else:
        assert StreamFinish.CANCELLED in reasons
    assert stats.state == "stopped" and stats.live_requests == 0
    assert runtime.statistics().live_devices == 0


# ---------------------------------------------------------------------------------------------
# M1: sync baseline vs async, in-flight 1
# ---------------------------------------------------------------------------------------------


@dataclass
class TraceSink:
    tokens: list[int] = field(default_factory=list)
    outcomes: list[RequestOutcome] = field(default_factory=list)

    def token(self, request_id: int, token: int) -> None:
        self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)


def build_trace(n: int, seed: int) -> list[tuple[float, str, Any]]:
    rng = random.Random(seed)
    events: list[tuple[float, str, Any]] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 0.004)
        prompt = tuple(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        deadline = 4 if rng.random() < 0.05 else None
        events.append((t, "submit", (i, GenerateRequest(prompt, rng.randint(1, 16), deadline_ms=deadline))))
        if rng.random() < 0.05:
            events.append((t + rng.uniform(0.001, 0.03), "cancel", i))
    events.sort(key=lambda e: e[0])
    return events


def run_trace(mode: ExecutionMode, events: list[tuple[float, str, Any]]) -> dict[str, Any]:
    transitions: dict[int, list[tuple[str, str]]] = {}
    # each restart brings a new device: device k gets rule set k
    device_rules = [(FaultRule(InjectedFault.DEVICE_BUSY, nth=250, count=2),
                     FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=600)),
                    (FaultRule(InjectedFault.BAD_COUNTERS, job_kind=JobKind.DECODE, nth=100),
                     FaultRule(InjectedFault.CCU_FAULT, job_kind=JobKind.DECODE, nth=400)),
                    (FaultRule(InjectedFault.DMA_UNKNOWN, job_kind=JobKind.PREFILL, nth=300),)]
    clock = FakeClock()
    runtime = RecordingRuntime(SimConfig(clock=clock, numerics=False), device_rules=device_rules)
    runtime.hooks.submit_errors.update({333: ReturnCode.INVALID_ARGUMENT, 1777: ReturnCode.OUT_OF_MEMORY,
                                        4100: ReturnCode.INVALID_STATE})
    runtime.hooks.result_rc.update({555: ReturnCode.INTERNAL, 2555: ReturnCode.NOT_FOUND})
    config = engine_config(recovery={"max_resets_per_10min": 100})
    from calculet.runtime.engine.driver import EngineDriver

    driver = EngineDriver(config, runtime, package_dir("current"), clock=clock,
                          options=EngineOptions(mode=mode, verify_golden=False, job_timeout_s=0.05, monitor_mode=None),
                          observer=lambda rec, s, t: transitions.setdefault(rec.request_id, []).append((s, t)))
    sinks: dict[int, TraceSink] = {}
    ids: dict[int, int] = {}
    admissions: dict[int, str] = {}
    core = driver.core
    i = 0
    while True:
        driver.dispatch()
        now = clock.now()
        while i < len(events) and events[i][0] <= now:
            _, kind, payload = events[i]
            i += 1
            if kind == "submit":
                n, req = payload
                sinks[n] = TraceSink()
                sub = driver.submit(req, sinks[n])
                ids[n] = sub.request_id
                admissions[n] = sub.outcome.decision.value
            elif ids.get(payload):
                try:
                    driver.cancel(ids[payload])
                except NotFound:
                    pass
        submitted = driver.schedule()
        if i == len(events) and core.idle():
            break
        if submitted and core.executor.healthy_inflight() == 0:
            continue  # the sync baseline waited already: look for more work at once
        if core.executor.healthy_inflight():
            nxt = min(t for t in (core.executor.next_completion(), core.executor.next_deadline()) if t is not None)
        else:
            candidates = [t for t in (core.next_wake(), events[i][0] if i < len(events) else None) if t is not None]
            nxt = min(candidates)
        clock.set(max(nxt, now))
    driver.stop()
    per_request = {n: (admissions[n], [(s, t) for s, t in transitions.get(ids[n], [])] if ids[n] else [],
                       tuple(sinks[n].tokens),
                       [(o.state, o.finish_reason.name, o.http_status, o.detail) for o in sinks[n].outcomes])
                   for n in sinks}
    jobs = [(j.kind, j.seqs, j.rc) for j in runtime.jobs]
    stats = driver.statistics()
    return {"requests": per_request, "jobs": jobs, "submit_rc": stats.executor.submit_rc,
            "completion_rc": stats.executor.completion_rc, "recovery": stats.recovery.faults}


@pytest.mark.req("R19.3", "R19.2")
def test_sync_baseline_and_async_in_flight_one_give_identical_traces() -> None:
    """M1 on 1 000 requests (simulated): the async path (submit, collect later) and the
    synchronous baseline (submit, Wait) replay the same trace — arrivals, cancels, tight
    deadlines, a timeout, a CCU fault, an unknown DMA, DeviceBusy, a counter anomaly and injected
    INVALID_ARGUMENT / OUT_OF_MEMORY / INVALID_STATE / INTERNAL / NOT_FOUND codes — with identical tokens, request
    transitions, outcomes, error codes and device job sequence. Events arriving while a job is on
    the device are delivered at the next job boundary in both paths (the sync baseline cannot see
    them earlier), so the comparison isolates the execution path."""
    events = build_trace(1000, seed=20260802)
    sync = run_trace(ExecutionMode.SYNC, events)
    async_ = run_trace(ExecutionMode.ASYNC, events)
    assert sync["jobs"] == async_["jobs"]
    assert sync["requests"] == async_["requests"]
    assert (sync["submit_rc"], sync["completion_rc"], sync["recovery"]) == (
        async_["submit_rc"], async_["completion_rc"], async_["recovery"])
    states = {outcome[0][0] for _, _, _, outcome in sync["requests"].values()}
    reasons = {outcome[0][1] for _, _, _, outcome in sync["requests"].values()}
    assert {"completed", "failed", "cancelled"} <= states and {"LENGTH", "ERROR", "DEADLINE"} <= reasons
    codes = set(sync["completion_rc"]) | set(sync["submit_rc"])
    assert {"TIMEOUT", "CCU_FAULT", "DMA_UNKNOWN", "DEVICE_BUSY", "INVALID_ARGUMENT", "OUT_OF_MEMORY",
            "INVALID_STATE", "INTERNAL", "NOT_FOUND"} <= codes, codes
    assert sync["recovery"] == {"timeout": 1, "ccu_fault": 1, "dma_unknown": 1, "device_state": 1}
    assert all(len(outcome) == 1 for _, _, _, outcome in sync["requests"].values())


# ---------------------------------------------------------------------------------------------
# the real-time engine on real threads
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R4.2", "R17.3.3", "R17.3.4", "R3.2", "R4.3")
def test_the_threaded_engine_serves_concurrent_clients_and_stops_cleanly() -> None:
    """Real time (the device's own worker thread completes jobs): 4 client threads submit 10
    requests each and cancel some; an asyncio consumer reads one stream; every stream closes
    exactly once, completed ones carry their reference tokens; stop() drains and unloads.
    Waits are bounded by events (stream close, thread join), never by sleeps."""
    runtime = SimCalRT(SimConfig(time_mode=TimeMode.REAL))
    engine = ThreadedEngine(engine_config(profiles=[1, 4], admission={"max_sequences": 8}), runtime,
                    package_dir("future"), options=EngineOptions(monitor_mode=None))
    assert engine.capabilities().ping_pong.simulated and engine.model_info().profiles == (1, 4)
    with pytest.raises(Exception, match="not started"):
        engine.submit(request(0, 2), StreamWriter())
    engine.start()
    results: dict[tuple[int, int], tuple[GenerateRequest, StreamWriter, bool]] = {}
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            for k in range(10):
                req = request(c * 10 + k, 5)
                stream = StreamWriter(tokenizer=engine.tokenizer)
                sub = engine.submit(req, stream)
                assert not sub.outcome.rejected, sub
                cancel = k % 4 == 3
                if cancel:
                    assert engine.cancel(sub.request_id).result in (CancelResult.CANCELLED, CancelResult.PENDING,
                                                                    CancelResult.ALREADY_TERMINAL)
                    engine.cancel(sub.request_id)  # idempotent
                results[(c, k)] = (req, stream, cancel)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()

    async def consume() -> list[int]:
        stream = StreamWriter(tokenizer=engine.tokenizer)
        engine.submit(request(3, 6), stream)
        tokens: list[int] = []
        async for event in stream.aevents():
            tokens.extend(event.tokens)
        return tokens

    assert tuple(asyncio.run(asyncio.wait_for(consume(), 30))) == reference(3, 6)
    for t in threads:
        t.join(30)
    assert not errors, errors
    for (c, k), (_req, stream, cancelled) in results.items():
        result = stream.result(30)
        assert stream.statistics().refused_closes == 0
        if not cancelled:
            assert result.raw_tokens == reference((c * 10 + k) % 16, 5) and result.finish_reason is StreamFinish.LENGTH
        else:
            assert result.finish_reason in (StreamFinish.CANCELLED, StreamFinish.LENGTH)
    stats = engine.statistics()
    assert stats.mailbox is not None and stats.mailbox.failed == 0
    assert runtime.statistics().live_devices == 1, "one physical device, driven by the engine's one executor"
    final = engine.stop(drain_timeout_s=10)
    assert final.state == "stopped" and final.live_requests == 0 and runtime.statistics().live_devices == 0
    with pytest.raises(Unavailable):
        engine.submit(request(0, 2), StreamWriter())
