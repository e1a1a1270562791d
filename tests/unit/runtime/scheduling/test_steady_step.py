"""The steady decode step (issue #20, :class:`~calculet.runtime.scheduling.changes.Changes`): a step, and a decode
result, that find the scheduler as the last admission pass left it — no request waiting, the same next deadline —
take the pass's answer instead of asking again. These tests hold it to asking every time (``Changes.reuse``
False): the same plans, wake-ups, admissions, tokens and outcomes, on random traffic; and they hold the count's
promise after every call — while ``calm`` equals ``count``, nothing waits and the next due deadline is ``wake``.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.plan import SchedulingCapabilities
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.traffic import play

OPS = ("submit", "submit", "cancel", "tick", "step", "step", "step", "fail", "confirm")
_op = st.tuples(st.sampled_from(OPS), st.integers(min_value=0, max_value=10**6))


def _promise(h: Harness) -> None:
    """``Changes``' promise: a calm count means nothing waits and the deadlines' next due is the kept wake-up."""
    changes = h.scheduler.changes
    if changes.calm == changes.count:
        assert h.scheduler.admission.waiting == 0
        assert changes.wake == h.scheduler._deadlines.next_due()  # noqa: SLF001 - the queue the step reads


def _play(ops: list[tuple[str, int]], reuse: bool) -> tuple[list[Any], int]:
    """Random traffic on a B1/B4 scheduler with few lanes (requests wait), chunked prompts, short deadlines,
    cancels and failed jobs; returns what the caller sees (every answer, plan, token and outcome, the
    statistics) and how many steps found the count calm. The count's promise is held after every call."""
    h = Harness.build(sizes=(1, 4), lanes=3, chunk=8, caps=SchedulingCapabilities(incremental_prefill=True),
                      tenants=[{"name": "a", "weight": 1.0}, {"name": "b", "weight": 3.0, "api_key_sha256": "b" * 64}])
    changes = h.scheduler.changes
    changes.reuse = reuse
    calm_steps = [0]

    def count_calm() -> None:
        calm_steps[0] += changes.calm == changes.count

    return play(h, ops, "ab", after_call=lambda: _promise(h), before_step=count_calm), calm_steps[0]


def _same_either_way(ops: list[tuple[str, int]]) -> None:
    on, _ = _play(ops, reuse=True)
    off, calm = _play(ops, reuse=False)
    assert calm == 0  # asking every time: never calm
    assert on == off


@pytest.mark.req("R5.1.2", "R7.2.1")
@settings(max_examples=60, deadline=None)
@given(st.lists(_op, min_size=1, max_size=90))
def test_the_steady_step_sees_what_asking_again_sees(ops: list[tuple[str, int]]) -> None:
    """Random traffic played twice, the steady step on and off: every answer, plan (its work, lanes, engine and
    wake-up), token, outcome and statistic is the same, and the count's promise holds after every call.
    Mutants caught (each checked to fail here): ``_on_transition`` not moving the count (a request queued while
    the count is calm: something waits, the step skips its admission); the deadline sweep not moving it (the sweep
    pops an ended request's deadline, the step keeps the old wake-up)."""
    _same_either_way(ops)


@pytest.mark.req("R5.1.2", "R7.2.1")
@pytest.mark.parametrize("seed", range(10))
def test_long_traffic_sees_what_asking_again_sees(seed: int) -> None:
    """The same on long seeded runs (120 calls: the pool fills and requests wait, which short examples seldom
    reach). Mutant caught besides the above: ``Changes.settle`` keeping a calm count while requests wait (the
    promise breaks: a request waits on a calm count, and no step admits it until something else moves)."""
    rng = random.Random(seed)
    _same_either_way([(rng.choice(OPS), rng.randrange(10**6)) for _ in range(120)])


@pytest.mark.req("R7.2.1")
def test_a_saturated_rotation_takes_the_pass_it_already_made() -> None:
    """Four streams decoding on three B1 lanes' worth of budget is the steady case: after the first steps every step
    finds the count calm, until a request ends (its transition moves the count) — then the next step asks
    again. Mutant caught: a count moved by the decode cycle's own steps (never calm: no step skips)."""
    h = Harness.build(sizes=(1,), lanes=4)
    for _ in range(4):
        h.submit(prompt=4, new=12, deadline_ms=60_000)
    h.prefill_all()
    changes = h.scheduler.changes
    calm = []
    for _ in range(24):
        calm.append(changes.calm == changes.count)
        h.run(h.step())
        _promise(h)
    assert sum(calm) >= 20
    h.drive()
    _promise(h)
    assert all(h.scheduler.registry.outcome(rid).state == "completed" for rid in h.sinks)


@pytest.mark.req("R5.1.2", "R5.2.2")
def test_a_request_queued_while_calm_is_admitted_when_a_lane_frees() -> None:
    """A calm rotation on a full pool, then a newcomer that must wait: the count moves with its ``bind``, the next
    pass sees it waiting, and it is admitted when a stream ends and its lane is released — the same step as
    asking every time. Mutant caught: ``_on_transition`` not moving the count (the promise breaks at once: a
    request waits on a calm count)."""
    h = Harness.build(sizes=(1,), lanes=2)
    first = [h.submit(prompt=4, new=3, deadline_ms=60_000).request_id for _ in range(2)]
    h.prefill_all()
    h.run(h.step())
    h.run(h.step())
    changes = h.scheduler.changes
    assert changes.calm == changes.count
    late = h.submit(prompt=4, new=2, deadline_ms=60_000).request_id
    _promise(h)
    assert h.state(late) == "waiting_admission"
    h.drive()
    assert [h.scheduler.registry.outcome(rid).state for rid in (*first, late)] == ["completed"] * 3
    assert len(h.sinks[late].tokens) == 2


@pytest.mark.req("R7.2.1")
def test_the_wake_up_follows_a_deadline_swept_for_an_ended_request() -> None:
    """A request that completed keeps its deadline queued until the sweep pops it (no transition tells): the
    steady step's wake-up must move on with the sweep. Mutant caught: the sweep not moving the count (the plan
    names the swept deadline as its wake-up, a past instant)."""
    h = Harness.build(sizes=(1,), lanes=2)
    short = h.submit(prompt=4, new=1, deadline_ms=50).request_id
    long = h.submit(prompt=4, new=40, deadline_ms=5_000).request_id
    h.prefill_all()
    h.confirm_all()
    assert h.scheduler.registry.outcome(short).state == "completed"
    plan = h.step()
    assert plan.wake_at == pytest.approx(0.05)
    h.run(plan)
    h.clock.advance(0.06)
    plan = h.step()
    assert plan.wake_at == pytest.approx(5.0) and not math.isclose(plan.wake_at, 0.05)
    _promise(h)
    h.run(plan)
    h.drive()
    assert h.scheduler.registry.outcome(long).state == "completed"


@pytest.mark.req("R5.1.2", "R5.2.2")
def test_a_full_pool_with_requests_waiting_keeps_its_blocked_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams decoding on two lanes, two requests waiting: once a pass finds the head held out (no free lane),
    the passes of the next steps and results take that answer (``Changes.blocked``) — counted as blocked each time,
    the queue not walked again — until a stream ends and its lane is released; the waiting ones are then admitted
    and every request completes. Mutants caught (each checked, here and by the random traffic above): the kept
    pass keyed without the free lanes (a lane released with no transition: the newcomer is never admitted by that
    release), a kept pass not counted as blocked (the statistics differ from asking again)."""
    h = Harness.build(sizes=(1,), lanes=2)
    ids = [h.submit(prompt=4, new=8, deadline_ms=60_000).request_id for _ in range(4)]
    h.prefill_all()
    h.confirm_all()
    walks = []
    admission = h.scheduler.admission
    real = admission.next_admissible
    monkeypatch.setattr(admission, "next_admissible", lambda free: walks.append(free) or real(free))
    blocked = admission.statistics().blocked.get("kv_lane", 0)
    for _ in range(6):
        h.run(h.step())
        _promise(h)
    assert len(walks) <= 1 and admission.statistics().blocked.get("kv_lane", 0) >= blocked + 6
    while all(h.scheduler.registry.outcome(rid) is None for rid in ids[:2]):  # until a stream ends
        h.run(h.step())
    assert [h.state(rid) for rid in ids[2:]] == ["waiting_admission"] * 2  # its lane not released yet
    h.confirm_all()  # released: no transition, the free lanes moved
    assert sorted(h.state(rid) for rid in ids[2:]) == ["prefill_ready", "waiting_admission"]
    h.drive()
    assert [h.scheduler.registry.outcome(rid).state for rid in ids] == ["completed"] * 4
