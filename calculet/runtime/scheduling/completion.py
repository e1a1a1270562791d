"""Completion checking (§7.4): split a job's result per lane and decide what each lane means.

This module decides, it does not act: :func:`check_decode_lanes` returns one
:class:`LaneCheck` per active lane of the submitted batch, and the scheduler then commits,
aborts or faults that lane's KV and fires that lane's request event. Rules:

* every lane's result must name the request, generation, sequence and lane the batch bound
  there; a lane whose tags disagree (crosstalk, a swapped seq/lane mapping, a wrong
  generation) is never delivered to any stream (R7.4.2) and its KV is treated as unknown;
* each lane finishes independently (R7.4.3);
* a device-level failure fails every lane and marks its KV Unknown, unless the capability
  contract declares lane-level failure isolation — then only the lanes reported failed
  fail (R7.4.5, R7.4.6);
* a lane that ran but returned no usable token (inconsistent nothing else) is a known
  failure: its KV transaction is aborted, not committed (§9.2: commit only when both the
  device and the output succeeded).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

from calculet.records import quick_init
from calculet.runtime.request import GenerationId, JobId, RequestId, SeqId


class FaultKind(enum.Enum):
    """How a job or lane failed; all but ``NONE`` leave the device's KV state unknown (§9.2)."""

    NONE = "none"
    ERROR = "error"
    """The device reported an error status for the job and is done with it."""
    TIMEOUT = "timeout"
    CCU_FAULT = "ccu_fault"
    DMA_UNKNOWN = "dma_unknown"

    @property
    def quarantines_job(self) -> bool:
        """CCU fault and unknown DMA fence the job's buffers until a reset (DeviceJobMachine)."""
        return self in (FaultKind.CCU_FAULT, FaultKind.DMA_UNKNOWN)


@quick_init
@dataclass(frozen=True)
class LaneOutcome:
    """One lane of a decode result, with the tags the device echoed (§7.4).

    This and the two completions are built once per job (and lane): frozen dataclasses whose ``__init__``
    writes ``__dict__`` (:func:`~calculet.records.quick_init`); with ``slots=True`` the dataclass's own
    ``__init__`` goes through ``object.__setattr__`` per field, ~1.4 µs each of them per B1 token that no
    call count shows (issue #20)."""

    lane: int
    request_id: RequestId
    seq_id: SeqId
    generation: GenerationId
    ok: bool
    token: int | None
    stop: bool = False


@quick_init
@dataclass(frozen=True)
class DecodeCompletion:
    """A decode job's result: (generation, job id) plus per-lane outcomes (§4, §7.4)."""

    job_id: JobId
    generation: GenerationId
    ok: bool
    lanes: tuple[LaneOutcome, ...]
    fault: FaultKind = FaultKind.NONE
    detail: str = ""
    """Why the job failed (the CalRT return code and message); it reaches the failed requests'
    error detail (R19.2)."""


@quick_init
@dataclass(frozen=True)
class PrefillCompletion:
    """A prefill job's (or prefill chunk's) result (§4 ``on_prefill_complete``).

    ``token`` is the first generated token (only meaningful for the last chunk).
    """

    job_id: JobId
    generation: GenerationId
    request_id: RequestId
    seq_id: SeqId
    ok: bool
    token: int | None
    stop: bool = False
    fault: FaultKind = FaultKind.NONE
    detail: str = ""
    """Why the job failed (the CalRT return code and message), for the request's error detail."""


class LaneVerdict(enum.Enum):
    OK = "ok"
    """Tags consistent, device and output succeeded: commit KV, deliver the token."""
    OUTPUT_INVALID = "output_invalid"
    """Tags consistent, the device finished, but there is no usable token: abort KV, fail."""
    DEVICE_FAILED = "device_failed"
    """The device failed this lane (or the whole job): KV Unknown, fail."""
    MISMATCH = "mismatch"
    """The lane's tags do not match what was bound there: never delivered, KV Unknown, fail."""


class LaneBindingTags(Protocol):
    """What the batch bound to a lane (``decode.LaneBinding`` has these and more)."""

    @property
    def lane(self) -> int: ...

    @property
    def request_id(self) -> RequestId: ...

    @property
    def seq_id(self) -> SeqId: ...

    @property
    def generation(self) -> GenerationId: ...


_new_tuple = tuple.__new__
"""Builds a named tuple without its generated ``__new__`` (a Python frame per lane)."""


class LaneCheck(NamedTuple):
    """The verdict on one lane (a named tuple: one per lane per tick, cheap to build)."""

    lane: int
    request_id: RequestId
    verdict: LaneVerdict
    token: int | None
    stop: bool
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict is LaneVerdict.OK


def check_lane(bound: LaneBindingTags, outcome: LaneOutcome | None, *, job_ok: bool,
               lane_isolation: bool, vocab_size: int | None = None) -> LaneCheck:
    """The verdict for one active lane (R7.4.2, R7.4.5, R7.4.6)."""
    rid = bound.request_id
    if not job_ok and not lane_isolation:
        return LaneCheck(bound.lane, rid, LaneVerdict.DEVICE_FAILED, None, False, "device-level failure")
    if outcome is None:
        return LaneCheck(bound.lane, rid, LaneVerdict.DEVICE_FAILED, None, False, "no result for this lane")
    if (outcome.request_id, outcome.seq_id, outcome.generation, outcome.lane) != (
            rid, bound.seq_id, bound.generation, bound.lane):
        return LaneCheck(bound.lane, rid, LaneVerdict.MISMATCH, None, False,
                         f"lane {bound.lane} bound (request {rid}, seq {bound.seq_id}, gen {bound.generation}) "
                         f"but the result says (request {outcome.request_id}, seq {outcome.seq_id}, "
                         f"gen {outcome.generation}, lane {outcome.lane})")
    if not outcome.ok:
        return LaneCheck(bound.lane, rid, LaneVerdict.DEVICE_FAILED, None, False, "lane reported failed")
    token = outcome.token
    if token is None or token < 0 or (vocab_size is not None and token >= vocab_size):
        return LaneCheck(bound.lane, rid, LaneVerdict.OUTPUT_INVALID, None, False, f"unusable token {token!r}")
    return LaneCheck(bound.lane, rid, LaneVerdict.OK, token, outcome.stop)


DecodeTokens = tuple[JobId, GenerationId, list[int], list[bool]]
"""The usual decode step as columns: (job id, the result's generation, tokens, stops), the columns in bound-lane
order with every bound lane's outcome OK and its own tags: what :func:`clean_decode_lanes` finds in a
:class:`DecodeCompletion`, and what the completion dispatcher hands the scheduler instead of one when it matched
every lane of a result to its binding (issue #20: no object per lane, no second pass over them)."""


def usable_tokens(tokens: Sequence[int], vocab_size: int | None) -> bool:
    """Whether every token is a usable output (in ``0 .. vocab_size - 1``; a token ``check_lane`` would not call
    OUTPUT_INVALID): the rule of a usual step's columns, whoever built them. One C pass (min/max), no loop."""
    return not tokens or (min(tokens) >= 0 and (vocab_size is None or max(tokens) < vocab_size))


def clean_decode_lanes(bound: Sequence[LaneBindingTags], completion: DecodeCompletion,
                       vocab_size: int | None = None) -> tuple[list[int], list[bool]] | None:
    """The usual decode result as columns — (tokens, stops) in lane order — or None if it is anything else.

    Usual: the job succeeded and its i-th outcome is the i-th bound lane's (lanes bound in increasing
    order), each with matching tags (R7.4.2), ``ok`` and a usable token (:func:`usable_tokens`). Then every
    lane's verdict is :attr:`LaneVerdict.OK` and there is no extra lane, so the caller needs no
    :class:`LaneCheck` per lane: one pass, no tuple per lane (issue #20, the per-step completion path).
    Anything else — one lane failed, mismatched, out of order or missing — returns None and
    :func:`check_decode_lanes` decides lane by lane.
    """
    outcomes = completion.lanes
    if not completion.ok or len(outcomes) != len(bound):
        return None
    tokens: list[int] = []
    stops: list[bool] = []
    add_token, add_stop, previous = tokens.append, stops.append, -1
    for b, outcome in zip(bound, outcomes):
        token, lane = outcome.token, b.lane
        if not (lane > previous and outcome.lane == lane and outcome.request_id == b.request_id
                and outcome.seq_id == b.seq_id and outcome.generation == b.generation and outcome.ok
                and token is not None):
            return None
        add_token(token)
        add_stop(outcome.stop)
        previous = lane
    return (tokens, stops) if usable_tokens(tokens, vocab_size) else None


def check_decode_lanes(bound: Sequence[LaneBindingTags], completion: DecodeCompletion, *,
                       lane_isolation: bool, vocab_size: int | None = None) -> tuple[tuple[LaneCheck, ...], int]:
    """Split a decode result by lane: one check per bound lane, plus the count of extra lanes.

    Extra lanes are results for lanes nothing was bound to (or duplicates): they are dropped
    and counted as crosstalk evidence.

    The usual result (:func:`clean_decode_lanes`, :func:`check_lane`'s accepting case in one pass with no
    call per lane, issue #20) gives every lane OK; anything else takes the general path below, every lane.
    """
    clean = clean_decode_lanes(bound, completion, vocab_size)
    if clean is not None:
        good = LaneVerdict.OK
        return tuple([_new_tuple(LaneCheck, (b.lane, b.request_id, good, token, stop, ""))
                      for b, token, stop in zip(bound, *clean)]), 0
    by_lane: dict[int, LaneOutcome] = {}
    for outcome in completion.lanes:
        if outcome.lane not in by_lane:
            by_lane[outcome.lane] = outcome
    job_ok = completion.ok
    checks = []
    used = 0
    for b in bound:
        found = by_lane.pop(b.lane, None)  # None: no result for this lane
        if found is not None:
            used += 1
        checks.append(check_lane(b, found, job_ok=job_ok, lane_isolation=lane_isolation, vocab_size=vocab_size))
    return tuple(checks), len(completion.lanes) - used
