"""The joint monitor hears a decode step's moves in one call (issue #20, ``JointMonitor.observe_step``): what it
keeps and marks for its next check is what hearing each record alone (``observe``) keeps and marks."""

from __future__ import annotations

from typing import Any

import pytest

from calculet.runtime.scheduling.joint_checks import JointMonitor
from tests.unit.runtime.runtime_support import Harness


def _traffic(step_observer: Any, monitor: JointMonitor) -> list[tuple[Any, ...]]:
    """B1 and B4 decode steps of six streams, the monitor told of every other move one by one; after each step
    (and its result) what the monitor keeps, and clears its marks as a check would."""
    h = Harness.build(sizes=(1, 4), lanes=8, observer=monitor.observe, step_observer=step_observer)
    for n in range(6):
        h.submit(prompt=4, new=3 + n, deadline_ms=60_000)
    seen = []
    for _ in range(200):
        plan = h.step()
        if plan.work is None and h.confirm_all() == 0:
            return seen
        if plan.work is not None:
            h.scheduler.submitted(plan.work.job_id)
            seen.append(_kept(monitor))
            h.complete(plan.work)
            seen.append(_kept(monitor))
            h.confirm_all()
    raise AssertionError("the traffic did not end")


def _kept(monitor: JointMonitor) -> tuple[Any, ...]:
    kept = (sorted(monitor.records), dict(monitor.seq), sorted(monitor._dirty))  # noqa: SLF001
    monitor._dirty.clear()  # noqa: SLF001 - what a check does with them
    return kept


@pytest.mark.req("R9.2.1")
def test_a_step_observed_at_once_keeps_and_marks_what_each_record_would() -> None:
    """Mutant caught: ``observe_step`` not marking a record for the next check (a decode step's request not
    checked again until it moves otherwise)."""
    whole, single = JointMonitor(), JointMonitor()
    at_once = _traffic(whole.observe_step, whole)
    one_by_one = _traffic(lambda recs, _source, _targets: [single.observe(rec) for rec in recs], single)
    assert at_once == one_by_one
    assert any(dirty for _, _, dirty in at_once)
