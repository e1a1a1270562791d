"""The engine (§3): the tick loop that joins the sans-io scheduler to the device, on one actor.

Components, in the order a request meets them (§3, R3.1)::

    API thread ─post→ actor: RequestRegistry → AdmissionController → Prefill/DecodeScheduler
                 (Scheduler) → DeviceExecutor ─CalRT→ device ─result→ CompletionDispatcher
                 → SamplerPool → Scheduler (request/KV/job machines fire) → sink (StreamWriter)
    HealthRecovery: timeouts, CCU faults, unknown DMA → reset/restart within the budget

**One owner of state** (DESIGN principle 2, §4). :class:`EngineCore` holds the scheduler,
executor, sampler and recovery, and is not thread-safe by design. Exactly one thread runs it:

* :class:`~calculet.runtime.engine.threaded.ThreadedEngine` — the public, thread-safe service
  API. ``start()`` spawns the actor thread (the tick loop) and a completion thread that blocks
  in CalRT ``WaitAny`` and *posts* results to the actor's mailbox; HTTP handlers post
  ``submit``/``cancel`` and wait on the actor's :class:`~calculet.runtime.actor.Reply`. Real
  time (``MonotonicClock``); nothing busy-waits.
* :class:`~calculet.runtime.engine.driver.EngineDriver` — the same actor code, stepped by the
  caller, for tests and simulation in **virtual time**: the device runs on a :class:`FakeClock`
  and ``run_until_idle`` advances it straight to the next event — the next device completion,
  the next Wait deadline, the scheduler's next wake-up (a request deadline, the batching window)
  or a DeviceBusy back-off — so thousands of requests simulate in seconds.

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
:class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``): from the
configuration's ``models[model_alias]`` with every trust check (§11 steps 1–11), or from a
package directory the caller vouches for (tests, simulation: steps 1–2 skipped and reported). The
tokenizer, KV lane pool and scheduler are built from that first package's verified manifest;
later generations must keep that contract. Loads, unloads and rollbacks then run on the actor,
one step per tick, while the engine keeps serving: ``engine.models.load(...)`` from any thread
(real time), or ``driver.models.load(...)`` in virtual time. Every request and job is counted on
its generation's ModelMachine, so a drain waits on the declared counters. The core is the
manager's :class:`~calculet.runtime.models.port.EnginePort`: the manager reaches nothing else of
the engine (its session and device, the submission hold, recovery's state, the scheduler view).

The core's collaborators: :mod:`~calculet.runtime.engine.requests` (the live requests' facts and
counts), :mod:`~calculet.runtime.engine.jobs` (submitting planned jobs, applying results,
executing the machines' commands), :mod:`~calculet.runtime.engine.types` (the public records).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Callable, ContextManager, Sequence

from calculet.adapters.calrt import CalRT, DeviceCapabilities, JobResult, ReturnCode, VirtualDevice
from calculet.clock import Clock
from calculet.config import SchedulerConfig
from calculet.errors import BadRequest, CalculetError, DefinitionError
from calculet.machines.monitor import MONITOR
from calculet.runtime.actor import MailboxStatistics
from calculet.runtime.distribution import HOST_TICK_BOUNDS, Distribution
from calculet.runtime.engine.jobs import JobPath
from calculet.runtime.engine.readings import engine_statistics, model_info
from calculet.runtime.engine.requests import RequestDesk, Trace
from calculet.runtime.engine.types import (EngineOptions, EngineStatistics, ExecutionMode, GenerateRequest, ModelInfo,
                                           TokenProvenance)
from calculet.runtime.execution.degrade import DegradeReason
from calculet.runtime.execution.dispatch import CompletionDispatcher
from calculet.runtime.execution.executor import DeviceExecutor
from calculet.runtime.execution.recovery import FaultReason, HealthRecovery, PendingRecovery, RecoveryAction
from calculet.runtime.execution.sampler import SamplerPool
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.execution.session_plan import SessionPlan
from calculet.runtime.models.capacity import CapacityPlanner
from calculet.runtime.models.manager import REQUEST_TARGETS, ModelManager
from calculet.runtime.models.reports import LoadFailed, LoadReport
from calculet.runtime.request import RequestSink
from calculet.runtime.scheduling.admission import Decision, ModelAvailability
from calculet.runtime.scheduling.budget_monitor import check_counts
from calculet.runtime.scheduling.joint_checks import JointMonitor
from calculet.runtime.scheduling.kv import KvLaneManager
from calculet.runtime.scheduling.registry import Cancellation, RequestRecord
from calculet.runtime.scheduling.plan import Submission
from calculet.runtime.scheduling.scheduler import Scheduler
from calculet.runtime.streams.package_tokenizer import loaded_tokenizer

log = logging.getLogger("calculet.runtime.engine.core")

__all__ = ["EngineCore"]


class EngineCore:
    """The actor's state and the tick; one thread at a time (the owner) may call it."""

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: Clock, options: EngineOptions = EngineOptions(),
                 observer: Callable[[RequestRecord, str, str], None] | None = None, device: VirtualDevice | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None, planner: CapacityPlanner | None = None
                 ) -> None:
        if options.mode is ExecutionMode.SYNC and config.executor.max_inflight != 1:
            raise DefinitionError("the synchronous baseline runs one job at a time: executor.max_inflight must be 1")
        self.config = config
        self.options = options
        self.runtime = runtime
        self.package_dir = package_dir
        self.clock = clock
        self._observer = observer
        self._joint = _TickChecks(self)  # requests × lanes invariants on the live system (#17)
        self._joint_observe = self._joint.observer  # bound once: every request transition calls it (issue #20)
        self._hold = False
        self._exclusive: Callable[[], ContextManager[None]] = contextlib.nullcontext
        self._device: VirtualDevice = device if device is not None else runtime.create_virtual_device()
        self.trace: Trace | None = [] if options.trace_components else None
        self._accepting, self._stopped = True, False
        self._backoff_until = 0.0
        self._wake: float | None = None
        self._ticks = 0
        self._host = Distribution(HOST_TICK_BOUNDS)
        self.chain_ready_s = 0.0
        """Set by ThreadedEngine: :meth:`schedule` applies ready results and plans again for this long (#20)."""
        self.models = ModelManager(self, planner=planner, first_generation=options.generation)
        try:
            # §11 steps 1–4 of the first generation; the components are built on its verified facts.
            prepared = self.models.prepare_initial(package_dir)
            self._build(prepared.plan, provenance)
            # Steps 5–11, inline: nothing serves yet, so nothing waits.
            self.bring_up: LoadReport = self.models.finish_initial(prepared)
        except LoadFailed as exc:
            self._device.close()
            raise exc.cause from exc
        except BaseException:
            self._device.close()
            raise

    def _build(self, plan: SessionPlan, provenance: Callable[[TokenProvenance], None] | None) -> None:
        """The components, on the first generation's verified facts (its EngineContract)."""
        config, options, clock = self.config, self.options, self.clock
        facts = plan.facts
        self._contract_capabilities = plan.capabilities
        # the package's own tokenizer and chat template, loaded and checked at §11 step 3 (#18)
        self.tokenizer = loaded_tokenizer(facts.package_sha256, facts.vocab_size, bos=facts.bos_token,
                                          eos=facts.eos_token)
        self.kv = KvLaneManager(plan.lanes, plan.max_seq, capabilities=plan.kv_capabilities(), clock=clock)
        self.scheduler = Scheduler(config, clock=clock, kv=self.kv, device_kv_tokens=plan.kv_token_capacity,
                                   max_seq=plan.max_seq, capabilities=plan.scheduling_capabilities(),
                                   observer=self._observe)
        self.set_observer(self._observer)  # a decode step's listener
        self.sampler = SamplerPool(seed=options.sampler_seed, eos=facts.eos_token, decoder=self.tokenizer)
        self.executor = DeviceExecutor(RuntimeSession.detached(self._device, config), config.executor, clock=clock,
                                       job_timeout_s=options.job_timeout_s,
                                       prefill_timeout_per_token_s=options.prefill_timeout_per_token_s,
                                       check_output_buffers=options.check_output_buffers,
                                       degrade_min_samples=options.degrade_min_samples)
        self.dispatcher = CompletionDispatcher(self.sampler,
                                               lane_isolation=plan.capabilities.lane_failure_isolation.value)
        self.recovery = HealthRecovery(config.recovery, clock=clock, capabilities=plan.capabilities)
        self.requests = RequestDesk(self.scheduler, self.tokenizer, self.sampler, self.executor, clock,
                                    trace=self.trace, provenance=provenance)
        self.jobs = JobPath(self.scheduler, self.executor, self.dispatcher, self.recovery, self.models,
                            self.requests, clock, trace=self.trace, enter_recovery=self._enter_recovery,
                            back_off=self._back_off, recover=self._maybe_recover)

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

    # ------------------------------------------------------------------ the models' port (EnginePort)

    @property
    def device(self) -> VirtualDevice:
        return self._device

    @property
    def verify_golden(self) -> bool:
        return self.options.verify_golden

    @property
    def warmup(self) -> bool:
        option = self.options.warmup
        return self.options.verify_golden if option is None else option

    def use_exclusive_device(self, exclusive: Callable[[], ContextManager[None]]) -> None:
        """The threaded engine's way to pause its completion thread (see :meth:`exclusive_device`)."""
        self._exclusive = exclusive

    def exclusive_device(self) -> ContextManager[None]:
        """Held around host-driven device work (golden, warm-up, a session reset): the threaded
        engine pauses its completion thread so WaitAny cannot take those jobs' results."""
        return self._exclusive()

    def bind_session(self, session: RuntimeSession) -> None:
        self.executor.rebind(session)

    def detach_session(self) -> None:
        self.executor.rebind(RuntimeSession.detached(self._device, self.config))

    def replace_device(self) -> None:
        """Close the VirtualDevice (every handle and job dies with it) and open a new one."""
        try:
            self._device.close()
        except CalculetError as exc:
            log.error("closing the device failed", extra={"detail": str(exc)})
        self.executor.forget_all()
        self._device = self.runtime.create_virtual_device()
        self.detach_session()

    def inflight_jobs(self) -> int:
        return self.executor.inflight()

    def resync_engine_sequences(self) -> None:
        self.executor.resync_engine_sequences()

    def hold_submissions(self, hold: bool) -> None:
        """§11 step 9: golden/warm-up jobs need the engines; planned work waits while they run."""
        self._hold = hold

    def recovery_pending(self) -> bool:
        return self.recovery.pending is not None

    def recovery_failed(self) -> bool:
        return self.recovery.failed

    def report_device_fault(self, rc: ReturnCode, detail: str) -> None:
        """A job outside the executor (golden/warm-up, §11 step 9) left the device in doubt: recover it (reset or
        restart per the contract, within the budget) before anything is served again."""
        reason = FaultReason.DEVICE_STATE if rc is ReturnCode.INVALID_STATE else self.recovery.reason_for(rc)
        self._enter_recovery(reason, detail)

    def run_commands(self) -> None:
        """Execute the machines' pending commands (FreeSequence, ...) through the adapter."""
        self.jobs.run_commands()

    # ------------------------------------------------------------------ API (on the actor)

    def submit(self, request: GenerateRequest, sink: RequestSink) -> Submission:
        """Validate, create and admit a request (§4, §5.2); the outcome is returned at once."""
        desk = self.requests
        if not self._accepting:
            return desk.refuse(sink, "stopping", Decision.REJECT_UNAVAILABLE, 503, "the engine is stopping")
        try:
            prompt = desk.validate(request)
        except BadRequest as exc:
            return desk.refuse(sink, "invalid", Decision.REJECT_INVALID, 400, exc.message)
        submission = desk.admit(request, prompt, sink)
        self.run_commands()
        return submission

    def cancel(self, request_id: int) -> Cancellation:
        """§4 cancel (idempotent; a running request drains); ``NotFound`` for an unknown id."""
        result = self.scheduler.cancel(request_id)
        self.run_commands()
        return result

    def begin_stop(self) -> None:
        """Stop admission: from now on new requests are answered 503."""
        self._accepting = False

    def shutdown(self) -> None:
        """The drain deadline passed: cancel every request not on the device (jobs still drain)."""
        self._accepting = False
        if self.scheduler.availability not in (ModelAvailability.SHUTDOWN, ModelAvailability.FAILED):
            self.scheduler.shutdown()
        self.run_commands()

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
            self._device.close()

    # ------------------------------------------------------------------ the tick

    def turn(self) -> bool:
        """One turn of the real-time actor: dispatch what is due, schedule, then apply the results the device
        already has (one that completes a job at its submit instant, the null device) rather than through the
        completion thread: a thread hop per step fewer. True when results were applied (turn again before sleeping).
        One host-time sample per turn, the results included (#20); with every event checked (tests) the joint
        checks still run between the three parts, as when called apart."""
        start = time.perf_counter()
        self._dispatch()
        joint = self._joint
        joint.after_call()
        results = self.executor.collect() if self._schedule(start) else None
        if results:
            joint.after_call()
            self.jobs.apply(results)
        joint.after_tick()
        self._account(start)
        return bool(results)

    def end_tick(self) -> None:
        """The end of a tick: the sampled joint checks (:class:`_TickChecks`)."""
        self._joint.after_tick()

    def dispatch(self) -> None:
        """Collect due completions, expire Wait deadlines, recover, execute commands."""
        start = time.perf_counter()
        self._dispatch()
        self._account(start)

    def _dispatch(self) -> None:
        jobs = self.jobs
        if self.options.mode is ExecutionMode.ASYNC:
            jobs.apply(self.executor.collect(), settle=False)  # settled below, after the Wait deadlines
        jobs.expire()
        if self.recovery.pending is not None:
            self._maybe_recover()
        jobs.run_commands()
        self.models.poll()

    def on_results(self, results: list[JobResult]) -> None:
        """Results collected by the completion thread (real time), applied on the actor."""
        start = time.perf_counter()
        self.jobs.apply(results)
        self._account(start)

    def schedule(self) -> int:
        """Plan and submit while the executor has room; the sync baseline also waits (one job)."""
        start = time.perf_counter()
        submitted = self._schedule(start)
        self._account(start)
        return submitted

    def _schedule(self, start: float) -> int:
        """:meth:`schedule` without its accounting; ``start`` bounds the chaining of ready results."""
        submitted = 0
        # the collaborators a step reads, read once per call (none is replaced while it runs; issue #20)
        scheduler, executor, recovery, job_path = self.scheduler, self.executor, self.recovery, self.jobs
        degrade, table, chain = executor.degrade, scheduler.jobs, self.chain_ready_s
        sync = self.options.mode is ExecutionMode.SYNC
        while True:
            effective = degrade.effective_inflight
            if effective < table.max_inflight:
                scheduler.limit_inflight(effective)
            # the clock is read only while a back-off stands (0.0 when none): once per token otherwise (issue #20)
            backoff = self._backoff_until
            backing_off = backoff != 0.0 and self.clock.now() < backoff  # as next_wake reads it
            if backing_off or recovery.pending is not None or self._hold:
                self._wake = backoff if backing_off else None
                break
            plan = scheduler.step()
            self._wake = plan.wake_at
            if plan.work is None:
                break
            job = job_path.submit(plan)
            if job is None:
                continue
            submitted += 1
            if not sync and plan.last_slot:
                if chain and time.perf_counter() - start < chain:
                    results = executor.collect()  # a device that completes at submit (the null device) has it now
                    if results:
                        job_path.apply(results)
                        continue  # the slot is free again: the next step plans work instead of finding none
                # No slot left: another step now would only find none (issue #20: a B1 token paid two steps).
                # The step just taken expired the deadlines and admitted what fits at this instant, and its
                # wake-up stands; the submit changed neither (it moves planned work onto the device).
                break
            if sync:
                result = executor.wait(job)
                if result is None:
                    executor.mark_timed_out(job)
                    self.jobs.timed_out(job)
                else:
                    self.jobs.handle_result(result)
                self._maybe_recover()
                self.run_commands()
                break
        if self.recovery.pending is not None:  # a submit refused for a bad device state
            self._maybe_recover()
        self.jobs.run_commands()
        return submitted

    def next_wake(self) -> float | None:
        """The next instant the actor must run without being told (deadlines, Wait timeouts, back-off)."""
        # compared in turn, not gathered in a list: the actor asks twice per turn (issue #20)
        wake = self._wake
        for t in (self.executor.next_deadline(), self.models.next_deadline()):
            if t is not None and (wake is None or t < wake):
                wake = t
        backoff = self._backoff_until
        if backoff and backoff > self.clock.now() and (wake is None or backoff < wake):
            wake = backoff
        return wake

    def next_event_time(self) -> float | None:
        """As :meth:`next_wake`, plus the next device completion (virtual time)."""
        times = [t for t in (self.next_wake(), self.executor.next_completion()) if t is not None]
        return min(times) if times else None

    def idle(self) -> bool:
        """Nothing live, nothing on the device that will still complete, no command pending."""
        return (len(self.scheduler.registry) == 0 and self.executor.healthy_inflight() == 0
                and not self.jobs.pending_frees and self.recovery.pending is None and not self.models.busy())

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def pending_frees(self) -> int:
        """``FreeSequence`` commands the device refused so far (retried every tick)."""
        return self.jobs.pending_frees

    # ------------------------------------------------------------------ reading

    def model_info(self) -> ModelInfo:
        return model_info(self)

    def statistics(self, mailbox: MailboxStatistics | None = None) -> EngineStatistics:
        return engine_statistics(self, mailbox)

    # ------------------------------------------------------------------ recovery

    def _enter_recovery(self, reason: FaultReason, detail: str) -> None:
        if self.recovery.failed:
            return
        self.recovery.report(reason, detail)
        self.models.recovery.on_fault()

    def _maybe_recover(self) -> None:
        """Reset/restart once the healthy jobs drained (§14), within the budget (§15)."""
        recovery = self.recovery
        while recovery.pending is not None and self.executor.healthy_inflight() == 0:
            pending = recovery.begin()
            if pending is None:
                self._give_up()
                return
            _recover(self, pending)

    def _back_off(self) -> None:
        """The device said DeviceBusy: plan nothing for ``busy_backoff_s``."""
        self._backoff_until = self.clock.now() + self.options.busy_backoff_s

    def _give_up(self) -> None:
        detail = self.recovery.give_up()
        self.models.recovery.on_give_up(detail)
        self.run_commands()

    # ------------------------------------------------------------------ sink callbacks

    def _observe(self, rec: RequestRecord, source: str, target: str) -> None:
        self._joint_observe(rec)
        if target in REQUEST_TARGETS:  # the moves that may change a generation's counters (not a decode step's)
            self.models.on_request_transition(rec, source, target)
        if self._observer is not None:
            self._observer(rec, source, target)

    def set_observer(self, observer: Callable[[RequestRecord, str, str], None] | None, *,
                     decode_steps: bool = True) -> None:
        """Install the caller's request observer (the service does, after bring-up); a decode step's listener follows.
        ``decode_steps`` False: the observer is not told a decode step's moves (``decode_ready`` ↔
        ``decode_running``, one pair a token) — an observer that reads what it needs of them from the record when
        the request leaves decode (the service's request phases, #20) costs no call per token then."""
        self._observer = observer
        self.scheduler.registry.quiet_listener = self._joint.step_listener(observer if decode_steps else None)

    def _account(self, start: float) -> None:
        self._joint.after_call()
        took = time.perf_counter() - start
        self._ticks += 1
        self._host.add(took)


class _TickChecks:
    """The requests × lanes monitor (#17) as the engine runs it. Sampled (production, ``monitoring.sample_every``
    > 1: "one engine tick's joint checks in N"), one draw per tick: the check is incremental — it covers every
    request that moved since the last one — so it checks the same states as a draw per actor call, at a third
    of the draws (issue #20). With every event checked (the test suite) each actor call that can move a
    request is checked where it happens, so a test sees a fault at the call that made it."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core
        self._monitor = JointMonitor()

    def observe(self, rec: RequestRecord) -> None:
        self._monitor.observe(rec)

    @property
    def observer(self) -> Callable[[RequestRecord], None]:
        """:meth:`observe` without its own frame: the monitor's bound method, called at each request transition."""
        return self._monitor.observe

    def step_listener(self, observer: Callable[[RequestRecord, str, str], None] | None
                      ) -> Callable[[Sequence[RequestRecord], str, Sequence[str]], None]:
        """A decode step's moves, in one call a step (#20): to the monitor alone, in one call, when nothing else
        listens; else to the monitor and ``observer``, record by record (none changes a generation's counters)."""
        if observer is None:
            return self._monitor.observe_step
        joint = self._monitor.observe

        def observe_step(recs: Sequence[RequestRecord], source: str, targets: Sequence[str]) -> None:
            for rec, target in zip(recs, targets):
                joint(rec)
                observer(rec, source, target)
        return observe_step

    def after_call(self) -> None:
        if MONITOR.sample_every == 1:
            self._check()

    def after_tick(self) -> None:
        if MONITOR.sample_every > 1:
            self._check()

    def _check(self) -> None:
        core = self._core
        scheduler = core.scheduler
        self._monitor.check(core.kv, "engine tick",  # each coupled step is complete here
                            lambda: core.models.counter_faults(scheduler.registry.live()))
        # The other whole-system monitors at the same boundary (#17): device jobs × lanes, the budget's counters.
        scheduler.job_lanes.boundary("engine tick")
        check_counts(scheduler.admission, scheduler.registry, "engine tick")


def _recover(core: EngineCore, pending: PendingRecovery) -> None:
    """One recovery action the budget allowed (:meth:`EngineCore._maybe_recover`): every job and sequence on the
    device is forgotten, the device reset or restarted; on success the scheduler learns the KV is lost and the
    engine serves again at once, on failure ping/pong degrades (an uncertain recovery) and a restart is pending."""
    recovery, models = core.recovery, core.models
    core.executor.forget_all()
    models.recovery.on_jobs_discarded()
    ok = True
    try:
        if pending.action is RecoveryAction.RESET:
            models.recovery.reset_device()
        else:  # close the VirtualDevice, bring the serving generation up on a new one
            models.recovery.restart_device()
    except CalculetError as exc:
        ok = False
        log.error("recovery action failed", extra={"action": pending.action.name, "detail": str(exc)})
    recovery.finished(pending, ok=ok)
    if not ok:
        core.executor.degrade.trigger(DegradeReason.UNCERTAIN_RECOVERY, pending.detail)
        return
    detail = f"KV lost in device {pending.action.name.lower()} after {pending.detail}"
    core.scheduler.device_reset(detail)
    core.scheduler.fail_lost_kv(detail)
    core.run_commands()
    models.recovery.on_recovered()
    core.run_commands()
    core._backoff_until = 0.0
    core._wake = core.clock.now()  # serve again at once
