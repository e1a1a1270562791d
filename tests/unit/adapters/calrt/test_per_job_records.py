"""The device's per-job records made cheaper (issue #20) keep the CalRT contract.

* :func:`~calculet.records.quick_init` gives a frozen dataclass an ``__init__`` that takes
  exactly the dataclass's parameters and builds an equal instance; the class stays frozen and
  ``dataclasses.replace`` still works; what it cannot reproduce it refuses at decoration time.
* :meth:`DecodeJob.of_lanes` builds the job the constructor builds from the same inputs, kept as the lanes'
  ints, its arrays built (read-only) only when read; the lengths are checked the same way.
* :func:`verify_result`, one pass over the lanes, reports exactly what the check it replaced reported
  (a reference copy of that check below), in the same order, on random results.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.adapters.calrt import (
    Anomaly,
    BufferHandle,
    BufferKind,
    DecodeJob,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobTicket,
    LaneResult,
    PrefillJob,
    ResultCheck,
    ReturnCode,
    StatusCounters,
    records_follow_contract,
    verify_result,
)
from calculet.adapters.calrt.jobs import CLEAN
from calculet.records import quick_init
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine

# ------------------------------------------------------------------ quick_init


@dataclasses.dataclass(frozen=True)
class _Reference:
    a: int
    b: str = "x"
    c: int = dataclasses.field(default=3, init=False)
    d: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "c", self.a * 2)


@quick_init
@dataclasses.dataclass(frozen=True)
class _Quick:
    a: int
    b: str = "x"
    c: int = dataclasses.field(default=3, init=False)
    d: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "c", self.a * 2)


def _shape(cls: type) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls.__init__).parameters.values()]


def test_quick_init_takes_the_dataclass_parameters_and_builds_the_same_frozen_instance() -> None:
    assert _shape(_Quick) == _shape(_Reference)
    for args, kwargs in (((1,), {}), ((2, "y"), {"d": (4,)}), ((), {"a": 5, "b": "z"})):
        quick, ref = _Quick(*args, **kwargs), _Reference(*args, **kwargs)
        assert dataclasses.astuple(quick) == dataclasses.astuple(ref) and quick.c == quick.a * 2
    q = _Quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.a = 2  # type: ignore[misc]
    assert dataclasses.replace(q, a=7) == _Quick(7) and repr(_Quick(1, d=(2,))) == "_Quick(a=1, b='x', c=2, d=(2,))"
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(1, "y", (2,))  # type: ignore[misc]  # d is keyword-only, as in the dataclass


def test_quick_init_refuses_what_it_cannot_reproduce() -> None:
    @dataclasses.dataclass
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class WithInitVar:
        a: int
        scale: dataclasses.InitVar[int] = 1

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    for cls, reason in ((Mutable, "not a frozen dataclass"), (Factory, "default_factory"),
                        (WithInitVar, "change its parameters"), (Slotted, "__slots__")):
        with pytest.raises(DefinitionError, match=reason):
            quick_init(cls)


@pytest.mark.parametrize("cls", [ResultCheck, PrefillJob])
def test_the_per_job_types_are_still_frozen_dataclasses_with_their_fields_as_parameters(cls: type) -> None:
    init_fields = [f.name for f in dataclasses.fields(cls) if f.init]
    assert [p for p in inspect.signature(cls.__init__).parameters][1:] == init_fields
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_decode_job_is_a_named_tuple_immutable_and_replaced_through_its_constructor() -> None:
    """Issue #20 (docs/devices.md §3): a DecodeJob is a named tuple of its fields and lanes (``of_lanes`` builds it
    with ``tuple.__new__``); its constructor takes the dataclass's parameters as before; nothing can be assigned;
    ``_replace`` goes through the constructor, so a changed tensor changes the lanes the device reads. Mutants
    caught: an attribute assignable, ``_replace`` copying the lanes of the original, a tensor not rebuilt."""
    assert [p for p in inspect.signature(DecodeJob.__new__).parameters][1:] == [
        "generation", "calbin_id", "compiled_batch", "engine", "buffers", "seq_ids", "token_ids", "positions",
        "lane_valid"]
    job = DecodeJob.of_lanes(2, 4, 2, JobEngine.PING, _buffers(2), (11, 12), (5, 6), (3, 9), (1, 1))
    assert isinstance(job, tuple) and job.kind is JobKind.DECODE
    for name in ("generation", "token_ids", "other"):
        with pytest.raises(AttributeError):
            setattr(job, name, 1)
    moved = job._replace(positions=np.array([4, 9]), engine=JobEngine.PONG)
    assert moved.lanes.positions == (4, 9) and moved.engine is JobEngine.PONG and job.lanes.positions == (3, 9)
    assert list(moved.positions) == [4, 9] and moved.lanes.tokens == job.lanes.tokens
    for copied in (copy.copy(job), pickle.loads(pickle.dumps(job))):  # rebuilt through the constructor
        assert copied.lanes == job.lanes and copied.buffers == job.buffers and list(copied.token_ids) == [5, 6]


def test_the_record_contract_accepts_the_named_tuples_and_refuses_look_alikes() -> None:
    """docs/devices.md §3: the conformance kit's ``result_records`` check. A binding's ticket and result pass only
    as the contract's named tuples, down to the counters and every lane; a plain tuple, a look-alike object or a
    list of lanes is refused (the host unpacks these records by position)."""
    lane = LaneResult(0, 5, True, ReturnCode.OK, 3, 4, None, 7)
    ticket = JobTicket(JobId(9), 1, JobKind.DECODE, JobEngine.PING, 1, 0.0)
    result = JobResult(JobId(9), 1, JobKind.DECODE, JobEngine.PING, 1, 1, ReturnCode.OK, (lane,),
                       StatusCounters(1, 1, 1, 1), 0.0, 0.0, _buffers(1).output)
    assert records_follow_contract(ticket, result)
    for bad_ticket, bad_result in ((tuple(ticket), result), (ticket, tuple(result)),
                                   (ticket, result._replace(lanes=[lane])),
                                   (ticket, result._replace(lanes=(tuple(lane),))),
                                   (ticket, result._replace(counters=(1, 1, 1, 1)))):
        assert not records_follow_contract(bad_ticket, bad_result)


@pytest.mark.parametrize("cls", [JobTicket, StatusCounters, LaneResult, JobResult])
def test_the_result_records_are_named_tuples_built_alike_by_tuple_new(cls: type) -> None:
    """Issue #20 (docs/devices.md §3): the records a device builds per job are named tuples, so a device may build
    them with ``tuple.__new__`` (no ``__new__`` frame) and get the record the constructor builds; they stay
    immutable, read by name, and copied with a field changed by ``_replace``. Mutants caught: a record that is a
    dataclass again (``_fields`` gone), fields reordered against the constructor's parameters."""
    fields = cls._fields  # type: ignore[attr-defined]
    assert [p for p in inspect.signature(cls.__new__).parameters][1:] == list(fields)
    values = tuple(range(len(fields)))
    built, raw = cls(*values), tuple.__new__(cls, values)
    assert built == raw and type(raw) is cls and all(getattr(raw, f) == v for f, v in zip(fields, values))
    with pytest.raises(AttributeError):
        setattr(raw, fields[0], 99)
    assert raw._replace(**{fields[0]: 99})[0] == 99  # type: ignore[attr-defined]


# ------------------------------------------------------------------ DecodeJob.of_lanes


def _buffers(b: int) -> JobBuffers:
    return JobBuffers(BufferHandle(1, BufferKind.INPUT, JobKind.DECODE, b, 64),
                      BufferHandle(2, BufferKind.OUTPUT, JobKind.DECODE, b, 64))


def test_a_decode_job_of_its_lanes_is_the_constructors_job_with_its_tensors_built_when_read() -> None:
    """Issue #20: ``of_lanes`` keeps the ints the scheduler's batch was built from as the job's lanes and builds the
    host tensors only when one is read — the constructor's values, in the batch's dtypes, read-only, built once.
    Mutants caught: a tensor made from the wrong column, a lanes field taken from the wrong tuple, a writable or
    rebuilt tensor, a wrong dtype, an unknown attribute answered instead of refused."""
    seqs, tokens, positions, valid = (11, 0, 12, 0), (5, -1, 7, -1), (3, 0, 9, 0), (1, 0, 1, 0)
    built = DecodeJob(generation=2, calbin_id=4, compiled_batch=4, engine=JobEngine.PONG, buffers=_buffers(4),
                      seq_ids=seqs, token_ids=np.array(tokens), positions=np.array(positions),
                      lane_valid=np.array(valid))
    job = DecodeJob.of_lanes(2, 4, 4, JobEngine.PONG, _buffers(4), seqs, tokens, positions, valid)
    assert job.lanes == built.lanes and job.active_lanes == (0, 2) and job.kind is JobKind.DECODE
    assert job.lanes.tokens is tokens and job.lanes.positions is positions and job.lanes.valid is valid
    for name in ("generation", "calbin_id", "compiled_batch", "engine", "buffers", "seq_ids"):
        assert getattr(job, name) == getattr(built, name), name
    assert "token_ids" not in job.__dict__  # nothing built until read
    for name, dtype in (("token_ids", np.int32), ("positions", np.int32), ("lane_valid", np.uint8)):
        arr = getattr(job, name)
        assert arr.dtype == dtype and np.array_equal(arr, getattr(built, name)), name
        assert getattr(job, name) is arr, "built once"
        with pytest.raises(ValueError):
            arr[0] = 1  # read-only, so it can never disagree with ``lanes``
    with pytest.raises(AttributeError, match="no attribute 'tokens'"):
        job.tokens  # noqa: B018 - the lookup is the test
    assert repr(job).startswith("DecodeJob(generation=2, calbin_id=4, compiled_batch=4")


@pytest.mark.req("R7.1.2")
@pytest.mark.parametrize("short", [0, 1, 2, 3])
def test_a_decode_job_of_its_lanes_is_checked_for_length(short: int) -> None:
    """A lane tuple one short is refused as the constructor refuses a short array (R7.1.2), naming the field."""
    lanes = [(1, 0, 0), (5, 5, 5), (0, 0, 0), (1, 0, 0)]
    lanes[short] = lanes[short][:2]
    name = ("seq_ids", "token_ids", "positions", "lane_valid")[short]
    with pytest.raises(DefinitionError, match=f"DecodeJob.{name} has 2 entries; compiled_batch is 3"):
        DecodeJob.of_lanes(1, 1, 3, JobEngine.PING, _buffers(3), *lanes)


@pytest.mark.req("R7.1.2")
@pytest.mark.parametrize(("field", "seqs", "lists"), [
    ("seq_ids", (1, 0), ([5, 5, 5], [0, 0, 0], [1, 0, 0])),
    ("token_ids", (1, 0, 0), ([5, 5], [0, 0, 0], [1, 0, 0])),
    ("positions", (1, 0, 0), ([5, 5, 5], [0], [1, 0, 0])),
    ("lane_valid", (1, 0, 0), ([5, 5, 5], [0, 0, 0], [1, 0, 0, 0])),
])
def test_a_decode_job_of_its_lanes_checks_the_lengths_as_the_constructor_does(
        field: str, seqs: tuple[int, ...], lists: tuple[list[int], ...]) -> None:
    message = f"DecodeJob.{field} has .* entries; compiled_batch is 3"
    with pytest.raises(DefinitionError, match=message):
        DecodeJob.of_lanes(1, 1, 3, JobEngine.PING, _buffers(3), seqs, *map(tuple, lists))
    with pytest.raises(DefinitionError, match=message):
        DecodeJob(generation=1, calbin_id=1, compiled_batch=3, engine=JobEngine.PING, buffers=_buffers(3),
                  seq_ids=seqs, token_ids=np.array(lists[0]), positions=np.array(lists[1]),
                  lane_valid=np.array(lists[2]))


@given(st.sampled_from([1, 2, 4, 8, 16]).flatmap(
    lambda b: st.lists(st.sampled_from([0, 1, 1, 2]), min_size=b, max_size=b)), st.booleans())
def test_a_decode_job_of_its_lanes_has_the_constructors_lanes_for_any_valid_pattern(valid: list[int],
                                                                                       full: bool) -> None:
    """Issue #20: of_lanes reads the active lanes of a valid pattern from a table of the patterns seen (bounded);
    the lanes are the constructor's whether the pattern is remembered, new, or the table is full. A 2 (a malformed
    flag) counts as valid, as in the constructor."""
    from calculet.adapters.calrt import jobs as calrt_jobs

    b = len(valid)
    seqs, tokens, positions = tuple(range(10, 10 + b)), [5] * b, list(range(b))
    built = DecodeJob(generation=1, calbin_id=1, compiled_batch=b, engine=JobEngine.PING, buffers=_buffers(b),
                      seq_ids=seqs, token_ids=np.array(tokens), positions=np.array(positions),
                      lane_valid=np.array(valid))
    saved = dict(calrt_jobs._ACTIVE)
    try:
        if full:  # a table with no room: the pattern is not remembered, the answer is the same
            calrt_jobs._ACTIVE.update({(-k,): () for k in range(1, calrt_jobs._ACTIVE_KEPT + 1)})
        for _ in range(2):  # new, then remembered (or not, when full)
            owned = DecodeJob.of_lanes(1, 1, b, JobEngine.PING, _buffers(b), seqs, tuple(tokens), tuple(positions),
                                       tuple(valid))
            assert owned.lanes == built.lanes
            assert owned.active_lanes == tuple(i for i, v in enumerate(valid) if v)
        assert (tuple(valid) in calrt_jobs._ACTIVE) is (not full or tuple(valid) in saved)
        assert len(calrt_jobs._ACTIVE) <= max(calrt_jobs._ACTIVE_KEPT + len(saved), len(saved) + 1)
    finally:
        calrt_jobs._ACTIVE.clear()
        calrt_jobs._ACTIVE.update(saved)


# ------------------------------------------------------------------ verify_result


def _reference_verify(job: Any, ticket: JobTicket, result: JobResult,
                      previous: int | None) -> list[tuple[Anomaly, str]]:
    """verify_result as it was before issue #20's single pass (commit f13f6f0), kept as the reference."""
    found: list[tuple[Anomaly, str]] = []
    if result.job_id != ticket.job_id:
        found.append((Anomaly.WRONG_JOB, f"result job {result.job_id} for ticket {ticket.job_id}"))
    if result.generation != job.generation:
        found.append((Anomaly.WRONG_GENERATION, f"result generation {result.generation} != {job.generation}"))
    decode = isinstance(job, DecodeJob)
    if decode:
        expected_seqs = job.lanes.seqs
        valid = [bool(v) for v in job.lanes.valid]
        n_valid = expected_tokens = len(job.lanes.active)
    else:
        expected_seqs, valid = (job.seq_id,), [True]
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
        expected_kv = (sum(1 for lane in lanes if lane.rc is ReturnCode.OK and lane.valid) if decode
                       else expected_tokens)
        if c.kv_tokens_written != expected_kv:
            found.append((Anomaly.COUNTERS, f"kv_tokens_written counter {c.kv_tokens_written} != {expected_kv}"))
    if previous is not None and c.engine_sequence != previous + 1:
        found.append((Anomaly.COUNTERS, f"engine_sequence {c.engine_sequence} does not follow {previous}"))
    return found


_RC = st.sampled_from([ReturnCode.OK, ReturnCode.OK, ReturnCode.TIMEOUT, ReturnCode.INVALID_ARGUMENT])


@st.composite
def _job_and_result(draw: st.DrawFn) -> tuple[Any, JobTicket, JobResult, int | None]:
    prefill = draw(st.booleans())
    b = 1 if prefill else draw(st.sampled_from([1, 2, 4]))
    seqs = tuple(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)))
    if prefill:
        job: Any = PrefillJob(generation=1, calbin_id=1, engine=JobEngine.PING, buffers=_buffers(1), seq_id=seqs[0],
                              tokens=np.arange(draw(st.integers(1, 4)), dtype=np.int32), start_position=0)
        valid = [1]
    else:
        valid = draw(st.lists(st.sampled_from([0, 1, 2]), min_size=b, max_size=b))  # 2: a malformed flag
        job = DecodeJob.of_lanes(1, 1, b, JobEngine.PING, _buffers(b), seqs, (7,) * b, (0,) * b, tuple(valid))
    n = draw(st.sampled_from([b, b, b - 1, b + 1]))
    lanes = []
    for i in range(max(n, 0)):
        faithful = draw(st.booleans()) or i >= b
        lane = i if faithful else draw(st.integers(0, 4))
        seq = seqs[i] if faithful and i < b else draw(st.integers(0, 3))
        is_valid = bool(valid[i]) if faithful and i < b else draw(st.booleans())
        lanes.append(LaneResult(lane, seq, is_valid, draw(_RC), 0, 1, None, None))
    counters = StatusCounters(draw(st.integers(3, 5)), draw(st.integers(0, 4)), draw(st.integers(0, 4)),
                              draw(st.integers(0, 4)))
    result = JobResult(JobId(draw(st.sampled_from([9, 9, 8]))), draw(st.sampled_from([1, 1, 2])), job.kind,
                       JobEngine.PING, 1, b, draw(_RC), tuple(lanes), counters, 0.0, 1.0, job.buffers.output)
    ticket = JobTicket(JobId(9), 1, job.kind, JobEngine.PING, 1, 0.0)
    return job, ticket, result, draw(st.sampled_from([None, 3, 4]))


@given(_job_and_result())
@settings(max_examples=300)
def test_verify_result_reports_what_the_check_it_replaced_reported(case: tuple[Any, JobTicket, JobResult, Any]) -> None:
    job, ticket, result, previous = case
    check = verify_result(job, ticket, result, previous)
    assert list(check.anomalies) == _reference_verify(job, ticket, result, previous)
    if check.ok:
        assert check is CLEAN and check == ResultCheck(())
