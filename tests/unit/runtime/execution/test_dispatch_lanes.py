"""CompletionDispatcher.decode matches each result lane to the request bound there by its sequence (§7.4).

With one binding (every B1 job) and with several, a lane whose sequence is the bound one is sampled for that
request; a lane naming any other sequence is unmatched — counted, never delivered to anyone. Mutants: a match
without the sequence's comparison (the only binding taken for any lane) delivers the unmatched lane's token; a
table keyed by lane instead of sequence mismatches the swapped B2 batch. The usual step (every lane its bound
lane's, in order) comes back as columns (issue #20); any other as one outcome per lane: the swapped batch is not
the usual step, and must not come back as columns, which would hand lane 0's token to lane 0's request.
"""

from __future__ import annotations

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
from calculet.runtime.execution.dispatch import CompletionDispatcher
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.execution.sampler import SamplerPool, SamplingParams
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.decode_select import LaneBinding


def _batch(bindings: tuple[LaneBinding, ...]) -> DecodeBatch:
    """A DecodeBatch with the fields the dispatcher reads (job id, generation, active bindings)."""
    return DecodeBatch(7, 1, None, bindings, (), (), (), None, 0.0, 0.0, ())  # type: ignore[arg-type]


def _dispatch(seqs: tuple[int, ...], bound: dict[int, int], result_seqs: tuple[int, ...]
              ) -> tuple[CompletionDispatcher, list[tuple[int, int, bool, int | None]]]:
    """Lanes ``0..len(seqs)-1`` on device sequences ``seqs``; ``bound`` maps a lane to its request (whose
    scheduler sequence is 100 + lane); the result's lanes name ``result_seqs``, each with token 40 + lane."""
    b = len(seqs)
    pool = SamplerPool()
    for rid in bound.values():
        pool.register(rid, SamplingParams(ignore_eos=True))
    bindings = tuple(LaneBinding(lane, rid, 100 + lane, 1, lane, 5, 3, "t", 9.0) for lane, rid in bound.items())
    buffers = JobBuffers(BufferHandle(1, BufferKind.INPUT, JobKind.DECODE, b, 64),
                         BufferHandle(2, BufferKind.OUTPUT, JobKind.DECODE, b, 64))
    spec = DecodeJob(generation=1, calbin_id=1, compiled_batch=b, engine=JobEngine.PING, buffers=buffers,
                     seq_ids=seqs, token_ids=np.array([5] * b), positions=np.array([3] * b),
                     lane_valid=np.array([1] * b))
    ticket = JobTicket(JobId(1), 1, JobKind.DECODE, JobEngine.PING, 1, 0.0)
    lanes = tuple(LaneResult(i, s, True, ReturnCode.OK, 3, 4, None, 40 + i) for i, s in enumerate(result_seqs))
    result = JobResult(JobId(1), 1, JobKind.DECODE, JobEngine.PING, 1, b, ReturnCode.OK, lanes,
                       StatusCounters(1, b, b, b), 0.0, 0.0, buffers.output)
    dispatcher = CompletionDispatcher(pool, lane_isolation=False)
    completion = dispatcher.decode(InflightJob(7, ticket, _batch(bindings), spec, 1.0, False), result, [])
    if isinstance(completion, tuple):  # the usual step as columns: lane i of the result is bound lane i's (#20)
        _, _, tokens, _ = completion
        return dispatcher, [(b.lane, b.request_id, True, token) for b, token in zip(bindings, tokens)]
    return dispatcher, [(o.lane, o.request_id, o.ok, o.token) for o in completion.lanes]


@pytest.mark.req("R7.4.1")
def test_a_b1_lane_on_the_bound_sequence_is_delivered_to_its_request() -> None:
    dispatcher, lanes = _dispatch((11,), {0: 3}, (11,))
    assert lanes == [(0, 3, True, 40)]
    assert dispatcher.statistics().lanes_unmatched == 0


@pytest.mark.req("R7.4.1")
def test_a_b1_lane_naming_another_sequence_is_not_delivered() -> None:
    dispatcher, lanes = _dispatch((11,), {0: 3}, (12,))
    assert lanes == [(0, 0, False, None)]
    assert dispatcher.statistics().lanes_unmatched == 1


@pytest.mark.req("R7.4.1")
def test_several_bindings_are_matched_by_sequence_not_by_lane() -> None:
    dispatcher, lanes = _dispatch((11, 12), {0: 3, 1: 4}, (11, 12))
    assert lanes == [(0, 3, True, 40), (1, 4, True, 41)]
    # the result names the sequences in swapped slots: each token goes to the request bound to that sequence
    dispatcher, lanes = _dispatch((11, 12), {0: 3, 1: 4}, (12, 11))
    assert lanes == [(0, 4, True, 40), (1, 3, True, 41)]  # outcomes, not columns (columns would say 3 got 40)
    dispatcher, lanes = _dispatch((11, 12), {0: 3, 1: 4}, (11, 13))
    assert lanes == [(0, 3, True, 40), (1, 0, False, None)]
    assert dispatcher.statistics().lanes_unmatched == 1
