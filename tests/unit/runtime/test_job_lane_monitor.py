"""Issue #17: JobLaneSystem's invariants evaluated on the live device jobs and KV lanes (R14.4, R5.1.2).

The monitor reads the jobs table (``InflightTable``: the jobs' ``DeviceJobMachine`` instances) and the
KV manager's lanes, binds each lane to the job whose submit opened its transaction, and evaluates the
declared invariants — and the step-end property declared beside them — before every job event (every
event in tests), and the declared step properties where the KV manager ends a lane's step (#20: the lane has
no in-flight state, so a wrong commit breaks no invariant). Seeded faults: a job that completes leaving one of
its lanes' steps open; a lane committed by another job's completion (by the KV manager directly, and in the
running scheduler with two jobs in flight); a lane marked Unknown by another job's timeout. The per-part verdict
is checked against the whole-system one on random states, and the step keys' verdict against ``broken_steps``
on the whole system; a check walks no declared expression (the monitor's table of verdicts per lane key, derived
at import).
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
from calculet.machines.system import NONE, CoupledSystem, SystemStep, SystemView
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
    kv.settle(a[0], "commit", job1)         # the fault: a[1]'s step is left open
    assert kv.open_list()[a[1].lane] and monitor.batch[a[1].lane] is job1
    assert monitor.verdict() == ["answered_job_leaves_no_step_open"]
    with pytest.raises(InvariantViolation) as info:
        _submit(table, kv, 2, _leases(kv, 3))   # the next job event is a step boundary
    assert info.value.invariant == "answered_job_leaves_no_step_open" and info.value.rid == "R14.4"


@pytest.mark.req("R14.4")
def test_a_lane_committed_by_another_jobs_completion_is_caught():
    """#20: the lane has no in-flight state, so job 1's end committing job 2's lane leaves a state every invariant
    accepts; the step property ``lane_commits_only_after_its_job_answered`` catches it where the KV manager
    commits. Mutant caught: the KV manager not calling the monitor at the commit (``KvLaneManager.steps`` unused,
    or ``attach`` not setting it): nothing is raised, and the next job event's state check passes."""
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1), _leases(kv, 2)
    job1 = _submit(table, kv, 1, a)
    job2 = _submit(table, kv, 2, b)
    table.fire(job1, "complete", ok=True)
    kv.settle(a[0], "commit", job1)
    with pytest.raises(InvariantViolation) as info:
        kv.settle(b[0], "commit", job1)     # the fault: job 1's end commits job 2's lane
    assert info.value.invariant == "lane_commits_only_after_its_job_answered" and info.value.rid == "R14.4"
    broken = [name for name, _ in info.value.post["broken"]]
    assert broken == ["lane_commits_only_after_its_job_answered", "open_step_closes_only_after_its_job_answered"]
    assert "job 1" in info.value.transition and f"lanes [{b[0].lane}]" in info.value.transition
    assert job2.state == "submitted" and monitor.verdict() == []   # no state invariant sees it (#20)


@pytest.mark.req("R14.4", "R7.4.6")
def test_a_quarantined_job_commits_its_lanes_only_when_its_completion_reported_the_fault():
    """R7.4.6 (#20): a job quarantined by a CCU fault its completion reported has answered for its lanes — with
    lane-level isolation a good lane commits (tests/integration/engine/test_lane_isolation.py); a job quarantined
    after a *timeout* has not, and a commit of its lane is caught where the KV manager takes it. Mutant caught
    (checked): JobLaneSystem's ``_answered`` taking every quarantined job (``fault_reported`` ignored)."""
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1, 2), _leases(kv, 3)
    reported = _submit(table, kv, 1, a)
    timed_out = _submit(table, kv, 2, b)
    table.fire(reported, "fault")
    assert reported.state == "quarantined" and reported.fault_reported
    kv.settle(a[0], "commit", reported)      # the good lane of the reported fault commits (isolation)
    kv.settle(a[1], "fault", reported)       # the reported lane is Unknown
    assert kv.committed_len(a[0]) == 1 and monitor.verdict() == []
    table.fire(timed_out, "timeout")
    table.fire(timed_out, "quarantine")
    assert timed_out.state == "quarantined" and not timed_out.fault_reported
    with pytest.raises(InvariantViolation) as info:
        kv.settle(b[0], "commit", timed_out)  # the fault: no result came back for it
    assert info.value.invariant == "lane_commits_only_after_its_job_answered"


@pytest.mark.req("R14.4", "R7.4.6")
def test_a_reported_fault_that_leaves_a_lane_pending_is_caught():
    """A job quarantined by a fault its completion reported has answered: the step that applies it settles every
    lane of its batch (R7.4.6: commit the good ones, fault the reported ones). Leaving one open is caught at the
    next step boundary by ``answered_job_leaves_no_step_open``. Mutant caught (checked): the step-end property
    reading only an *ended* job (the property before session 19's R7.4.6 decision)."""
    table, kv, monitor = _runtime()
    a = _leases(kv, 1, 2)
    job = _submit(table, kv, 1, a)
    table.fire(job, "fault")
    kv.settle(a[0], "commit", job)          # the fault: a[1] neither committed nor marked Unknown
    assert monitor.verdict() == ["answered_job_leaves_no_step_open"]
    with pytest.raises(InvariantViolation) as info:
        _submit(table, kv, 2, _leases(kv, 3))
    assert info.value.invariant == "answered_job_leaves_no_step_open"


@pytest.mark.req("R14.4", "R9.2.6")
def test_a_lane_marked_unknown_by_another_jobs_timeout_is_caught():
    table, kv, monitor = _runtime()
    a, b = _leases(kv, 1), _leases(kv, 2)
    job1 = _submit(table, kv, 1, a)
    _submit(table, kv, 2, b)
    table.fire(job1, "timeout")
    kv.settle(a[0], "fault")
    kv.settle(b[0], "fault", job1)          # the fault: job 1's timeout marks job 2's lane Unknown
    # a fault keeps the binding and commits nothing: no step property sees it, the state invariant does (job 2,
    # which the lane is bound to, is still on the device)
    assert monitor.verdict() == ["unknown_lane_names_its_job"]
    with pytest.raises(InvariantViolation) as info:
        monitor.check()
    assert info.value.invariant == "unknown_lane_names_its_job"


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
        jobs = [_Instance(job_id=k + 1, state=rnd.choice(job_states), fault_reported=rnd.random() < 0.5)
                for k in range(rnd.randint(0, 4))]
        opened = [rnd.choice((0, 1)) for _ in lanes]   # each lane's step open or not (bound only while open)
        kv = SimpleNamespace(lanes=len(lanes), lane=lambda i, lanes=lanes: lanes[i], open_list=lambda o=opened: o)
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

    def settle_but_once(lease, verdict, job):  # type: ignore[no-untyped-def]
        if not skipped:
            skipped.append(lease)   # the fault: the lane's step stays open
            return None
        return real(lease, verdict, job)

    monkeypatch.setattr(applier, "_settle_kv", settle_but_once)
    h.submit(prompt=8, new=3)
    h.submit(prompt=8, new=3)
    with pytest.raises(InvariantViolation) as info:
        h.drive()
    assert skipped and info.value.invariant == "answered_job_leaves_no_step_open"


@pytest.mark.req("R14.4", "R9.2.1")
def test_a_scheduler_whose_completion_commits_another_jobs_lanes_is_caught(monkeypatch):
    """#20's cross-job commit in the running scheduler: two decode jobs in flight (PING/PONG), and the first one's
    completion commits the second one's lane as well as its own (``KvLaneManager.commit_batch`` given the other
    job's reservation too, with the job ``apply.py`` passes). No state invariant sees it (the lane has no in-flight
    state); the step property does, at the commit, naming the completing job. Mutants caught (each checked: the
    test fails): the KV manager's batch commit not calling the monitor (``commit_batch`` without its step check);
    ``attach`` not hooking the monitor into the KV manager (``kv.steps`` left None); ``apply.py`` not passing the
    completing job to ``commit_batch`` (the report does not name it). The fault is injected into the layered path's
    ``commit_batch``, so the B1 composite (``step_done``, which the fault would not pass through) is off here."""
    from calculet.runtime.scheduling import step_done
    from tests.unit.runtime.runtime_support import Harness
    monkeypatch.setattr(step_done, "COMPOSITE", None)
    h = Harness.build(sizes=(1,), lanes=4, executor={"max_inflight": 2})
    h.submit(prompt=8, new=3)
    h.submit(prompt=8, new=3)
    h.prefill_all()
    first, second = h.step().work, None
    h.scheduler.submitted(first.job_id)
    second = h.step().work
    h.scheduler.submitted(second.job_id)
    assert first.kv.lanes != second.kv.lanes
    kv = h.kv
    real = kv.commit_batch

    def commit_both(reservation, job=None):  # type: ignore[no-untyped-def]
        real(reservation, job)
        if reservation is first.kv:
            real(second.kv, job)   # the fault: the first job's end commits the second job's lane

    monkeypatch.setattr(kv, "commit_batch", commit_both)
    with pytest.raises(InvariantViolation) as info:
        h.complete(first)
    assert info.value.invariant == "lane_commits_only_after_its_job_answered"
    assert info.value.transition == f"commit of lanes [{second.kv.lanes[0]}] at the end of job {first.job_id}"
    assert h.scheduler.jobs.get(second.job_id).state == "submitted"
    assert h.scheduler.job_lanes.verdict() == []   # the state after it breaks no invariant (#20)


@pytest.mark.req("R14.4")
def test_the_step_keys_verdict_equals_broken_steps_on_the_whole_system():
    """The monitor's step verdict (each settled lane's step key looked up, module doc *Steps*) equals the declared
    step properties evaluated by ``broken_steps`` on the whole system before and after, on random steps of random
    systems, consistent or not (lanes bound to any job, committed lengths growing or not, bindings dropped or
    kept). Mutants caught (each checked: the test fails): ``step_keys`` reading the bound job's state after the
    step instead of before; ``step_keys`` taking a lane as bound after the step only when bound to the same job as before
    (the declared properties read ``post.unbound(i)`` alone: a lane another job's batch took is bound); the key
    leaving out the job's ``fault_reported`` (R7.4.6: a quarantined job whose completion reported the fault)."""
    from calculet.runtime.scheduling.job_lane_monitor import step_verdict
    rnd = random.Random(20)
    lane_states = list(KvSequenceMachine.definition.states)
    job_states = list(DeviceJobMachine.definition.states)
    names = [sp.name for sp in SD.step_properties]
    seen = set()
    for _ in range(600):
        n = rnd.randint(1, 4)
        jobs = [_Instance(job_id=k + 1, state=rnd.choice(job_states), fault_reported=rnd.random() < 0.5)
                for k in range(rnd.randint(1, 3))]
        pre_lanes = [_Instance(state=rnd.choice(lane_states), committed_len=rnd.randint(0, 2)) for _ in range(n)]
        opened = [rnd.choice((0, 1)) for _ in range(n)]
        table = _Table(jobs)
        for i in range(n):
            table.binding[i] = rnd.choice(jobs)
        lanes = list(pre_lanes)
        kv = SimpleNamespace(lanes=n, lane=lambda i: lanes[i], lane_list=lambda: lanes, open_list=lambda: opened)
        monitor = JobLaneMonitor(kv, table)
        pre_binding = [jobs.index(table.binding[i]) if opened[i] else NONE for i in range(n)]
        pre_jobs = [_Instance(job_id=j.job_id, state=j.state, fault_reported=j.fault_reported) for j in jobs]
        before = monitor.before(range(n))
        event = rnd.choice(("commit", "abort", "fault", "recover"))
        # the step: each lane may change state, grow, close its step, or be taken by another job's batch
        lanes[:] = [_Instance(state=rnd.choice((m.state, rnd.choice(lane_states))),
                              committed_len=m.committed_len + rnd.choice((0, 0, 1))) for m in pre_lanes]
        for i in range(n):
            if rnd.random() < 0.4:
                opened[i] = 0
            elif rnd.random() < 0.2:
                table.binding[i] = rnd.choice(jobs)
        for j in jobs:
            if rnd.random() < 0.2:
                j.state = rnd.choice(job_states)   # a job moved meanwhile: the step reads its state before
                j.fault_reported = rnd.random() < 0.5
        post_binding = [jobs.index(table.binding[i]) if opened[i] else NONE for i in range(n)]
        whole = SD.broken_steps(SystemView(pre_lanes, pre_jobs, pre_binding, [0] * n),
                                SystemView(lanes, pre_jobs, post_binding, [0] * n), SystemStep(event))
        keys = monitor.step_keys(before, event)
        seen.update(keys)
        assert sorted(whole) == sorted(name for name in names if any(name in step_verdict(k) for k in keys))
    assert len(seen) > 100
