"""B1's decode build is the general selection's trivial case (issue #20): the same batches, step for step.

:func:`~calculet.runtime.scheduling.decode_select.first_lane` builds B1's usual lane without the general pass
(:mod:`.decode_build`); anything unusual is left to :func:`~calculet.runtime.scheduling.decode_select.select_candidates`.
Two schedulers driven alike — one with the B1 case, one forced through the general pass — must plan the same
batches (lanes, positions, tokens, waits, the expired and invalid they turned away) and end every request alike:
the §7.1 selection and §7.2 order (R7.1.1, R7.2.1, R7.2.3) are decided in one place whichever path builds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calculet.runtime.scheduling.decode_build as decode_build
from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness

OPS = st.lists(st.tuples(st.sampled_from(["submit", "step", "step", "step", "cancel", "confirm", "advance"]),
                         st.sampled_from(["default", "gold", "bronze"]), st.integers(1, 40), st.integers(1, 12),
                         st.integers(0, 50), st.sampled_from([None, 200, 2_000, 60_000])),
               min_size=40, max_size=120)
TENANTS = {"tenants": [{"name": "default"}, {"name": "gold", "weight": 3, "api_key_sha256": "a" * 64},
                       {"name": "bronze", "weight": 1, "api_key_sha256": "b" * 64}]}


def _trace(ops: list[tuple[str, str, int, int, int, int | None]]) -> list[Any]:
    """What one scheduler planned and answered for ``ops`` (a B1 harness, several tenants, deadlines that pass)."""
    h = Harness.build(sizes=(1,), lanes=6, **TENANTS)
    seen: list[Any] = []
    for op, tenant, prompt, new, pick, deadline_ms in ops:
        if op == "advance":
            h.clock.advance(pick / 100)
            continue
        if op == "submit":
            seen.append(h.submit(prompt, new, tenant, deadline_ms).outcome)
            continue
        if op != "step":
            seen.append(h.play(op, tenant, prompt, new, pick))
            continue
        plan = h.step()
        work = plan.work
        if isinstance(work, DecodeBatch):
            seen.append((work.job_id, work.active, work.lane_tokens, work.lane_positions, work.lane_flags,
                         work.wait_s, [r.request_id for r in work.records], work.kv.lanes,
                         [r.request_id for r in work.expired], [(r.request_id, why) for r, why in work.invalid]))
        else:
            seen.append((plan.reason, type(work).__name__))
        if work is not None:
            h.run(plan)
            h.confirm_all()
    registry = h.scheduler.registry
    seen.append(sorted((rid, h.state(rid)) for rid in h.sinks))
    seen.append((h.scheduler.decode._vt, h.scheduler.decode.total_ready(), len(registry)))  # noqa: SLF001
    return seen


@pytest.mark.req("R7.1.1", "R7.2.1", "R7.2.3")
@settings(deadline=None)
@given(OPS)
def test_b1_case_plans_what_the_general_selection_plans(ops: list[tuple[str, str, int, int, int, int | None]]) -> None:
    with_case = _trace(ops)
    original = decode_build.first_lane
    decode_build.first_lane = lambda *args: None  # every B1 build through select_candidates
    try:
        general = _trace(ops)
    finally:
        decode_build.first_lane = original
    assert with_case == general


def test_b1_case_builds_the_usual_step() -> None:
    """The rotation's usual step takes the B1 case (the general pass is not asked) and makes a one-lane batch."""
    h = Harness.build(sizes=(1,), lanes=4)
    for _ in range(3):
        h.submit(prompt=8, new=6)
    h.prefill_all()
    asked: list[int] = []
    original = decode_build.select_candidates
    decode_build.select_candidates = lambda *args: asked.append(1) or original(*args)  # type: ignore[func-returns-value]
    try:
        batch = h.next_decode()
    finally:
        decode_build.select_candidates = original
    assert not asked
    assert len(batch.active) == 1 and batch.lane_flags == (1,) and batch.records[0].request_id == batch.active[0].request_id
    assert batch.kv.lanes == (batch.active[0].kv_lane,) and batch.expired == () and batch.invalid == ()
