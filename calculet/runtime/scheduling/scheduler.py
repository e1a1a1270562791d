"""The scheduling core (§3–§9) as one sans-io object that the engine's actor drives.

It decides and never performs I/O; time comes from the injected clock (DESIGN principles 1–3).
A request flows::

    submit(request, sink)      -> Submission(request_id, Admit | Queue | Reject*)   §4, §5
    step()                     -> Plan(work=PrefillWork | DecodeBatch | None, engine, wake_at)
    submitted(job_id)          the device accepted the job: request/KV/job machines fire
      or submit_failed(job_id) the device refused it: nothing fired, candidates re-queued
    on_prefill_complete(PrefillCompletion) / on_decode_complete(DecodeCompletion | DecodeTokens)  §7.4
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

This object is the intake, the tick and the reclaim path; the rest lives beside it: the tick itself
(``step``, :mod:`.stepping`, a mixin of this class), what the device's results do (:mod:`.apply`), which generation requests are pinned to
(:mod:`.generations`), and the values exchanged with the actor (:mod:`.plan`). A step that finds
nothing changed since the last admission pass found nothing waiting takes that pass's answer
(:mod:`.changes`: the steady decode step, issue #20).

Decisions where the spec is silent (the generation decisions are in :mod:`.generations`):

* a service opportunity (§6 WRR) is one device job;
* a request whose prefill is chunked is cancelled or expires between chunks at once
  (nothing is in flight to drain);
* Unknown KV lanes are recovered by ``device_reset`` or by ``recover_lanes`` (only lanes no
  in-flight job may still write), or when a late completion proves the job finished.
"""

from __future__ import annotations

from collections.abc import Sequence

from calculet.clock import Clock
from calculet.config import SchedulerConfig
from calculet.errors import BadRequest, DefinitionError
from calculet.machines.request import FinishReason
from calculet.runtime.request import InferenceRequest, RequestOutcome, RequestSink
from calculet.runtime.scheduling.admission import (ADMITTED, QUEUED, AdmissionController, AdmissionOutcome, Decision,
                                                   ModelAvailability)
from calculet.runtime.scheduling.apply import CompletionApplier, DeadlineQueue, end_between_chunks
from calculet.runtime.scheduling.completion import DecodeCompletion, DecodeTokens, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch, DecodeScheduler
from calculet.runtime.scheduling.estimates import PrefillTimer, StepTimer
from calculet.runtime.scheduling.fairness import TenantPolicy
from calculet.runtime.scheduling.generations import GenerationBinding
from calculet.runtime.scheduling.changes import Changes
from calculet.runtime.scheduling.job_lane_monitor import attach as attach_job_lane_monitor
from calculet.runtime.scheduling.jobs import InflightTable, JobRecord
from calculet.runtime.scheduling.kv import KvLaneManager, KvLease
from calculet.runtime.scheduling.on_time import OnTimePolicy
from calculet.runtime.scheduling.plan import (Applied, Command, SchedulerStatistics, SchedulingCapabilities,
                                              Submission)
from calculet.runtime.scheduling.prefill import PrefillScheduler, SmoothWrr
from calculet.runtime.scheduling.profiles import ProfileSet
from calculet.runtime.scheduling.stepping import Stepping
from calculet.runtime.scheduling.step_done import decode_step_submitted, job_submitted
from calculet.runtime.scheduling.registry import (PREFILL_STATES, WAITING_STATES, Cancellation, CancelResult, QuietListener,
                                                  RequestRecord, RequestRegistry, TransitionListener, one_by_one)

ENDED_STATES = frozenset({"finishing", "completed", "cancelled", "failed"})
DECODE_CYCLE = frozenset({"decode_ready", "decode_running"})
"""Moving between these reclaims nothing (the queue entry left with the batch) and is neither an admission
nor an end (OnTimePolicy.transition acts only on those): two transitions per lane per step skip the listener;
an observer hears them once per step (``step_observer``), or one by one from that one call."""
_new_tuple = tuple.__new__


class Scheduler(Stepping):
    """Registry, admission, fairness, prefill and decode scheduling and KV lanes, wired together."""

    def __init__(self, config: SchedulerConfig, *, clock: Clock, kv: KvLaneManager, device_kv_tokens: int,
                 max_seq: int, capabilities: SchedulingCapabilities = SchedulingCapabilities(),
                 step_estimate_s: float = 0.0, observer: TransitionListener | None = None,
                 step_observer: QuietListener | None = None) -> None:
        """``observer`` hears every request transition; ``step_observer``, if given, a decode step's (#20)."""
        self.config = config
        self._observer = observer
        self.capabilities = capabilities
        self._clock = clock
        self.kv = kv
        budget = config.capacity_budget(device_kv_tokens)
        self.registry = RequestRegistry(listener=self._on_transition)
        self.registry.quiet = DECODE_CYCLE  # _on_transition ignores a decode step's moves: told once per step (#20)
        self.registry.quiet_listener = step_observer or (one_by_one(observer) if observer is not None else None)
        self.admission = AdmissionController(
            budget, tenants=[TenantPolicy.from_config(t) for t in config.tenants], queues=config.queues,
            long_quota=config.admission.long_prefill_quota, now=clock.now())
        self.prefill = PrefillScheduler(config.queues, clock=clock, chunk_cost=self.admission.wfq.prefill_tag)
        self.step_times = StepTimer(step_estimate_s)
        self.prefill_times = PrefillTimer()
        self.decode = DecodeScheduler(kv, batching_window_us=config.batch.batching_window_us,
                                      max_tenant_lane_share=config.batch.max_tenant_lane_share,
                                      step_times=self.step_times, step_cost=self.admission.wfq.step_tag,
                                      deadline_order=config.batch.deadline_order,
                                      deadline_slack=config.batch.deadline_slack)
        self.jobs = InflightTable(max_inflight=budget.max_inflight_jobs, fixed_engine=config.executor.fixed_engine)
        self.job_lanes = attach_job_lane_monitor(self.jobs, kv)  # JobLaneSystem's invariants, live (#17)
        self.arbiter = SmoothWrr(config.queues.wrr_weights())
        self._deadline_default_ms = config.admission.deadline_default_ms
        self._deadlines = DeadlineQueue()
        self._commands: list[Command] = []
        self.changes = Changes()
        self.queued_commands: Sequence[Command] = self._commands
        """The commands not yet taken, read-only: the engine asks :meth:`take_commands` only when there are some."""
        self._pending: JobRecord | None = None
        self._next_job = 1
        self.generations = GenerationBinding(registry=self.registry, admission=self.admission, prefill=self.prefill,
                                             capabilities=capabilities, default_max_seq=max_seq, pump=self._pump,
                                             admit_now=self._admit_now)
        self.completions = CompletionApplier(registry=self.registry, kv=kv, jobs=self.jobs, decode=self.decode,
                                             prefill=self.prefill, step_times=self.step_times,
                                             capabilities=capabilities, clock=clock, commands=self._commands,
                                             pump=self._pump, prefill_times=self.prefill_times, changes=self.changes)
        self.on_time = None if config.batch.deadline_order != "on_time" else OnTimePolicy(
            config, registry=self.registry, admission=self.admission, decode=self.decode, prefill=self.prefill,
            step_times=self.step_times, prefill_times=self.prefill_times,
            engines=lambda: self.jobs.max_inflight, profiles=lambda: self.generations.profiles,
            prefilled=lambda rec: 0 if rec.lease is None else self.kv.owned_position(rec.lease) or 0)
        self._decode_cap = None if self.on_time is None else self.on_time.cap_reader  # None: no cap, no call (#20)

    # ------------------------------------------------------------------ model (§10, §12)

    @property
    def generation(self) -> int:
        return self.generations.generation

    @property
    def availability(self) -> ModelAvailability:
        return self.generations.availability

    @property
    def profiles(self) -> ProfileSet | None:
        """The serving generation's profiles (None before the first ``set_model`` with profiles)."""
        return self.generations.profiles

    def set_model(self, generation: int, availability: ModelAvailability, profiles: ProfileSet | None = None,
                  detail: str = "") -> None:
        """The model manager's view of the alias: its generation, availability and profiles. ``detail`` is the
        error detail of requests that end because the generation went away or failed (R19.2)."""
        self._no_pending()
        self.generations.set_model(generation, availability, profiles, detail, self._clock.now())

    @property
    def holding_new_requests(self) -> bool:
        return self.generations.held

    def hold_new_requests(self, hold: bool) -> None:
        """§11 step 5 "stop new admission if replacement": while held, a new request is not pinned
        to the serving generation but waits unbound (WaitingModel, bounded by the waiting budget and
        its deadline); requests already pinned keep being admitted and served. Releasing the hold
        pins the waiting ones to the generation that is Ready then (R10.3: pinned once, never moved)."""
        self._no_pending()
        self.generations.hold(hold, self._clock.now())

    def reject_waiting_model(self, detail: str) -> int:
        """End every request still waiting for a generation with 503 (the alias has none and none is
        coming, e.g. a failed replacement whose previous version could not be restored)."""
        self._no_pending()
        return self.generations.reject_waiting(detail)

    def shutdown(self) -> None:
        """Refuse new requests (503); cancel everything not on the device; running jobs drain."""
        self._no_pending()
        self.generations.shutdown()

    # ------------------------------------------------------------------ requests (§4, §5)

    def submit(self, request: InferenceRequest, sink: RequestSink) -> Submission:
        """Create the request and answer with its §5.2 outcome."""
        if self._pending is not None:
            self._no_pending()
        now = self._clock.now()
        generations = self.generations
        max_seq = generations.max_seq()
        ms = request.deadline_ms if request.deadline_ms is not None else self._deadline_default_ms
        try:
            rec = self.registry.create(request, sink, max_seq=max_seq, arrival=now, deadline=now + ms / 1000)
        except BadRequest as exc:
            outcome = self.admission.record(AdmissionOutcome(Decision.REJECT_INVALID, exc.message))
            sink.close(RequestOutcome(0, "failed", FinishReason.REJECTED, 0, 400, exc.message))
            return Submission(0, outcome)
        rec.prefill_class = prefill_class = self.config.queues.prefill_class(request.prompt_tokens)  # R6.2, as
        # PrefillScheduler.classify answers (the same configuration's rule), without its call
        rejection = self.admission.screen(request, max_seq=max_seq, availability=generations.availability, now=now,
                                          long=prefill_class == "long")
        if rejection is not None:
            self.registry.reject(rec, rejection.http_status or 400, rejection.reason)
            return Submission(rec.request_id, rejection)
        if generations.availability is ModelAvailability.READY:  # §5.2 prospect: on_time's estimate, or the backlog
            no_prospect = (self.on_time.screen(rec, now) if self.on_time is not None else self.admission.without_prospect(
                rec, now, decode_step_s=self.step_times.decode_step_s) if self.config.admission.queue_needs_prospect
                else None)
            if no_prospect is not None:
                self.registry.reject(rec, 429, no_prospect.reason)
                return Submission(rec.request_id, no_prospect)
        self._deadlines.add(rec)
        generations.place(rec, now)  # admitted at once, or accepted (waiting budget) and queued
        outcome = self.admission.record(ADMITTED if rec.machine.state == "prefill_ready" else QUEUED)
        return _new_tuple(Submission, (rec.request_id, outcome))  # Submission(...) without its __new__ frame

    def cancel(self, request_id: int) -> Cancellation:
        """§4 cancel: idempotent; immediate unless a job is on the device."""
        self._no_pending()
        rec = self.registry.get(request_id)
        if rec is not None and rec.state == "prefill_running" and self.prefill.queued(rec):
            self.registry.fire(rec, "cancel")
            end_between_chunks(self.registry, rec)
            result = Cancellation(CancelResult.CANCELLED, self.registry.outcome(request_id))
        else:
            result = self.registry.cancel(request_id)
        self._pump(self._clock.now())
        return result

    # ------------------------------------------------------------------ the tick

    def submitted(self, job_id: int) -> None:
        """The device accepted the planned job: jobs, KV lanes and requests fire ``submit``."""
        job = self._pending
        if job is None or job.job_id != job_id:
            job = self._take_pending(job_id)  # raises here: not the planned job
        self._pending = None  # _take_pending's accepting case without its call (once per step, issue #20)
        work = job.work
        # a B1 decode step: its events as one composite, called from here (a frame a token fewer, session 26 #20);
        # any other job, or a step the composite declines (nothing changed then), each machine's event (step_done.py)
        if work.__class__ is DecodeBatch and decode_step_submitted(self, job, work):
            return
        job_submitted(self, job)

    def submit_failed(self, job_id: int) -> None:
        """The device refused the planned job (DeviceBusy, ...): nothing ran; re-queue its work."""
        job = self._take_pending(job_id)
        self.jobs.fire(job, "submit_rejected")
        work = job.work
        if isinstance(work, DecodeBatch):
            self.decode.restore(work.records)
        else:
            self.prefill.restore(work.record)

    # ------------------------------------------------------------------ what the device did (§4, §7.4, §9.2)

    def on_decode_complete(self, completion: DecodeCompletion | DecodeTokens) -> Applied:
        """Apply a decode job's result lane by lane (the usual step: as columns), or drop it as stale and reclaim."""
        if self._pending is not None:  # _no_pending without its call (once per decode step)
            self._no_pending()
        return self.completions.decode_complete(completion)

    def on_prefill_complete(self, completion: PrefillCompletion) -> Applied:
        """Apply a prefill job's (or chunk's) result, or drop it as stale and reclaim."""
        self._no_pending()
        return self.completions.prefill_complete(completion)

    def job_timed_out(self, job_id: int, detail: str = "") -> Applied:
        """Wait timed out: the job keeps its slot (it may still write), lanes go Unknown, requests end."""
        self._no_pending()
        return self.completions.timed_out(job_id, detail)

    def device_reset(self, detail: str = "") -> None:
        """A device reset per the contract ended every job: slots free, Unknown lanes recover."""
        self._no_pending()
        self.completions.device_reset(detail)
        if self.on_time is not None:
            self.on_time.mark()

    def recover_lanes(self) -> int:
        """Recover Unknown lanes that no in-flight job can still write (after a known failure)."""
        self._no_pending()
        return self.completions.recover_lanes()

    def fail(self, request_id: int, detail: str) -> bool:
        """End a request that has no job in flight as Failed (ERROR) with ``detail`` (a submit
        refused for good, KV lost in a reset; R19.2). False if the request is unknown, ended,
        finishing, or has a job on the device (that job's completion decides)."""
        self._no_pending()
        return self.completions.fail(request_id, detail)

    def fail_lost_kv(self, detail: str) -> int:
        """The device lost every KV sequence (reset, restart): end each request whose committed
        KV is gone (a lane with nothing committed yet is still usable). Returns how many ended."""
        self._no_pending()
        return self.completions.fail_lost_kv(detail)

    def limit_inflight(self, max_inflight: int) -> None:
        """§14 degrade: new jobs go out ``max_inflight`` at a time; submitted jobs still drain."""
        if not 1 <= max_inflight <= 2:
            raise DefinitionError(f"limit_inflight({max_inflight}): must be 1 or 2 (§14)")
        self.jobs.max_inflight = max_inflight

    # ------------------------------------------------------------------ KV commands (§9.2)

    def take_commands(self) -> list[Command]:
        """Commands for the engine to execute through the adapter (FreeSequence, ...)."""
        commands = self._commands.copy()
        self._commands.clear()  # the list itself is shared with the completion applier
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
        completions = self.completions
        return SchedulerStatistics(
            self.generations.generation, self.generations.availability.value, self.registry.statistics(),
            self.admission.statistics(), self.prefill.statistics(), self.decode.statistics(self._clock.now()),
            self.kv.statistics(), self.jobs.statistics(), self.arbiter.picks(), completions.stale, completions.anomalies,
            len(self._commands), self.step_times.statistics(),
            None if self.on_time is None else self.on_time.statistics())

    # ------------------------------------------------------------------ internals

    def _on_transition(self, rec: RequestRecord, source: str, target: str) -> None:
        """Reclaim whatever ``rec`` stops needing with this transition (the one reclaim path)."""
        self.changes.count += 1  # a reported move may start or end a wait, free budget or end a deadline
        if self._observer is not None:
            self._observer(rec, source, target)
        if source == target or (source in DECODE_CYCLE and target in DECODE_CYCLE):
            return  # a decode step's submit or result: nothing to reclaim, and on_time acts on none of them
        ends = target in ENDED_STATES and source not in ENDED_STATES  # its first step into an ended state
        if self.on_time is not None and (ends or target == "prefill_ready"):  # the moves OnTimePolicy.transition acts on
            self.on_time.transition(rec, target, ends, self._clock.now())
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

    def _admit_now(self, rec: RequestRecord, now: float) -> bool:
        """Admit ``rec`` (new, screened, its generation Ready) at once if nothing else waits and the budget has room,
        as the queue would (#20: one ``admit_now`` event, no waiting budget held and given back). False: it waits."""
        admission, cap = self.admission, self._decode_cap() if self._decode_cap is not None else None
        if (cap is not None and admission.active >= cap) or not admission.admissible_at_once(rec, self.kv.free_lanes):
            return False
        self._admit(rec, now, self.generations.generation)
        return True

    def _pump(self, now: float) -> None:
        """Admit waiting requests in WFQ order while the budget and a free lane allow (§5)."""
        admission = self.admission
        ready = self.generations.availability is ModelAvailability.READY
        if not ready or not admission.waiting:
            return  # nothing waits (every step of a saturated decode rotation): nothing to admit (issue #20)
        kv, changes, free = self.kv, self.changes, self.kv.free_lanes  # free: moved only by _admit (#20: read 3 times)
        cap = self._decode_cap() if self._decode_cap is not None else None
        if changes.blocked == (changes.count, free, cap):
            admission.blocked_again()  # the last pass's head, held out again (Changes.blocked)
            return
        while cap is None or admission.active < cap:
            rec = admission.next_admissible(free)
            if rec is None:
                changes.held_out(admission.blocked_by, free, cap)
                return
            self._admit(rec, now)
            free = kv.free_lanes

    def _admit(self, rec: RequestRecord, now: float, bind: int = 0) -> None:
        """``rec`` leaves the waiting budget for a KV lane and the prefill queue (admission found room);
        ``bind``: a new request admitted at once, pinned to generation ``bind`` by the same event."""
        lease = self.kv.reserve(bind or rec.machine.generation, rec.machine.prompt_tokens + rec.machine.max_new_tokens)
        if lease.__class__ is not KvLease:
            raise DefinitionError(f"admission found room but the KV pool refused: {lease.reason}")  # type: ignore[union-attr]
        rec.lease = lease
        self.admission.admitted(rec, now)
        self.registry.fire(rec, "admit_now", gen=bind) if bind else self.registry.fire(rec, "admit")  # one event each
        self.prefill.add(rec, now)

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
