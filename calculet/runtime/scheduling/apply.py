"""Applying what the device did to requests, KV lanes and jobs (§4, §7.4, §9.2, §14).

The scheduler (:mod:`calculet.runtime.scheduling.scheduler`) plans jobs; this is the other half
of its contract with the device: a job's completion, its Wait timeout, a device reset, and a
failure found outside any completion (a submit refused for good, KV lost in a reset). Every
change is a declared machine's event — the job (``InflightTable``), each lane's KV transaction
(``KvLaneManager``) and each request (``RequestRegistry``); the resources a request stops needing
are reclaimed by the registry's transition listener, so nothing here frees anything by hand.

Rules kept here:

* §9.2 KV is committed only when the device *and* the output succeeded; a lane whose device
  state is unknown (timeout, CCU fault, DMA unknown, mismatched result) becomes Unknown and is
  quarantined until recovered;
* §7.4 a decode result is checked lane by lane (``check_decode_lanes``); without lane-failure
  isolation a failed job fails every lane (R7.4.6); the usual step given as columns (``DecodeTokens``,
  issue #20) is applied as the outcomes it stands for, checked for what columns cannot say (job, generation,
  usable tokens);
* §4 a completion for a job that is no longer expected (timed out, reset) is stale: its results
  are dropped, but the job's slot and lanes are reclaimed;
* a chunked prompt's intermediate chunk commits KV and re-queues the next chunk (§6).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from calculet.clock import Clock
from calculet.runtime.scheduling.changes import Changes
from calculet.runtime.scheduling.completion import (DecodeCompletion, DecodeTokens, FaultKind, LaneOutcome,
                                                    LaneVerdict, PrefillCompletion, check_decode_lanes,
                                                    clean_decode_lanes, usable_tokens)
from calculet.runtime.scheduling.decode import DecodeBatch, DecodeScheduler
from calculet.runtime.scheduling.estimates import PrefillTimer, StepTimer
from calculet.runtime.scheduling.jobs import DECODE, PREFILL, InflightTable, JobRecord
from calculet.runtime.scheduling.kv import KvLaneManager, KvLease
from calculet.runtime.scheduling.plan import Applied, Command, SchedulingCapabilities
from calculet.runtime.scheduling.prefill import PrefillScheduler, PrefillWork
from calculet.runtime.scheduling.registry import (RUNNING_STATES, WAITING_STATES, CallbackResult, RequestRecord,
                                                  RequestRegistry)
from calculet.runtime.scheduling.step_done import decode_step_done


_SETTLE = {LaneVerdict.OK: "commit", LaneVerdict.OUTPUT_INVALID: "abort",
           LaneVerdict.DEVICE_FAILED: "fault", LaneVerdict.MISMATCH: "fault"}
"""§9.2: the KV event that ends a lane's transaction for each verdict — commit only when device and
output succeeded, abort when the device's effect is known, Unknown (fault) when it is not."""
_new_tuple = tuple.__new__
"""Builds the step's named tuple (:class:`Applied`) without its generated ``__new__`` (a Python frame)."""
_SETTLE_BY_VALUE = {verdict.value: event for verdict, event in _SETTLE.items()}
"""``_SETTLE`` by the verdict's value: an Enum member hashes in Python code, a str in C (once per lane per step)."""


def end_between_chunks(registry: RequestRegistry, rec: RequestRecord) -> None:
    """A chunked prefill with nothing in flight ends now (its cancel/deadline flag decides how)."""
    registry.fire(rec, "prefill_done", job=rec.job_id, ok=True, stop=False)


def end_for_deadline(registry: RequestRegistry, prefill: PrefillScheduler, rec: RequestRecord) -> None:
    """``rec`` cannot make its deadline (it passed, or the overload selection shed it): ``expire``.

    Ended at once (DEADLINE) unless a job of it is on the device, which drains first; a chunked
    prefill between chunks has nothing in flight and ends now."""
    state = rec.state
    if state in RUNNING_STATES and rec.machine.deadline_passed:
        return
    registry.fire(rec, "expire")
    if state == "prefill_running" and prefill.queued(rec):
        end_between_chunks(registry, rec)


class DeadlineQueue:
    """Every accepted request's deadline, soonest first: a request whose deadline passes is ended
    (§7.2, :func:`end_for_deadline`) at the first scheduler step at or after it, and the scheduler's
    plan names the soonest one as its wake-up time. Requests that ended first are skipped when their
    entry comes up (nothing is removed early)."""

    __slots__ = ("_heap", "soonest")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self.soonest = math.inf
        """The soonest deadline queued (inf with none): a step before it has nothing to sweep (issue #20)."""

    def add(self, rec: RequestRecord) -> None:
        heapq.heappush(self._heap, (rec.deadline, rec.request_id))
        self.soonest = self._heap[0][0]

    def next_due(self) -> float | None:
        heap = self._heap
        return heap[0][0] if heap else None

    def expire_due(self, now: float, registry: RequestRegistry, prefill: PrefillScheduler,
                   waiting_timed_out: Callable[[], None]) -> None:
        """End each live request whose deadline is at or before ``now``; ``waiting_timed_out`` counts one
        that was still waiting for admission (the admission controller's count)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, request_id = heapq.heappop(heap)
            self.soonest = heap[0][0] if heap else math.inf
            rec = registry.get(request_id)
            if rec is None:
                continue
            state = rec.state
            if state == "finishing":
                continue
            if state in WAITING_STATES:
                waiting_timed_out()
            end_for_deadline(registry, prefill, rec)


class CompletionApplier:
    """Completions, timeouts, resets and failures applied to the scheduler's machines."""

    def __init__(self, *, registry: RequestRegistry, kv: KvLaneManager, jobs: InflightTable,
                 decode: DecodeScheduler, prefill: PrefillScheduler, step_times: StepTimer,
                 capabilities: SchedulingCapabilities, clock: Clock, commands: list[Command],
                 pump: Callable[[float], None], prefill_times: PrefillTimer | None = None,
                 changes: Changes | None = None) -> None:
        self.registry = registry
        self.kv = kv
        self.jobs = jobs
        self.decode = decode
        self.prefill = prefill
        self.step_times = step_times
        self.prefill_times = prefill_times if prefill_times is not None else PrefillTimer()
        self.capabilities = capabilities
        self._clock = clock
        self._commands = commands
        """The scheduler's command list (shared: the engine takes from it)."""
        self._pump = pump
        """Admit waiting requests (the scheduler's ``_pump``): reclaimed room is used at once."""
        self._changes = changes if changes is not None else Changes()
        """The scheduler's count of changes: a decode result that changed nothing a pass reads skips it."""
        self.stale = 0
        self.anomalies = 0

    def _decoding_elsewhere(self, done: JobRecord) -> tuple[int, int]:
        """(active lanes, compiled lanes) of the other decode jobs in flight (ping/pong, §14): sequences in
        decode that are neither ready nor in ``done``, and the lanes decoding at once, which the per-token
        time counts (issue #13: without them it read under the step time under ping/pong, and the
        B16 ping/pong estimate was optimistic by a signed median of 22 %). Scans the jobs in flight."""
        lanes = compiled = 0
        for other in self.jobs:
            if other is not done and other.kind == DECODE and other.state == "submitted":
                lanes += len(other.work.active)
                compiled += other.work.profile.compiled_batch
        return lanes, compiled

    def _ahead(self) -> float | None:
        """The earliest submit instant among the jobs still on the device (None: none): the overlap timer's input."""
        return min((job.submitted_at for job in self.jobs.by_id.values() if job.state == "submitted"), default=None)

    # ------------------------------------------------------------------ completions (§4, §7.4)

    def decode_complete(self, completion: DecodeCompletion | DecodeTokens) -> Applied:
        """Apply a decode job's result lane by lane, or drop it as stale and reclaim.

        The usual step may come as columns (:data:`~.completion.DecodeTokens`, issue #20): applied as the outcomes
        they stand for, without building them, when what the columns do not say by themselves holds — the job
        current and of that generation, every token usable (:func:`usable_tokens`); otherwise the outcomes are
        built from the batch's bindings and take :meth:`_decode_outcomes` as any other result."""
        if completion.__class__ is not tuple:
            return self._decode_outcomes(completion)  # type: ignore[arg-type]
        job_id, generation, tokens, stops = completion
        job = self.jobs.by_id.get(job_id)  # the table's read-only view: its ``get`` without the frame (#20)
        if (job is not None and job.kind == DECODE and job.state == "submitted" and generation == job.generation
                and usable_tokens(tokens, self.capabilities.vocab_size)):
            now = self._clock.now()
            if len(tokens) == 1:  # B1: the events as one composite, without _decode_settled's frame (issue #20)
                applied = decode_step_done(self, job, job.work, now, tokens[0], stops[0])
                if applied is not None:
                    return applied
            return self._decode_settled(job, job.work, now, (tokens, stops), None)
        bound = job.work.active if job is not None and job.kind == DECODE else ()
        return self._decode_outcomes(DecodeCompletion(job_id, generation, True, tuple([
            LaneOutcome(b.lane, b.request_id, b.seq_id, generation, True, token, stop)
            for b, token, stop in zip(bound, tokens, stops)])))

    def _decode_outcomes(self, completion: DecodeCompletion) -> Applied:
        """:meth:`decode_complete` of a result as outcomes per lane."""
        now = self._clock.now()
        job = self.jobs.get(completion.job_id)
        if job is None or job.kind != DECODE:
            self.stale += 1
            return Applied(completion.job_id, True)
        batch: DecodeBatch = job.work
        if job.state != "submitted":
            return self._late(job, batch.kv.leases, now)
        if completion.generation != job.generation:
            self.anomalies += 1
            completion = DecodeCompletion(completion.job_id, job.generation, False, (), FaultKind.ERROR,
                                          f"result of generation {completion.generation} for a job of generation "
                                          f"{job.generation}")
        clean = clean_decode_lanes(batch.active, completion, self.capabilities.vocab_size)
        return self._decode_settled(job, batch, now, clean, completion)

    def _decode_settled(self, job: JobRecord, batch: DecodeBatch, now: float,
                        clean: tuple[list[int], list[bool]] | None, completion: DecodeCompletion | None) -> Applied:
        """A current decode job's result applied: the job ends, its step is timed, every lane's KV settled, its
        requests moved. ``clean``: the usual step's columns (then ``completion`` may be None); else ``completion``
        decides lane by lane."""
        if clean is not None and len(clean[0]) == 1:  # B1: the three events as one composite (issue #20)
            applied = decode_step_done(self, job, batch, now, clean[0][0], clean[1][0])
            if applied is not None:
                return applied
        if clean is not None or completion.ok:  # type: ignore[union-attr]
            self.jobs.fire(job, "complete", ok=True)
            self.observe_step(job, batch, now)
        else:
            self._job_failed(job, completion.fault)  # type: ignore[union-attr]
        registry = self.registry
        # §9.2: commit only when device and output succeeded. Every lane of the job is settled in one
        # call before any request moves (a request that ends releases its lane, which must not be
        # Updating any more); per lane the order is the same as settling it just before its request.
        tokens: Sequence[int | None]  # a lane with no usable output has None (only off the clean path)
        if clean is not None:  # every lane OK (the usual step): columns, no LaneCheck per lane (issue #20)
            tokens, stops = clean
            lanes = len(tokens)
            self.kv.commit_batch(batch.kv, job)  # job: the step's, for the job x lane step check
            produced: list[bool] = [True] * lanes
            details = [""] * lanes
            ok, failed = lanes, 0
        else:
            produced, stops, tokens, details = self._lane_verdicts(job, batch, completion)  # type: ignore[arg-type]
            ok = sum(produced)
            failed = len(produced) - ok
        records = batch.records
        targets = registry.decode_done_each(records, job.generation, job.job_id, produced, stops, tokens, details)
        return self.after_decode(job, records, targets, now, ok, failed)

    def observe_step(self, job: JobRecord, batch: DecodeBatch, now: float) -> None:
        """A decode job that completed ok (it has left the table) times its step: the step timer's sample, and under
        ping/pong the overlap's."""
        jobs = self.jobs
        # the usual decode step: ``job`` has left the table and no other job is in it, nothing to scan
        lanes_elsewhere, compiled_elsewhere = self._decoding_elsewhere(job) if jobs.by_id else (0, 0)
        step_times = self.step_times
        active = len(batch.active)
        step_times.observe(now - job.submitted_at, lanes=active, now=now,
                           compiled=batch.profile.compiled_batch + compiled_elsewhere,
                           decoding=active + self.decode.total_ready() + lanes_elsewhere)
        if step_times.overlap is not None:  # ping/pong's overlap, for the rollout only (#13 session 22)
            step_times.overlap.completed(job.submitted_at, now, self._ahead(), compiled=batch.profile.compiled_batch)

    def after_decode(self, job: JobRecord, records: Sequence[RequestRecord], targets: Sequence[str | None],
                     now: float, ok: int, failed: int) -> Applied:
        """After a decode job's requests moved (``targets``): finishing ones finish, ready ones queue again, room
        reclaimed is used (the scheduler's pump) when something changed."""
        registry = self.registry
        if "finishing" in targets:
            for rec, target in zip(records, targets):
                if target == "finishing":
                    registry.finish(rec.request_id)
        # Ready again: queued in lane order (nothing between reads the queue); usually every lane is
        if targets.count("decode_ready") == len(records):
            self.decode.add_back(records, now)
        else:
            self.decode.add_back([rec for rec, target in zip(records, targets) if target == "decode_ready"], now)
        changes = self._changes
        if changes.calm != changes.count:  # a lane ended (its budget back), or a change since the last pass
            self._pump(now)
        return _new_tuple(Applied, (job.job_id, False, ok, failed))  # Applied(...) without its __new__ frame

    def _lane_verdicts(self, job: JobRecord, batch: DecodeBatch, completion: DecodeCompletion
                       ) -> tuple[list[bool], list[bool], list[int | None], list[str]]:
        """A decode result that is not all OK, lane by lane (§7.4): every lane's KV settled by its verdict,
        anomalies counted; the (produced, stop, token, detail) columns for the requests."""
        checks, extra = check_decode_lanes(batch.active, completion,
                                           lane_isolation=self.capabilities.lane_failure_isolation,
                                           vocab_size=self.capabilities.vocab_size)
        self.anomalies += extra
        settles = _SETTLE_BY_VALUE
        self.kv.settle_batch(batch.kv.leases, [settles[check.verdict._value_] for check in checks], job)
        good = LaneVerdict.OK
        produced = [check.verdict is good for check in checks]
        self.anomalies += sum(check.verdict is LaneVerdict.MISMATCH for check in checks)
        details = ["" if check.verdict is good else (completion.detail or check.detail) for check in checks]
        return produced, [check.stop for check in checks], [check.token for check in checks], details

    def prefill_complete(self, completion: PrefillCompletion) -> Applied:
        """Apply a prefill job's (or chunk's) result, or drop it as stale and reclaim."""
        now = self._clock.now()
        job = self.jobs.get(completion.job_id)
        if job is None or job.kind != PREFILL:
            self.stale += 1
            return Applied(completion.job_id, True)
        work: PrefillWork = job.work
        if job.state != "submitted":
            return self._late(job, (work.lease,), now)
        consistent = (completion.generation, completion.request_id, completion.seq_id) == (
            job.generation, work.request_id, work.seq_id)
        if not consistent:
            self.anomalies += 1
        device_ok = completion.ok and consistent
        if device_ok:
            self.jobs.fire(job, "complete", ok=True)
            self.prefill_times.observe(work.tokens, now - job.submitted_at)
            self.step_times.prefill_ran(now - job.submitted_at)
            if self.step_times.overlap is not None:
                self.step_times.overlap.completed(job.submitted_at, now, self._ahead(), tokens=work.tokens)
        else:
            self._job_failed(job, completion.fault if consistent else FaultKind.ERROR)
        token = completion.token
        verdict = self._prefill_verdict(device_ok, consistent, token, work.last_chunk)
        self._settle_kv(work.lease, verdict, job)
        rec = work.record
        if verdict is LaneVerdict.OK and not work.last_chunk:
            return self._next_chunk(job, work, rec, now)
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

    def _prefill_verdict(self, device_ok: bool, consistent: bool, token: int | None, last_chunk: bool) -> LaneVerdict:
        """A prefill's one lane: OK, unusable output (only the last chunk yields a token), or failed."""
        vocab = self.capabilities.vocab_size
        token_ok = token is not None and token >= 0 and (vocab is None or token < vocab)
        if device_ok and (token_ok or not last_chunk):
            return LaneVerdict.OK
        if device_ok:
            return LaneVerdict.OUTPUT_INVALID
        return LaneVerdict.DEVICE_FAILED if consistent else LaneVerdict.MISMATCH

    def _next_chunk(self, job: JobRecord, work: PrefillWork, rec: RequestRecord, now: float) -> Applied:
        """An intermediate chunk succeeded: queue the next one, or end a request cancelled or
        expired meanwhile (§6)."""
        live = self.registry.get(rec.request_id) is rec and rec.state == "prefill_running"
        if not live or rec.job_id != work.request_job:
            self.stale += 1
            return Applied(job.job_id, True)
        if rec.machine.cancel_requested or rec.machine.deadline_passed:
            end_between_chunks(self.registry, rec)
        else:
            remaining = rec.prompt_tokens - self.kv.committed_len(work.lease)
            self.prefill.requeue(rec, now, self.prefill.next_chunk(remaining))
        self._pump(now)
        return Applied(job.job_id, False, 1, 0)

    # ------------------------------------------------------------------ timeouts and resets (§9.2, §14)

    def timed_out(self, job_id: int, detail: str = "") -> Applied:
        """Wait timed out: the job keeps its slot (it may still write), its lanes go Unknown,
        its requests end (Failed, or Cancelled if they were being cancelled)."""
        job = self.jobs.get(job_id)
        if job is None or job.state != "submitted":
            self.stale += 1
            return Applied(job_id, True)
        self.jobs.fire(job, "timeout")
        failed = self._fail_job_requests(job, detail or "TIMEOUT: Wait timed out")
        self._pump(self._clock.now())
        return Applied(job_id, False, 0, failed)

    def device_reset(self, detail: str = "") -> None:
        """A device reset per the contract ended every job: slots free, Unknown lanes recover."""
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
        busy = {lease.lane for job in self.jobs for lease in _job_leases(job)}
        recovered = 0
        for lane in range(self.kv.lanes):
            if lane not in busy and self.kv.lane(lane).state == "unknown":
                self._commands.append(self.kv.recover(lane))
                recovered += 1
        return recovered

    # ------------------------------------------------------------------ failures outside a completion (R19.2)

    def fail(self, request_id: int, detail: str) -> bool:
        """End a request that has no job in flight as Failed (ERROR) with ``detail``.

        For failures the engine finds outside a completion: a submit the device refused for
        good (INVALID_ARGUMENT, OUT_OF_MEMORY, ...), or KV lost in a reset (R19.2: the return
        code reaches the request's error detail). Returns False if the request is unknown,
        ended, finishing, or has a job on the device (that job's completion decides).
        """
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
        ended = 0
        for rec in self.registry.live():
            lease = rec.lease
            if lease is None or not self.kv.owns(lease) or self.kv.committed_len(lease) == 0:
                continue
            ended += self.fail(rec.request_id, detail)
        return ended

    # ------------------------------------------------------------------ internals

    def _after_done(self, rec: RequestRecord, target: str, now: float) -> None:
        if target == "decode_ready":
            self.decode.add(rec, now, stepped=rec.machine.generated_tokens > 1)
        elif target == "finishing":
            self.registry.finish(rec.request_id)

    def _settle_kv(self, lease: KvLease, verdict: LaneVerdict, job: JobRecord) -> None:
        """§9.2: commit only when device and output succeeded; Unknown when the device's state is (at the end
        of ``job``, which the KV manager's step check names)."""
        self.kv.settle(lease, _SETTLE[verdict], job)

    def _job_failed(self, job: JobRecord, fault: FaultKind) -> None:
        """A job that did not succeed ends: quarantined when its buffers are fenced, else completed not ok
        (a success fires ``complete(ok=True)`` where it is applied)."""
        if fault.quarantines_job:
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
        self.stale += 1
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
            self.kv.settle(lease, "fault", job)
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


def _job_leases(job: JobRecord) -> tuple[KvLease, ...]:
    work = job.work
    return work.kv.leases if isinstance(work, DecodeBatch) else (work.lease,)
