"""The scheduler step does only what changed (issue #20): what it skips, it skips exactly when there is nothing.

* The deadline sweep runs only once the soonest queued deadline is due (``DeadlineQueue.soonest``).
* The prefill classes are asked whether they are eligible, and the at-risk prefill whether it goes first, only
  while a prefill is queued (``PrefillScheduler.depth``, kept beside the per-class depths).

Each kept count must equal what it stands for after every call, or a step would skip work that is there: a
queued prefill never planned (a chunked prompt stuck after its first chunk), a deadline never enforced.
"""

from __future__ import annotations

import math
import random

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from tests.unit.runtime.runtime_support import Harness


def _agree(h: Harness) -> None:
    """The step's two counts against what they summarise."""
    s = h.scheduler
    assert s.prefill.depth == sum(s.prefill.statistics().depth.values())
    due = s._deadlines.next_due()  # noqa: SLF001 - the queue the step reads
    assert s._deadlines.soonest == (math.inf if due is None else due)  # noqa: SLF001


@pytest.mark.req("R6.1", "R7.2.1")
@pytest.mark.parametrize("seed", range(6))
def test_the_step_skips_nothing_that_is_there(seed: int) -> None:
    """Random traffic with chunked prompts, cancellations of queued and running requests, deadlines that pass
    while requests wait, prefill and decode: after every call both counts equal what they stand for, every
    request ends, and each request that was not cancelled or expired gets all its tokens. Mutants caught: the
    prefill depth not counted down when a queued prefill is discarded (cancel, deadline) or taken, or not
    counted up when a chunk is re-queued (the next chunk never planned); the soonest deadline not updated when
    a deadline is added (no request ever expires) or when the sweep pops one."""
    rng = random.Random(seed)
    h = Harness.build(sizes=(1, 4), lanes=6, chunk=8, caps=SchedulingCapabilities(incremental_prefill=True))
    ids: list[int] = []
    new_tokens: dict[int, int] = {}
    for _ in range(120):
        roll = rng.random()
        if roll < 0.3:
            sub = h.submit(prompt=rng.choice((4, 20, 40)), new=rng.randint(1, 6),
                           deadline_ms=rng.choice((None, 5, 50, 400)))
            if sub.request_id:
                ids.append(sub.request_id)
                new_tokens[sub.request_id] = h.rec(sub.request_id).max_new_tokens
        elif roll < 0.38 and ids:
            h.scheduler.cancel(rng.choice(ids))
        else:
            h.clock.advance(rng.choice((0.0, 0.001, 0.01)))
            plan = h.step()
            if plan.work is not None:
                h.run(plan)
            h.confirm_all()
        _agree(h)
    h.clock.advance(1.0)
    h.drive()
    _agree(h)
    assert h.scheduler.idle()
    for rid in ids:
        outcome = h.scheduler.registry.outcome(rid)
        assert outcome is not None, rid
        if outcome.state == "completed":
            assert len(h.sinks[rid].tokens) == new_tokens[rid]


def test_a_chunked_prompt_alone_runs_every_chunk() -> None:
    """One chunked prompt and nothing else queued: each re-queued chunk is planned at the next step (the
    depth counted it), then decode. Mutant caught: re-queueing that leaves the depth at 0."""
    h = Harness.build(sizes=(1,), lanes=2, chunk=8, caps=SchedulingCapabilities(incremental_prefill=True))
    rid = h.submit(prompt=30, new=2).request_id
    plans = h.drive()
    assert [type(p.work).__name__ for p in plans] == ["PrefillWork"] * 4 + ["DecodeBatch"]  # 8+8+8+6, then 1
    assert not isinstance(plans[0].work, DecodeBatch) and h.scheduler.registry.outcome(rid).state == "completed"
