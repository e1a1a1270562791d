"""DeviceExecutor, result verification, ping/pong degrade and the CompletionDispatcher (§3, §7.4, §14).

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

**Result verification (crosstalk detection).** Four independent checks, each on data the host
already has:

1. :func:`~calculet.adapters.calrt.verify_result` — (generation, job id), one result per
   compiled lane, slot *i* tagged (lane *i*, the sequence bound there, valid bit), status
   counters (valid lanes, tokens processed, KV tokens written, and ``engine_sequence``
   advancing by exactly one per job on each engine);
2. job identity — the result names the job's engine, kind, calbin, compiled batch and *its own*
   OutputBuf: a result carrying the other engine's buffer is cross-job crosstalk (ping/pong);
3. lane echo — every valid lane echoes the position it was given and, when OK, the KV length
   that position implies (+1 for decode, + the chunk for prefill); an inactive lane produces
   no token: a lane whose tags are right but whose content belongs to another sequence shows
   here;
4. data channel against control channel — each lane's logits (the tagged result) must equal
   the row of the job's OutputBuf at the lane the tag names. The tags and the buffer travel
   different paths on a device; swapped lanes disagree even when each tag is self-consistent.

Any crosstalk finding fails the whole job (no lane's token is delivered, its lanes' KV become
Unknown and are recovered as a known failure) and degrades ping/pong. A counter anomaly does the
same (the device's own bookkeeping is wrong, so its output is not trusted).

**DegradeMonitor** — §14: any crosstalk, a status/counter anomaly, P99 inter-token latency
under ping/pong beyond ``executor.degrade.p99_regression_ratio`` over the single-job baseline
measured in the same run, ``consecutive_busy_or_timeout`` DeviceBusy refusals / Wait timeouts with no job accepted in
between, or an
uncertain recovery switch the executor to one job in flight. Only new jobs are affected: jobs
already submitted drain (R14.10). The degrade is sticky for the life of the engine.

**CompletionDispatcher** — §7.4: splits a verified result per lane, samples each OK lane
through its own request's sampler (:mod:`calculet.runtime.execution.sampler`) and builds the
scheduler's completion, carrying the CalRT return code as the failed requests' error detail
(R19.2).
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, deque
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    Anomaly,
    DecodeJob,
    JobId,
    JobKind,
    JobResult,
    JobSpec,
    JobTicket,
    KvSeqId,
    PrefillJob,
    ReturnCode,
    VirtualDevice,
    rc_of,
    verify_result,
)
from calculet.config import DegradeConfig, ExecutorConfig
from calculet.errors import CalculetError, DefinitionError
from calculet.machines.job import JobEngine
from calculet.clock import Clock
from calculet.runtime.scheduling.completion import DecodeCompletion, FaultKind, LaneOutcome, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.kv import FreeSequence
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.execution.sampler import SamplerPool
from calculet.runtime.execution.session import RuntimeSession

log = logging.getLogger("calculet.runtime.execution.executor")

Work = Union[PrefillWork, DecodeBatch]

_FAULT_FOR_RC = {ReturnCode.OK: FaultKind.NONE, ReturnCode.TIMEOUT: FaultKind.TIMEOUT,
                 ReturnCode.CCU_FAULT: FaultKind.CCU_FAULT, ReturnCode.DMA_UNKNOWN: FaultKind.DMA_UNKNOWN}


def fault_kind(rc: ReturnCode) -> FaultKind:
    """The completion's fault for a job return code (every other failure is a known ERROR)."""
    return _FAULT_FOR_RC.get(rc, FaultKind.ERROR)


# ---------------------------------------------------------------------------------------------
# In-flight jobs
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class InflightJob:
    """A job the device accepted, until its result is dispatched or a reset discards it."""

    job_id: int
    """The scheduler's job id (the DeviceJobMachine's)."""
    ticket: JobTicket
    work: Work
    spec: JobSpec
    deadline: float
    overlapped: bool
    """Another job was on the device when this one was submitted (ping/pong)."""
    timed_out: bool = False

    @property
    def device_job(self) -> JobId:
        return self.ticket.job_id

    @property
    def generation(self) -> int:
        return self.ticket.generation


@dataclass(frozen=True)
class SubmitRefused:
    """The device refused a job at submit; nothing is in flight."""

    rc: ReturnCode
    message: str

    @property
    def detail(self) -> str:
        return f"{self.rc.name}: {self.message}"


# ---------------------------------------------------------------------------------------------
# §14 degrade
# ---------------------------------------------------------------------------------------------


class DegradeReason(str, enum.Enum):
    CROSSTALK = "crosstalk"
    COUNTERS = "counters"
    P99_REGRESSION = "p99_regression"
    BUSY_OR_TIMEOUT = "busy_or_timeout"
    UNCERTAIN_RECOVERY = "uncertain_recovery"


@dataclass(frozen=True)
class DegradeStatistics:
    configured_inflight: int
    effective_inflight: int
    degraded: bool
    reason: str
    triggers: dict[str, int]
    busy_or_timeout_streak: int
    solo_samples: int
    pingpong_samples: int
    p99_solo_s: float
    p99_pingpong_s: float


class DegradeMonitor:
    """Watches the §14 triggers and decides the effective in-flight depth (2 → 1, sticky)."""

    CHECK_EVERY = 64

    def __init__(self, config: DegradeConfig, *, configured_inflight: int, min_samples: int = 64,
                 window: int = 2048) -> None:
        self.config = config
        self.configured = configured_inflight
        self.min_samples = min_samples
        self._degraded = False
        self._reason = ""
        self._triggers: Counter[str] = Counter()
        self._streak = 0
        self._solo: deque[float] = deque(maxlen=window)
        self._pp: deque[float] = deque(maxlen=window)
        self._since_check = 0

    @property
    def effective_inflight(self) -> int:
        return 1 if self._degraded else self.configured

    @property
    def degraded(self) -> bool:
        return self._degraded

    def trigger(self, reason: DegradeReason, detail: str) -> bool:
        """Record a §14 trigger; returns True when it newly degrades ping/pong."""
        self._triggers[reason.value] += 1
        if self._degraded or self.configured == 1:
            return False
        self._degraded = True
        self._reason = f"{reason.value}: {detail}"
        log.warning("ping/pong degraded to one job in flight", extra={"reason": reason.value, "detail": detail})
        return True

    def busy_or_timeout(self, detail: str) -> bool:
        self._streak += 1
        if self._streak >= self.config.consecutive_busy_or_timeout:
            return self.trigger(DegradeReason.BUSY_OR_TIMEOUT, f"{self._streak} in a row; last {detail}")
        return False

    def accepted(self) -> None:
        """The device accepted a job: the run of DeviceBusy/timeouts is broken."""
        self._streak = 0

    def latency(self, seconds: float, *, overlapped: bool) -> bool:
        """One inter-token latency sample, taken while one job (solo) or two (ping/pong) ran."""
        (self._pp if overlapped else self._solo).append(seconds)
        self._since_check += 1
        if self._since_check < self.CHECK_EVERY or self._degraded or self.configured == 1:
            return False
        self._since_check = 0
        if len(self._pp) < self.min_samples or len(self._solo) < self.min_samples:
            return False
        solo, pp = self._p99(self._solo), self._p99(self._pp)
        if pp > solo * (1.0 + self.config.p99_regression_ratio):
            return self.trigger(DegradeReason.P99_REGRESSION,
                                f"P99 {pp * 1e3:.3f} ms under ping/pong vs {solo * 1e3:.3f} ms single "
                                f"(> +{self.config.p99_regression_ratio:.0%})")
        return False

    @staticmethod
    def _p99(samples: deque[float]) -> float:
        return float(np.percentile(np.fromiter(samples, dtype=np.float64), 99)) if samples else 0.0

    def statistics(self) -> DegradeStatistics:
        return DegradeStatistics(self.configured, self.effective_inflight, self._degraded, self._reason,
                                 dict(self._triggers), self._streak, len(self._solo), len(self._pp),
                                 self._p99(self._solo), self._p99(self._pp))


# ---------------------------------------------------------------------------------------------
# Result verification
# ---------------------------------------------------------------------------------------------


def check_result(job: InflightJob, result: JobResult, *, previous_engine_sequence: int | None,
                 output_rows: np.ndarray | None) -> list[tuple[Anomaly, str]]:
    """Every anomaly of ``result`` against the job that was submitted (the four checks above)."""
    spec, ticket = job.spec, job.ticket
    found = list(verify_result(spec, ticket, result, previous_engine_sequence).anomalies)
    out = spec.buffers.output
    if (result.engine is not spec.engine or result.kind is not spec.kind or result.calbin_id != spec.calbin_id
            or result.compiled_batch != spec.compiled_batch
            or result.output_buffer.buffer_id != out.buffer_id):
        found.append((Anomaly.CROSSTALK,
                      f"result names engine {result.engine.name.lower()}, {result.kind.value} B{result.compiled_batch}, "
                      f"OutputBuf {result.output_buffer.buffer_id}; the job ran on {spec.engine.name.lower()}, "
                      f"{spec.kind.value} B{spec.compiled_batch}, OutputBuf {out.buffer_id}"))
    if isinstance(spec, DecodeJob):
        positions = [int(p) for p in spec.positions]
        valid = [bool(v) for v in spec.lane_valid]
        step = [1] * spec.compiled_batch
    else:
        positions, valid, step = [spec.start_position], [True], [len(spec.tokens)]
    for lane in result.lanes:
        i = lane.lane
        if not 0 <= i < len(positions):
            found.append((Anomaly.CROSSTALK, f"a result names lane {i}, outside the job's {len(positions)} lanes"))
            continue
        if not valid[i]:
            if lane.greedy_token is not None or (lane.logits is not None and not np.all(np.isnan(lane.logits))):
                found.append((Anomaly.CROSSTALK, f"inactive lane {i} returned output"))
            continue
        if lane.position != positions[i]:
            found.append((Anomaly.CROSSTALK, f"lane {i} echoes position {lane.position}; it was given "
                                             f"{positions[i]}"))
        elif lane.rc is ReturnCode.OK and result.ok and lane.kv_len != positions[i] + step[i]:
            found.append((Anomaly.CROSSTALK, f"lane {i} reports KV length {lane.kv_len}; position {positions[i]} "
                                             f"+ {step[i]} was expected"))
        if output_rows is not None and lane.logits is not None and lane.rc is ReturnCode.OK:
            row = output_rows[i] if i < len(output_rows) else None
            if row is None or row.shape != lane.logits.shape or not np.array_equal(row, lane.logits):
                found.append((Anomaly.CROSSTALK, f"lane {i}'s logits differ from OutputBuf row {i}"))
    return found


# ---------------------------------------------------------------------------------------------
# The executor
# ---------------------------------------------------------------------------------------------


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
        self._completion_rc: Counter[str] = Counter()
        self._wait_timeouts = 0
        self._stale = 0
        self._anomalies: Counter[str] = Counter()
        self._free_refusals = 0

    @property
    def device(self) -> VirtualDevice:
        return self.session.device

    # ------------------------------------------------------------------ building and submitting

    def build(self, work: Work, engine: JobEngine, prompt: Sequence[int] | None) -> JobSpec:
        """The CalRT job for planned work (KV sequences bound on first use).

        Raises a :class:`CalculetError` carrying ``rc`` if a sequence cannot be allocated.
        """
        session = self.session
        calbin_id = session.calbin.calbin_id
        if isinstance(work, DecodeBatch):
            size = work.profile.compiled_batch
            seqs = [NO_SEQUENCE] * size
            for binding in work.active:
                seqs[binding.lane] = self._seqs[binding.seq_id]
            return DecodeJob(generation=work.generation, calbin_id=calbin_id, compiled_batch=size, engine=engine,
                             buffers=session.buffers(engine, JobKind.DECODE, size), seq_ids=tuple(int(s) for s in seqs),
                             token_ids=work.token_ids, positions=work.positions, lane_valid=work.lane_valid)
        assert prompt is not None
        seq = self._seqs.get(work.seq_id)
        if seq is None:
            seq = self._seqs[work.seq_id] = session.allocate_sequence()
        start = work.start_position
        tokens = np.asarray(prompt[start:start + work.tokens], dtype=np.int32)
        return PrefillJob(generation=work.generation, calbin_id=calbin_id, engine=engine,
                          buffers=session.buffers(engine, JobKind.PREFILL, 1), seq_id=seq, tokens=tokens,
                          start_position=start)

    def submit(self, work: Work, spec: JobSpec) -> InflightJob | SubmitRefused:
        """Submit ``spec``; a refusal is a value (its rc counted and logged, R19.2)."""
        now = self._clock.now()
        try:
            ticket = self.device.submit(spec)
        except CalculetError as exc:
            rc = rc_of(exc)
            self._submit_rc[rc.name] += 1
            log.warning("submit refused", extra={"rc": rc.name, "job_id": work.job_id, "detail": str(exc)})
            return SubmitRefused(rc, str(exc))
        self._submit_rc[ReturnCode.OK.name] += 1
        self._submitted += 1
        if isinstance(spec, PrefillJob):
            timeout = self.job_timeout_s + self.prefill_timeout_per_token_s * len(spec.tokens)
        else:
            timeout = self.job_timeout_s
        job = InflightJob(work.job_id, ticket, work, spec, now + timeout, overlapped=bool(self._jobs))
        for other in self._jobs.values():
            other.overlapped = True
        self._jobs[int(ticket.job_id)] = job
        return job

    # ------------------------------------------------------------------ completions

    def collect(self) -> list[JobResult]:
        """Results the device has completed (virtual time: those due now)."""
        try:
            return self.device.poll()
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

    def take(self, result: JobResult) -> InflightJob | None:
        """The in-flight job a result belongs to (removed), or None for a stale/unknown result."""
        self._completion_rc[result.rc.name] += 1
        job = self._jobs.pop(int(result.job_id), None)
        if job is None:
            self._stale += 1
            log.info("stale result dropped", extra={"device_job": int(result.job_id), "rc": result.rc.name})
        return job

    def verify(self, job: InflightJob, result: JobResult) -> list[tuple[Anomaly, str]]:
        """Crosstalk and counter checks (module docstring).

        The engine's expected ``engine_sequence`` follows this result; after a counter anomaly it is
        forgotten instead, since counters the device got wrong are no anchor for the next job."""
        engine = job.spec.engine
        rows = None
        if self.check_output_buffers and result.ok and any(lane.logits is not None for lane in result.lanes):
            try:
                rows = np.asarray(self.device.read_buffer(job.spec.buffers.output))
            except CalculetError as exc:
                rows = None
                log.warning("OutputBuf unreadable", extra={"rc": rc_of(exc).name})
        found = check_result(job, result, previous_engine_sequence=self._engine_seq[engine], output_rows=rows)
        counters_bad = any(kind is Anomaly.COUNTERS for kind, _ in found)
        self._engine_seq[engine] = None if counters_bad else result.counters.engine_sequence
        for kind, _ in found:
            self._anomalies[kind.value] += 1
        return found

    def expired(self, now: float) -> list[InflightJob]:
        """Submitted jobs whose Wait deadline passed (marked timed out; they keep their buffers)."""
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
            submit_rc=dict(self._submit_rc), completion_rc=dict(self._completion_rc),
            wait_timeouts=self._wait_timeouts, stale_results=self._stale, anomalies=dict(self._anomalies),
            sequences_bound=len(self._seqs), free_refusals=self._free_refusals,
            degrade=self.degrade.statistics())


# ---------------------------------------------------------------------------------------------
# CompletionDispatcher
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompletionStatistics:
    results: int
    failed_results: int
    rejected_results: int
    lanes_sampled: int
    lanes_failed: int
    lanes_unmatched: int


class CompletionDispatcher:
    """§7.4: a verified result → per-lane sampling → the scheduler's completion."""

    def __init__(self, sampler: SamplerPool, *, lane_isolation: bool) -> None:
        self.sampler = sampler
        self.lane_isolation = lane_isolation
        self._results = 0
        self._failed = 0
        self._rejected = 0
        self._sampled = 0
        self._lanes_failed = 0
        self._unmatched = 0

    def prefill(self, job: InflightJob, result: JobResult, anomalies: list[tuple[Anomaly, str]]
                ) -> PrefillCompletion:
        work = job.work
        assert isinstance(work, PrefillWork)
        self._results += 1
        if anomalies:
            self._rejected += 1
            return PrefillCompletion(work.job_id, work.generation, work.request_id, work.seq_id, False, None,
                                     False, FaultKind.ERROR, _anomaly_detail(anomalies))
        lane = result.lanes[0] if result.lanes else None
        if not result.ok or lane is None or lane.rc is not ReturnCode.OK:
            self._failed += 1
            rc = result.rc if not result.ok else (lane.rc if lane is not None else ReturnCode.INTERNAL)
            return PrefillCompletion(work.job_id, result.generation, work.request_id, work.seq_id, False, None,
                                     False, fault_kind(rc), _rc_detail(rc, result.message))
        token: int | None = None
        stop = False
        if work.last_chunk:
            sample = self.sampler.sample(work.request_id, lane.logits, lane.greedy_token)
            if sample is not None:
                self._sampled += 1
                token, stop = sample
        return PrefillCompletion(work.job_id, result.generation, work.request_id, work.seq_id, True, token, stop,
                                 FaultKind.NONE, "" if token is not None or not work.last_chunk
                                 else "no usable output token")

    def decode(self, job: InflightJob, result: JobResult, anomalies: list[tuple[Anomaly, str]]) -> DecodeCompletion:
        batch = job.work
        assert isinstance(batch, DecodeBatch)
        self._results += 1
        if anomalies:
            self._rejected += 1
            self._lanes_failed += len(batch.active)
            return DecodeCompletion(batch.job_id, batch.generation, False, (), FaultKind.ERROR,
                                    _anomaly_detail(anomalies))
        detail = "" if result.ok else _rc_detail(result.rc, result.message)
        if not result.ok:
            self._failed += 1
        by_seq = {int(job.spec.seq_ids[b.lane]): b for b in batch.active}  # type: ignore[union-attr]
        usable = result.ok or self.lane_isolation
        lanes: list[LaneOutcome] = []
        for lane in result.lanes:
            if not lane.valid:
                continue
            binding = by_seq.get(lane.seq_id)
            if binding is None:
                self._unmatched += 1
                lanes.append(LaneOutcome(lane.lane, 0, 0, result.generation, False, None))
                continue
            token: int | None = None
            stop = False
            if usable and lane.rc is ReturnCode.OK:
                sample = self.sampler.sample(binding.request_id, lane.logits, lane.greedy_token)
                if sample is not None:
                    self._sampled += 1
                    token, stop = sample
            if token is None:
                self._lanes_failed += 1
            lanes.append(LaneOutcome(lane.lane, binding.request_id, binding.seq_id, result.generation,
                                     token is not None, token, stop))
        return DecodeCompletion(batch.job_id, result.generation, result.ok, tuple(lanes), fault_kind(result.rc),
                                detail)

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(self._results, self._failed, self._rejected, self._sampled, self._lanes_failed,
                                    self._unmatched)


def _rc_detail(rc: ReturnCode, message: str) -> str:
    return f"{rc.name}: {message}" if message else rc.name


def _anomaly_detail(anomalies: list[tuple[Anomaly, str]]) -> str:
    kind, text = anomalies[0]
    more = f" (+{len(anomalies) - 1} more)" if len(anomalies) > 1 else ""
    return f"result rejected, {kind.value}: {text}{more}"
