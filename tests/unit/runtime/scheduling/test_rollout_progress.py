"""Issue #13 session 22 (E22c): a chunked prompt's progress in the decode set's rollout.

A lane holder between two chunks (§6) has part of its prompt in KV (its lane's committed length); the rollout
read its whole prompt, so a half-prefilled prompt was rolled out as if none of it had run. The present now carries
what each lane holder has prefilled: only what is left is rolled out, in the class of the whole prompt (where the
scheduler re-queues a chunk). Checked on the model by hand, then through the sans-io scheduler.
"""

from __future__ import annotations

from typing import Any

import pytest

from calculet.runtime.scheduling import on_time
from calculet.runtime.scheduling.decode_rollout import DeviceShape, Present, rollout_finish
from calculet.runtime.scheduling.plan import SchedulingCapabilities
from calculet.runtime.scheduling.prefill import PrefillWork
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_on_time_never import advance


def _shape(lanes: int, chunk: int | None = None) -> DeviceShape:
    return DeviceShape(lanes=lanes, engines=1, profile_of=lambda n: 4, step_s={4: 0.1}.__getitem__,
                       prefill_s=lambda tokens: 0.001 * tokens, chunk_tokens=chunk)


@pytest.mark.req("R5.2.2")
def test_only_the_prompt_left_is_rolled_out_in_the_class_of_the_whole_prompt():
    """B4 at 0.1 s a step, prefill 1 ms a token, chunks of 500.
    (a) One lane, held by a 1000-token prompt with 800 prefilled, asking 2 tokens; the candidate (1-token prompt, asks
    1) waits for the lane: the 200 left (0.2 s, its first token), one step (0.1 s), then the candidate's prefill
    (0.001 s): 0.301 s, against 1.101 s rolled out whole.
    (b) Two lanes, one held by a 5000-token prompt (§6's *long* class) with 4900 prefilled, asking 1; the candidate
    (100 tokens, asks 1) takes the other lane: by §6's WRR (short 4 : long 1) its short prefill runs first, 0.1 s. Were
    the 100 left classed by themselves (short), the holder would be ahead of it in the short queue: 0.2 s.
    Mutants caught (each applied once): ``Present.prefilled`` ignored by the rollout ((a) 1.101 s); the class read
    from the tokens left instead of the whole prompt ((b) 0.2 s)."""
    half = Present(prefilling=((1000, 2),), prefilled=(800,))
    assert rollout_finish(half, 1, 1, 0.0, _shape(1, 500)) == pytest.approx(0.301)
    assert rollout_finish(Present(prefilling=((1000, 2),)), 1, 1, 0.0, _shape(1, 500)) == pytest.approx(1.101)
    long_left = Present(prefilling=((5000, 1),), prefilled=(4900,))
    assert rollout_finish(long_left, 100, 1, 0.0, _shape(2)) == pytest.approx(0.1)


@pytest.mark.req("R5.2.2")
def test_the_policys_present_carries_a_chunked_prompts_committed_length(monkeypatch: Any):
    """B1 + B4, chunks of 64, four lanes: a first request measures the step; a 200-token prompt then runs its first
    chunk and waits for the next (its lane has 64 committed). A candidate's rollout is handed a present whose lane
    holder has those 64 prefilled, read from the KV lane (the request machine carries none until the last chunk).
    Mutants caught (each applied once): the scheduler not handing ``prefilled`` to the policy (``()``); the policy not
    passing it to ``present_of`` (``()``); ``Scheduler._prefilled`` answering 0 (``(0,)``)."""
    h = Harness.build(sizes=(1, 4), lanes=4, chunk=64, caps=SchedulingCapabilities(incremental_prefill=True),
                      admission={"max_sequences": 4})
    h.submit(prompt=8, new=3, deadline_ms=600_000)
    advance(h, drained=True)
    long = h.submit(prompt=200, new=5, deadline_ms=600_000)
    plan = h.step()
    assert isinstance(plan.work, PrefillWork) and plan.work.tokens == 64
    h.run(plan)
    rec = h.rec(long.request_id)
    assert rec.state == "prefill_running" and h.kv.committed_len(rec.lease) == 64
    seen: list[Present] = []
    real = on_time.rollout_finish

    def spy(present: Present, *args: Any, **kwargs: Any) -> float | None:
        seen.append(present)
        return real(present, *args, **kwargs)

    monkeypatch.setattr(on_time, "rollout_finish", spy)
    candidate = h.rec(h.submit(prompt=8, new=5, deadline_ms=600_000).request_id)
    policy = h.scheduler.on_time
    assert policy.model() is not None
    policy._rollout_finish(candidate, h.clock.now(), h.scheduler.registry.live)
    assert seen and seen[-1].prefilling == ((200, 5),) and seen[-1].prefilled == (64,)
