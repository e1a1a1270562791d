"""Issue #17: JobLaneSystem's invariants evaluated on the live device jobs and KV lanes (R14.4, R5.1.2).

The monitor reads the jobs table (``InflightTable``: the jobs' ``DeviceJobMachine`` instances) and the
KV manager's lanes, binds each lane to the job whose submit opened its transaction, and evaluates the
declared invariants — and the step-end property declared beside them — before every job event (every
event in tests). Seeded faults: a job that completes leaving one of its lanes pending; a lane committed
by another job's completion; a lane marked Unknown by another job's timeout. The per-part verdict is
checked against the whole-system one on random states; a check walks no declared expression (the
monitor's table of verdicts per lane key, derived at import).
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from calculet.invariants.strength import check_system_witnesses
from calculet.machines.errors import InvariantViolation
from calculet.machines.job import DeviceJobMachine
from calculet.machines.job_lanes import SETTLED_AT_STEP_END, JobLaneSystem
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.system import CoupledSystem
from calculet.runtime.scheduling.job_lane_monitor import JobLaneMonitor, attach
from calculet.runtime.scheduling.jobs import DECODE, InflightTable
from calculet.runtime.scheduling.kv import KvBatchReservation, KvLaneManager

SD = JobLaneSystem.definition


def _runtime(lanes: int = 4, max_inflight: int = 2):  # type: ignore[no-untyped-def]
    table = InflightTable(max_inflight=max_inflight)
    kv = KvLaneManager(lanes, 64)
    return table, kv, attach(table, kv)


def _submit(table: InflightTable, kv: KvLaneManager, job_id: int, leases):  # type: ignore[no-untyped-def]
    """What Scheduler.plan + submitted do: plan the job, fire submit, open each lane's transaction."""
    reservation = kv.reserve_batch(leases)
    job = table.plan(job_id, DECODE, 1, len(leases), SimpleNamespace(kv=reservation))
    table.fire(job, "submit")
    kv.submit_batch(reservation)
    return job


def _leases(kv: KvLaneManager, *seqs: int):  # type: ignore[no-untyped-def]
    return [kv.reserve(1, 8, seq_id=s) for s in seqs]


@pytest.mark.req("R14.4")
def test_the_step_end_property_has_a_witness_and_is_not_an_induction_invariant():
    system = type("StepEnd", (CoupledSystem,), {
        "__doc__": "JobLaneSystem's step-end property.", "spec": SD.spec, "request": SD.request, "lane": SD.lane,
        "steps": list(SD.steps), "invariants": list(SETTLED_AT_STEP_END), "omitted": list(SD.omitted)})
    assert check_system_witnesses(system.definition).ok
    assert not {inv.name for inv in SETTLED_AT_STEP_END} & {inv.name for inv in SD.invariants}


@pytest.mark.req("R14.4", "R9.2.1")
def test_a_correct_runtime_passes_every_check():
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1, 2), _leases(kv, 3, 4)
    job1 = _submit(table, kv, 1, a)
    job2 = _submit(table, kv, 2, b)       # PING and PONG in flight, each with its own lanes
    assert monitor.verdict() == [] and monitor.broken() == []
    table.fire(job1, "complete", ok=True)
    for lease in a:
        kv.settle(lease, "commit")
    table.fire(job2, "timeout")
    for lease in b:
        kv.settle(lease, "fault")
    monitor.check()
    table.fire(job2, "late_complete")
    for lease in b:
        kv.recover(lease.lane)
    monitor.check()
    assert {monitor.batch[lane].job_id for lane in range(4)} == {1, 2}   # ended jobs stay bound, as in the model


@pytest.mark.req("R14.4", "R7.4.2", "R7.4.6")
def test_a_completed_job_may_leave_its_own_mismatched_lane_unknown():
    """R7.4.2/R7.4.6: a completion in time whose result for one lane does not match it (or that reports
    the lane failed) marks that lane Unknown — its own lane, so JobLaneSystem allows it (the monitor found
    the first declaration forbidding it on the concurrency test's lane crosstalk)."""
    table, kv, monitor = _runtime()
    a = _leases(kv, 1, 2)
    job = _submit(table, kv, 1, a)
    table.fire(job, "complete", ok=True)
    kv.settle(a[0], "commit")
    kv.settle(a[1], "fault")
    monitor.check()
    assert monitor.verdict() == []


@pytest.mark.req("R14.4", "R9.2.1")
def test_a_job_that_completes_leaving_a_lane_pending_is_caught():
    table, kv, monitor = _runtime()
    a = _leases(kv, 1, 2)
    job1 = _submit(table, kv, 1, a)
    table.fire(job1, "complete", ok=True)
    kv.settle(a[0], "commit")               # the fault: a[1] is left pending
    assert monitor.verdict() == ["ended_job_leaves_no_lane_pending"]
    with pytest.raises(InvariantViolation) as info:
        _submit(table, kv, 2, _leases(kv, 3))   # the next job event is a step boundary
    assert info.value.invariant == "ended_job_leaves_no_lane_pending" and info.value.rid == "R14.4"


@pytest.mark.req("R14.4")
def test_a_lane_committed_by_another_jobs_completion_is_caught():
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1), _leases(kv, 2)
    job1 = _submit(table, kv, 1, a)
    job2 = _submit(table, kv, 2, b)
    table.fire(job1, "complete", ok=True)
    kv.settle(a[0], "commit")
    kv.settle(b[0], "commit")               # the fault: job 1's end commits job 2's lane
    with pytest.raises(InvariantViolation) as info:
        table.fire(job2, "complete", ok=True)
    assert info.value.invariant == "lanes_of_a_job_on_the_device_are_pending"
    assert job2.state == "submitted"        # caught before the next event fired


@pytest.mark.req("R14.4", "R9.2.6")
def test_a_lane_marked_unknown_by_another_jobs_timeout_is_caught():
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1), _leases(kv, 2)
    job1 = _submit(table, kv, 1, a)
    _submit(table, kv, 2, b)
    table.fire(job1, "timeout")
    kv.settle(a[0], "fault")
    kv.settle(b[0], "fault")                # the fault: job 1's timeout marks job 2's lane Unknown
    broken = monitor.verdict()
    assert "lanes_of_a_job_on_the_device_are_pending" in broken and "unknown_lane_names_its_job" in broken
    with pytest.raises(InvariantViolation):
        monitor.check()


@pytest.mark.req("R14.4")
def test_two_jobs_on_the_device_holding_one_lane_is_caught():
    table, kv, monitor = _runtime()
    a = _leases(kv, 1)
    _submit(table, kv, 1, a)
    job2 = table.plan(2, DECODE, 1, 1, SimpleNamespace(kv=KvBatchReservation(tuple(a))))
    job2.machine.fire("submit")             # the fault: a second batch claims the lane, bypassing the table
    assert monitor.index_faults() == [("lane_in_two_batches_on_the_device", "R14.4")]


class _Instance(SimpleNamespace):
    def at(self, *states: str) -> bool:
        return self.state in states


class _Table(list):
    """A jobs table as the monitor reads it: its jobs, and the binding it keeps (``InflightTable.binding``)."""

    def __init__(self, jobs: Any) -> None:
        super().__init__(jobs)
        self.binding: dict[int, Any] = {}


@pytest.mark.req("R14.4", "R5.1.2")
def test_the_per_part_verdict_equals_the_whole_system_verdict():
    """Parts (each job with its lanes, the unbound lanes, every job for the budget) give the same broken
    invariants as one view over everything, on random states, consistent or not."""
    rnd = random.Random(17)
    lane_states = list(KvSequenceMachine.definition.states)
    job_states = list(DeviceJobMachine.definition.states)
    for _ in range(400):
        lanes = [_Instance(state=rnd.choice(lane_states)) for _ in range(rnd.randint(1, 5))]
        # a job is its machine (the table's record is the DeviceJobMachine instance, issue #20)
        jobs = [_Instance(job_id=k + 1, state=rnd.choice(job_states)) for k in range(rnd.randint(0, 4))]
        kv = SimpleNamespace(lanes=len(lanes), lane=lambda i, lanes=lanes: lanes[i])
        table = _Table(j for j in jobs if not j.at("completed", "failed"))  # ended jobs left it, may stay bound
        monitor = JobLaneMonitor(kv, table)
        for i in range(len(lanes)):
            if jobs and rnd.random() < 0.7:
                monitor.batch[i] = rnd.choice(jobs)
        assert sorted(monitor.verdict()) == sorted(monitor.broken())


@pytest.mark.req("R14.4")
def test_the_scheduler_runs_the_monitor(monkeypatch):
    """Every Scheduler hooks the monitor into its jobs table; the runtime tests run it at every job event."""
    from tests.unit.runtime.runtime_support import Harness
    h = Harness.build(sizes=(1,), lanes=4)
    assert h.scheduler.jobs.check == h.scheduler.job_lanes.observe
    seen = []
    monkeypatch.setattr(h.scheduler.job_lanes, "check", lambda after="check": seen.append(after))
    h.submit(prompt=8, new=3)
    h.drive()
    assert any("submit" in s for s in seen) and any("complete" in s for s in seen)
    assert h.scheduler.job_lanes.batch   # lanes bound to the jobs that opened their transactions


@pytest.mark.req("R14.4", "R5.1.2")
def test_a_check_evaluates_no_declared_expression():
    """A check looks each live lane's key up in the table derived from the declarations at import: it walks no
    expression (issue #20). Mutant caught: ``_Across.predicate`` evaluating the declared predicate on each
    lane's view again (the table unused); the verdicts stay equal, only this catches it."""
    import sys

    import calculet.logic.expr as expr
    import calculet.machines.system as system

    table, kv, monitor = _runtime(lanes=8)
    _submit(table, kv, 1, _leases(kv, 1, 2, 3))
    walked: list[str] = []

    def hook(frame, event, _arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename in (expr.__file__, system.__file__):
            walked.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        monitor.check("test")
    finally:
        sys.setprofile(None)
    assert monitor.verdict() == []
    # the budget's count over the (at most max_inflight) jobs is the only declared predicate evaluated: one If
    # per job, nothing per lane
    assert set(walked) <= {"__init__", "beyond", "If", "is_symbolic"}, walked
    assert walked.count("If") == len(table) == 1


@pytest.mark.req("R14.4", "R9.2.1")
def test_a_scheduler_whose_completion_skips_a_lane_is_caught(monkeypatch):
    """The seeded fault in the running scheduler: a prefill completion that ends its job but does not settle
    its lane (CompletionApplier._settle_kv dropped once). The next job event of the scheduler is a step
    boundary where the monitor finds the ended job's lane still pending."""
    from tests.unit.runtime.runtime_support import Harness
    h = Harness.build(sizes=(1,), lanes=4)
    applier = h.scheduler.completions
    real = applier._settle_kv
    skipped: list[object] = []

    def settle_but_once(lease, verdict):  # type: ignore[no-untyped-def]
        if not skipped:
            skipped.append(lease)   # the fault: the lane's transaction stays open
            return None
        return real(lease, verdict)

    monkeypatch.setattr(applier, "_settle_kv", settle_but_once)
    h.submit(prompt=8, new=3)
    h.submit(prompt=8, new=3)
    with pytest.raises(InvariantViolation) as info:
        h.drive()
    assert skipped and info.value.invariant == "ended_job_leaves_no_lane_pending"
