"""The clean-decode fast path of :func:`check_result` (issue #20) gives the verdict of the checks it skips.

A decode result that passes every check is recognised in one pass (``clean_decode``, which the executor asks
first) instead of going through :func:`~calculet.adapters.calrt.verify_result` and the identity and echo checks one
by one (``anomalies``). Here a clean result and every one-field corruption of it are checked both ways — as shipped
(the fast path may apply) and by the full checks alone — and the two lists of anomalies must be equal: a fast path
that accepted a corrupted result would return ``[]`` where the full checks name an anomaly (mutant: drop any one
condition of ``clean_decode``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from calculet.adapters.calrt import (
    BufferHandle,
    BufferKind,
    DecodeJob,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobTicket,
    LaneResult,
    ReturnCode,
    StatusCounters,
)
from calculet.machines.job import JobEngine
from calculet.runtime.execution import verification
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.execution.verification import check_result


def _job(valid: list[int]) -> tuple[InflightJob, JobResult]:
    """A decode job over ``len(valid)`` lanes and the clean result of it (no logits, every lane OK)."""
    b = len(valid)
    buffers = JobBuffers(BufferHandle(1, BufferKind.INPUT, JobKind.DECODE, b, 64),
                         BufferHandle(2, BufferKind.OUTPUT, JobKind.DECODE, b, 64))
    seqs = tuple(range(10, 10 + b))
    positions = [3 + i for i in range(b)]
    spec = DecodeJob(generation=1, calbin_id=4, compiled_batch=b, engine=JobEngine.PING, buffers=buffers,
                     seq_ids=seqs, token_ids=np.array([5 if v else 7 for v in valid]),
                     positions=np.array(positions), lane_valid=np.array(valid))
    ticket = JobTicket(JobId(9), 1, JobKind.DECODE, JobEngine.PING, 4, 0.0)
    lanes = tuple(LaneResult(i, seqs[i], bool(v), ReturnCode.OK, positions[i], positions[i] + 1 if v else 0,
                             None, 11 if v else None) for i, v in enumerate(valid))
    n = sum(1 for v in valid if v)
    result = JobResult(JobId(9), 1, JobKind.DECODE, JobEngine.PING, 4, b, ReturnCode.OK, lanes,
                       StatusCounters(6, n, n, n), 0.0, 0.0, buffers.output)
    job = InflightJob(1, ticket, None, spec, 1.0, False)  # type: ignore[arg-type]  # the checks never read work
    return job, result


def _lane(result: JobResult, i: int, **changes: Any) -> JobResult:
    lanes = list(result.lanes)
    lanes[i] = lanes[i]._replace(**changes)
    return result._replace(lanes=tuple(lanes))


def _counters(result: JobResult, **changes: Any) -> JobResult:
    return result._replace(counters=result.counters._replace(**changes))


_CORRUPTIONS: dict[str, Callable[[JobResult, int], JobResult]] = {
    "none": lambda r, i: r,
    "job_id": lambda r, i: r._replace(job_id=JobId(8)),
    "generation": lambda r, i: r._replace(generation=2),
    "engine": lambda r, i: r._replace(engine=JobEngine.PONG),
    "kind": lambda r, i: r._replace(kind=JobKind.PREFILL),
    "calbin": lambda r, i: r._replace(calbin_id=5),
    "batch": lambda r, i: r._replace(compiled_batch=r.compiled_batch + 1),
    "output_buffer": lambda r, i: r._replace(
        output_buffer=BufferHandle(3, BufferKind.OUTPUT, JobKind.DECODE, r.compiled_batch, 64)),
    "job_rc": lambda r, i: r._replace(rc=ReturnCode.CCU_FAULT),
    "lane_missing": lambda r, i: r._replace(lanes=r.lanes[:-1]),
    "lane_extra": lambda r, i: r._replace(lanes=(*r.lanes, r.lanes[-1])),
    "lane_index": lambda r, i: _lane(r, i, lane=i + 1),
    "seq": lambda r, i: _lane(r, i, seq_id=99),
    "valid_flipped": lambda r, i: _lane(r, i, valid=not r.lanes[i].valid),
    "valid_as_int": lambda r, i: _lane(r, i, valid=int(r.lanes[i].valid)),
    "lane_rc": lambda r, i: _lane(r, i, rc=ReturnCode.CCU_FAULT),
    "position": lambda r, i: _lane(r, i, position=r.lanes[i].position + 1),
    "kv_len": lambda r, i: _lane(r, i, kv_len=r.lanes[i].kv_len + 1),
    "greedy_token": lambda r, i: _lane(r, i, greedy_token=3),
    "logits_nan": lambda r, i: _lane(r, i, logits=np.full(4, np.nan)),
    "lanes_valid": lambda r, i: _counters(r, lanes_valid=r.counters.lanes_valid + 1),
    "tokens_processed": lambda r, i: _counters(r, tokens_processed=r.counters.tokens_processed - 1),
    "kv_tokens_written": lambda r, i: _counters(r, kv_tokens_written=r.counters.kv_tokens_written + 1),
    "engine_sequence": lambda r, i: _counters(r, engine_sequence=9),
}


_PATTERNS = ([1], [1, 1], [0, 1], [1, 1, 0, 0], [1, 0, 1, 1])
"""Lane-valid patterns: B1 (the production profile), full batches and batches with inactive lanes."""


@pytest.mark.parametrize("corruption", sorted(_CORRUPTIONS))
def test_the_fast_path_finds_what_the_full_checks_find(corruption: str) -> None:
    """Every corruption at every lane of every pattern, with and without a previous engine sequence (5 follows
    the clean result's 6; 4 does not): exhaustive, so a dropped condition is found whatever it guards."""
    for valid in _PATTERNS:
        job, clean = _job(valid)
        for lane in range(len(valid)):
            result = _CORRUPTIONS[corruption](clean, lane)
            for previous in (None, 5, 4):
                fast = check_result(job, result, previous_engine_sequence=previous, output_rows=None)
                full = verification.anomalies(job, result, previous_engine_sequence=previous, output_rows=None)
                assert fast == full, (valid, lane, previous)


@pytest.mark.parametrize("valid", [[1], [1, 1, 0, 0], [0, 1]])
def test_a_clean_decode_result_skips_the_one_by_one_checks(valid: list[int],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is taken for a clean result (mutant: ``clean_decode`` always False — the figure of issue #20
    would silently return), and its verdict is the full checks' (nothing found)."""
    job, result = _job(valid)
    calls: list[object] = []
    monkeypatch.setattr(verification, "verify_result", lambda *a: calls.append(a))
    assert check_result(job, result, previous_engine_sequence=5, output_rows=None) == []
    assert check_result(job, result, previous_engine_sequence=None, output_rows=None) == []
    assert calls == []
