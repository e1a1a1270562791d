"""The job path between the scheduler and the device (§7–§9, §14, §15): submit what the scheduler
planned, then apply what the device answered.

A planned job is gated on its generation still serving (§10), built and submitted; a refusal
backs off (DeviceBusy), hands the device to recovery (a bad state) or fails its requests. A result
is verified (crosstalk, wrong job or generation, engine counters: the degrade detector, §14),
dispatched to the sampler and the scheduler, and a fault goes to recovery; a late result only
reclaims its slot and lanes. The machines' commands (``FreeSequence``, §9.2) go to the device
the same way, a refused one retried every tick. Requests' engine-side facts live in the
:class:`~calculet.runtime.engine.requests.RequestDesk`; recovery itself is the core's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from calculet.adapters.calrt import Anomaly, JobResult, ReturnCode, rc_of
from calculet.clock import Clock
from calculet.errors import DefinitionError
from calculet.runtime.engine.requests import RequestDesk, Trace
from calculet.runtime.execution.degrade import DegradeReason
from calculet.runtime.execution.dispatch import CompletionDispatcher
from calculet.runtime.execution.executor import DeviceExecutor, SubmitRefused
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.execution.recovery import FaultReason, HealthRecovery
from calculet.runtime.models.manager import ModelManager
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.kv import FreeSequence
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.scheduling.plan import Plan
from calculet.runtime.scheduling.scheduler import Scheduler

log = logging.getLogger("calculet.runtime.engine.jobs")

__all__ = ["JobPath"]


class JobPath:
    """Submitting planned jobs and applying their results, on the actor."""

    def __init__(self, scheduler: Scheduler, executor: DeviceExecutor, dispatcher: CompletionDispatcher,
                 recovery: HealthRecovery, models: ModelManager, desk: RequestDesk, clock: Clock, *,
                 trace: Trace | None, enter_recovery: Callable[[FaultReason, str], None],
                 back_off: Callable[[], None], recover: Callable[[], None]) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.dispatcher = dispatcher
        self.recovery = recovery
        self.models = models
        self.clock = clock
        self.trace = trace
        self._desk = desk
        self._enter_recovery = enter_recovery
        self._back_off = back_off
        self._recover = recover
        """Recover the device once its healthy jobs drained (the engine's, within the budget): :meth:`apply` asks
        when a result left a recovery pending."""
        self._pending_frees: list[FreeSequence] = []
        self._provenance = desk.tracks_provenance  # fixed when the desk is built: read once, not per result

    def submit(self, plan: Plan) -> InflightJob | None:
        """Submit a planned job, or refuse it for a generation leaving service or a device that said no."""
        work = plan.work
        assert work is not None and plan.engine is not None
        scheduler, executor = self.scheduler, self.executor
        if not self.models.may_submit(work.generation):  # a generation leaving service takes no new job
            scheduler.submit_failed(work.job_id)
            for rid in self._request_ids(work):
                scheduler.fail(rid, f"generation {work.generation} is no longer serving")
            return None
        prefill = isinstance(work, PrefillWork)  # asked once per job (issue #20)
        if prefill:
            prompt = self._desk.prompt(work.request_id)
            if prompt is None:
                scheduler.submit_failed(work.job_id)
                missing = DefinitionError(f"request {work.request_id} has no prompt on record")
                self._refuse(work, SubmitRefused(rc_of(missing), str(missing)))
                return None
            outcome = executor.submit(work, plan.engine, prompt)
        else:
            outcome = executor.submit(work, plan.engine)  # built and submitted in one call (issue #20)
        if isinstance(outcome, SubmitRefused):
            scheduler.submit_failed(work.job_id)
            self._refuse(work, outcome)
            return None
        scheduler.submitted(work.job_id)  # the jobs table counts it for its generation: no model event (#20)
        degrade = executor.degrade
        if degrade.streak:  # a run of DeviceBusy/timeouts stands: this accepted job breaks it
            degrade.accepted()
        if self.trace is not None:
            stage = "prefill_scheduler" if prefill else "decode_scheduler"
            for rid in self._request_ids(work):
                self.trace.extend(((stage, rid), ("executor", rid)))
        return outcome

    def _refuse(self, work: PrefillWork | DecodeBatch, refused: SubmitRefused) -> None:
        """A submit the device refused: back off (busy), recover (bad state) or fail the requests."""
        rc = refused.rc
        if rc is ReturnCode.DEVICE_BUSY:
            self.executor.degrade.busy_or_timeout(refused.detail)
            self._back_off()
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

    def apply(self, results: Iterable[JobResult], settle: bool = True) -> None:
        """Device results, in order: each one's job taken (checked by the executor), what it produced delivered,
        what went wrong reacted to — one pass per result (issue #20): a clean step is delivered here; a late
        completion, a rejected or failed result goes on to :meth:`_late` or :meth:`_react`. ``settle``: then, as
        after every batch of results the actor applies, the recovery one of them asked for (once the healthy jobs
        drained) and the machines' commands — one stage from the device's results to the commands they freed,
        where the engine forwarded each result here and settled after (two calls per decode step)."""
        executor, desk, provenance, scheduler, dispatcher = (self.executor, self._desk, self._provenance,
                                                             self.scheduler, self.dispatcher)
        for result in results:
            job, found = executor.complete(result)
            if job is None:
                continue
            work = job.work
            desk.on_job_done(work, result)  # device work per request, before the result can end one (#13)
            if provenance:
                desk.delivering = (work.generation, result.generation,
                                   self.models.generation_of_calbin(result.calbin_id))
            try:
                if job.timed_out:  # a late completion: nothing is delivered, the slot and lanes are reclaimed
                    self._late(work, result)
                    continue
                desk.overlapped = job.overlapped
                if self.trace is not None:
                    for rid in self._request_ids(work):
                        self.trace.extend((("completion", rid), ("sampler", rid)))
                if isinstance(work, DecodeBatch):
                    scheduler.on_decode_complete(dispatcher.decode(job, result, found))
                else:
                    scheduler.on_prefill_complete(dispatcher.prefill(job, result, found))
                if found or result.rc is not ReturnCode.OK:
                    self._react(result, found)
            finally:
                if provenance:
                    desk.delivering = None
        if settle:
            if self.recovery.pending is not None:
                self._recover()
            if self._pending_frees or scheduler.queued_commands:  # run_commands' own first test, without its call
                self.run_commands()

    def handle_result(self, result: JobResult) -> None:
        """One device result, :meth:`apply` of it alone with nothing settled after (the caller settles)."""
        self.apply((result,), settle=False)

    def _late(self, work: PrefillWork | DecodeBatch, result: JobResult) -> None:
        """The result of a job that timed out: its slot and lanes are reclaimed, nothing is delivered."""
        scheduler = self.scheduler
        if isinstance(work, DecodeBatch):
            scheduler.on_decode_complete(DecodeCompletion(work.job_id, result.generation, False, (),
                                                          FaultKind.ERROR, "late completion"))
        else:
            scheduler.on_prefill_complete(PrefillCompletion(work.job_id, result.generation, work.request_id,
                                                            work.seq_id, False, None))

    def _react(self, result: JobResult, found: list[tuple[Anomaly, str]]) -> None:
        """A delivered result the checks rejected (crosstalk, counters: degrade, §14) or the device failed."""
        scheduler, degrade = self.scheduler, self.executor.degrade
        if found:
            kinds = {kind.value for kind, _ in found}
            detail = found[0][1]
            if kinds & {"crosstalk", "wrong_job", "wrong_generation"}:
                degrade.trigger(DegradeReason.CROSSTALK, detail)
            if "counters" in kinds:
                degrade.trigger(DegradeReason.COUNTERS, detail)
            scheduler.recover_lanes()
            return
        rc = result.rc
        if rc in (ReturnCode.TIMEOUT, ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN):
            if rc is ReturnCode.TIMEOUT:
                degrade.busy_or_timeout(rc.name)
            self._enter_recovery(self.recovery.reason_for(rc), f"{rc.name}: {result.message or 'job fault'}")
            return
        scheduler.recover_lanes()  # a known failure: the device is done with the job's lanes

    def expire(self) -> None:
        """Jobs past their Wait deadline time out (the executor reads the clock, the engine's, when one is in flight)."""
        for job in self.executor.expired():
            self.timed_out(job)

    def timed_out(self, job: InflightJob) -> None:
        """A job did not complete in time: its requests fail, the device is recovered."""
        timeout = job.deadline - job.ticket.submitted_at
        detail = f"TIMEOUT: job {int(job.device_job)} not complete after {timeout:g} s"
        log.warning("Wait timed out", extra={"rc": ReturnCode.TIMEOUT.name, "job_id": job.job_id})
        self.scheduler.job_timed_out(job.job_id, detail)
        self.executor.degrade.busy_or_timeout(detail)
        self._enter_recovery(FaultReason.TIMEOUT, detail)

    # ------------------------------------------------------------------ commands (§9.2)

    @property
    def pending_frees(self) -> int:
        """``FreeSequence`` commands the device refused so far (retried every tick)."""
        return len(self._pending_frees)

    def run_commands(self) -> None:
        """Execute the machines' pending commands (FreeSequence, ...) through the adapter."""
        scheduler, executor = self.scheduler, self.executor
        if not self._pending_frees and not scheduler.queued_commands:
            return  # the common case, several times a step: nothing to execute (issue #20)
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
