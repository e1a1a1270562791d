"""Issue #20: a job admitted at the cached schedule's tail is kept as its values and built when read.

``OnTimePlanner.admit`` places most candidates at the tail of the cached EDF lane schedule and keeps their
``PendingJob`` values, not the job (:mod:`calculet.runtime.scheduling.on_time_kept`): the job is built
when the kept list is read (the slow path, the admission-order estimate) and never when the next plan
rebuilds the set first. These tests drive the same operations through a scheduler that keeps values and
one whose kept list is read (so built) after every operation — the jobs as they were built at each
``submit()`` before — and require the same decisions, estimates, kept jobs and plan flags throughout.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.finish_estimate import PendingJob
from calculet.runtime.scheduling.on_time_kept import KeptJobs, job_values, pending_job
from calculet.runtime.scheduling.on_time_planner import OnTimePlanner
from tests.unit.runtime.runtime_support import Harness

TENANTS = [{"name": "a", "api_key_sha256": "a" * 64}, {"name": "b", "weight": 3, "api_key_sha256": "b" * 64},
           {"name": "default"}]
STEP_S = 0.05


def _harness(size: int, lanes: int) -> Harness:
    """``size`` 1: more sequences than a step decodes (the EDF plan binds); ``size`` = ``lanes``: every
    sequence is in each step (the admission order's estimate reads the kept list at each admission)."""
    return Harness.build(sizes=(size,), lanes=lanes, tenants=TENANTS, step_estimate_s=STEP_S,
                         admission={"max_sequences": lanes, "max_waiting_requests": 64})


def _planner(h: Harness) -> OnTimePlanner:
    assert h.scheduler.on_time is not None
    return h.scheduler.on_time.planner


def _kept_as_built(planner: OnTimePlanner) -> list[PendingJob]:
    """The kept list as :meth:`KeptJobs.jobs` would build it, without building it (the set is left as is)."""
    kept = planner._kept
    return [*kept._jobs, *(PendingJob.trusted(*values) for values in kept._since)]


def _view(h: Harness) -> Any:
    planner = _planner(h)
    recs = sorted(h.scheduler.registry.live(), key=lambda r: r.request_id)
    return ([(r.request_id, r.state, r.estimated_finish, r.at_risk) for r in recs], _kept_as_built(planner),
            len(planner._kept), planner.dirty, planner.stale, planner.epoch, planner.statistics())


OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "step", "cancel", "wait"]),
                         st.sampled_from(["a", "b", "default"]), st.sampled_from([4, 16, 40]),
                         st.sampled_from([2, 8, 30]), st.sampled_from([None, 300, 1500, 20_000]),
                         st.integers(0, 50)), max_size=40)


@settings(max_examples=80)
@given(ops=OPS, shape=st.sampled_from([(1, 4), (4, 4), (4, 8)]))
def test_jobs_kept_as_values_decide_as_jobs_built_at_submit(ops: list[tuple[str, str, int, int, int | None, int]],
                                                             shape: tuple[int, int]):
    kept_values, built = _harness(*shape), _harness(*shape)
    for op, tenant, prompt, new, deadline_ms, pick in ops:
        results = []
        for h in (kept_values, built):
            if op == "submit":
                sub = h.submit(prompt, new, tenant, deadline_ms)
                results.append((sub.request_id, sub.outcome))
            elif op == "step":
                plan = h.step()
                results.append(None if plan.work is None else type(plan.work).__name__)
                if plan.work is not None:
                    h.run(plan)
                    h.confirm_all()
            elif op == "cancel":
                live = sorted(r.request_id for r in h.scheduler.registry.live())
                results.append(h.scheduler.cancel(live[pick % len(live)]).result if live else None)
            else:
                h.clock.advance(pick * STEP_S / 10)
                results.append(None)
        _planner(built)._kept.jobs()  # the reference: every job built as soon as it is admitted
        assert results[0] == results[1]
        assert _view(kept_values) == _view(built)


def test_a_tail_admission_keeps_values_and_a_read_builds_the_same_jobs_in_order():
    h = _harness(1, 4)
    planner = _planner(h)
    subs = [h.submit(8, 4, "a", 20_000) for _ in range(3)]
    assert all(not s.outcome.rejected for s in subs)
    kept = planner._kept
    assert len(kept._since) >= 2 and len(kept) == len(kept._jobs) + len(kept._since)  # placed at the tail
    expected = [pending_job(h.rec(s.request_id), 1.0) for s in subs]
    jobs = kept.jobs()
    assert jobs[-3:] == expected and kept._since == [] and kept.jobs() is jobs  # built once, the same list
    assert [job.id for job in jobs[-3:]] == [s.request_id for s in subs]


def test_an_admitted_request_held_as_values_is_in_the_set_when_it_ends():
    h = _harness(1, 4)
    planner = _planner(h)
    h.step()  # a plan: what follows is admitted at the cache's tail
    sub = h.submit(8, 4, "a", 20_000)
    assert planner.keeps(sub.request_id) and planner._kept._since[-1][0] == sub.request_id
    planner.stale = False
    h.scheduler.cancel(sub.request_id)
    assert planner.stale  # its work left the kept set: the cache may not refuse until the next plan
    kept = KeptJobs([PendingJob(1, 2, 3, 4.0)])
    kept.admitted((5, 6, 7, None, 1.0))
    assert kept.holds(1) and kept.holds(5) and not kept.holds(6) and len(kept) == 2


@pytest.mark.parametrize("state", ["prefill_ready", "decode_ready"])
def test_job_values_are_the_pending_jobs_fields(state: str):
    h = _harness(1, 4)
    sub = h.submit(8, 5, "b", 20_000)
    rec = h.rec(sub.request_id)  # admitted at once: prefill_ready
    if state == "decode_ready":
        h.prefill_all()
    assert rec.state == state
    values = job_values(rec, 3.0)
    job = pending_job(rec, 3.0)
    assert values is not None and job == PendingJob(*values)
    assert (job.prefill_tokens, job.decode_steps) == ((8, 4) if state == "prefill_ready" else (0, 4))
