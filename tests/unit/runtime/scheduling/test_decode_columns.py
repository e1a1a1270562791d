"""The usual decode step as columns (issue #20): ``on_decode_complete((job, generation, tokens, stops))`` does what
the outcomes the columns stand for do (§7.4, R7.4.2, R7.4.3, §9.2).

The completion dispatcher hands the scheduler the usual step as columns, without one ``LaneOutcome`` per lane; the
scheduler applies them without building any when the job is current, of that generation, and every token usable,
and otherwise builds the outcomes from the batch's bindings and decides lane by lane. Either way the requests,
sinks, KV lanes and counts end as they do for the outcomes. Mutants: columns applied without the vocabulary check
(an unusable token delivered and its KV committed), without the generation check (a result of another generation
delivered), or the job looked up without its state (a late result delivered).
"""

from __future__ import annotations

import pytest

from calculet.runtime.scheduling.completion import DecodeCompletion, LaneOutcome
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from tests.unit.runtime.runtime_support import Harness, default_token

VOCAB = 1 << 20


def _step(columns: bool, case: str) -> tuple[Harness, object]:
    h = Harness.build(sizes=(4,), lanes=6, caps=SchedulingCapabilities(vocab_size=VOCAB))
    for i in range(3):
        h.submit(prompt=10 + i, new=6)
    h.prefill_all()
    batch: DecodeBatch = h.next_decode()
    h.scheduler.submitted(batch.job_id)
    generation, job_id = batch.generation, batch.job_id
    tokens = [default_token(b.request_id, b.position + 1) for b in batch.active]
    stops = [False] * len(tokens)
    if case == "stop":
        stops[1] = True
    elif case == "unusable":
        tokens[2] = VOCAB + 5
    elif case == "generation":
        generation += 6
    elif case == "stale":
        job_id += 100
    elif case == "late":
        h.scheduler.job_timed_out(batch.job_id, "late")
    if columns:
        applied = h.scheduler.on_decode_complete((job_id, generation, tokens, stops))
    else:
        lanes = tuple(LaneOutcome(b.lane, b.request_id, b.seq_id, generation, True, token, stop)
                      for b, token, stop in zip(batch.active, tokens, stops))
        applied = h.scheduler.on_decode_complete(DecodeCompletion(job_id, generation, True, lanes))
    return h, applied


def _seen(h: Harness, applied: object) -> tuple[object, ...]:
    sinks = {rid: (tuple(sink.tokens), tuple((o.state, o.finish_reason, o.detail) for o in sink.outcomes))
             for rid, sink in h.sinks.items()}
    stats = h.scheduler.statistics()
    return applied, sinks, h.kv.statistics(), stats.anomalies, stats.stale_completions


@pytest.mark.req("R7.4.2", "R7.4.3")
@pytest.mark.parametrize("case", ["usual", "stop", "unusable", "generation", "stale", "late"])
def test_columns_do_what_the_outcomes_they_stand_for_do(case: str) -> None:
    assert _seen(*_step(True, case)) == _seen(*_step(False, case))


def test_the_usual_columns_deliver_every_token() -> None:
    h, applied = _step(True, "usual")
    assert (applied.lanes_ok, applied.lanes_failed, applied.stale) == (3, 0, False)  # type: ignore[attr-defined]
    assert all(len(sink.tokens) == 2 and not sink.outcomes for sink in h.sinks.values())
