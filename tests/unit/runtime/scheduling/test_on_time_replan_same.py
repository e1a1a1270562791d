"""The cheaper replan decides what the full one decided (issue #20, session 26; §5.2, §7.2).

The replan's admission cache is computed at its first read (:meth:`.on_time_cache._EdfCache.deferred`) and the
fair-share finish without a call per job (:func:`.finish_estimate.fair_share_finish`). Two B1 schedulers on the
on_time order, driven alike over random arrivals, steps of varying length (the plan's drift), cancels and ends — one
with the old forms (the cache built in the replan, the per-job fair share: ``_reference``) — must answer every submit
alike (status, Retry-After, estimated finish), shed and prioritise the same requests at every replan, plan the same
work, and end every request alike.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import calculet.runtime.scheduling.on_time_planner as on_time_planner
import calculet.runtime.scheduling.on_time_spare as on_time_spare
from calculet.runtime.scheduling.on_time_cache import _EdfCache
from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_fair_share_same import _reference

OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "step", "step", "step", "step", "cancel", "confirm"]),
                         st.sampled_from(["default", "gold"]), st.integers(1, 40), st.integers(1, 12),
                         st.integers(0, 50), st.sampled_from([None, 300, 1_500, 5_000])),
               min_size=40, max_size=140)
TENANTS = {"tenants": [{"name": "default"}, {"name": "gold", "weight": 3, "api_key_sha256": "a" * 64}]}
STEP = 0.05


def _trace(ops: list[tuple[str, str, int, int, int, int | None]]) -> list[Any]:
    """What one scheduler answered, planned and replanned for ``ops``."""
    h = Harness.build(sizes=(1,), lanes=6, step_estimate_s=STEP, **TENANTS)
    planner = h.scheduler.on_time.planner  # type: ignore[union-attr]
    seen: list[Any] = []
    replan = planner.replan

    def recorded(*args: Any) -> Any:
        plan = replan(*args)
        seen.append(("replan", [r.request_id for r in plan.shed], [r.request_id for r in plan.at_risk]))
        return plan

    planner.replan = recorded
    for op, tenant, prompt, new, pick, deadline_ms in ops:
        if op == "submit":
            sub = h.submit(prompt, new, tenant, deadline_ms)
            rec = h.rec(sub.request_id)
            seen.append((sub.outcome, None if rec is None else rec.estimated_finish))
        elif op == "step":
            plan = h.step()
            seen.append((plan.reason, type(plan.work).__name__))
            if plan.work is not None:
                h.scheduler.submitted(plan.work.job_id)
                h.clock.advance(STEP * (0.5 + pick / 25))  # a device now faster, now slower than planned
                h.complete(plan.work)
            else:
                h.clock.advance(STEP)
            h.confirm_all()
        else:
            seen.append(h.play(op, tenant, prompt, new, pick))
    seen.append(sorted((rid, h.state(rid)) for rid in h.sinks))
    seen.append(h.scheduler.statistics().on_time)
    return seen


@pytest.mark.req("R5.2.2", "R7.2.1")
@settings(deadline=None)
@given(OPS)
def test_the_cheaper_replan_decides_what_the_full_replan_decided(ops: list[tuple[str, str, int, int, int, int | None]]
                                                                 ) -> None:
    new = _trace(ops)
    deferred, fair_share = _EdfCache.__dict__["deferred"], on_time_spare.fair_share_finish
    _EdfCache.deferred = classmethod(lambda cls, *args: cls(*args))  # type: ignore[method-assign,assignment]
    on_time_spare.fair_share_finish = on_time_planner.fair_share_finish = _reference  # type: ignore[assignment]
    try:
        old = _trace(ops)
    finally:
        _EdfCache.deferred = deferred  # type: ignore[method-assign]
        on_time_spare.fair_share_finish = on_time_planner.fair_share_finish = fair_share
    assert new == old
    assert any(entry[0] == "replan" for entry in new if isinstance(entry, tuple)) or len(ops) < 60
