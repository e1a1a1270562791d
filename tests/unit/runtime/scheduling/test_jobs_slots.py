"""InflightTable.has_slot (§14): a slot exists exactly when a job could be planned on a free engine.

``has_slot`` answers from the table's length alone (issue #20: it is asked twice a step); this holds it
equal to the full answer — fewer than ``max_inflight`` jobs *and* an engine no held job uses — over every
sequence of plans, ends and §14 degrades (``max_inflight`` lowered while a job on PONG still drains).

Mutants caught: ``<=`` for ``<`` in ``has_slot`` (a third job, or a second at max_inflight 1); ``has_slot``
reading a ``max_inflight`` fixed at construction (the degrade to 1 with one job held still answers yes).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.jobs import DECODE, InflightTable


def _full_answer(table: InflightTable) -> bool:
    """The rule as :meth:`InflightTable.plan` applies it: room in the table and a free engine."""
    return len(table) < table.max_inflight and table._free_engine() is not None  # noqa: SLF001


_ops = st.lists(st.one_of(st.just(("plan",)), st.tuples(st.just("end"), st.integers(0, 1), st.booleans()),
                          st.tuples(st.just("limit"), st.integers(1, 2))), max_size=24)


@settings(max_examples=200, deadline=None)
@given(max_inflight=st.integers(1, 2), fixed=st.booleans(), ops=_ops)
def test_has_slot_is_room_and_a_free_engine(max_inflight: int, fixed: bool, ops: list[tuple]) -> None:
    if fixed:
        max_inflight = 1
    table = InflightTable(max_inflight=max_inflight, fixed_engine=fixed)
    next_id = 1
    for op in ops:
        assert table.has_slot() == _full_answer(table)
        if op[0] == "plan" and table.has_slot():
            job = table.plan(next_id, DECODE, 1, 1, None)
            next_id += 1
            table.fire(job, "submit")
        elif op[0] == "end" and len(table):
            jobs = list(table)
            job = jobs[op[1] % len(jobs)]
            table.fire(job, "complete", ok=op[2])
        elif op[0] == "limit" and not fixed:  # Scheduler.limit_inflight: the §14 degrade and its end
            table.max_inflight = op[1]
    assert table.has_slot() == _full_answer(table)


def test_degrade_with_a_pong_job_draining_leaves_no_slot() -> None:
    """Two jobs on PING and PONG, the PING one ends, then the degrade to one at a time: PING is free but
    the PONG job still counts, so nothing may be planned until it drains."""
    table = InflightTable(max_inflight=2)
    ping = table.plan(1, DECODE, 1, 1, None)
    pong = table.plan(2, DECODE, 1, 1, None)
    assert not table.has_slot()
    for job in (ping, pong):
        table.fire(job, "submit")
    table.fire(ping, "complete", ok=True)
    assert table.has_slot()
    table.max_inflight = 1
    assert not table.has_slot()
    table.fire(pong, "complete", ok=True)
    assert table.has_slot()


def test_a_planned_job_is_its_machine_instance() -> None:
    """One object per job (issue #20): the table's record is the DeviceJobMachine instance — the declaration's
    parameters, its generated ``fire`` — with the kind and work it carries, and it leaves the table through its
    own declared events. Catches a record wrapping a second, separately created machine (``job.machine is not
    job``: two creations per decode step again) and a plan that drops the work or mislabels the kind."""
    from calculet.machines import DeviceJobMachine
    from calculet.machines.job import JobEngine

    table = InflightTable(max_inflight=2)
    work = object()
    job = table.plan(7, DECODE, 3, 4, work)
    assert isinstance(job, DeviceJobMachine.Instance) and job.machine is job
    assert (job.job_id, job.generation, job.engine, job.lanes) == (7, 3, JobEngine.PING, 4)
    assert (job.kind, job.work, job.submitted_at, job.state) == (DECODE, work, 0.0, "prepared")
    assert table.fire(job, "submit") == "submitted" and table.get(7) is job
    assert table.fire(job, "complete", ok=True) == "completed" and table.get(7) is None and job.delivered == 1
    assert table.statistics().ended == {"complete_ok": 1}
