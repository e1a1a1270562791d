"""DeviceExecutor (§3, §14): planned work becomes CalRT jobs on the device, tracked until the device
is done with them.

**DeviceExecutor** — one per physical device (§3). It turns the scheduler's planned work
(:class:`~calculet.runtime.scheduling.prefill.PrefillWork`, :class:`~calculet.runtime.scheduling.decode.DecodeBatch`)
into CalRT jobs on the engine the job machine chose (PING or PONG, §14), submits them, and keeps
every submitted job — its spec, ticket, engine, buffers and deadline — keyed by the device's job
id until the device is provably done with it. Each engine has its own InputBuf/OutputBuf pairs
(from the session), so two in-flight jobs never share a buffer; a job that timed out keeps its
buffers (and its engine) until a reset or restart (§12). The scheduler's KV sequences are bound
to CalRT KvManager sequences here (allocated at a sequence's first prefill, freed by the
``FreeSequence`` command). Completions are correlated by the device job id and must carry the
job's generation; a result the executor does not know (a job discarded by a reset, a stale
device) is dropped and counted, and one the scheduler no longer expects is still handed to it so
the job's slot and lanes are reclaimed (§4).

Each result is checked against its job (:mod:`.verification`) before the completion
dispatcher (:mod:`.dispatch`) samples it; crosstalk, counter anomalies and runs of DeviceBusy or
timeouts feed the ping/pong degrade (:mod:`.degrade`).

A job's Wait deadline is its ticket's ``submitted_at`` plus its timeout (issue #20, session 26): the ticket's instant
is read from the runtime's clock by the device (``docs/devices.md`` §3), so the executor does not read the clock a
second time per job, and the timeout a late job reports (``deadline - submitted_at``) is the one it was given.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    Anomaly,
    DecodeJob,
    JobKind,
    JobResult,
    JobSpec,
    KvSeqId,
    PrefillJob,
    ReturnCode,
    VirtualDevice,
    rc_of,
)
from calculet.clock import Clock
from calculet.config import ExecutorConfig
from calculet.errors import CalculetError, DefinitionError
from calculet.machines.job import JobEngine
from calculet.runtime.execution.degrade import DegradeMonitor, DegradeStatistics
from calculet.runtime.execution.inflight import InflightJob, Work
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.execution.verification import anomalies, clean_decode
from calculet.runtime.scheduling.kv import FreeSequence
from calculet.runtime.scheduling.prefill import PrefillWork

log = logging.getLogger("calculet.runtime.execution.executor")

_OK = ReturnCode.OK.name
"""The rc counters' key of a job the device accepted or completed OK (an enum's ``.name`` is a Python call)."""


@dataclass(frozen=True)
class SubmitRefused:
    """The device refused a job at submit; nothing is in flight."""

    rc: ReturnCode
    message: str

    @property
    def detail(self) -> str:
        return f"{self.rc.name}: {self.message}"


@dataclass(frozen=True)
class ExecutorStatistics:
    """§16 executor metrics: in-flight, ping/pong, submit/Wait return codes, status, buffers."""

    inflight: int
    inflight_by_engine: dict[str, int]
    quarantined_jobs: int
    submitted: int
    submit_rc: dict[str, int]
    completion_rc: dict[str, int]
    wait_timeouts: int
    stale_results: int
    anomalies: dict[str, int]
    sequences_bound: int
    free_refusals: int
    degrade: DegradeStatistics


class DeviceExecutor:
    """Submits planned work to the device and tracks it until the device is done with it (§3, §14)."""

    def __init__(self, session: RuntimeSession, config: ExecutorConfig, *, clock: Clock, job_timeout_s: float,
                 prefill_timeout_per_token_s: float, check_output_buffers: bool = True,
                 degrade_min_samples: int = 64) -> None:
        self.session = session
        self.config = config
        self._clock = clock
        self.job_timeout_s = job_timeout_s
        self.prefill_timeout_per_token_s = prefill_timeout_per_token_s
        self.check_output_buffers = check_output_buffers
        self.degrade = DegradeMonitor(config.degrade, configured_inflight=config.max_inflight,
                                      min_samples=degrade_min_samples)
        self._jobs: dict[int, InflightJob] = {}
        self._seqs: dict[int, KvSeqId] = {}
        self._engine_seq: dict[JobEngine, int | None] = dict.fromkeys(JobEngine)
        """Per engine, the ``engine_sequence`` the last verified result carried; None: not known yet
        (the next result on that engine sets it without a continuity check)."""
        self._submitted = 0
        self._submit_rc: Counter[str] = Counter()
        """Submits the device refused, by rc; the accepted ones are :attr:`_submitted` (the OK of ``submit_rc``)."""
        self._completion_rc: Counter[str] = Counter()
        self._wait_timeouts = 0
        self._stale = 0
        self._anomalies: Counter[str] = Counter()
        self._free_refusals = 0

    @property
    def device(self) -> VirtualDevice:
        return self.session.device

    # ------------------------------------------------------------------ building and submitting

    def submit(self, work: Work, engine: JobEngine, prompt: Sequence[int] | None = None) -> InflightJob | SubmitRefused:
        """The CalRT job for planned work on ``engine`` (a decode batch; a prefill of ``prompt``), submitted and
        tracked; a refusal is a value (R19.2): the device's, its rc counted and logged, or a job that could not be
        built (no buffers for it, a sequence the device would not allocate), which never reached the device.

        A decode step is built from its session's :attr:`~RuntimeSession.decode_targets` entry and its lanes' ints
        (issue #20: one read per step for what its configuration fixes; the batch keeps no arrays, the job builds
        its tensors only if read); a prefill binds its KV sequence at its first chunk."""
        if prompt is None:  # a decode batch
            size = work.profile.compiled_batch  # type: ignore[union-attr]
            target = self.session.decode_targets.get((engine, size))
            if target is None:
                refused = self.session.no_decode_target(engine, size)
                return SubmitRefused(rc_of(refused), str(refused))
            bound = self._seqs
            active = work.active  # type: ignore[union-attr]
            if size == 1 and len(active) == 1:  # B1, CalRT 0.7.6's only batch: its lane is the one binding's (#20)
                seqs: tuple[int, ...] = (bound[active[0].seq_id],)
            else:
                lanes = [NO_SEQUENCE] * size
                for binding in active:
                    lanes[binding.lane] = bound[binding.seq_id]
                seqs = tuple(lanes)
            spec: JobSpec = DecodeJob.of_lanes(work.generation, target[0], size, engine, target[1], seqs,
                                               work.lane_tokens, work.lane_positions,  # type: ignore[union-attr]
                                               work.lane_flags)  # type: ignore[union-attr]
            timeout = self.job_timeout_s
        else:
            try:
                spec = self._prefill_job(work, engine, prompt)  # type: ignore[arg-type]
            except CalculetError as exc:
                return SubmitRefused(rc_of(exc), str(exc))
            timeout = self.job_timeout_s + self.prefill_timeout_per_token_s * len(spec.tokens)
        try:
            ticket = self.session.device.submit(spec)
        except CalculetError as exc:
            rc = rc_of(exc)
            self._submit_rc[rc.name] += 1
            log.warning("submit refused", extra={"rc": rc.name, "job_id": work.job_id, "detail": str(exc)})
            return SubmitRefused(rc, str(exc))
        self._submitted += 1  # the rc counters' OK at submit (statistics), not counted a second time (issue #20)
        jobs = self._jobs
        # the deadline from the ticket's instant, on the runtime's clock (docs/devices.md §3): one clock read a job
        job = InflightJob(work.job_id, ticket, work, spec, ticket.submitted_at + timeout, bool(jobs))
        if jobs:  # another job on the device (ping/pong): both overlapped; none on the null device (issue #20)
            for other in jobs.values():
                other.overlapped = True
        jobs[ticket.job_id] = job  # a JobId is an int (NewType): keyed as the result's job_id is looked up
        return job

    def _prefill_job(self, work: PrefillWork, engine: JobEngine, prompt: Sequence[int]) -> PrefillJob:
        """The prefill (chunk) job of ``work`` (its KV sequence bound on first use). Raises a :class:`CalculetError`
        carrying ``rc`` if a sequence cannot be allocated, or if the session has no calbin or buffers for it."""
        session = self.session
        calbin_id = session.calbin.calbin_id  # first: a session with no calbin says so, not that it has no KvManager
        seq = self._seqs.get(work.seq_id)
        if seq is None:
            seq = self._seqs[work.seq_id] = session.allocate_sequence()
        start = work.start_position
        tokens = np.asarray(prompt[start:start + work.tokens], dtype=np.int32)
        return PrefillJob(generation=work.generation, calbin_id=calbin_id, engine=engine,
                          buffers=session.buffers(engine, JobKind.PREFILL, 1), seq_id=seq, tokens=tokens,
                          start_position=start)

    # ------------------------------------------------------------------ completions

    def collect(self) -> list[JobResult]:
        """Results the device has completed (virtual time: those due now)."""
        try:
            return self.session.device.poll()
        except CalculetError as exc:
            log.error("poll failed", extra={"rc": rc_of(exc).name, "detail": str(exc)})
            return []

    def wait(self, job: InflightJob) -> JobResult | None:
        """The synchronous baseline (M1): Wait for ``job``; None when Wait timed out (rc TIMEOUT)."""
        remaining = max(0.0, job.deadline - self._clock.now())
        try:
            return self.device.wait(job.device_job, remaining)
        except CalculetError as exc:
            rc = rc_of(exc)
            self._completion_rc[rc.name] += 1
            if rc is ReturnCode.TIMEOUT:
                self._wait_timeouts += 1
            log.warning("Wait failed", extra={"rc": rc.name, "job_id": job.job_id, "detail": str(exc)})
            return None

    def complete(self, result: JobResult) -> tuple[InflightJob | None, list[tuple[Anomaly, str]]]:
        """The in-flight job a result belongs to (removed from those tracked) and what the result checks found
        (:mod:`.verification`); (None, []) for a stale or unknown result, nothing checked for a job that timed out
        (a late completion: the caller only reclaims its slot and lanes).

        One pass per result (issue #20): a clean decode result is recognised by
        :func:`~.verification.clean_decode` (the common case, once per token at B1); any other goes through every
        check, which names what it finds. The engine's expected ``engine_sequence`` follows the result; after a
        counter anomaly it is forgotten instead, since counters the device got wrong are no anchor for the next
        job."""
        rc = result.rc
        self._completion_rc[_OK if rc is ReturnCode.OK else rc.name] += 1
        job = self._jobs.pop(result.job_id, None)
        if job is None:
            self._stale += 1
            log.info("stale result dropped", extra={"device_job": int(result.job_id), "rc": rc.name})
            return None, []
        if job.timed_out:
            return job, []
        spec = job.spec
        engine = spec.engine
        previous = self._engine_seq[engine]
        rows = None
        if self.check_output_buffers and rc is ReturnCode.OK:
            for lane in result.lanes:  # a plain loop: the null device returns no logits, every token (issue #20)
                if lane.logits is not None:
                    try:
                        rows = np.asarray(self.device.read_buffer(spec.buffers.output))
                    except CalculetError as exc:
                        rows = None
                        log.warning("OutputBuf unreadable", extra={"rc": rc_of(exc).name})
                    break
        if rows is None and clean_decode(spec, job.ticket, result, previous):
            self._engine_seq[engine] = result.counters.engine_sequence
            return job, []
        found = anomalies(job, result, previous_engine_sequence=previous, output_rows=rows)
        counters_bad = False
        for kind, _ in found:
            self._anomalies[kind.value] += 1
            counters_bad = counters_bad or kind is Anomaly.COUNTERS
        self._engine_seq[engine] = None if counters_bad else result.counters.engine_sequence
        return job, found

    def expired(self, now: float | None = None) -> list[InflightJob]:
        """Submitted jobs whose Wait deadline passed (marked timed out; they keep their buffers).

        ``now`` defaults to the executor's clock, read only when a job is in flight: the engine asks every turn, and
        on the null device nothing is in flight then (issue #20: a clock read per turn for nothing)."""
        if not self._jobs:
            return []
        if now is None:
            now = self._clock.now()
        out = []
        for job in self._jobs.values():
            if not job.timed_out and job.deadline <= now:
                job.timed_out = True
                self._wait_timeouts += 1
                self._completion_rc[ReturnCode.TIMEOUT.name] += 1
                out.append(job)
        return out

    def mark_timed_out(self, job: InflightJob) -> None:
        job.timed_out = True

    def next_deadline(self) -> float | None:
        if not self._jobs:  # the actor asks twice per turn; on the null device nothing is in flight then (#20)
            return None
        deadlines = [j.deadline for j in self._jobs.values() if not j.timed_out]
        return min(deadlines) if deadlines else None

    def next_completion(self) -> float | None:
        try:
            return self.device.next_completion_time()
        except CalculetError:
            return None

    def inflight(self) -> int:
        return len(self._jobs)

    def healthy_inflight(self) -> int:
        """Jobs still expected to complete (not timed out)."""
        return sum(1 for j in self._jobs.values() if not j.timed_out)

    # ------------------------------------------------------------------ KV sequences and resets

    def free_sequence(self, command: FreeSequence) -> bool:
        """Free the CalRT sequence bound to a released lane; False if the device refused (retry)."""
        seq = self._seqs.get(command.seq_id)
        if seq is None:
            return True
        try:
            self.session.free_sequence(seq)
        except CalculetError as exc:
            rc = rc_of(exc)
            if rc is ReturnCode.NOT_FOUND:  # the device no longer has it: nothing left to free
                log.warning("freed sequence was already gone", extra={"seq": int(seq)})
                self._seqs.pop(command.seq_id, None)
                return True
            self._free_refusals += 1
            log.warning("free sequence refused", extra={"rc": rc.name, "seq": int(seq)})
            return False
        del self._seqs[command.seq_id]
        return True

    def forget_all(self) -> list[InflightJob]:
        """A reset or restart discarded every job and sequence on the device."""
        jobs = list(self._jobs.values())
        self._jobs.clear()
        self._seqs.clear()
        self.resync_engine_sequences()
        return jobs

    def resync_engine_sequences(self) -> None:
        """Forget the ``engine_sequence`` each engine is expected to report next (§14 counter check).

        Why: jobs the device ran *outside* this executor — the golden and warm-up jobs of §11 step 9,
        which the session drives itself — advance the device's per-engine counters as well, so the
        executor's next result would look like a counter anomaly and degrade ping/pong for good.
        After this call the first result on each engine re-anchors the expectation (every other
        check still applies to it) and each later result must follow it by exactly one again.

        Legal only while none of this executor's jobs is in flight, timed-out ones included: such a
        job's result is still to be checked against the current expectation, and forgetting it would
        let a real counter anomaly on that job pass unseen. Bound KV sequences are kept (a co-resident
        generation may still be serving from them). Raises :class:`~calculet.errors.DefinitionError`
        otherwise: calling it then is a bug in the caller, not a device condition to recover from.
        """
        if self._jobs:
            raise DefinitionError(
                f"resync_engine_sequences() with {len(self._jobs)} job(s) in flight: their results would "
                "escape the engine_sequence check (§14); wait until the executor is idle",
                inflight=len(self._jobs))
        self._engine_seq = dict.fromkeys(JobEngine)

    def rebind(self, session: RuntimeSession) -> None:
        """Serve from a new session (after a restart on a new device)."""
        self.session = session

    def statistics(self) -> ExecutorStatistics:
        by_engine = Counter(j.spec.engine.name.lower() for j in self._jobs.values())
        return ExecutorStatistics(
            inflight=len(self._jobs), inflight_by_engine=dict(by_engine),
            quarantined_jobs=sum(1 for j in self._jobs.values() if j.timed_out), submitted=self._submitted,
            submit_rc=dict(self._submit_rc, **({_OK: self._submitted} if self._submitted else {})),
            completion_rc=dict(self._completion_rc),
            wait_timeouts=self._wait_timeouts, stale_results=self._stale, anomalies=dict(self._anomalies),
            sequences_bound=len(self._seqs), free_refusals=self._free_refusals,
            degrade=self.degrade.statistics())
