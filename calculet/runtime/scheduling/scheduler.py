"""The scheduling core (§3–§9) as one sans-io object that the engine's actor drives.

It decides and never performs I/O; time comes from the injected clock (DESIGN principles 1–3).
A request flows::

    submit(request, sink)      -> Submission(request_id, Admit | Queue | Reject*)   §4, §5
    step()                     -> Plan(work=PrefillWork | DecodeBatch | None, engine, wake_at)
    submitted(job_id)          the device accepted the job: request/KV/job machines fire
      or submit_failed(job_id) the device refused it: nothing fired, candidates re-queued
    on_prefill_complete(PrefillCompletion) / on_decode_complete(DecodeCompletion)     §7.4
    job_timed_out(job_id), device_reset()                                              §9.2
    take_commands()            -> [FreeSequence, ...]; then confirm_release(lane, seq) §9.2

Between ``step()`` returning work and ``submitted``/``submit_failed`` no other call is
allowed (it raises): planning and submission form one step of the actor, so nothing can
cancel a request whose lane is being handed to the device.

Every state change is a declared machine's event: requests (``RequestRegistry``), KV lanes
(``KvLaneManager``) and jobs (``InflightTable``). Resources are reclaimed in one place, the
registry's transition listener (:meth:`Scheduler._on_transition`): leaving a waiting state
returns waiting budget, leaving prefill returns the long-quota slot, leaving decode-ready
removes the queue entry, and reaching Finishing or a terminal state releases the KV lease
(which emits ``FreeSequence``) and the active budget.

Decisions where the spec is silent:

* one generation is served at a time (CalRT 0.7.6 cannot co-reside, §11 step 6); requests
  still pinned to a replaced generation are ended when it goes away;
* while a replacement runs (§11 step 5 "stop new admission" until step 10), new requests are
  *held*: they wait unbound (WaitingModel) and are pinned to whichever generation is Ready
  when the hold ends — the new one, or the old one again if the load failed
  (:meth:`Scheduler.hold_new_requests`); requests already pinned keep being served;
* a service opportunity (§6 WRR) is one device job;
* a request whose prefill is chunked is cancelled or expires between chunks at once
  (nothing is in flight to drain);
* Unknown KV lanes are recovered by ``device_reset`` or by ``recover_lanes`` (only lanes no
  in-flight job may still write), or when a late completion proves the job finished.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Union

from calculet.config import SchedulerConfig
from calculet.errors import BadRequest, DefinitionError
from calculet.machines.job import JobEngine
from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.admission import (AdmissionController, AdmissionOutcome, AdmissionStatistics, Decision,
                                        ModelAvailability)
from calculet.clock import Clock
from calculet.runtime.scheduling.completion import (DecodeCompletion, FaultKind, LaneVerdict, PrefillCompletion,
                                         check_decode_lanes)
from calculet.runtime.scheduling.decode import DecodeBatch, DecodeScheduler, DecodeStatistics, NoBatch, NoBatchReason
from calculet.runtime.scheduling.estimates import StepTimer, StepTimeStatistics
from calculet.runtime.scheduling.fairness import TenantPolicy
from calculet.runtime.scheduling.jobs import DECODE, PREFILL, InflightTable, JobRecord, JobStatistics
from calculet.runtime.scheduling.kv import FreeSequence, KvLease, KvLaneManager, KvReservationFailure, KvLaneStatistics, ShiftSequence
from calculet.runtime.scheduling.prefill import PrefillScheduler, PrefillStatistics, PrefillWork, SmoothWrr
from calculet.runtime.scheduling.profiles import ProfileSet, ProfileSpec
from calculet.runtime.scheduling.registry import (RUNNING_STATES, WAITING_STATES, CallbackResult, Cancellation, CancelResult,
                                       RegistryStatistics, RequestRecord, RequestRegistry, TransitionListener)
from calculet.runtime.request import InferenceRequest, RequestOutcome, RequestSink

Command = Union[FreeSequence, ShiftSequence]

PREFILL_STATES = frozenset({"prefill_ready", "prefill_running"})
ENDED_STATES = frozenset({"finishing", "completed", "cancelled", "failed"})
SERVING = frozenset({ModelAvailability.READY, ModelAvailability.DRAINING})


@dataclass(frozen=True, slots=True)
class SchedulingCapabilities:
    """Facts of the runtime's capability contract that scheduling depends on (DESIGN principle 8)."""

    incremental_prefill: bool = False
    """The compiler/runtime explicitly supports incremental prefill (§6); chunking needs it."""
    lane_failure_isolation: bool = False
    """A failed batch job may still carry good lanes (§7.4, R7.4.6)."""
    vocab_size: int | None = None
    """Tokens at or above it are unusable output."""


@dataclass(frozen=True, slots=True)
class Submission:
    """What ``submit`` answers: the request id (0 if none could be created) and the outcome."""

    request_id: int
    outcome: AdmissionOutcome


@dataclass(frozen=True, eq=False)
class Plan:
    """One scheduler step: the job to submit (if any), its engine, and when to step again."""

    work: PrefillWork | DecodeBatch | None
    engine: JobEngine | None = None
    wake_at: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Applied:
    """What a completion did: applied to its lanes, or dropped as stale (resources reclaimed)."""

    job_id: int
    stale: bool
    lanes_ok: int = 0
    lanes_failed: int = 0


@dataclass(frozen=True)
class SchedulerStatistics:
    generation: int
    availability: str
    registry: RegistryStatistics
    admission: AdmissionStatistics
    prefill: PrefillStatistics
    decode: DecodeStatistics
    kv: KvLaneStatistics
    jobs: JobStatistics
    wrr_picks: dict[str, int]
    stale_completions: int
    anomalies: int
    pending_commands: int
    step_times: StepTimeStatistics


class Scheduler:
    """Registry, admission, fairness, prefill and decode scheduling and KV lanes, wired together."""

    def __init__(self, config: SchedulerConfig, *, clock: Clock, kv: KvLaneManager, device_kv_tokens: int,
                 max_seq: int, capabilities: SchedulingCapabilities = SchedulingCapabilities(),
                 step_estimate_s: float = 0.0, observer: TransitionListener | None = None) -> None:
        self.config = config
        self._observer = observer
        self.capabilities = capabilities
        self._clock = clock
        self.kv = kv
        budget = config.capacity_budget(device_kv_tokens)
        self.registry = RequestRegistry(listener=self._on_transition)
        self.admission = AdmissionController(
            budget, tenants=[TenantPolicy.from_config(t) for t in config.tenants], queues=config.queues,
            long_quota=config.admission.long_prefill_quota, now=clock.now())
        self.prefill = PrefillScheduler(config.queues, clock=clock, chunk_cost=self.admission.wfq.prefill_tag)
        self.step_times = StepTimer(step_estimate_s)
        self.decode = DecodeScheduler(kv, batching_window_us=config.batch.batching_window_us,
                                      max_tenant_lane_share=config.batch.max_tenant_lane_share,
                                      step_times=self.step_times, step_cost=self.admission.wfq.step_tag,
                                      deadline_order=config.batch.deadline_order,
                                      deadline_slack=config.batch.deadline_slack)
        self.jobs = InflightTable(max_inflight=budget.max_inflight_jobs, fixed_engine=config.executor.fixed_engine)
        self.arbiter = SmoothWrr(config.queues.wrr_weights())
        self._default_max_seq = max_seq
        self._deadline_default_ms = config.admission.deadline_default_ms
        self._generation = 0
        self._availability = ModelAvailability.UNLOADED
        self._held = False
        self._profiles: ProfileSet | None = None
        self._deadlines: list[tuple[float, int]] = []
        self._model_wait: deque[RequestRecord] = deque()
        self._commands: list[Command] = []
        self._pending: JobRecord | None = None
        self._next_job = 1
        self._stale = 0
        self._anomalies = 0

    # ------------------------------------------------------------------ model (§10, §12)

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def availability(self) -> ModelAvailability:
        return self._availability

    def set_model(self, generation: int, availability: ModelAvailability, profiles: ProfileSet | None = None,
                  detail: str = "") -> None:
        """The model manager's view of the alias: its generation, availability and profiles.

        ``detail`` is the error detail of requests that end because the generation went away
        or failed (R19.2)."""
        self._no_pending()
        now = self._clock.now()
        old = self._generation
        if old and generation != old:
            self._end_generation(old, detail)
        self._generation = generation
        self._availability = availability
        if profiles is not None:
            self._profiles = profiles
            self.prefill.chunk_tokens = profiles.prefill_chunk_tokens if self.capabilities.incremental_prefill else None
        if availability is ModelAvailability.READY:
            if not self._held:
                self._bind_waiting_model()
            self._pump(now)
        elif availability is ModelAvailability.DRAINING:  # §12: cancel waiting requests
            for rec in self.registry.live():
                if rec.state == "waiting_admission" and rec.generation == generation:
                    self.registry.fire(rec, "cancel")
        elif availability is ModelAvailability.FAILED:
            self._end_generation(generation, detail)

    @property
    def holding_new_requests(self) -> bool:
        return self._held

    def hold_new_requests(self, hold: bool) -> None:
        """§11 step 5 "stop new admission if replacement": while held, a new request is not pinned
        to the serving generation but waits unbound (WaitingModel, bounded by the waiting budget and
        its deadline); requests already pinned keep being admitted and served. Releasing the hold
        pins the waiting ones to the generation that is Ready then (R10.3: pinned once, never moved)."""
        self._no_pending()
        self._held = hold
        if not hold and self._availability is ModelAvailability.READY:
            self._bind_waiting_model()
            self._pump(self._clock.now())

    def reject_waiting_model(self, detail: str) -> int:
        """End every request still waiting for a generation with 503 (the alias has none and none is
        coming, e.g. a failed replacement whose previous version could not be restored)."""
        self._no_pending()
        waiting, self._model_wait = self._model_wait, deque()
        ended = 0
        for rec in waiting:
            if rec.state == "waiting_model":
                self.registry.reject(rec, 503, detail)
                ended += 1
        return ended

    def shutdown(self) -> None:
        """Refuse new requests (503); cancel everything not on the device; running jobs drain."""
        self._no_pending()
        self._availability = ModelAvailability.SHUTDOWN
        for rec in self.registry.live():
            state = rec.state
            if state == "finishing":
                self.registry.finish(rec.request_id)
            elif state == "prefill_running" and self.prefill.queued(rec):
                self.registry.fire(rec, "cancel")
                self._end_between_chunks(rec)
            else:
                self.registry.cancel(rec.request_id)

    # ------------------------------------------------------------------ requests (§4, §5)

    def submit(self, request: InferenceRequest, sink: RequestSink) -> Submission:
        """Create the request and answer with its §5.2 outcome."""
        self._no_pending()
        now = self._clock.now()
        availability = self._availability
        max_seq = self._max_seq()
        ms = request.deadline_ms if request.deadline_ms is not None else self._deadline_default_ms
        try:
            rec = self.registry.create(request, sink, max_seq=max_seq, arrival=now, deadline=now + ms / 1000)
        except BadRequest as exc:
            outcome = self.admission.record(AdmissionOutcome(Decision.REJECT_INVALID, exc.message))
            sink.close(RequestOutcome(0, "failed", FinishReason.REJECTED, 0, 400, exc.message))
            return Submission(0, outcome)
        rec.prefill_class = self.prefill.classify(request.prompt_tokens)
        rejection = self.admission.screen(request, max_seq=max_seq, availability=availability, now=now,
                                          long=rec.is_long)
        if rejection is not None:
            self.registry.reject(rec, rejection.http_status or 400, rejection.reason)
            return Submission(rec.request_id, rejection)
        no_prospect = self._without_prospect(rec, now)
        if no_prospect is not None:
            self.registry.reject(rec, 429, no_prospect.reason)
            return Submission(rec.request_id, no_prospect)
        self.admission.accept(rec)
        heapq.heappush(self._deadlines, (rec.deadline, rec.request_id))
        if availability is ModelAvailability.READY and not self._held:
            self.registry.fire(rec, "bind", gen=self._generation)
            self.admission.enqueue(rec)
            self._pump(now)
        else:
            self.registry.fire(rec, "wait_model")
            self._model_wait.append(rec)
        decision = Decision.ADMIT if rec.state == "prefill_ready" else Decision.QUEUE
        return Submission(rec.request_id, self.admission.record(AdmissionOutcome(decision)))

    def cancel(self, request_id: int) -> Cancellation:
        """§4 cancel: idempotent; immediate unless a job is on the device."""
        self._no_pending()
        rec = self.registry.get(request_id)
        if rec is not None and rec.state == "prefill_running" and self.prefill.queued(rec):
            self.registry.fire(rec, "cancel")
            self._end_between_chunks(rec)
            result = Cancellation(CancelResult.CANCELLED, self.registry.outcome(request_id))
        else:
            result = self.registry.cancel(request_id)
        self._pump(self._clock.now())
        return result

    # ------------------------------------------------------------------ the tick

    def step(self) -> Plan:
        """Expire deadlines, admit what fits, and plan at most one job (one service opportunity)."""
        self._no_pending()
        now = self._clock.now()
        self._expire_due(now)
        self._pump(now)
        wake = self._deadlines[0][0] if self._deadlines else None
        if not self.jobs.has_slot():
            return Plan(None, wake_at=wake, reason="no in-flight slot")
        gen = self._generation
        profiles = self._profiles
        if gen == 0 or profiles is None or self._availability not in SERVING:
            return Plan(None, wake_at=wake, reason=f"model {self._availability.value}")
        for _attempt in range(4):
            eligible = self.prefill.nonempty()
            profile = None
            ready = self.decode.ready_count(gen)
            if ready:
                profile = profiles.select_profile(ready, self.decode.oldest_wait(gen, now))
                due, fire_at = self.decode.dispatch_due(gen, profile.compiled_batch, now)
                if due:
                    eligible.add("decode")
                elif fire_at is not None:
                    wake = fire_at if wake is None else min(wake, fire_at)
            choice = self.arbiter.choose(eligible)
            if choice is None:
                return Plan(None, wake_at=wake, reason="nothing ready")
            job_id = self._next_job
            if choice == "decode":
                assert profile is not None
                work: PrefillWork | DecodeBatch | None = self._build_decode(profile, gen, now, job_id)
            else:
                work = self._build_prefill(choice, job_id, now)
            if work is None:
                continue
            self._next_job += 1
            if isinstance(work, DecodeBatch):
                job = self.jobs.plan(job_id, DECODE, gen, work.profile.compiled_batch, work)
            else:
                job = self.jobs.plan(job_id, PREFILL, work.generation, 1, work)
            self._pending = job
            return Plan(work, engine=job.engine, wake_at=wake)
        return Plan(None, wake_at=wake, reason="no eligible work")

    def submitted(self, job_id: int) -> None:
        """The device accepted the planned job: jobs, KV lanes and requests fire ``submit``."""
        job = self._take_pending(job_id)
        self.jobs.fire(job, "submit")
        job.submitted_at = self._clock.now()
        work = job.work
        if isinstance(work, DecodeBatch):
            self.decode.submitted(work)
            self.kv.submit_batch(work.kv)
            for rec in work.records:
                self.registry.fire(rec, "submit_decode", job=job_id)
        else:
            self.kv.submit(work.lease, work.tokens)
            rec = work.record
            if rec.state == "prefill_ready":
                self.registry.fire(rec, "submit_prefill", job=job_id)

    def submit_failed(self, job_id: int) -> None:
        """The device refused the planned job (DeviceBusy, ...): nothing ran; re-queue its work."""
        job = self._take_pending(job_id)
        self.jobs.fire(job, "submit_rejected")
        work = job.work
        if isinstance(work, DecodeBatch):
            self.decode.restore(work.records)
        else:
            rec = work.record
            self.prefill.restore(rec)

    # ------------------------------------------------------------------ completions (§4, §7.4)

    def on_decode_complete(self, completion: DecodeCompletion) -> Applied:
        """Apply a decode job's result lane by lane, or drop it as stale and reclaim."""
        self._no_pending()
        now = self._clock.now()
        job = self.jobs.get(completion.job_id)
        if job is None or job.kind != DECODE:
            self._stale += 1
            return Applied(completion.job_id, True)
        batch: DecodeBatch = job.work
        if job.state != "submitted":
            return self._late(job, batch.kv.leases, now)
        if completion.generation != job.generation:
            self._anomalies += 1
            completion = DecodeCompletion(completion.job_id, job.generation, False, (), FaultKind.ERROR,
                                          f"result of generation {completion.generation} for a job of generation "
                                          f"{job.generation}")
        checks, extra = check_decode_lanes(batch.active, completion,
                                           lane_isolation=self.capabilities.lane_failure_isolation,
                                           vocab_size=self.capabilities.vocab_size)
        self._anomalies += extra
        self._end_job(job, completion.ok, completion.fault)
        if completion.ok:
            self.step_times.observe(now - job.submitted_at)
        ok = failed = 0
        registry, generation, job_id = self.registry, job.generation, job.job_id
        for check, rec, lease in zip(checks, batch.records, batch.kv.leases):
            verdict = check.verdict
            good = verdict is LaneVerdict.OK
            if verdict is LaneVerdict.MISMATCH:
                self._anomalies += 1
            self._settle_kv(lease, verdict)
            detail = "" if good else (completion.detail or check.detail)
            callback = registry.on_decode_complete(rec.request_id, generation=generation, job_id=job_id,
                                                   ok=good, stop=check.stop, token=check.token, detail=detail)
            if good:
                ok += 1
            else:
                failed += 1
            if callback.result is CallbackResult.APPLIED:
                self._after_done(rec, callback.target, now)
        self._pump(now)
        return Applied(job.job_id, False, ok, failed)

    def on_prefill_complete(self, completion: PrefillCompletion) -> Applied:
        """Apply a prefill job's (or chunk's) result, or drop it as stale and reclaim."""
        self._no_pending()
        now = self._clock.now()
        job = self.jobs.get(completion.job_id)
        if job is None or job.kind != PREFILL:
            self._stale += 1
            return Applied(completion.job_id, True)
        work: PrefillWork = job.work
        if job.state != "submitted":
            return self._late(job, (work.lease,), now)
        consistent = (completion.generation, completion.request_id, completion.seq_id) == (
            job.generation, work.request_id, work.seq_id)
        if not consistent:
            self._anomalies += 1
        device_ok = completion.ok and consistent
        self._end_job(job, device_ok, completion.fault if consistent else FaultKind.ERROR)
        token = completion.token
        vocab = self.capabilities.vocab_size
        token_ok = token is not None and token >= 0 and (vocab is None or token < vocab)
        if device_ok and (token_ok or not work.last_chunk):
            verdict = LaneVerdict.OK
        elif device_ok:
            verdict = LaneVerdict.OUTPUT_INVALID
        else:
            verdict = LaneVerdict.DEVICE_FAILED if consistent else LaneVerdict.MISMATCH
        self._settle_kv(work.lease, verdict)
        rec = work.record
        if verdict is LaneVerdict.OK and not work.last_chunk:
            live = self.registry.get(rec.request_id) is rec and rec.state == "prefill_running"
            if not live or rec.job_id != work.request_job:
                self._stale += 1
                return Applied(job.job_id, True)
            if rec.machine.cancel_requested or rec.machine.deadline_passed:
                self._end_between_chunks(rec)
            else:
                remaining = rec.prompt_tokens - self.kv.committed_len(work.lease)
                self.prefill.requeue(rec, now, self.prefill.next_chunk(remaining))
            self._pump(now)
            return Applied(job.job_id, False, 1, 0)
        ok = verdict is LaneVerdict.OK
        detail = "" if ok else (completion.detail or (
            "prefill result tags do not match the job" if not consistent else f"unusable token {token!r}"))
        callback = self.registry.on_prefill_complete(rec.request_id, generation=job.generation,
                                                     job_id=work.request_job, ok=ok, stop=completion.stop,
                                                     token=token if ok else None, detail=detail)
        if callback.result is CallbackResult.APPLIED:
            self._after_done(rec, callback.target, now)
        self._pump(now)
        return Applied(job.job_id, callback.result is CallbackResult.STALE, int(ok), int(not ok))

    def job_timed_out(self, job_id: int, detail: str = "") -> Applied:
        """Wait timed out: the job keeps its slot (it may still write), its lanes go Unknown,
        its requests end (Failed, or Cancelled if they were being cancelled)."""
        self._no_pending()
        job = self.jobs.get(job_id)
        if job is None or job.state != "submitted":
            self._stale += 1
            return Applied(job_id, True)
        self.jobs.fire(job, "timeout")
        failed = self._fail_job_requests(job, detail or "TIMEOUT: Wait timed out")
        self._pump(self._clock.now())
        return Applied(job_id, False, 0, failed)

    def device_reset(self, detail: str = "") -> None:
        """A device reset per the contract ended every job: slots free, Unknown lanes recover."""
        self._no_pending()
        for job in self.jobs:
            if job.state == "submitted":
                self.jobs.fire(job, "fault")
                self._fail_job_requests(job, detail or "job ended by a device reset")
            elif job.state == "timed_out":
                self.jobs.fire(job, "quarantine")
            self.jobs.fire(job, "reset_done")
        self._commands.extend(self.kv.recover_unknown())
        self._pump(self._clock.now())

    def recover_lanes(self) -> int:
        """Recover Unknown lanes that no in-flight job can still write (after a known failure)."""
        self._no_pending()
        busy = {lease.lane for job in self.jobs for lease in self._job_leases(job)}
        recovered = 0
        for lane in range(self.kv.lanes):
            if lane not in busy and self.kv.lane(lane).state == "unknown":
                self._commands.append(self.kv.recover(lane))
                recovered += 1
        return recovered

    def fail(self, request_id: int, detail: str) -> bool:
        """End a request that has no job in flight as Failed (ERROR) with ``detail``.

        For failures the engine finds outside a completion: a submit the device refused for
        good (INVALID_ARGUMENT, OUT_OF_MEMORY, ...), or KV lost in a reset (R19.2: the return
        code reaches the request's error detail). Returns False if the request is unknown,
        ended, finishing, or has a job on the device (that job's completion decides).
        """
        self._no_pending()
        rec = self.registry.get(request_id)
        if rec is None or rec.state == "finishing":
            return False
        if rec.state in RUNNING_STATES:
            if rec.state != "prefill_running" or not self.prefill.queued(rec):
                return False
            if detail:  # between chunks: nothing in flight
                rec.detail = detail
            self.registry.fire(rec, "prefill_done", job=rec.job_id, ok=False, stop=False)
        else:
            self.registry.fail(rec, detail)
        self._pump(self._clock.now())
        return True

    def fail_lost_kv(self, detail: str) -> int:
        """The device lost every KV sequence (reset, restart): end each request whose committed
        KV is gone (a lane with nothing committed yet is still usable). Returns how many ended."""
        self._no_pending()
        ended = 0
        for rec in self.registry.live():
            lease = rec.lease
            if lease is None or not self.kv.owns(lease) or self.kv.committed_len(lease) == 0:
                continue
            ended += self.fail(rec.request_id, detail)
        return ended

    def limit_inflight(self, max_inflight: int) -> None:
        """§14 degrade: new jobs go out ``max_inflight`` at a time; submitted jobs still drain."""
        if not 1 <= max_inflight <= 2:
            raise DefinitionError(f"limit_inflight({max_inflight}): must be 1 or 2 (§14)")
        self.jobs.max_inflight = max_inflight

    # ------------------------------------------------------------------ KV commands (§9.2)

    def take_commands(self) -> list[Command]:
        """Commands for the engine to execute through the adapter (FreeSequence, ...)."""
        commands, self._commands = self._commands, []
        return commands

    def confirm_release(self, lane: int, seq_id: int) -> None:
        """The runtime freed the sequence; the lane is Free and may admit a waiting request."""
        self._no_pending()
        self.kv.confirm_release(lane, seq_id)
        self._pump(self._clock.now())

    # ------------------------------------------------------------------ statistics (§16)

    def idle(self) -> bool:
        """Nothing live, nothing queued, no job and no lane held (leak check)."""
        return (len(self.registry) == 0 and len(self.jobs) == 0 and self.decode.total_ready() == 0
                and not self.prefill.nonempty() and self.admission.waiting == 0 and self.admission.active == 0
                and self.kv.free_lanes == self.kv.lanes and not self._commands)

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            self._generation, self._availability.value, self.registry.statistics(), self.admission.statistics(),
            self.prefill.statistics(), self.decode.statistics(), self.kv.statistics(), self.jobs.statistics(),
            self.arbiter.picks(), self._stale, self._anomalies, len(self._commands), self.step_times.statistics())

    # ------------------------------------------------------------------ internals

    def _on_transition(self, rec: RequestRecord, source: str, target: str) -> None:
        """Reclaim whatever ``rec`` stops needing with this transition (the one reclaim path)."""
        if self._observer is not None:
            self._observer(rec, source, target)
        if source == target:
            return
        if source in WAITING_STATES:
            if target not in WAITING_STATES:
                self.admission.leave_waiting(rec)
        elif source in PREFILL_STATES:
            self.prefill.discard(rec)
            if target not in PREFILL_STATES:
                self.admission.prefill_left(rec)
        elif source == "decode_ready" and target != "decode_running":
            self.decode.discard(rec)
        if target in ENDED_STATES:
            lease = rec.lease
            if lease is not None:
                rec.lease = None
                command = self.kv.release(lease)
                if command is not None:
                    self._commands.append(command)
                self.admission.released(rec)

    def _pump(self, now: float) -> None:
        """Admit waiting requests in WFQ order while the budget and a free lane allow (§5)."""
        if self._availability is not ModelAvailability.READY:
            return
        kv = self.kv
        while True:
            rec = self.admission.next_admissible(kv.free_lanes)
            if rec is None:
                return
            lease = kv.reserve(rec.generation, rec.prompt_tokens + rec.max_new_tokens)
            if not isinstance(lease, KvLease):
                raise DefinitionError(f"admission found room but the KV pool refused: {lease.reason}")
            rec.lease = lease
            self.admission.admitted(rec, now)
            self.registry.fire(rec, "admit")
            self.prefill.add(rec, now)

    def _without_prospect(self, rec: RequestRecord, now: float) -> AdmissionOutcome | None:
        """§5.2: the 429 of a request that would queue with no prospect of service before its deadline.

        Only while others wait (admission.estimated_wait). The service time counted is
        ``max_new_tokens`` decode steps at the measured step time, so a request that would be
        admitted only to expire part-way is refused now, with nothing spent on it. A request
        that could not finish by its deadline even if admitted at once (an open-ended one: a
        chat request without ``max_tokens`` asks for the rest of the context) may still stop
        early, so for it only one step is counted: its prospect is to start.
        """
        if not self.config.admission.queue_needs_prospect or self._availability is not ModelAvailability.READY:
            return None
        wait = self.admission.estimated_wait(rec.tenant, now)
        if wait is None:
            return None
        left = rec.deadline - now
        step = self.step_times.decode_step_s
        service = rec.max_new_tokens * step
        if service > left:
            service = step
        if wait + service <= left:
            return None
        return self.admission.reject_no_prospect(wait, service, left)

    def _expire_due(self, now: float) -> None:
        deadlines = self._deadlines
        registry = self.registry
        while deadlines and deadlines[0][0] <= now:
            _, request_id = heapq.heappop(deadlines)
            rec = registry.get(request_id)
            if rec is None:
                continue
            state = rec.state
            if state == "finishing":
                continue
            if state in RUNNING_STATES:
                if rec.machine.deadline_passed:
                    continue
                registry.fire(rec, "expire")
                if state == "prefill_running" and self.prefill.queued(rec):
                    self._end_between_chunks(rec)
            else:
                if state in WAITING_STATES:
                    self.admission.timed_out()
                registry.fire(rec, "expire")

    def _build_decode(self, profile: ProfileSpec, gen: int, now: float, job_id: int) -> DecodeBatch | None:
        result = self.decode.build_decode_batch(profile, gen, now, job_id)
        for rec in result.expired:
            if rec.state == "decode_ready":
                self.registry.fire(rec, "expire")
        for rec, _problem in result.invalid:
            if rec.state == "decode_ready":  # R7.4.4: intercepted before submit
                self.registry.fire(rec, "fail")
        if isinstance(result, NoBatch):
            if result.reason is NoBatchReason.KV_RESERVATION:
                for rec in result.refused:
                    if rec.state == "decode_ready":
                        self.registry.fire(rec, "fail")
            return None
        return result

    def _build_prefill(self, queue: str, job_id: int, now: float) -> PrefillWork | None:
        rec = self.prefill.take(queue)
        lease = rec.lease
        done = self.kv.committed_len(lease)
        remaining = rec.prompt_tokens - done
        tokens = self.prefill.next_chunk(remaining)
        check = self.kv.reserve_batch((lease,), tokens)
        if isinstance(check, KvReservationFailure):  # R7.4.4: never submitted
            if rec.state == "prefill_ready":
                self.registry.fire(rec, "fail")
            else:
                self.registry.fire(rec, "prefill_done", job=rec.job_id, ok=False, stop=False)
            return None
        request_job = job_id if rec.state == "prefill_ready" else rec.job_id
        if tokens < rec.prompt_tokens:
            self.prefill.count_chunk()
        return PrefillWork(job_id, rec.generation, rec.request_id, lease.seq_id, lease.lane, done, tokens,
                           rec.prompt_tokens, done + tokens == rec.prompt_tokens, queue, request_job, lease, rec)

    def _after_done(self, rec: RequestRecord, target: str, now: float) -> None:
        if target == "decode_ready":
            self.decode.add(rec, now, stepped=rec.machine.generated_tokens > 1)
        elif target == "finishing":
            self.registry.finish(rec.request_id)

    def _settle_kv(self, lease: KvLease, verdict: LaneVerdict) -> None:
        """§9.2: commit only when device and output succeeded; Unknown when the device's state is."""
        if verdict is LaneVerdict.OK:
            self.kv.settle(lease, "commit")
        elif verdict is LaneVerdict.OUTPUT_INVALID:
            self.kv.settle(lease, "abort")
        else:
            self.kv.settle(lease, "fault")

    def _end_job(self, job: JobRecord, ok: bool, fault: FaultKind) -> None:
        if ok:
            self.jobs.fire(job, "complete", ok=True)
        elif fault.quarantines_job:
            self.jobs.fire(job, "fault")
        else:
            self.jobs.fire(job, "complete", ok=False)

    def _late(self, job: JobRecord, leases: tuple[KvLease, ...], now: float) -> Applied:
        """A completion after a timeout: results dropped, the job's slot and lanes reclaimed."""
        self.jobs.fire(job, "late_complete")
        for lease in leases:
            machine = self.kv.lane(lease.lane)
            if (machine.state == "unknown" and machine.seq_id == lease.seq_id
                    and machine.generation == lease.generation and not self.kv.owns(lease)):
                self._commands.append(self.kv.recover(lease.lane))
        self._stale += 1
        self._pump(now)
        return Applied(job.job_id, True)

    def _fail_job_requests(self, job: JobRecord, detail: str = "") -> int:
        """The job's device state is unknown: fault its lanes and end its requests."""
        work = job.work
        if isinstance(work, DecodeBatch):
            pairs = list(zip(work.records, work.kv.leases))
            request_job = job.job_id
        else:
            pairs = [(work.record, work.lease)]
            request_job = work.request_job
        failed = 0
        for rec, lease in pairs:
            self.kv.settle(lease, "fault")
            if isinstance(work, DecodeBatch):
                callback = self.registry.on_decode_complete(rec.request_id, generation=job.generation,
                                                            job_id=request_job, ok=False, stop=False, token=None,
                                                            detail=detail)
            else:
                callback = self.registry.on_prefill_complete(rec.request_id, generation=job.generation,
                                                             job_id=request_job, ok=False, stop=False, token=None,
                                                             detail=detail)
            failed += callback.result is CallbackResult.APPLIED
        return failed

    def _job_leases(self, job: JobRecord) -> tuple[KvLease, ...]:
        work = job.work
        return work.kv.leases if isinstance(work, DecodeBatch) else (work.lease,)

    def _end_between_chunks(self, rec: RequestRecord) -> None:
        """A chunked prefill with nothing in flight ends now (its cancel/deadline flag decides how)."""
        self.registry.fire(rec, "prefill_done", job=rec.job_id, ok=True, stop=False)

    def _end_generation(self, generation: int, detail: str = "") -> None:
        """Requests pinned to a generation that can no longer serve them end (running ones drain)."""
        for rec in self.registry.live():
            if rec.generation != generation:
                continue
            state = rec.state
            if state == "finishing":
                self.registry.finish(rec.request_id)
            elif state == "prefill_running" and self.prefill.queued(rec):
                if detail:
                    rec.detail = detail
                self.registry.fire(rec, "prefill_done", job=rec.job_id, ok=False, stop=False)
            elif state not in RUNNING_STATES:
                self.registry.fail(rec, detail)

    def _bind_waiting_model(self) -> None:
        max_seq = self._max_seq()
        waiting, self._model_wait = self._model_wait, deque()
        for rec in waiting:
            if rec.state != "waiting_model":
                continue
            if rec.prompt_tokens + rec.max_new_tokens > max_seq:
                self.registry.reject(rec, 400, f"prompt + max_new_tokens exceeds the context of {max_seq}")
                continue
            self.registry.fire(rec, "bind", gen=self._generation)
            self.admission.enqueue(rec)

    def _max_seq(self) -> int:
        return self._profiles.max_seq if self._profiles is not None else self._default_max_seq

    def _no_pending(self) -> None:
        if self._pending is not None:
            raise DefinitionError(f"job {self._pending.job_id} is planned: call submitted() or submit_failed() "
                                  "before anything else")

    def _take_pending(self, job_id: int) -> JobRecord:
        job = self._pending
        if job is None or job.job_id != job_id:
            raise DefinitionError(f"job {job_id} is not the planned job")
        self._pending = None
        return job
