"""Jobs the device runs and the results it returns (§2, §4, §7.4, §14).

Every result carries (generation id, job id), per-lane (seq id, lane) tags and status counters,
so the runtime can correlate completions (§4, R4.8) and detect crosstalk or counter anomalies
(§14, R14.5–R14.6); :func:`verify_result` does that check once for every adapter. A job runs
wholly on one :class:`~calculet.machines.job.JobEngine` (ping or pong, §14): the one enum the job
lifecycle machine and the device share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

import numpy as np

from calculet.adapters.calrt.codes import ReturnCode
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine

KvSeqId = NewType("KvSeqId", int)
"""A KvManager sequence id. 0 is never allocated: it means "no sequence" (an inactive lane)."""

JobId = NewType("JobId", int)
"""Device-assigned job id, unique for the life of a VirtualDevice (never reused)."""

NO_SEQUENCE: KvSeqId = KvSeqId(0)


class JobKind(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class BufferKind(str, enum.Enum):
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True)
class BufferHandle:
    """A device buffer. Ids are never reused within a VirtualDevice (stale handles fail NOT_FOUND)."""

    buffer_id: int
    kind: BufferKind
    job_kind: JobKind
    compiled_batch: int
    nbytes: int


@dataclass(frozen=True)
class JobBuffers:
    """The InputBuf/OutputBuf pair of one job (§14: each in-flight job has its own)."""

    input: BufferHandle
    output: BufferHandle


class DecodeLanes(NamedTuple):
    """A decode job's per-lane inputs as plain ints (``valid`` as given: 0/1 for a well-formed job)."""

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    valid: tuple[int, ...]
    seqs: tuple[int, ...]
    active: tuple[int, ...]
    """The lanes whose ``valid`` entry is truthy, in order."""


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """One decode step over a compiled batch (§2 ``DecodeBatch`` as the device sees it).

    Arrays have length ``compiled_batch`` (R7.1.2). For a valid lane ``positions[lane]`` must equal
    the sequence's committed KV length (§9.2, R9.2.4). An inactive lane carries the profile's
    ``fill_token`` and ``lane_valid`` 0; its ``seq_ids`` entry may name a sequence (that sequence's
    KV must not change) or be :data:`NO_SEQUENCE`.
    """

    generation: int
    calbin_id: int
    compiled_batch: int
    engine: JobEngine
    buffers: JobBuffers
    seq_ids: tuple[int, ...]
    token_ids: np.ndarray
    positions: np.ndarray
    lane_valid: np.ndarray

    kind: JobKind = field(default=JobKind.DECODE, init=False)
    lanes: DecodeLanes = field(init=False, repr=False)
    """The lanes as plain Python values, converted once: the device's checks, its DMA payload, its commit and
    the host's result checks each read them, and a numpy conversion per reader cost ~10 calls per B1 token
    (issue #20). The arrays are read-only copies, so these can never disagree with them."""

    def __post_init__(self) -> None:
        b = self.compiled_batch
        plain = []
        for name in ("token_ids", "positions", "lane_valid"):
            given = getattr(self, name)
            arr = given.copy() if isinstance(given, np.ndarray) else np.array(given)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
            plain.append(arr.tolist())
        seqs = self.seq_ids
        for name, arr in (("seq_ids", seqs), ("token_ids", self.token_ids),
                          ("positions", self.positions), ("lane_valid", self.lane_valid)):
            if len(arr) != b:
                raise DefinitionError(f"DecodeJob.{name} has {len(arr)} entries; compiled_batch is {b} (R7.1.2)")
        tokens, positions, valid = plain
        object.__setattr__(self, "lanes", DecodeLanes(tuple(tokens), tuple(positions), tuple(valid),
                                                      tuple(map(int, seqs)),
                                                      tuple([i for i, v in enumerate(valid) if v])))

    @property
    def active_lanes(self) -> tuple[int, ...]:
        return self.lanes.active


@dataclass(frozen=True, eq=False)
class PrefillJob:
    """Prefill of one sequence (§6). ``start_position`` must equal the committed KV length; a
    non-zero start (a chunk) needs the incremental-prefill capability."""

    generation: int
    calbin_id: int
    engine: JobEngine
    buffers: JobBuffers
    seq_id: int
    tokens: np.ndarray
    start_position: int

    kind: JobKind = field(default=JobKind.PREFILL, init=False)
    compiled_batch: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", np.array(self.tokens, copy=True))
        if self.tokens.ndim != 1 or len(self.tokens) == 0:
            raise DefinitionError("PrefillJob.tokens must be a non-empty 1-D array")


JobSpec = DecodeJob | PrefillJob


@dataclass(frozen=True)
class JobTicket:
    """What submit returns: the device's job id and the tags the result will echo."""

    job_id: JobId
    generation: int
    kind: JobKind
    engine: JobEngine
    calbin_id: int
    submitted_at: float


@dataclass(frozen=True)
class StatusCounters:
    """Status counters the device reports with every job (§14: counter anomaly → degrade).

    ``engine_sequence`` counts completed jobs per engine and must grow by one per job;
    ``lanes_valid`` / ``tokens_processed`` / ``kv_tokens_written`` must match the job.
    """

    engine_sequence: int
    lanes_valid: int
    tokens_processed: int
    kv_tokens_written: int


@dataclass(frozen=True, eq=False)
class LaneResult:
    """One lane's output, tagged with the lane and sequence the device says it belongs to (§7.4).

    ``logits`` is None for an inactive lane whose profile does not return logits, for a failed
    lane, and in numerics-off simulation; ``greedy_token`` is the device's argmax (or the
    simulator's pseudo token) for hosts that do not sample themselves.
    """

    lane: int
    seq_id: int
    valid: bool
    rc: ReturnCode
    position: int
    kv_len: int
    logits: np.ndarray | None
    greedy_token: int | None


@dataclass(frozen=True, eq=False)
class JobResult:
    """A completed job: (generation id, job id) plus per-lane tags and status counters (§4, §7.4).

    ``rc`` is the job's status. With lane-level failure isolation (a capability, R7.4.6) a failed
    job may still carry OK lanes; without it, a failed job fails every lane (R7.4.5).
    """

    job_id: JobId
    generation: int
    kind: JobKind
    engine: JobEngine
    calbin_id: int
    compiled_batch: int
    rc: ReturnCode
    lanes: tuple[LaneResult, ...]
    counters: StatusCounters
    submitted_at: float
    completed_at: float
    output_buffer: BufferHandle
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.rc is ReturnCode.OK


class Anomaly(str, enum.Enum):
    """What :func:`verify_result` can find (§7.4 consistency, §14 degrade triggers)."""

    WRONG_JOB = "wrong_job"
    WRONG_GENERATION = "wrong_generation"
    CROSSTALK = "crosstalk"
    COUNTERS = "counters"


@dataclass(frozen=True)
class ResultCheck:
    """Outcome of checking a result against the job that was submitted."""

    anomalies: tuple[tuple[Anomaly, str], ...]

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def has(self, kind: Anomaly) -> bool:
        return any(a is kind for a, _ in self.anomalies)


def verify_result(job: JobSpec, ticket: JobTicket, result: JobResult,
                  previous_engine_sequence: int | None = None) -> ResultCheck:
    """Check that a result belongs to the job and that its tags and counters are consistent.

    §7.4: verify request/generation/seq/lane before using a lane; §14: any crosstalk or counter
    anomaly triggers degrade. ``previous_engine_sequence`` is the counter of the previous job
    completed on the same engine, when the caller tracks it.
    """
    found: list[tuple[Anomaly, str]] = []
    if result.job_id != ticket.job_id:
        found.append((Anomaly.WRONG_JOB, f"result job {result.job_id} for ticket {ticket.job_id}"))
    if result.generation != job.generation:
        found.append((Anomaly.WRONG_GENERATION, f"result generation {result.generation} != {job.generation}"))
    decode = isinstance(job, DecodeJob)
    if decode:
        lanes_in = job.lanes  # plain values converted once per job (issue #20)
        expected_seqs = lanes_in.seqs
        valid = [bool(v) for v in lanes_in.valid]
        n_valid = expected_tokens = len(lanes_in.active)
    else:
        expected_seqs = (job.seq_id,)
        valid = [True]
        n_valid, expected_tokens = 1, len(job.tokens)
    lanes = result.lanes
    if len(lanes) != len(expected_seqs):
        found.append((Anomaly.CROSSTALK, f"{len(lanes)} lane results for {len(expected_seqs)} lanes"))
    for i, lane in enumerate(lanes[: len(expected_seqs)]):
        if lane.lane != i or lane.seq_id != expected_seqs[i] or lane.valid != valid[i]:
            found.append((Anomaly.CROSSTALK,
                          f"slot {i} carries lane {lane.lane} seq {lane.seq_id} valid={lane.valid}; "
                          f"expected lane {i} seq {expected_seqs[i]} valid={valid[i]}"))
    c = result.counters
    if c.lanes_valid != n_valid:
        found.append((Anomaly.COUNTERS, f"lanes_valid counter {c.lanes_valid} != {n_valid}"))
    if c.tokens_processed != expected_tokens:
        found.append((Anomaly.COUNTERS, f"tokens_processed counter {c.tokens_processed} != {expected_tokens}"))
    if result.rc is ReturnCode.OK:
        ok = ReturnCode.OK
        expected_kv = sum(1 for lane in lanes if lane.rc is ok and lane.valid) if decode else expected_tokens
        if c.kv_tokens_written != expected_kv:
            found.append((Anomaly.COUNTERS, f"kv_tokens_written counter {c.kv_tokens_written} != {expected_kv}"))
    if previous_engine_sequence is not None and c.engine_sequence != previous_engine_sequence + 1:
        found.append((Anomaly.COUNTERS,
                      f"engine_sequence {c.engine_sequence} does not follow {previous_engine_sequence}"))
    return ResultCheck(tuple(found))
