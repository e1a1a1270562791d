"""Jobs the device runs and the results it returns (§2, §4, §7.4, §14).

Every result carries (generation id, job id), per-lane (seq id, lane) tags and status counters,
so the runtime can correlate completions (§4, R4.8) and detect crosstalk or counter anomalies
(§14, R14.5–R14.6); :func:`verify_result` does that check once for every adapter. A job runs
wholly on one :class:`~calculet.machines.job.JobEngine` (ping or pong, §14): the one enum the job
lifecycle machine and the device share.

The per-job records — the :class:`DecodeJob` the host submits, the :class:`JobTicket` submit returns, the
:class:`JobResult` with its :class:`LaneResult` per lane and :class:`StatusCounters` — are named tuples (issue #20,
session 26; the contract in ``docs/devices.md`` §3): at B1, CalRT 0.7.6's only batch, five of them are built per
streamed token, and a named tuple built with ``tuple.__new__`` costs a third of a frozen dataclass's ``__init__``
(~0.15 µs against 0.3–0.7). They stay immutable and are read by name; what changed for a reader is that they
compare as tuples and are copied with ``_replace``. :class:`PrefillJob` (once per request) stays a dataclass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

import numpy as np

from calculet.adapters.calrt.codes import ReturnCode
from calculet.records import quick_init
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


class _DecodeJobFields(NamedTuple):
    generation: int
    calbin_id: int
    compiled_batch: int
    engine: JobEngine
    buffers: JobBuffers
    seq_ids: tuple[int, ...]
    lanes: DecodeLanes
    """The lanes as plain Python values, converted once: the device's checks, its DMA payload, its commit and
    the host's result checks each read them, and a numpy conversion per reader cost ~10 calls per B1 token
    (issue #20). The tensors are read-only, so these can never disagree with them."""


class DecodeJob(_DecodeJobFields):
    """One decode step over a compiled batch (§2 ``DecodeBatch`` as the device sees it).

    Arrays have length ``compiled_batch`` (R7.1.2). For a valid lane ``positions[lane]`` must equal
    the sequence's committed KV length (§9.2, R9.2.4). An inactive lane carries the profile's
    ``fill_token`` and ``lane_valid`` 0; its ``seq_ids`` entry may name a sequence (that sequence's
    KV must not change) or be :data:`NO_SEQUENCE`.

    Built with the constructor, the job copies the arrays it is given (the caller may go on writing
    its own) and checks their lengths; :meth:`of_lanes` builds it from the lanes' Python ints (the
    scheduler's batch), its arrays made only if read.

    A named tuple of its fields (issue #20, ``docs/devices.md`` §3): :meth:`of_lanes` builds one with
    ``tuple.__new__``, a third of the frozen dataclass it was; its instances keep a ``__dict__`` only for the host
    tensors ``token_ids``, ``positions``, ``lane_valid`` (built when first read). Immutable: no attribute can be
    set; a copy with fields or tensors changed is :meth:`_replace`.
    """

    kind = JobKind.DECODE

    def __new__(cls, generation: int, calbin_id: int, compiled_batch: int, engine: JobEngine, buffers: JobBuffers,
                seq_ids: tuple[int, ...], token_ids: np.ndarray, positions: np.ndarray,
                lane_valid: np.ndarray) -> DecodeJob:
        tensors, plain = {}, []
        for name, given in (("token_ids", token_ids), ("positions", positions), ("lane_valid", lane_valid)):
            arr = given.copy() if isinstance(given, np.ndarray) else np.array(given)
            arr.setflags(write=False)
            tensors[name] = arr
            plain.append(arr.tolist())
        tokens, lane_positions, valid = plain
        seqs = tuple(map(int, seq_ids))
        _check_lengths(compiled_batch, seqs, tokens, lane_positions, valid)
        lanes = DecodeLanes(tuple(tokens), tuple(lane_positions), tuple(valid), seqs,
                            tuple([i for i, v in enumerate(valid) if v]))
        job = _new_tuple(cls, (generation, calbin_id, compiled_batch, engine, buffers, seq_ids, lanes))
        job.__dict__.update(tensors)
        return job

    @classmethod
    def of_lanes(cls, generation: int, calbin_id: int, compiled_batch: int, engine: JobEngine, buffers: JobBuffers,
                 seq_ids: tuple[int, ...], tokens: tuple[int, ...], positions: tuple[int, ...],
                 valid: tuple[int, ...]) -> DecodeJob:
        """The job from its lanes as tuples of Python ints, which it keeps as its :attr:`lanes`; the host tensors
        ``token_ids``, ``positions`` and ``lane_valid`` are built from them when first read (:meth:`__getattr__`).

        Why: every reader on the way to a device that needs no tensors — the device's submit checks, its DMA
        payload, the null device's commit, the host's result checks — reads the plain lanes; the three read-only
        arrays per decode step (their building, their flags, their shapes compared) were made for nobody there
        (issue #20). A device that computes reads them and gets the arrays the constructor would hold, built
        from the same values, so the two can never disagree. The lengths are checked as the constructor checks
        them (R7.1.2)."""
        if not len(tokens) == len(positions) == len(valid) == len(seq_ids) == compiled_batch:
            _check_lengths(compiled_batch, seq_ids, list(tokens), list(positions), list(valid))
        active = _ACTIVE.get(valid)
        if active is None:
            active = _active_lanes(valid)
        return _new_tuple(cls, (generation, calbin_id, compiled_batch, engine, buffers, seq_ids,
                                _new_tuple(DecodeLanes, (tokens, positions, valid, seq_ids, active))))

    def __getattr__(self, name: str) -> np.ndarray:
        """A host tensor of a job built by :meth:`of_lanes`, made from its lanes at its first read and kept
        (read-only, of the dtypes the scheduler's batch uses); any other missing attribute is an AttributeError."""
        column = _TENSORS.get(name)
        if column is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        arr = np.array(self.lanes[column[0]], dtype=column[1])
        arr.setflags(write=False)
        self.__dict__[name] = arr
        return arr

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"DecodeJob is immutable: cannot assign to {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"DecodeJob is immutable: cannot delete {name!r}")

    def _replace(self, **changes: object) -> DecodeJob:  # type: ignore[override]
        """A copy with fields or host tensors changed (``seq_ids``, ``positions``, ``engine``...), built by the
        constructor so that its lanes are its tensors' values and its lengths are checked."""
        kw: dict[str, object] = {name: getattr(self, name) for name in _CONSTRUCTOR}
        kw.update(changes)
        return DecodeJob(**kw)  # type: ignore[arg-type]

    def __getnewargs__(self) -> tuple[object, ...]:  # type: ignore[override]
        """The constructor's arguments (copy and pickle rebuild the job through it, as :meth:`_replace` does)."""
        return tuple(getattr(self, name) for name in _CONSTRUCTOR)

    @property
    def active_lanes(self) -> tuple[int, ...]:
        return self.lanes.active


_CONSTRUCTOR = ("generation", "calbin_id", "compiled_batch", "engine", "buffers", "seq_ids", "token_ids",
                "positions", "lane_valid")
"""The parameters of :class:`DecodeJob`'s constructor, in order."""


_TENSORS: dict[str, tuple[int, type]] = {"token_ids": (0, np.int32), "positions": (1, np.int32),
                                         "lane_valid": (2, np.uint8)}
"""The host tensors :meth:`DecodeJob.of_lanes` builds on first read: each one's column of :class:`DecodeLanes`
and dtype (the scheduler's ``DecodeBatch``'s: int32 tokens and positions, uint8 valid bits)."""


_new_object = object.__new__
_new_tuple = tuple.__new__

_ACTIVE: dict[tuple[int, ...], tuple[int, ...]] = {}
"""The active lanes of each ``lane_valid`` pattern seen (a scheduler's batches use a few: lanes 0..n-1 valid),
read once per decode job instead of a comprehension over the lanes (issue #20); at most :data:`_ACTIVE_KEPT`."""
_ACTIVE_KEPT = 1024


def _active_lanes(valid: tuple[int, ...]) -> tuple[int, ...]:
    """The lanes whose ``valid`` entry is truthy, in order; remembered in :data:`_ACTIVE` while it has room."""
    active = tuple([i for i, v in enumerate(valid) if v])
    if len(_ACTIVE) < _ACTIVE_KEPT:
        _ACTIVE[valid] = active
    return active


def _check_lengths(b: int, seqs: tuple[int, ...], tokens: list[int], positions: list[int], valid: list[int]) -> None:
    """Every per-lane input of a decode job has ``compiled_batch`` entries (R7.1.2)."""
    if len(seqs) == len(tokens) == len(positions) == len(valid) == b:
        return
    for name, given in (("seq_ids", seqs), ("token_ids", tokens), ("positions", positions), ("lane_valid", valid)):
        if len(given) != b:
            raise DefinitionError(f"DecodeJob.{name} has {len(given)} entries; compiled_batch is {b} (R7.1.2)")


@quick_init
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


class JobTicket(NamedTuple):
    """What submit returns: the device's job id and the tags the result will echo.

    ``submitted_at`` is read from the clock the device was opened with (``request.clock``, the runtime's): the
    executor takes the job's Wait deadline from it instead of reading the clock a second time (issue #20)."""

    job_id: JobId
    generation: int
    kind: JobKind
    engine: JobEngine
    calbin_id: int
    submitted_at: float


class StatusCounters(NamedTuple):
    """Status counters the device reports with every job (§14: counter anomaly → degrade).

    ``engine_sequence`` counts completed jobs per engine and must grow by one per job;
    ``lanes_valid`` / ``tokens_processed`` / ``kv_tokens_written`` must match the job.
    """

    engine_sequence: int
    lanes_valid: int
    tokens_processed: int
    kv_tokens_written: int


class LaneResult(NamedTuple):
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


class JobResult(NamedTuple):
    """A completed job: (generation id, job id) plus per-lane tags and status counters (§4, §7.4).

    ``rc`` is the job's status. With lane-level failure isolation (a capability, R7.4.6) a failed
    job may still carry OK lanes; without it, a failed job fails every lane (R7.4.5).

    The result records (this, :class:`JobTicket`, :class:`StatusCounters`, :class:`LaneResult`) are named tuples
    (issue #20, ``docs/devices.md`` §3): a device builds four per job, once per token at B1, and a named tuple built
    with ``tuple.__new__`` costs a third of a frozen dataclass's ``__init__``; fields read the same (``result.rc``),
    immutable as before; a copy with a field changed is ``result._replace(rc=...)``.
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


def records_follow_contract(ticket: object, result: object) -> bool:
    """Whether a binding's ticket and result are the contract's records (``docs/devices.md`` §3): exactly
    :class:`JobTicket`, :class:`JobResult`, its :class:`StatusCounters` and one :class:`LaneResult` per lane. The
    host reads them as the named tuples they are (a clean result's fields unpacked in one step, issue #20), so a
    look-alike object of another type is refused by the conformance kit rather than failing in the executor."""
    if type(ticket) is not JobTicket or type(result) is not JobResult:
        return False
    return type(result.counters) is StatusCounters and type(result.lanes) is tuple and all(
        type(lane) is LaneResult for lane in result.lanes)


class Anomaly(str, enum.Enum):
    """What :func:`verify_result` can find (§7.4 consistency, §14 degrade triggers)."""

    WRONG_JOB = "wrong_job"
    WRONG_GENERATION = "wrong_generation"
    CROSSTALK = "crosstalk"
    COUNTERS = "counters"


@quick_init
@dataclass(frozen=True)
class ResultCheck:
    """Outcome of checking a result against the job that was submitted."""

    anomalies: tuple[tuple[Anomaly, str], ...]

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def has(self, kind: Anomaly) -> bool:
        return any(a is kind for a, _ in self.anomalies)


CLEAN = ResultCheck(())
"""The check of a result with no anomaly (frozen, so one instance serves every clean result)."""


def verify_result(job: JobSpec, ticket: JobTicket, result: JobResult,
                  previous_engine_sequence: int | None = None) -> ResultCheck:
    """Check that a result belongs to the job and that its tags and counters are consistent.

    §7.4: verify request/generation/seq/lane before using a lane; §14: any crosstalk or counter
    anomaly triggers degrade. ``previous_engine_sequence`` is the counter of the previous job
    completed on the same engine, when the caller tracks it.

    Runs once per job, so once per token at B1 (issue #20): the lane tags and the KV tokens written
    are read in one pass over the lanes, and a clean result returns the one shared :data:`CLEAN`
    check instead of a new one.
    """
    found: list[tuple[Anomaly, str]] = []
    if result.job_id != ticket.job_id:
        found.append((Anomaly.WRONG_JOB, f"result job {result.job_id} for ticket {ticket.job_id}"))
    if result.generation != job.generation:
        found.append((Anomaly.WRONG_GENERATION, f"result generation {result.generation} != {job.generation}"))
    decode = job.kind is JobKind.DECODE
    if decode:
        lanes_in = job.lanes  # type: ignore[union-attr]  # plain values converted once per job (issue #20)
        expected_seqs, expected_valid = lanes_in.seqs, lanes_in.valid
    else:
        expected_seqs, expected_valid = (job.seq_id,), (True,)  # type: ignore[union-attr]
    ok = ReturnCode.OK
    n_lanes = len(expected_seqs)
    lanes = result.lanes
    if len(lanes) != n_lanes:
        found.append((Anomaly.CROSSTALK, f"{len(lanes)} lane results for {n_lanes} lanes"))
    kv_written = i = 0
    for lane in lanes:
        if lane.valid and lane.rc is ok:
            kv_written += 1
        if i < n_lanes:
            valid = expected_valid[i] != 0  # as bool: ``valid`` is given as 0/1 (a non-zero entry is a valid lane)
            if lane.lane != i or lane.seq_id != expected_seqs[i] or lane.valid != valid:
                found.append((Anomaly.CROSSTALK,
                              f"slot {i} carries lane {lane.lane} seq {lane.seq_id} valid={lane.valid}; "
                              f"expected lane {i} seq {expected_seqs[i]} valid={valid}"))
        i += 1
    if decode:
        n_valid = expected_tokens = len(lanes_in.active)
    else:
        n_valid, expected_tokens = 1, len(job.tokens)  # type: ignore[union-attr]
    c = result.counters
    if c.lanes_valid != n_valid:
        found.append((Anomaly.COUNTERS, f"lanes_valid counter {c.lanes_valid} != {n_valid}"))
    if c.tokens_processed != expected_tokens:
        found.append((Anomaly.COUNTERS, f"tokens_processed counter {c.tokens_processed} != {expected_tokens}"))
    if result.rc is ok:
        expected_kv = kv_written if decode else expected_tokens
        if c.kv_tokens_written != expected_kv:
            found.append((Anomaly.COUNTERS, f"kv_tokens_written counter {c.kv_tokens_written} != {expected_kv}"))
    if previous_engine_sequence is not None and c.engine_sequence != previous_engine_sequence + 1:
        found.append((Anomaly.COUNTERS,
                      f"engine_sequence {c.engine_sequence} does not follow {previous_engine_sequence}"))
    return ResultCheck(tuple(found)) if found else CLEAN
