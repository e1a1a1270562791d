"""The per-token time under ping/pong counts the other engine's sequences (issue #13, §14; FakeClock).

Why: the finish estimate's lane step on B>1 is :attr:`StepTimer.token_s`, Little's law over the
sequences in decode. With two decode jobs in flight the sequences of the other job are neither ready
nor in the job that completed, so they went uncounted and the per-token time read about half what a
sequence sees; the B16 ping/pong estimate was optimistic by a signed median of 22 % (steady preset).
"""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness

JOB_S = 0.1
"""Each decode job's time from submission to completion; the two engines are half a job apart."""


def _pingpong(h: Harness, completions: int) -> dict[int, list[float]]:
    """Keep two B4 decode jobs in flight, staggered by JOB_S / 2; returns each request's token times."""
    tokens: dict[int, list[float]] = {}
    flight: list[tuple[float, DecodeBatch]] = []
    for _ in range(2):
        work = h.next_decode()
        h.scheduler.submitted(work.job_id)
        flight.append((h.clock.now(), work))
        h.clock.advance(JOB_S / 2)
    for _ in range(completions):
        started, work = flight.pop(0)
        h.clock.advance(started + JOB_S - h.clock.now())
        h.complete(work)
        for lane in work.active:
            tokens.setdefault(lane.request_id, []).append(h.clock.now())
        h.confirm_all()
        again = h.next_decode()
        h.scheduler.submitted(again.job_id)
        flight.append((h.clock.now(), again))
    return tokens


def test_the_per_token_time_under_ping_pong_counts_the_sequences_of_the_other_job_in_flight():
    h = Harness.build(sizes=(4,), lanes=8, executor={"max_inflight": 2})
    for _ in range(8):
        h.submit(prompt=8, new=1000)
    assert h.prefill_all() == 8
    tokens = _pingpong(h, 600)
    gaps = [b - a for times in tokens.values() for a, b in zip(times[-50:], times[-49:])]
    assert len(tokens) == 8 and max(gaps) == pytest.approx(JOB_S) == pytest.approx(min(gaps))
    stats = h.scheduler.statistics().step_times
    assert stats.decode_step_s == pytest.approx(JOB_S)
    # each sequence gets a token every JOB_S; counting only the completed job's 4 lanes read JOB_S / 2
    assert stats.token_s == pytest.approx(JOB_S, rel=0.02)


def test_one_job_in_flight_is_unchanged_by_the_other_engine_count():
    """Without ping/pong nothing else is in flight: 8 sequences rotating on B4 get a token every two jobs,
    of which one job's wait counts (the lane schedule of the estimate models rotation beyond the widest
    batch, so the per-token time does not count it twice)."""
    h = Harness.build(sizes=(4,), lanes=8)
    for _ in range(8):
        h.submit(prompt=8, new=1000)
    assert h.prefill_all() == 8
    for _ in range(600):
        work = h.next_decode()
        h.scheduler.submitted(work.job_id)
        h.clock.advance(JOB_S)
        h.complete(work)
        h.confirm_all()
    assert h.scheduler.statistics().step_times.token_s == pytest.approx(JOB_S, rel=0.02)
