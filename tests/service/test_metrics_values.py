"""§16 by value: each row's series read from a /metrics scrape after a scripted scenario (issue #19).

The runtime is the real engine (scheduler, executor, sampler, recovery) on the simulated NPU in
virtual time (EngineDriver, FakeClock, the tiny cost model): every scenario puts it in a known
situation, then the exposition ``GET /metrics`` serves (the app's registry: the engine collector,
the service's request metrics and request-phase observer, encoded by the same function) is parsed
and the VALUES asserted — not only that the names exist. Expected values come from the scenario
(lanes, prompt lengths, the fake clock's advances, the cost model), never from the exporter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from calculet.adapters.calrt import JobKind, ReturnCode
from calculet.adapters.sim import CostModel, FaultRule, InjectedFault, SimConfig, package_dir
from calculet.clock import FakeClock
from calculet.config import SchedulerConfig
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.request import RequestOutcome
from calculet.runtime.scheduling.kv import KvLease
from calculet.server.metrics import EngineCollector, ServedModelFacts
from calculet.server.metrics_runtime import exposition
from calculet.server.model_admin import ManagedModelAdmin
from calculet.server.request_metrics import RequestPhases, ServiceMetrics, make_registry
from tests.integration.engine.support import RecordingRuntime, engine_config

TINY = CostModel.tiny()
SMALL_CLASSES = {"short_prefill_max_tokens": 16, "medium_prefill_max_tokens": 64}
"""Prefill classes small enough for the tiny model's 256-token context: ≤16 short, ≤64 medium, long above."""


@dataclass
class FirstTokenSink:
    """A request sink that tells the service's starvation watch about arrival and first token, as the
    HTTP layer's stream does, on the fake clock."""

    watch: Any
    clock: FakeClock
    tenant: str
    tokens: int = 0
    outcome: RequestOutcome | None = None

    def __post_init__(self) -> None:
        self.watch.arrived(id(self), self.tenant, self.clock.now())

    def token(self, request_id: int, token: int) -> None:
        if self.tokens == 0:
            self.watch.started(id(self), self.clock.now())
        self.tokens += 1

    def close(self, outcome: RequestOutcome) -> None:
        self.outcome = outcome
        self.watch.ended(id(self))


@dataclass
class Stack:
    """The engine in virtual time with the service's registry around it."""

    driver: EngineDriver
    clock: FakeClock
    runtime: RecordingRuntime
    metrics: ServiceMetrics
    phases: RequestPhases
    registry: Any
    transitions: list[tuple[float, int, str, str]] = field(default_factory=list)

    def scrape(self) -> dict[str, list[Sample]]:
        """What GET /metrics returns, parsed: family name → samples."""
        body, content_type = exposition(self.registry, None)
        assert content_type.startswith("text/plain; version=0.0.4")
        return {f.name: list(f.samples) for f in text_string_to_metric_families(body.decode())}

    def submit(self, prompt: int, new: int = 4, *, tenant: str = "default", deadline_ms: int = 600_000) -> FirstTokenSink:
        sink = FirstTokenSink(self.metrics.watch, self.clock, tenant)
        request = GenerateRequest(tuple(range(1, prompt + 1)), new, tenant=tenant, deadline_ms=deadline_ms,
                                  sampling=SamplingParams(ignore_eos=True))
        self.driver.submit(request, sink)
        return sink

    def entered(self, state: str) -> list[float]:
        """Fake-clock instants at which a request entered ``state``, in order."""
        return [at for at, _, _, target in self.transitions if target == state]


def stack(config: SchedulerConfig, *, profiles: tuple[int, ...] | None = None, variant: str = "current",
          cost: CostModel = TINY, options: EngineOptions | None = None) -> Stack:
    clock = FakeClock()
    runtime = RecordingRuntime(SimConfig(clock=clock, numerics=False, cost=cost))
    registry = make_registry()
    metrics = ServiceMetrics(registry, [t.name for t in config.tenants])
    phases = RequestPhases(metrics, clock)
    transitions: list[tuple[float, int, str, str]] = []

    def observe(rec: Any, source: str, target: str) -> None:
        transitions.append((clock.now(), rec.request_id, source, target))
        phases.observe(rec, source, target)

    driver = EngineDriver(config, runtime, package_dir(variant, profiles=profiles),  # type: ignore[arg-type]
                          clock=clock, options=options or EngineOptions(verify_golden=False, monitor_mode=None),
                          observer=observe)
    runtime.jobs.clear()
    runtime.hooks.submits = runtime.hooks.accepted = 0
    admin = ManagedModelAdmin(driver.models, config)
    kv_tokens = driver.statistics().session.kv_token_capacity
    registry.register(EngineCollector(statistics=driver.statistics, models=admin.status, config=config,
                                      facts=ServedModelFacts(driver.model_info().profiles, kv_tokens)))
    return Stack(driver, clock, runtime, metrics, phases, registry, transitions)


def value(families: Mapping[str, list[Sample]], name: str, suffix: str = "", **labels: str) -> float:
    """The one sample ``name`` + ``suffix`` (``_total``, ``_count``, ``_sum``, ``_bucket``) with ``labels``."""
    full = name + suffix
    found = [s.value for s in families[name] if s.name == full and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{full}{labels}: {len(found)} samples"
    return found[0]


def counter(families: Mapping[str, list[Sample]], name: str, **labels: str) -> float:
    return value(families, name, "_total", **labels)


def bucket_counts(families: Mapping[str, list[Sample]], name: str, **labels: str) -> dict[str, float]:
    return {s.labels["le"]: s.value for s in families[name] if s.name == name + "_bucket"
            and all(s.labels.get(k) == v for k, v in labels.items())}


Scenario = Callable[[], Stack]


# ---------------------------------------------------------------------------------------------
# §16 queues
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.2")
def test_queues_depth_and_oldest_wait_of_decode_short_medium_long_follow_the_fake_clock() -> None:
    """One sequence in decode Ready and one prompt per prefill class waiting; the clock then moves
    1.25 s: each queue's depth is 1 and its oldest wait is its age on the fake clock."""
    st = stack(engine_config(queues=SMALL_CLASSES))
    st.submit(8)
    st.driver.schedule()                   # its prefill on the device
    st.clock.advance(0.5)
    st.driver.dispatch()                   # prefill applied: decode Ready; nothing scheduled
    st.clock.advance(0.25)
    st.submit(8), st.submit(40), st.submit(100)  # short, medium, long; the device is idle but nobody plans
    st.clock.advance(1.25)
    m = st.scrape()
    for queue in ("decode", "short", "medium", "long"):
        assert value(m, "calculet_queue_depth_requests", queue=queue) == 1, queue
    assert value(m, "calculet_queue_oldest_wait_seconds", queue="decode") == pytest.approx(1.5)
    for queue in ("short", "medium", "long"):
        assert value(m, "calculet_queue_oldest_wait_seconds", queue=queue) == pytest.approx(1.25), queue
    assert value(m, "calculet_request_waiting_requests") == 3
    assert value(m, "calculet_request_running_requests") == 1
    st.driver.run_until_idle()
    m = st.scrape()
    for queue in ("decode", "short", "medium", "long"):
        assert value(m, "calculet_queue_depth_requests", queue=queue) == 0
        assert value(m, "calculet_queue_oldest_wait_seconds", queue=queue) == 0
    assert counter(m, "calculet_queue_prefill_taken", queue="long") == 1
    assert counter(m, "calculet_queue_prefill_taken", queue="short") == 2


# ---------------------------------------------------------------------------------------------
# §16 batch
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.3")
def test_a_b4_batch_with_3_active_lanes_reports_compiled_4_active_3_fill_075_waste_1() -> None:
    """Three equal requests on the B4 profile (a batching window gathers their prefills): every decode
    batch is B4 with 3 lanes — fill 0.75, one wasted lane per batch — and each batch's wait is in the
    histogram (the sum is what the fake clock says the lanes waited)."""
    config = engine_config(profiles=(4,), batch={"batching_window_us": 50_000})
    st = stack(config, profiles=(1, 4), variant="future")
    new = 5
    for _ in range(3):
        st.submit(8, new)
    st.driver.run_until_idle()
    m = st.scrape()
    batches = new - 1  # the first token comes from the prefill
    assert counter(m, "calculet_batch_batches") == batches
    assert value(m, "calculet_batch_compiled_size_lanes") == 4
    assert value(m, "calculet_batch_active_lanes") == 3
    assert value(m, "calculet_batch_fill_ratio") == 0.75
    assert counter(m, "calculet_batch_lane_waste_lanes") == batches
    assert counter(m, "calculet_batch_lanes", kind="active") == 3 * batches
    assert counter(m, "calculet_batch_lanes", kind="compiled") == 4 * batches
    ready = st.entered("decode_ready")
    running = st.entered("decode_running")
    waits = [max(0.0, min(running[3 * b:3 * b + 3]) - min(ready[3 * b:3 * b + 3])) for b in range(batches)]
    assert value(m, "calculet_batch_wait_seconds", "_count") == batches
    assert value(m, "calculet_batch_wait_seconds", "_sum") == pytest.approx(sum(waits))
    assert value(m, "calculet_batch_wait_max_seconds") == pytest.approx(max(waits))
    assert max(waits) > 0  # the window held the first batch for the later prefills


# ---------------------------------------------------------------------------------------------
# §16 admission
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.1")
def test_admission_outcomes_waiting_counts_and_timeouts_move_their_series() -> None:
    """One sequence at a time, one may wait: admit, queue, reject (capacity), an invalid prompt; the
    queued one's deadline passes while it waits (a timeout)."""
    config = engine_config(admission={"max_sequences": 1, "max_waiting_requests": 1},
                           batch={"deadline_order": "at_risk"})
    st = stack(config)
    st.submit(8, 200)                          # admitted, holds the only sequence
    st.submit(12, 4, deadline_ms=100)          # queued (waits for the sequence), expires in 0.1 s
    refused = st.submit(9, 4)                  # no room to wait: 429
    invalid = st.submit(400, 4)                # longer than the context: 400
    m = st.scrape()
    assert counter(m, "calculet_admission_decisions", decision="admit") == 1
    assert counter(m, "calculet_admission_decisions", decision="queue") == 1
    assert counter(m, "calculet_admission_decisions", decision="reject_capacity") == 1
    assert counter(m, "calculet_admission_rejected_requests", reason="capacity") == 1
    assert counter(m, "calculet_admission_rejected_requests", reason="invalid") == 1
    assert value(m, "calculet_admission_waiting_requests") == 1
    assert value(m, "calculet_admission_waiting_prompt_tokens") == 12
    assert value(m, "calculet_admission_active_sequences") == 1
    assert value(m, "calculet_admission_tenant_active_sequences", tenant="default") == 1
    assert value(m, "calculet_admission_tenant_waiting_tokens", tenant="default") == 12
    assert counter(m, "calculet_admission_timeouts") == 0
    assert refused.outcome is not None and invalid.outcome is not None
    st.driver.advance(0.15)                    # the first needs 200 decode steps of ~1 ms
    m = st.scrape()
    assert counter(m, "calculet_admission_timeouts") == 1
    assert value(m, "calculet_admission_waiting_requests") == 0
    assert value(m, "calculet_admission_waiting_prompt_tokens") == 0
    st.driver.run_until_idle()
    m = st.scrape()
    assert counter(m, "calculet_request_prompt_tokens", tenant="default") == 8  # only the admitted prompt
    assert value(m, "calculet_admission_active_sequences") == 0


# ---------------------------------------------------------------------------------------------
# request phases (vLLM's queue / prefill / per-token decode time)
# ---------------------------------------------------------------------------------------------


def test_request_phase_histograms_hold_the_cost_models_durations() -> None:
    """A request alone on B1: no queueing, its prefill takes the cost model's prefill time and each
    decode step the B1 step time; a second request submitted meanwhile queues for exactly the rest
    of the first one's prefill."""
    st = stack(engine_config())
    st.submit(20, 6)
    st.driver.schedule()
    st.clock.advance(TINY.prefill_s(20) / 2)
    st.submit(10, 1)
    st.driver.run_until_idle()
    m = st.scrape()
    assert value(m, "calculet_request_queue_time_seconds", "_count", tenant="default") == 2
    assert value(m, "calculet_request_prefill_time_seconds", "_count", tenant="default") == 2
    prefills = value(m, "calculet_request_prefill_time_seconds", "_sum", tenant="default")
    assert prefills == pytest.approx(TINY.prefill_s(20) + TINY.prefill_s(10))
    queued = value(m, "calculet_request_queue_time_seconds", "_sum", tenant="default")
    assert queued >= TINY.prefill_s(20) / 2 - 1e-12  # the second waited at least for the first prefill
    assert value(m, "calculet_request_decode_time_per_token_seconds", "_count", tenant="default") == 1
    per_token = value(m, "calculet_request_decode_time_per_token_seconds", "_sum", tenant="default")
    assert per_token >= TINY.decode_s(1) - 1e-12
    assert counter(m, "calculet_request_prompt_tokens", tenant="default") == 30
    assert st.phases.open == 0


@pytest.mark.parametrize("decode_steps", [True, False], ids=["told-each-step", "as-the-service"])
def test_decode_time_per_token_is_the_decode_phase_over_its_steps_told_each_decode_step_or_not(
        decode_steps: bool) -> None:
    """A request alone on B1, 6 tokens: the prefill yields the first, then 5 decode steps of the B1 step time back to
    back, so its decode time per token is exactly that step time — whether the phases are told each decode step's
    moves or, as the service installs them (``decode_steps=False``, #20), count the steps from the record at the
    decode phase's end. Catches: the first token (the prefill's) counted as a decode step (5/6 of the step time),
    a step counted per move (half of it), the steps not counted at all without the moves (no sample)."""
    st = stack(engine_config())
    st.driver.core.set_observer(st.driver.core._observer, decode_steps=decode_steps)  # noqa: SLF001
    st.submit(20, 6)
    st.driver.run_until_idle()
    m = st.scrape()
    assert value(m, "calculet_request_decode_time_per_token_seconds", "_count", tenant="default") == 1
    per_token = value(m, "calculet_request_decode_time_per_token_seconds", "_sum", tenant="default")
    assert per_token == pytest.approx(TINY.decode_s(1), rel=1e-9)
    assert st.phases.open == 0


# ---------------------------------------------------------------------------------------------
# §16 KV and recovery
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.4", "R16.8")
def test_kv_states_tokens_unknown_and_recovery_series_follow_an_injected_dma_unknown() -> None:
    """Ping/pong B1: one sequence's KV after its prefill (8 committed, 8 + 6 reserved); then a decode
    job's DMA is unknown while the other engine still runs: its lane is Unknown and quarantined and
    recovery waits (state recovering); once the other job is done the runtime restarts, and the
    recovery time is what the fake clock says it took. Every release's free latency is in the
    histogram."""
    config = engine_config(profiles=(1,), inflight=2, recovery={"max_resets_per_10min": 5})
    st = stack(config, profiles=(1,), variant="future",
               options=EngineOptions(verify_golden=False, monitor_mode=None, job_timeout_s=0.2))
    first = st.submit(8, 6)
    st.driver.schedule()
    st.clock.advance(0.5)
    st.driver.dispatch()
    m = st.scrape()
    capacity = value(m, "calculet_kv_capacity_tokens")
    assert value(m, "calculet_kv_sequences", state="active") == 1
    assert value(m, "calculet_kv_sequences", state="free") == value(m, "calculet_kv_lanes") - 1
    assert value(m, "calculet_kv_used_tokens") == 8
    assert value(m, "calculet_kv_reserved_tokens") == 8 + 6
    assert value(m, "calculet_kv_usage_ratio") == pytest.approx((8 + 6) / capacity)
    assert counter(m, "calculet_kv_reservations") == 1

    st.runtime.device.faults.add(FaultRule(InjectedFault.DMA_UNKNOWN, job_kind=JobKind.DECODE, nth=2))
    second = st.submit(8, 30)
    seen: list[tuple[float, dict[str, list[Sample]]]] = []
    while True:
        st.driver.step()
        m = st.scrape()
        if value(m, "calculet_recovery_state", state="recovering") == 1:
            seen.append((st.clock.now(), m))
        elif seen:
            recovered_at = st.clock.now()
            break
        nxt = st.driver.next_event_time()
        assert nxt is not None, "the fault never fired"
        st.clock.set(max(nxt, st.clock.now()))
    faulted_at, during = seen[0]
    assert value(during, "calculet_kv_unknown_sequences") == 1
    assert value(during, "calculet_kv_sequences", state="unknown") == 1
    assert value(during, "calculet_recovery_quarantined_kv_sequences") == 1
    assert counter(during, "calculet_kv_faults") == 1
    assert counter(during, "calculet_recovery_faults", reason="dma_unknown") == 1
    assert counter(during, "calculet_recovery_restarts") == 0
    st.driver.run_until_idle()
    m = st.scrape()
    assert counter(m, "calculet_recovery_restarts") == 1 and counter(m, "calculet_recovery_resets") == 0
    assert value(m, "calculet_recovery_state", state="healthy") == 1
    assert value(m, "calculet_recovery_time_seconds", "_count") == 1
    assert value(m, "calculet_recovery_time_seconds", "_sum") == pytest.approx(recovered_at - faulted_at)
    assert recovered_at > faulted_at
    assert value(m, "calculet_kv_unknown_sequences") == 0
    assert value(m, "calculet_kv_used_tokens") == 0 and value(m, "calculet_kv_usage_ratio") == 0
    releases = counter(m, "calculet_kv_confirmed_releases")
    assert releases >= 1
    assert value(m, "calculet_kv_free_latency_seconds", "_count") == releases
    assert {first.outcome.state, second.outcome.state} >= {"failed"}  # type: ignore[union-attr]


@pytest.mark.req("R16.4")
def test_lane_wait_every_lane_held_the_next_request_waits_at_admission_and_the_pool_refuses_a_reservation() -> None:
    """Every KV lane held by a running sequence and one more request: it waits at admission for a
    lane (admission blocked by ``kv_lane``), and the engine never asks the pool for a lane it does
    not have (0 refusals); a reservation asked of the full pool is refused and counted (1), and once
    the sequences end the waiting request gets its lane and the waits stop."""
    st = stack(engine_config(profiles=(1,), admission={"max_kv_tokens": 1_000_000}))
    lanes = st.driver.core.scheduler.kv.lanes
    for _ in range(lanes):
        st.submit(8, 30)
    st.driver.schedule()
    m = st.scrape()
    assert value(m, "calculet_kv_free_lanes") == 0 and value(m, "calculet_kv_lanes") == lanes
    assert counter(m, "calculet_admission_blocked", limit="kv_lane") == 0
    late = st.submit(8, 2)
    st.driver.schedule()
    m = st.scrape()
    waited = counter(m, "calculet_admission_blocked", limit="kv_lane")
    assert waited >= 1 and value(m, "calculet_admission_waiting_requests") == 1
    assert counter(m, "calculet_kv_lane_wait_refusals") == 0
    refused = st.driver.core.scheduler.kv.reserve(1, 16)
    assert not isinstance(refused, KvLease)
    assert counter(st.scrape(), "calculet_kv_lane_wait_refusals") == 1
    st.driver.run_until_idle()
    m = st.scrape()
    assert late.outcome is not None and late.tokens == 2
    assert counter(m, "calculet_kv_lane_wait_refusals") == 1 and value(m, "calculet_kv_free_lanes") == lanes
    assert counter(m, "calculet_admission_blocked", limit="kv_lane") >= waited


# ---------------------------------------------------------------------------------------------
# §16 executor
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.5")
def test_executor_in_flight_by_engine_and_return_codes_match_the_devices_job_log() -> None:
    """Ping/pong: two jobs in flight, one per engine; then a DeviceBusy at submit and an INTERNAL
    result: the submit and Wait return-code counters equal what the device's own job log saw."""
    st = stack(engine_config(profiles=(1,), inflight=2), profiles=(1,), variant="future")
    st.submit(8, 6), st.submit(8, 6)
    st.driver.schedule()
    st.driver.schedule()
    m = st.scrape()
    assert value(m, "calculet_executor_inflight_jobs") == 2
    assert value(m, "calculet_executor_engine_inflight_jobs", engine="ping") == 1
    assert value(m, "calculet_executor_engine_inflight_jobs", engine="pong") == 1
    assert value(m, "calculet_executor_device_status", status="ok") == 1
    st.runtime.hooks.submit_errors[st.runtime.hooks.submits + 2] = ReturnCode.DEVICE_BUSY
    st.runtime.hooks.result_rc[st.runtime.hooks.accepted + 2] = ReturnCode.INTERNAL
    st.driver.run_until_idle()
    m = st.scrape()
    jobs = st.runtime.jobs
    assert counter(m, "calculet_executor_submit_rc", rc="OK") == len(jobs)
    assert counter(m, "calculet_executor_submit_rc", rc="DEVICE_BUSY") == st.runtime.hooks.submits - len(jobs) == 1
    assert counter(m, "calculet_executor_wait_rc", rc="INTERNAL") == sum(j.rc == "INTERNAL" for j in jobs) == 1
    assert counter(m, "calculet_executor_wait_rc", rc="OK") == sum(j.rc == "OK" for j in jobs)
    assert counter(m, "calculet_executor_submitted_jobs") == len(jobs)
    assert value(m, "calculet_executor_inflight_jobs") == 0
    ticks = counter(m, "calculet_engine_ticks")
    assert value(m, "calculet_engine_tick_host_seconds", "_count") == ticks > 0
    assert value(m, "calculet_engine_tick_host_seconds", "_sum") == pytest.approx(
        value(m, "calculet_engine_tick_host_avg_seconds") * ticks)


@pytest.mark.req("R16.5")
def test_executor_mailbox_counts_posted_run_failed_and_pending_messages() -> None:
    """The actor's mailbox: each submit is one message posted and run; two messages posted and not
    yet run are pending; when they run, the one that raised is counted failed."""
    st = stack(engine_config())
    m = st.scrape()
    base = {stage: counter(m, "calculet_executor_mailbox_messages", stage=stage) for stage in ("posted", "run",
                                                                                                "failed")}
    assert value(m, "calculet_executor_mailbox_pending_messages") == 0
    for _ in range(3):
        st.submit(8, 2)
    mailbox = st.driver._mailbox

    def broken() -> None:
        raise RuntimeError("a message that fails on the actor")

    mailbox.post(lambda: None)
    mailbox.post(broken)
    m = st.scrape()
    assert value(m, "calculet_executor_mailbox_pending_messages") == 2
    assert counter(m, "calculet_executor_mailbox_messages", stage="posted") == base["posted"] + 5
    assert counter(m, "calculet_executor_mailbox_messages", stage="run") == base["run"] + 3
    assert counter(m, "calculet_executor_mailbox_messages", stage="failed") == base["failed"]
    st.driver.run_until_idle()
    m = st.scrape()
    assert value(m, "calculet_executor_mailbox_pending_messages") == 0
    assert counter(m, "calculet_executor_mailbox_messages", stage="run") == base["run"] + 5
    assert counter(m, "calculet_executor_mailbox_messages", stage="failed") == base["failed"] + 1


# ---------------------------------------------------------------------------------------------
# §16 model
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.6")
def test_model_state_generation_and_phase_durations_over_a_load_and_unload_cycle() -> None:
    """Bring-up with warm-up: Ready, generation 1, warm-up = one 1-token prefill and one B1 decode of
    the cost model; an unload while a request runs: the drain lasts until that request completes."""
    st = stack(engine_config(), options=EngineOptions(verify_golden=False, warmup=True, monitor_mode=None))
    alias = st.driver.models.alias
    m = st.scrape()
    assert value(m, "calculet_model_state", alias=alias, state="ready") == 1
    assert sum(s.value for s in m["calculet_model_state"]) == 1
    assert value(m, "calculet_model_generation", alias=alias) == 1
    warmup = value(m, "calculet_model_phase_duration_seconds", alias=alias, phase="warmup")
    assert warmup == pytest.approx(TINY.prefill_s(1) + TINY.decode_s(1))
    assert value(m, "calculet_model_phase_duration_seconds", alias=alias, phase="load") >= warmup
    st.submit(8, 30)
    st.driver.advance(0.005)
    started = st.clock.now()
    st.driver.models.begin_unload(alias)
    st.driver.run_until_idle()
    m = st.scrape()
    completed = st.entered("completed")[-1]
    assert value(m, "calculet_model_phase_duration_seconds", alias=alias, phase="drain") == \
        pytest.approx(completed - started)
    assert value(m, "calculet_model_phase_duration_seconds", alias=alias, phase="unload") >= completed - started
    assert value(m, "calculet_model_state", alias=alias, state="unloaded") == 1
    assert value(m, "calculet_model_generation", alias=alias) == 0


# ---------------------------------------------------------------------------------------------
# §16 fairness
# ---------------------------------------------------------------------------------------------


@pytest.mark.req("R16.7")
def test_fairness_service_tokens_per_tenant_and_a_starving_setup_counts_one_starvation_event() -> None:
    """One sequence at a time, 0.1 s per decode step; tenant ``heavy`` (weight 1000) keeps overtaking
    ``light`` (weight 1), which waits more than 30 s while later arrivals get their first token: one
    starvation event for ``light``. Service tokens are each tenant's §5.3 costs (prompt + 8 × output)."""
    slow = CostModel(prefill_fixed_s=0.01, prefill_per_token_s=0.0, decode_fixed_s=0.1, decode_per_lane_s=0.0,
                     pingpong_overlap=0.5, numerics=False)
    config = engine_config(admission={"max_sequences": 1}, batch={"deadline_order": "at_risk"},
                           tenants=[{"name": "heavy", "weight": 1000.0, "api_key_sha256": "a" * 64},
                                    {"name": "light", "weight": 1.0, "api_key_sha256": "b" * 64}])
    st = stack(config, cost=slow)
    st.submit(8, 100, tenant="heavy")              # admitted at once: 10 s on the device
    st.submit(8, 100, tenant="light")              # waits
    for _ in range(4):
        st.clock.advance(0.001)
        st.submit(8, 100, tenant="heavy")          # arrive after light, overtake it (weight 1000)
    st.driver.run_until_idle()
    m = st.scrape()
    cost = 8 + 8 * 100
    assert counter(m, "calculet_fairness_service_tokens", tenant="heavy") == 5 * cost
    assert counter(m, "calculet_fairness_service_tokens", tenant="light") == cost
    assert counter(m, "calculet_fairness_starvation_events", tenant="light") == 1
    assert counter(m, "calculet_fairness_starvation_events", tenant="heavy") == 0
    assert value(m, "calculet_fairness_weight", tenant="heavy") == 1000


@pytest.mark.req("R16.7")
def test_fairness_virtual_lag_is_each_tenants_virtual_time_behind_the_global_one() -> None:
    """§5.3: a request entering service moves its tenant's virtual time and the global one to its
    finish tag, max(tenant, global) + cost / weight. Tenant ``a`` (weight 2) is served alone, then
    ``b`` (weight 1): a's tag is cost/2 (lags: a 0, b -cost/2); b's is cost/2 + cost (lags: a -cost,
    b 0). Cost = prompt + wfq_decode_weight x max tokens."""
    config = engine_config(tenants=[{"name": "a", "weight": 2.0, "api_key_sha256": "a" * 64},
                                    {"name": "b", "weight": 1.0, "api_key_sha256": "b" * 64}])
    st = stack(config)
    cost = 8 + config.queues.wfq_decode_weight * 4
    m = st.scrape()
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="a") == 0
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="b") == 0
    st.submit(8, 4, tenant="a")
    st.driver.run_until_idle()
    m = st.scrape()
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="a") == 0
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="b") == -cost / 2
    st.submit(8, 4, tenant="b")
    st.driver.run_until_idle()
    m = st.scrape()
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="a") == -cost
    assert value(m, "calculet_fairness_virtual_lag_tokens", tenant="b") == 0


@pytest.mark.req("R16.8")
def test_a_wait_timeout_counts_one_timeout_fault_and_one_reset() -> None:
    """A decode job that never completes: its Wait deadline (0.2 s) passes, the fault is a timeout and
    the device is reset (not restarted); the job's buffers were quarantined until then."""
    config = engine_config(profiles=(1,), inflight=2, recovery={"max_resets_per_10min": 5})
    st = stack(config, profiles=(1,), variant="future",
               options=EngineOptions(verify_golden=False, monitor_mode=None, job_timeout_s=0.2))
    st.runtime.device.faults.add(FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, nth=2))
    st.submit(8, 6), st.submit(8, 30)
    st.driver.run_until_idle()
    m = st.scrape()
    assert counter(m, "calculet_recovery_faults", reason="timeout") == 1
    assert counter(m, "calculet_executor_wait_timeouts") == 1
    assert counter(m, "calculet_recovery_resets") == 1 and counter(m, "calculet_recovery_restarts") == 0
    assert value(m, "calculet_recovery_resets_in_window") == 1
    assert value(m, "calculet_recovery_reset_budget") == 5
    assert value(m, "calculet_recovery_time_seconds", "_count") == 1
