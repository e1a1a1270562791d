"""The engine (§3): the tick loop that joins the sans-io scheduler to the device, on one actor.

Components, in the order a request meets them (§3, R3.1)::

    API thread ─post→ actor: RequestRegistry → AdmissionController → Prefill/DecodeScheduler
                 (Scheduler) → DeviceExecutor ─CalRT→ device ─result→ CompletionDispatcher
                 → SamplerPool → Scheduler (request/KV/job machines fire) → sink (StreamWriter)
    HealthRecovery: timeouts, CCU faults, unknown DMA → reset/restart within the budget

**One owner of state** (DESIGN principle 2, §4). :class:`EngineCore` holds the scheduler,
executor, sampler and recovery, and is not thread-safe by design. Exactly one thread runs it:

* :class:`Engine` — the public, thread-safe service API. ``start()`` spawns the actor thread
  (the tick loop) and a completion thread that blocks in CalRT ``WaitAny`` and *posts* results
  to the actor's mailbox; HTTP handlers post ``submit``/``cancel`` and wait on the actor's
  :class:`~calculet.runtime.actor.Reply`. Real time (``MonotonicClock``); nothing busy-waits.
* :class:`EngineDriver` — the same actor code, stepped by the caller, for tests and
  simulation in **virtual time**: the device runs on a :class:`FakeClock` and
  :meth:`EngineDriver.run_until_idle` advances it straight to the next event — the next device
  completion, the next Wait deadline, the scheduler's next wake-up (a request deadline, the
  batching window) or a DeviceBusy back-off — so thousands of requests simulate in seconds.

A tick is :meth:`EngineCore.dispatch` (collect completions, verify, sample, apply; expire Wait
deadlines; recover; execute the machines' commands — ``FreeSequence`` through the adapter then
``confirm_release``) followed by :meth:`EngineCore.schedule` (plan with ``scheduler.step()`` and
submit while the executor has room — one job at a time, or two with ping/pong).

**Sync baseline** (§19 M1, R19.3): ``ExecutionMode.SYNC`` submits one job and *waits* for it
(CalRT ``Wait``) inside ``schedule`` — the serial runner the async path must equal. With
in-flight 1 both paths make the same calls in the same order, so the same trace gives the same
tokens, transitions and error codes.

Decisions where the spec is silent:

* the Wait timeout is ``job_timeout_s`` (+ ``prefill_timeout_per_token_s`` per prompt token of a
  prefill job): a device job has no timeout field in CalRT or in the configuration;
* ``stop()`` stops admission (new requests get 503), lets every accepted request finish until
  the drain deadline, then cancels what is left (running jobs still drain) — every accepted
  request gets exactly one terminal outcome;
* a reset loses every KV sequence on the device: requests whose committed KV died with it end
  with an error naming the fault (a request with nothing committed yet keeps its place);
* the generation is kept across a reset or restart of the same package (§18 "generation
  recovery"); the model manager decides about new generations.

**Models** (§10–§13). The engine brings its model up through its
:class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``): from the configuration's
``models[model_alias]`` with every trust check (§11 steps 1–11), or from a package directory the
caller vouches for (tests, simulation: steps 1–2 skipped and reported). The tokenizer, KV lane
pool and scheduler are built from that first package's verified manifest; later generations
must keep that contract. Loads, unloads and rollbacks then run on the actor, one step per tick,
while the engine keeps serving: ``engine.models.load(...)`` from any thread (real time), or
``driver.models.load(...)`` in virtual time. Every request and job is counted on its
generation's ModelMachine, so a drain waits on the declared counters.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Literal, TypeVar

from calculet.adapters.calrt import CalRT, DeviceCapabilities, JobResult, ReturnCode, VirtualDevice, rc_of
from calculet.config import SchedulerConfig
from calculet.errors import BadRequest, CalculetError, DefinitionError, Unavailable
from calculet.machines.monitor import MONITOR
from calculet.machines.request import FinishReason
from calculet.runtime.actor import Mailbox, MailboxStatistics
from calculet.runtime.scheduling.admission import AdmissionOutcome, Decision, ModelAvailability
from calculet.clock import Clock, FakeClock, MonotonicClock
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.execution.executor import (
    CompletionDispatcher,
    CompletionStatistics,
    DegradeReason,
    DeviceExecutor,
    ExecutorStatistics,
    InflightJob,
    SubmitRefused,
)
from calculet.runtime.scheduling.kv import FreeSequence, KvLaneManager
from calculet.runtime.models.manager import (
    CapacityPlanner,
    LoadFailed,
    LoadReport,
    ModelManager,
    ModelManagerStatistics,
    Operation,
)
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.execution.recovery import FaultReason, HealthRecovery, RecoveryAction, RecoveryStatistics
from calculet.runtime.scheduling.registry import Cancellation, RequestRecord
from calculet.runtime.request import InferenceRequest, RequestOutcome, RequestSink
from calculet.runtime.execution.sampler import SamplerPool, SamplerStatistics, SamplingParams
from calculet.runtime.scheduling.scheduler import Plan, Scheduler, SchedulerStatistics, Submission
from calculet.runtime.execution.session import RuntimeSession, SessionStatistics
from calculet.runtime.streams.tokenizer import ByteTokenizer

log = logging.getLogger("calculet.runtime.engine.core")

T = TypeVar("T")

__all__ = ["Engine", "EngineCore", "EngineDriver", "EngineOptions", "EngineStatistics", "ExecutionMode",
           "GenerateRequest", "ModelInfo", "SamplingParams", "Submission", "TokenProvenance"]


class ExecutionMode(str, enum.Enum):
    ASYNC = "async"
    """Submit, return to the loop, collect the completion later (the production path)."""
    SYNC = "sync"
    """Submit and Wait for each job (the M1 synchronous baseline; in-flight 1 only)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request as the service hands it to the engine.

    ``deadline_ms`` is relative to arrival on the monotonic clock; None takes
    ``admission.deadline_default_ms`` (§15). Tenant weights and limits come only from the
    configuration (§5.3, R5.3.7).
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    tenant: str = "default"
    deadline_ms: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(self.prompt))


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings that are not part of ``calculet-scheduler/v1`` (ambiguities noted above)."""

    mode: ExecutionMode = ExecutionMode.ASYNC
    generation: int = 1
    job_timeout_s: float = 30.0
    prefill_timeout_per_token_s: float = 1e-3
    busy_backoff_s: float = 1e-3
    verify_golden: bool = True
    """§11 step 9 at bring-up and after every reset; impossible with numerics off."""
    warmup: bool | None = None
    """§11 step 9 warm-up jobs (one prefill, one decode per profile) before a generation is
    published; None follows ``verify_golden`` (a numerics-off simulation keeps its clock at 0)."""
    check_output_buffers: bool = True
    """The data-channel crosstalk check (reads each job's OutputBuf once)."""
    sampler_seed: int = 0
    degrade_min_samples: int = 64
    monitor_mode: Literal["raise", "count"] | None = "count"
    """``Engine.start`` applies ``monitoring.invariants`` with this mode; None leaves the global
    monitor as it is (tests keep it raising)."""
    trace_components: bool = False
    """Record (component, request id) as requests pass each §3 component (R3.1)."""
    actor_idle_s: float = 0.5
    """Longest the actor thread sleeps when nothing is due (it is woken by any message)."""


@dataclass(frozen=True)
class ModelInfo:
    """The served model generation and its capability contract (what ``/models`` shows)."""

    generation: int
    calbin: str
    exact_submodel: str
    package_sha256: str
    vocab_size: int
    bos_token: int
    eos_token: int
    max_seq: int
    profiles: tuple[int, ...]
    capabilities: DeviceCapabilities


@dataclass(frozen=True)
class EngineStatistics:
    """Every component's statistics in one frozen record, for the metrics layer (§16)."""

    state: str
    mode: str
    generation: int
    availability: str
    accepting: bool
    ticks: int
    host_time_per_tick_s: float
    host_time_max_s: float
    accepted: int
    rejected_before_admission: dict[str, int]
    finished: dict[str, int]
    live_requests: int
    pending_frees: int
    scheduler: SchedulerStatistics
    executor: ExecutorStatistics
    completion: CompletionStatistics
    sampler: SamplerStatistics
    recovery: RecoveryStatistics
    session: SessionStatistics
    mailbox: MailboxStatistics | None
    device: Any
    models: ModelManagerStatistics | None = None


@dataclass(frozen=True)
class TokenProvenance:
    """Where a delivered token came from (generation isolation, §10, R19.16): the request's pinned
    generation, the generation of the job that produced it, the generation the device's result
    carried, and the generation whose calbin the result names."""

    request_id: int
    token: int
    request_generation: int
    job_generation: int
    result_generation: int
    calbin_generation: int

    @property
    def isolated(self) -> bool:
        return (self.request_generation == self.job_generation == self.result_generation
                == self.calbin_generation)


class _Request:
    """Engine-side facts of a live request: its prompt ids and its stream timing."""

    __slots__ = ("prompt", "last_token_at")

    def __init__(self, prompt: tuple[int, ...]) -> None:
        self.prompt = prompt
        self.last_token_at: float | None = None


class _Sink:
    """Wraps the caller's sink: the engine sees each token and the close, then forwards them."""

    __slots__ = ("core", "user", "closed")

    def __init__(self, core: EngineCore, user: RequestSink) -> None:
        self.core = core
        self.user = user
        self.closed = False

    def token(self, request_id: int, token: int) -> None:
        self.core._on_token(request_id, token)
        self.user.token(request_id, token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closed = True
        self.core._on_close(outcome)
        self.user.close(outcome)


def _reject(sink: RequestSink, decision: Decision, status: int, reason: str) -> Submission:
    outcome = RequestOutcome(0, "failed", FinishReason.REJECTED, 0, status, reason)
    try:
        sink.close(outcome)
    except Exception:  # noqa: BLE001 - a broken client must not break the actor
        log.exception("sink.close failed on a rejection")
    return Submission(0, AdmissionOutcome(decision, reason))


class EngineCore:
    """The actor's state and the tick; one thread at a time (the owner) may call it."""

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: Clock, options: EngineOptions = EngineOptions(),
                 observer: Callable[[RequestRecord, str, str], None] | None = None,
                 device: VirtualDevice | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None,
                 planner: CapacityPlanner | None = None) -> None:
        if options.mode is ExecutionMode.SYNC and config.executor.max_inflight != 1:
            raise DefinitionError("the synchronous baseline runs one job at a time: executor.max_inflight must be 1")
        self.config = config
        self.options = options
        self.runtime = runtime
        self.package_dir = package_dir
        self.clock = clock
        self._observer = observer
        self._provenance = provenance
        self._delivering: tuple[int, int, int] | None = None
        self._hold = False
        self.exclusive_device: Callable[[], ContextManager[None]] = contextlib.nullcontext
        """Held around host-driven device work (golden, warm-up, a session reset): the threaded
        engine pauses its completion thread so WaitAny cannot take those jobs' results."""
        self.device: VirtualDevice = device if device is not None else runtime.create_virtual_device()
        self.trace: list[tuple[str, int]] | None = [] if options.trace_components else None
        self._requests: dict[int, _Request] = {}
        self._pending_frees: list[FreeSequence] = []
        self._accepting = True
        self._stopped = False
        self._backoff_until = 0.0
        self._wake: float | None = None
        self._overlapped = False
        self._accepted = 0
        self._rejected: Counter[str] = Counter()
        self._finished: Counter[str] = Counter()
        self._ticks = 0
        self._host_time = 0.0
        self._host_max = 0.0
        self.models = ModelManager(self, planner=planner, first_generation=options.generation)
        try:
            # §11 steps 1–4 of the first generation; the components are built on its verified facts.
            prepared = self.models.prepare_initial(package_dir)
            plan = prepared.plan
            facts = plan.facts
            self._contract_capabilities = plan.capabilities
            self.tokenizer = ByteTokenizer(facts.vocab_size, bos=facts.bos_token, eos=facts.eos_token)
            self.kv = KvLaneManager(plan.lanes, plan.max_seq, capabilities=plan.kv_capabilities(), clock=clock)
            self.scheduler = Scheduler(config, clock=clock, kv=self.kv, device_kv_tokens=plan.kv_token_capacity,
                                       max_seq=plan.max_seq, capabilities=plan.scheduling_capabilities(),
                                       observer=self._observe)
            self.sampler = SamplerPool(seed=options.sampler_seed, eos=facts.eos_token)
            self.executor = DeviceExecutor(RuntimeSession.detached(self.device, config), config.executor, clock=clock,
                                           job_timeout_s=options.job_timeout_s,
                                           prefill_timeout_per_token_s=options.prefill_timeout_per_token_s,
                                           check_output_buffers=options.check_output_buffers,
                                           degrade_min_samples=options.degrade_min_samples)
            self.dispatcher = CompletionDispatcher(self.sampler,
                                                   lane_isolation=plan.capabilities.lane_failure_isolation.value)
            self.recovery = HealthRecovery(config.recovery, clock=clock, capabilities=plan.capabilities)
            # Steps 5–11, inline: nothing serves yet, so nothing waits.
            self.bring_up: LoadReport = self.models.finish_initial(prepared)
        except LoadFailed as exc:
            self.device.close()
            raise exc.cause from exc
        except BaseException:
            self.device.close()
            raise

    # ------------------------------------------------------------------ the serving generation

    @property
    def session(self) -> RuntimeSession:
        """The session the executor is bound to: the serving generation's (or a detached one)."""
        return self.executor.session

    @property
    def generation(self) -> int:
        gen = self.models.serving
        return gen.id if gen is not None else self.scheduler.generation

    @property
    def capabilities(self) -> DeviceCapabilities:
        """The capability contract of the serving generation's package (the first one's when none
        serves); the engine-level facts in it are the same for every generation (EngineContract)."""
        gen = self.models.serving
        if gen is not None and gen.facts is not None:
            return gen.facts.capabilities
        return self._contract_capabilities

    def hold_submissions(self, hold: bool) -> None:
        """§11 step 9: golden/warm-up jobs need the engines; planned work waits while they run."""
        self._hold = hold

    def run_commands(self) -> None:
        """Execute the machines' pending commands (FreeSequence, ...) through the adapter."""
        self._run_commands()

    def report_device_fault(self, rc: ReturnCode, detail: str) -> None:
        """A job outside the executor (golden/warm-up, §11 step 9) left the device in doubt: recover
        it (reset or restart per the contract, within the budget) before anything is served again."""
        reason = FaultReason.DEVICE_STATE if rc is ReturnCode.INVALID_STATE else self.recovery.reason_for(rc)
        self._enter_recovery(reason, detail)

    # ------------------------------------------------------------------ API (on the actor)

    def submit(self, request: GenerateRequest, sink: RequestSink) -> Submission:
        """Validate, create and admit a request (§4, §5.2); the outcome is returned at once."""
        if not self._accepting:
            self._rejected["stopping"] += 1
            return _reject(sink, Decision.REJECT_UNAVAILABLE, 503, "the engine is stopping")
        try:
            prompt = self.tokenizer.validate(request.prompt)
            if not prompt:
                raise BadRequest("the prompt must hold at least one token", field="prompt")
            if not isinstance(request.sampling, SamplingParams):
                raise BadRequest("sampling must be SamplingParams", field="sampling")
        except BadRequest as exc:
            self._rejected["invalid"] += 1
            return _reject(sink, Decision.REJECT_INVALID, 400, exc.message)
        wrapper = _Sink(self, sink)
        submission = self.scheduler.submit(
            InferenceRequest(len(prompt), request.max_new_tokens, request.tenant, request.deadline_ms), wrapper)
        rid = submission.request_id
        if rid and not wrapper.closed:
            self._accepted += 1
            self._requests[rid] = _Request(prompt)
            self.sampler.register(rid, request.sampling)
            if self.trace is not None:
                self.trace.extend((("api", rid), ("registry", rid), ("admission", rid)))
        self._run_commands()
        return submission

    def cancel(self, request_id: int) -> Cancellation:
        """§4 cancel (idempotent; a running request drains); ``NotFound`` for an unknown id."""
        result = self.scheduler.cancel(request_id)
        self._run_commands()
        return result

    def begin_stop(self) -> None:
        """Stop admission: from now on new requests are answered 503."""
        self._accepting = False

    def shutdown(self) -> None:
        """The drain deadline passed: cancel every request not on the device (jobs still drain)."""
        self._accepting = False
        if self.scheduler.availability not in (ModelAvailability.SHUTDOWN, ModelAvailability.FAILED):
            self.scheduler.shutdown()
        self._run_commands()

    def teardown(self) -> None:
        """Release the device: an orderly unload (§12) of every idle generation, then close it."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.models.teardown()
        except CalculetError as exc:
            log.error("unload was not clean; closing the device", extra={"detail": str(exc)})
        finally:
            self.device.close()

    # ------------------------------------------------------------------ the tick

    def tick(self) -> None:
        """One turn of the loop: dispatch what is due, then schedule."""
        self.dispatch()
        self.schedule()

    def dispatch(self) -> None:
        """Collect due completions, expire Wait deadlines, recover, execute commands."""
        start = time.perf_counter()
        if self.options.mode is ExecutionMode.ASYNC:
            for result in self.executor.collect():
                self._handle_result(result)
        self._expire_jobs()
        self._maybe_recover()
        self._run_commands()
        self.models.poll()
        self._account(start)

    def on_results(self, results: list[JobResult]) -> None:
        """Results collected by the completion thread (real time), applied on the actor."""
        start = time.perf_counter()
        for result in results:
            self._handle_result(result)
        self._maybe_recover()
        self._run_commands()
        self._account(start)

    def schedule(self) -> int:
        """Plan and submit while the executor has room; the sync baseline also waits (one job)."""
        start = time.perf_counter()
        submitted = 0
        scheduler, executor = self.scheduler, self.executor
        sync = self.options.mode is ExecutionMode.SYNC
        while True:
            effective = executor.degrade.effective_inflight
            if effective < scheduler.jobs.max_inflight:
                scheduler.limit_inflight(effective)
            now = self.clock.now()
            if now < self._backoff_until or self.recovery.pending is not None or self._hold:
                self._wake = self._backoff_until if now < self._backoff_until else None
                break
            plan = scheduler.step()
            self._wake = plan.wake_at
            if plan.work is None:
                break
            job = self._submit(plan)
            if job is None:
                continue
            submitted += 1
            if sync:
                result = executor.wait(job)
                if result is None:
                    executor.mark_timed_out(job)
                    self._timed_out(job)
                else:
                    self._handle_result(result)
                self._maybe_recover()
                self._run_commands()
                break
        self._maybe_recover()  # a submit refused for a bad device state
        self._run_commands()
        self._account(start)
        return submitted

    def next_wake(self) -> float | None:
        """The next instant the actor must run without being told (deadlines, Wait timeouts, back-off)."""
        times = [t for t in (self._wake, self.executor.next_deadline(), self.models.next_deadline())
                 if t is not None]
        if self._backoff_until > self.clock.now():
            times.append(self._backoff_until)
        return min(times) if times else None

    def next_event_time(self) -> float | None:
        """As :meth:`next_wake`, plus the next device completion (virtual time)."""
        times = [t for t in (self.next_wake(), self.executor.next_completion()) if t is not None]
        return min(times) if times else None

    def idle(self) -> bool:
        """Nothing live, nothing on the device that will still complete, no command pending."""
        return (len(self.scheduler.registry) == 0 and self.executor.healthy_inflight() == 0
                and not self._pending_frees and self.recovery.pending is None and not self.models.busy())

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def pending_frees(self) -> int:
        """``FreeSequence`` commands the device refused so far (retried every tick)."""
        return len(self._pending_frees)

    # ------------------------------------------------------------------ reading

    def model_info(self) -> ModelInfo:
        gen = self.models.serving
        session = gen.session if gen is not None else None
        if gen is None or session is None or not session.has_calbin:
            raise Unavailable(f"no model generation of {self.config.model_alias!r} is serving")
        calbin = session.calbin
        return ModelInfo(gen.id, calbin.name, calbin.exact_submodel, calbin.package_sha256,
                         calbin.vocab_size, calbin.bos_token, calbin.eos_token, session.max_seq,
                         session.profiles.sizes, calbin.capabilities)

    def statistics(self, mailbox: MailboxStatistics | None = None) -> EngineStatistics:
        scheduler = self.scheduler
        try:
            device = self.device.statistics()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - statistics of a closed device are not essential
            device = None
        state = "stopped" if self._stopped else "running" if self._accepting else "stopping"
        return EngineStatistics(
            state=state, mode=self.options.mode.value, generation=self.generation,
            availability=scheduler.availability.value, accepting=self._accepting, ticks=self._ticks,
            host_time_per_tick_s=self._host_time / self._ticks if self._ticks else 0.0,
            host_time_max_s=self._host_max, accepted=self._accepted, rejected_before_admission=dict(self._rejected),
            finished=dict(self._finished), live_requests=len(scheduler.registry),
            pending_frees=len(self._pending_frees), scheduler=scheduler.statistics(),
            executor=self.executor.statistics(), completion=self.dispatcher.statistics(),
            sampler=self.sampler.statistics(), recovery=self.recovery.statistics(),
            session=self.session.statistics(), mailbox=mailbox, device=device,
            models=self.models.statistics_now())

    # ------------------------------------------------------------------ submitting

    def _submit(self, plan: Plan) -> InflightJob | None:
        work = plan.work
        assert work is not None and plan.engine is not None
        scheduler, executor = self.scheduler, self.executor
        if not self.models.may_submit(work.generation):  # a generation leaving service takes no new job
            scheduler.submit_failed(work.job_id)
            for rid in self._request_ids(work):
                scheduler.fail(rid, f"generation {work.generation} is no longer serving")
            return None
        prompt = None
        if isinstance(work, PrefillWork):
            entry = self._requests.get(work.request_id)
            prompt = entry.prompt if entry is not None else None
        try:
            if isinstance(work, PrefillWork) and prompt is None:
                raise DefinitionError(f"request {work.request_id} has no prompt on record")
            spec = executor.build(work, plan.engine, prompt)
        except CalculetError as exc:
            scheduler.submit_failed(work.job_id)
            self._refused(work, SubmitRefused(rc_of(exc), str(exc)))
            return None
        outcome = executor.submit(work, spec)
        if isinstance(outcome, SubmitRefused):
            scheduler.submit_failed(work.job_id)
            self._refused(work, outcome)
            return None
        scheduler.submitted(work.job_id)
        self.models.on_job_submitted(work.generation)
        executor.degrade.accepted()
        if self.trace is not None:
            stage = "decode_scheduler" if isinstance(work, DecodeBatch) else "prefill_scheduler"
            for rid in self._request_ids(work):
                self.trace.extend(((stage, rid), ("executor", rid)))
        return outcome

    def _refused(self, work: PrefillWork | DecodeBatch, refused: SubmitRefused) -> None:
        """A submit the device refused: back off (busy), recover (bad state) or fail the requests."""
        rc = refused.rc
        if rc is ReturnCode.DEVICE_BUSY:
            self.executor.degrade.busy_or_timeout(refused.detail)
            self._backoff_until = self.clock.now() + self.options.busy_backoff_s
            return
        if rc in (ReturnCode.INVALID_STATE, ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN, ReturnCode.TIMEOUT):
            self._enter_recovery(self.recovery.reason_for(rc) if rc is not ReturnCode.INVALID_STATE
                                 else FaultReason.DEVICE_STATE, refused.detail)
            return
        for rid in self._request_ids(work):
            self.scheduler.fail(rid, f"submit refused, {refused.detail}")

    @staticmethod
    def _request_ids(work: PrefillWork | DecodeBatch) -> list[int]:
        if isinstance(work, DecodeBatch):
            return [b.request_id for b in work.active]
        return [work.request_id]

    # ------------------------------------------------------------------ completions

    def _handle_result(self, result: JobResult) -> None:
        job = self.executor.take(result)
        if job is None:
            return
        work = job.work
        self.models.on_job_finished(work.generation)
        if self._provenance is not None:
            self._delivering = (work.generation, result.generation,
                                self.models.generation_of_calbin(result.calbin_id))
        try:
            self._apply_result(job, result)
        finally:
            self._delivering = None

    def _apply_result(self, job: InflightJob, result: JobResult) -> None:
        executor, scheduler = self.executor, self.scheduler
        work = job.work
        if job.timed_out:  # a late completion: nothing is delivered, the slot and lanes are reclaimed
            if isinstance(work, DecodeBatch):
                scheduler.on_decode_complete(DecodeCompletion(work.job_id, result.generation, False, (),
                                                              FaultKind.ERROR, "late completion"))
            else:
                scheduler.on_prefill_complete(PrefillCompletion(work.job_id, result.generation, work.request_id,
                                                                work.seq_id, False, None))
            return
        anomalies = executor.verify(job, result)
        self._overlapped = job.overlapped
        if self.trace is not None:
            for rid in self._request_ids(work):
                self.trace.extend((("completion", rid), ("sampler", rid)))
        if isinstance(work, DecodeBatch):
            scheduler.on_decode_complete(self.dispatcher.decode(job, result, anomalies))
        else:
            scheduler.on_prefill_complete(self.dispatcher.prefill(job, result, anomalies))
        degrade = executor.degrade
        if anomalies:
            kinds = {kind.value for kind, _ in anomalies}
            detail = anomalies[0][1]
            if kinds & {"crosstalk", "wrong_job", "wrong_generation"}:
                degrade.trigger(DegradeReason.CROSSTALK, detail)
            if "counters" in kinds:
                degrade.trigger(DegradeReason.COUNTERS, detail)
            scheduler.recover_lanes()
            return
        rc = result.rc
        if rc is ReturnCode.OK:
            return
        if rc in (ReturnCode.TIMEOUT, ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN):
            if rc is ReturnCode.TIMEOUT:
                degrade.busy_or_timeout(rc.name)
            self._enter_recovery(self.recovery.reason_for(rc), f"{rc.name}: {result.message or 'job fault'}")
            return
        scheduler.recover_lanes()  # a known failure: the device is done with the job's lanes

    def _expire_jobs(self) -> None:
        for job in self.executor.expired(self.clock.now()):
            self._timed_out(job)

    def _timed_out(self, job: InflightJob) -> None:
        timeout = job.deadline - job.ticket.submitted_at
        detail = f"TIMEOUT: job {int(job.device_job)} not complete after {timeout:g} s"
        log.warning("Wait timed out", extra={"rc": ReturnCode.TIMEOUT.name, "job_id": job.job_id})
        self.scheduler.job_timed_out(job.job_id, detail)
        self.executor.degrade.busy_or_timeout(detail)
        self._enter_recovery(FaultReason.TIMEOUT, detail)

    # ------------------------------------------------------------------ recovery

    def _enter_recovery(self, reason: FaultReason, detail: str) -> None:
        if self.recovery.failed:
            return
        self.recovery.report(reason, detail)
        self.models.on_fault()

    def _maybe_recover(self) -> None:
        """Reset/restart once the healthy jobs drained (§14), within the budget (§15)."""
        recovery = self.recovery
        while recovery.pending is not None and self.executor.healthy_inflight() == 0:
            pending = recovery.begin()
            if pending is None:
                self._give_up()
                return
            self.executor.forget_all()
            self.models.on_jobs_discarded()
            ok = True
            try:
                if pending.action is RecoveryAction.RESET:
                    self.models.reset_device()
                else:
                    self._restart()
            except CalculetError as exc:
                ok = False
                log.error("recovery action failed", extra={"action": pending.action.name, "detail": str(exc)})
            recovery.finished(pending, ok=ok)
            if not ok:
                self.executor.degrade.trigger(DegradeReason.UNCERTAIN_RECOVERY, pending.detail)
                continue
            detail = f"KV lost in device {pending.action.name.lower()} after {pending.detail}"
            self.scheduler.device_reset(detail)
            self.scheduler.fail_lost_kv(detail)
            self._run_commands()
            self.models.on_recovered()
            self._run_commands()
            self._backoff_until = 0.0
            self._wake = self.clock.now()  # serve again at once

    def _restart(self) -> None:
        """Close the VirtualDevice and bring the serving generation up on a new one (a process restart)."""
        self.models.restart_device()

    def _give_up(self) -> None:
        detail = self.recovery.give_up()
        self.models.on_give_up(detail)
        self._run_commands()

    # ------------------------------------------------------------------ commands (§9.2)

    def _run_commands(self) -> None:
        scheduler, executor = self.scheduler, self.executor
        for _ in range(1000):
            commands: list[Any] = self._pending_frees + scheduler.take_commands()
            self._pending_frees = []
            if not commands:
                return
            progressed = False
            for command in commands:
                if isinstance(command, FreeSequence):
                    if executor.free_sequence(command):
                        scheduler.confirm_release(command.lane, command.seq_id)
                        progressed = True
                    else:
                        self._pending_frees.append(command)
                else:
                    log.error("unsupported command dropped", extra={"command": repr(command)})
            if not progressed:
                return

    # ------------------------------------------------------------------ sink callbacks

    def _observe(self, rec: RequestRecord, source: str, target: str) -> None:
        self.models.on_request_transition(rec, source, target)
        if self._observer is not None:
            self._observer(rec, source, target)

    def _on_token(self, request_id: int, token: int) -> None:
        provenance = self._provenance
        if provenance is not None:
            rec = self.scheduler.registry.get(request_id)
            job_gen, result_gen, calbin_gen = self._delivering or (0, 0, 0)
            provenance(TokenProvenance(request_id, token, rec.generation if rec is not None else 0, job_gen,
                                       result_gen, calbin_gen))
        entry = self._requests.get(request_id)
        if entry is None:
            return
        now = self.clock.now()
        if entry.last_token_at is not None:
            self.executor.degrade.latency(now - entry.last_token_at, overlapped=self._overlapped)
        entry.last_token_at = now
        if self.trace is not None:
            self.trace.append(("stream", request_id))

    def _on_close(self, outcome: RequestOutcome) -> None:
        self._finished[outcome.finish_reason.name.lower()] += 1
        self._requests.pop(outcome.request_id, None)
        self.sampler.release(outcome.request_id)

    def _account(self, start: float) -> None:
        took = time.perf_counter() - start
        self._ticks += 1
        self._host_time += took
        if took > self._host_max:
            self._host_max = took


# ---------------------------------------------------------------------------------------------
# The thread-safe service API
# ---------------------------------------------------------------------------------------------


class Engine:
    """The engine as the HTTP service uses it; every method may be called from any thread.

    ::

        engine = Engine(config, runtime, package_dir)      # bring-up (§11 steps 7–9)
        engine.start()
        stream = StreamWriter(tokenizer=engine.tokenizer, stop=params.stop)
        submission = engine.submit(GenerateRequest(prompt, 64, sampling=params), stream)
        for event in stream.events(timeout=30): ...
        engine.cancel(submission.request_id)
        engine.stop(drain_timeout_s=30)
    """

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: Clock | None = None, options: EngineOptions = EngineOptions(),
                 device: VirtualDevice | None = None, planner: CapacityPlanner | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None) -> None:
        if isinstance(clock, FakeClock):
            raise DefinitionError("Engine runs in real time; drive a FakeClock with EngineDriver")
        if options.mode is not ExecutionMode.ASYNC:
            raise DefinitionError("Engine runs the async path; the sync baseline is EngineDriver's")
        self._core = EngineCore(config, runtime, package_dir, clock=clock or MonotonicClock(), options=options,
                                device=device, planner=planner, provenance=provenance)
        self.models: ModelManager = self._core.models
        """Load / unload / rollback / status, thread-safe and blocking with a timeout (§10–§13)."""
        self.models.bind_port(_ThreadPort(self))
        self._mailbox = Mailbox()
        self._device_cv = threading.Condition()
        self._exclusive = False
        self._in_wait = False
        self._core.exclusive_device = self._exclusive_device
        self._actor: threading.Thread | None = None
        self._completer: threading.Thread | None = None
        self._stop = threading.Event()
        self._stop_deadline: float | None = None
        self._lock = threading.Lock()
        self._final: EngineStatistics | None = None
        self.tokenizer = self._core.tokenizer

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the actor (tick loop) and the completion thread."""
        with self._lock:
            if self._actor is not None:
                raise DefinitionError("the engine was already started")
            mode = self._core.options.monitor_mode
            if mode is not None:
                MONITOR.configure(enabled=self._core.config.monitoring.invariants, mode=mode)
            self._actor = threading.Thread(target=self._run_actor, name="calculet-engine", daemon=True)
            self._completer = threading.Thread(target=self._run_completer, name="calculet-completion", daemon=True)
            self._actor.start()
            self._completer.start()

    def stop(self, drain_timeout_s: float = 30.0) -> EngineStatistics:
        """Stop admission, drain accepted requests up to ``drain_timeout_s``, then cancel what is
        left, wait for the device and unload. Every accepted request gets one terminal outcome."""
        with self._lock:
            actor = self._actor
            if actor is None:
                self._core.begin_stop()
                self._core.shutdown()
                self._core.teardown()
                self._final = self._core.statistics()
                return self._final
        deadline = self._core.clock.now() + drain_timeout_s
        self._mailbox.post(lambda: self._begin_stop(deadline))
        actor.join()
        self._stop.set()
        if self._completer is not None:
            self._completer.join()
        assert self._final is not None
        return self._final

    # ------------------------------------------------------------------ requests

    def submit(self, request: GenerateRequest, sink: RequestSink, timeout: float | None = 30.0) -> Submission:
        """Admit a request; the §5.2 outcome comes back synchronously (the actor's Reply)."""
        return self._call(lambda: self._core.submit(request, sink), timeout)

    def cancel(self, request_id: int, timeout: float | None = 30.0) -> Cancellation:
        """§4 cancel: idempotent; a running request drains. ``NotFound`` for an unknown id."""
        return self._call(lambda: self._core.cancel(request_id), timeout)

    # ------------------------------------------------------------------ reading

    def statistics(self, timeout: float | None = 30.0) -> EngineStatistics:
        """Every component's statistics, read on the actor (a consistent snapshot)."""
        if self._final is not None:
            return self._final
        if self._actor is None:
            return self._core.statistics(self._mailbox.statistics())
        return self._call(lambda: self._core.statistics(self._mailbox.statistics()), timeout)

    def capabilities(self) -> DeviceCapabilities:
        """The device capability contract, with evidence tier and source per answer (§1, §20)."""
        return self._core.capabilities

    def model_info(self) -> ModelInfo:
        return self._core.model_info()

    # ------------------------------------------------------------------ threads

    def _call(self, message: Callable[[], T], timeout: float | None) -> T:
        if self._actor is None:
            raise DefinitionError("the engine is not started")
        if self._final is not None:
            raise Unavailable("the engine has stopped")
        return self._mailbox.call(message, timeout)

    def _begin_stop(self, deadline: float) -> None:
        self._stop_deadline = deadline
        self._core.begin_stop()

    def _run_actor(self) -> None:
        core, mailbox = self._core, self._mailbox
        clock = core.clock
        try:
            while True:
                wake = core.next_wake()
                now = clock.now()
                idle = core.options.actor_idle_s
                timeout = idle if wake is None else min(idle, max(0.0, wake - now))
                if self._stop_deadline is not None:
                    timeout = min(timeout, max(0.0, self._stop_deadline - now))
                mailbox.run_until(timeout)
                core.tick()
                deadline = self._stop_deadline
                if deadline is None:
                    continue
                if core.idle():
                    break
                if clock.now() >= deadline and core.accepting is False:
                    core.shutdown()
                    if core.executor.healthy_inflight() == 0 and not core.pending_frees:
                        break
        finally:
            core.shutdown()
            core.teardown()
            self._final = core.statistics(mailbox.statistics())
            mailbox.run_pending()

    @contextlib.contextmanager
    def _exclusive_device(self) -> Iterator[None]:
        """(actor) Pause the completion thread: host-driven jobs (golden, warm-up) Wait for their own
        results, which WaitAny must not collect first. Returns once WaitAny is not running."""
        cv = self._device_cv
        with cv:
            self._exclusive = True
            while self._in_wait:
                cv.wait()
        try:
            yield
        finally:
            with cv:
                self._exclusive = False
                cv.notify_all()

    def _run_completer(self) -> None:
        """Blocks in CalRT WaitAny and posts results to the actor (DESIGN principle 2)."""
        core = self._core
        cv = self._device_cv
        while not self._stop.is_set():
            with cv:
                while self._exclusive and not self._stop.is_set():
                    cv.wait(0.5)
                self._in_wait = True
            device = core.device
            try:
                results = device.wait_any(0.1)
            except CalculetError:
                results = None
            finally:
                with cv:
                    self._in_wait = False
                    cv.notify_all()
            if results is None:
                self._stop.wait(0.05)
                continue
            if results:
                self._mailbox.post(lambda r=results: core.on_results(r))  # type: ignore[misc]


class _ThreadPort:
    """The model manager's way to the real-time actor: post a message, wait for the reply."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        engine = self._engine
        if engine._final is not None:
            raise Unavailable("the engine has stopped")
        actor = engine._actor
        if actor is None or actor.ident == threading.get_ident():
            return fn()  # not started yet (the caller is the only thread), or already on the actor
        return engine._mailbox.call(fn, timeout)

    def run(self, op: Operation, timeout: float | None) -> Any:
        engine = self._engine
        if engine._actor is None and not op.done:
            engine._core.models.poll()
            if not op.done:
                raise DefinitionError(f"start the engine first: {op.describe()}")
        return op.reply.wait(timeout)


# ---------------------------------------------------------------------------------------------
# The caller-stepped driver (virtual time)
# ---------------------------------------------------------------------------------------------


class EngineDriver:
    """The engine's actor code, stepped by the calling thread — for tests and simulation.

    With a virtual-time device (``SimConfig(time_mode=VIRTUAL, clock=fake)``) and the same
    :class:`FakeClock`, :meth:`run_until_idle` jumps the clock from event to event; with
    ``options.mode=SYNC`` every job is submitted and waited for (the M1 baseline).
    """

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: FakeClock, options: EngineOptions = EngineOptions(),
                 observer: Callable[[RequestRecord, str, str], None] | None = None,
                 device: VirtualDevice | None = None, planner: CapacityPlanner | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None) -> None:
        self.clock = clock
        self.core = EngineCore(config, runtime, package_dir, clock=clock, options=options, observer=observer,
                               device=device, planner=planner, provenance=provenance)
        self.models: ModelManager = self.core.models
        """The same ModelManager API, run in virtual time: a blocking call steps this driver."""
        self.models.bind_port(_VirtualPort(self))
        self._mailbox = Mailbox()
        self.tokenizer = self.core.tokenizer

    # ------------------------------------------------------------------ the same API, inline

    def submit(self, request: GenerateRequest, sink: RequestSink) -> Submission:
        return self._run(lambda: self.core.submit(request, sink))

    def cancel(self, request_id: int) -> Cancellation:
        return self._run(lambda: self.core.cancel(request_id))

    def statistics(self) -> EngineStatistics:
        return self.core.statistics(self._mailbox.statistics())

    def capabilities(self) -> DeviceCapabilities:
        return self.core.capabilities

    def model_info(self) -> ModelInfo:
        return self.core.model_info()

    def stop(self, drain_timeout_s: float = 30.0) -> EngineStatistics:
        """As :meth:`Engine.stop`, in virtual time."""
        core = self.core
        core.begin_stop()
        self.run_until_idle(max_time_s=drain_timeout_s)
        if not core.idle():
            core.shutdown()
            self.run_until_idle(max_time_s=max(core.options.job_timeout_s, 1.0) * 4)
        core.teardown()
        return self.statistics()

    # ------------------------------------------------------------------ stepping

    def dispatch(self) -> None:
        self._mailbox.run_pending()
        self.core.dispatch()

    def schedule(self) -> int:
        return self.core.schedule()

    def step(self) -> None:
        """One tick at the current instant."""
        self.dispatch()
        self.schedule()

    def next_event_time(self) -> float | None:
        return self.core.next_event_time()

    def run_until(self, when: float) -> None:
        """Process every event up to ``when``; the clock ends at ``when``."""
        stalls = 0
        while True:
            self.step()
            nxt = self.next_event_time()
            if nxt is None or nxt > when:
                break
            stalls = self._jump(nxt, stalls)
        if when > self.clock.now():
            self.clock.set(when)
            self.step()

    def advance(self, seconds: float) -> None:
        self.run_until(self.clock.now() + seconds)

    def run_until_idle(self, max_time_s: float | None = None) -> float:
        """Step from event to event until nothing is left to do (or ``max_time_s`` of virtual time)."""
        limit = None if max_time_s is None else self.clock.now() + max_time_s
        stalls = 0
        while True:
            self.step()
            if self.core.idle():
                return self.clock.now()
            nxt = self.next_event_time()
            if nxt is None:
                raise DefinitionError("work remains but no event is due: nothing will ever progress "
                                      f"(live={len(self.core.scheduler.registry)}, "
                                      f"inflight={self.core.executor.inflight()})")
            if limit is not None and nxt > limit:
                self.clock.set(max(limit, self.clock.now()))
                self.step()
                return self.clock.now()
            stalls = self._jump(nxt, stalls)

    def _jump(self, nxt: float, stalls: int) -> int:
        """Move the clock to the next event; count ticks that found it already due (a livelock guard)."""
        now = self.clock.now()
        if nxt <= now:
            if stalls + 1 > 10_000:
                raise DefinitionError(f"no progress at t={now}: the next event stays at {nxt}")
            return stalls + 1
        self.clock.set(nxt)
        return 0

    def _run(self, message: Callable[[], T]) -> T:
        reply = self._mailbox.post(message)
        self._mailbox.run_pending()
        return reply.wait(0)


class _VirtualPort:
    """The model manager's way to the driver: the caller is the actor; waiting steps virtual time.

    ``timeout`` is in virtual seconds."""

    def __init__(self, driver: EngineDriver) -> None:
        self._driver = driver

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        return fn()

    def run(self, op: Operation, timeout: float | None) -> Any:
        driver = self._driver
        clock = driver.clock
        limit = None if timeout is None else clock.now() + timeout
        guard = 0
        while not op.done:
            driver.step()
            if op.done:
                break
            nxt = driver.next_event_time()
            now = clock.now()
            if nxt is None:
                raise DefinitionError(f"no progress in virtual time: {op.describe()}, and nothing is scheduled")
            if limit is not None and nxt > limit:
                clock.set(max(limit, now))
                driver.step()
                if not op.done:
                    raise TimeoutError(f"{op.describe()} after {timeout} virtual seconds")
                break
            if nxt <= now:
                guard += 1
                if guard > 10_000:
                    raise DefinitionError(f"no progress at t={now}: {op.describe()}")
                continue
            guard = 0
            clock.set(nxt)
        return op.reply.wait(0)
