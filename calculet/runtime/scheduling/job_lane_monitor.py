"""Run-time monitor of device jobs × KV lanes (§14, R14.4, R5.1.2's in-flight budget; issue #17).

:class:`~calculet.machines.job_lanes.JobLaneSystem` proves that each in-flight job has its own KV
transaction: a pending lane belongs to one job's batch, only its own job's end settles it, a fault
marks Unknown only its own lanes, at most ``max_inflight`` jobs hold a device slot. This evaluates
the *same* declared invariants on the live objects — the scheduler's jobs (:class:`InflightTable`'s
``DeviceJobMachine`` instances) and the KV manager's lanes (``KvSequenceMachine`` instances) — so
a runtime that settles a lane by the wrong job's end is caught where it runs.

*Binding.* The model's ``binding[lane] = job``: the job of the lane's open step (#20). The KV manager knows
whether a lane's step is open (``KvLaneManager.open_list``), not which job it is; the jobs table keeps the job
whose batch last took each lane (``InflightTable.binding``): on ``submit`` the job's lanes (its batch) are bound to
it — exactly the model's ``enlist`` after ``job:submit`` — and a lane is bound while its step is open. An ended job stays in the table's map (its final
machine state) until another job takes its lanes, as in the model.

*When.* The runtime does a job's event and its lanes' settlement in one actor step (a completion
ends the job, then settles each lane of its batch); the declared invariants hold between such
steps. Every job event starts a new step of that kind, so the state just *before* a job event is a
step boundary: that is where ``observe`` checks (at the monitors' sampled rate: every event in the
test suite, one in ``monitoring.sample_every`` in production; the table draws, issue #20); the start
of each scheduler step is another (``drawn``, the scheduler drawing: a request that moves on a lane
left pending is seen there before the lane's own machine refuses the move), and the engine's tick
(``boundary``); :meth:`check` checks at any other boundary (tests).

*At step ends only.* ``JobLaneSystem.SETTLED_AT_STEP_END`` (declared there, with a negative witness)
adds what only a boundary can show: no ended job leaves a lane of its batch pending. The model
settles lanes one event at a time, so the induction cannot state it; the runtime's step can.

*A table.* The declared predicates read a lane's state, whether it is bound, and the state of the job it is
bound to, nothing else (no length, no id: the random-state tests give them objects with nothing else); and every
declared JobLaneSystem invariant but the budget is a ∀ over lanes (and jobs) whose instance reads one lane and,
through ``bound(i, j)``, only the job it is bound to (``all_requests`` / ``all_pairs`` with every conjunct
guarded by ``bound`` or ``unbound``). So such an invariant holds on the whole system iff it holds on each lane's
one-lane view (the lane, and its job if bound), and that view's verdict is a function of the lane's *key* (its
state, its job's state and ``fault_reported`` — R7.4.6 — or :data:`UNBOUND`). The verdicts of every key — 5 lane
states × (6 × 2 + 1), from the two machines' declarations — are evaluated once, at import, with the declared
predicates on views of stand-ins that carry only those (:data:`BROKEN_BY_KEY`); a check collects the live lanes' keys (O(lanes) plain reads) and looks them up,
so it evaluates no expression (issue #20: 212 µs for a 16-lane check through the expression helpers, per job
part, before; the check is now as cheap as the snapshot comparison that used to decide which parts to evaluate,
so that comparison went too). The in-flight budget counts jobs: it is evaluated on the view holding every job in
the table and no lane. The tests compare the table's verdict with the declared predicates on the whole system
(``test_job_lane_monitor``), on random states, consistent or not.

*Steps.* A lane's step has no in-flight state (#20): a lane committed while its job is still on the device, or by
another job's end, leaves both states satisfying every invariant above, so a state check cannot see it. The
declared step properties (``JobLaneSystem.step_properties``: ``lane_commits_only_after_its_job_answered``,
``open_step_closes_only_after_its_job_answered``) see it, and their run-time form is evaluated where the lanes' steps
end: the KV manager's ``settle``/``settle_batch``/``commit_batch``/``commit``/``abort``/``recover`` call
:meth:`JobLaneMonitor.before` on the lanes they are about to settle and :meth:`JobLaneMonitor.after` once settled
(:attr:`KvLaneManager.steps`, set by :func:`attach`; at the monitors' sampled rate, drawn there). Those calls carry
the job whose end settles the lanes (``job``, passed by ``apply.py``), which names the step in a report; the verdict
reads, as the model's ``pre.bound(i, j)`` does, the job the lane is *bound* to (the table's binding while the step is
open). The step properties have the invariants' shape (a ∀ over lanes and jobs whose instance reads one lane and
the job it is bound to), so a step's verdict is the union of its lanes' one-lane verdicts, each a function of the
lane's *step key* (the event, the lane's state before and after, whether its committed length grew, its bound job's
state and ``fault_reported`` — R7.4.6: a job quarantined by a fault its completion reported has answered for its
lanes — or UNBOUND before, whether it is bound after): evaluated with ``SystemDefinition.broken_steps`` on
stand-ins the first time a key is seen (:func:`step_verdict`), looked up after.
"""

from __future__ import annotations

from typing import Any, Sequence

from calculet.machines.job import DeviceJobMachine
from calculet.machines.job_lanes import SETTLED_AT_STEP_END, JobLaneSystem
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.monitor import MONITOR
from calculet.machines.system import NONE, SystemStep, SystemView
from calculet.runtime.scheduling.jobs import lanes_of
from calculet.runtime.scheduling.partwise import AcrossParts

__all__ = ["BROKEN_BY_KEY", "UNBOUND", "JobLaneMonitor", "attach", "step_verdict"]

_SYSTEM = JobLaneSystem.definition
_ON_DEVICE = ("submitted", "timed_out", "quarantined")


UNBOUND = None
"""A lane's key when no job's batch holds it (in place of that job's state)."""


class _StandIn:
    """A machine as the table's views show it: a state and nothing else (a predicate reading more would raise)."""

    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state

    def at(self, *states: str) -> bool:
        return self.state in states


class _Job(_StandIn):
    """A job as a step key's views show it: its state and whether its completion reported a fault (R7.4.6)."""

    __slots__ = ("fault_reported",)

    def __init__(self, state: str, fault_reported: bool) -> None:
        super().__init__(state)
        self.fault_reported = fault_reported


def _one_lane_view(key: tuple[str, tuple[str, bool] | None]) -> SystemView:
    lane, job = key
    if job is UNBOUND:
        return SystemView([_StandIn(lane)], [], [NONE], [0])
    return SystemView([_StandIn(lane)], [_Job(*job)], [0], [0])


LaneKey = tuple[str, "tuple[str, bool] | None"]
"""A lane's state and its bound job's (state, fault_reported), or UNBOUND."""

BROKEN_BY_KEY: dict[LaneKey, frozenset[str]] = {
    key: frozenset(inv.name for inv in (*_SYSTEM.invariants, *SETTLED_AT_STEP_END)
                   if not inv.counts and not inv.predicate(_one_lane_view(key)))
    for key in ((lane, job) for lane in KvSequenceMachine.definition.states
                for job in (*((s, r) for s in DeviceJobMachine.definition.states for r in (False, True)), UNBOUND))}
"""Per lane key (the lane's state, its job's (state, fault_reported) or UNBOUND): the declared per-lane invariants
its one-lane view breaks (module doc, *A table*), derived from the declarations at import."""


class _Across(AcrossParts):
    """A declared invariant over a check's parts — the lanes' keys and the jobs' view: a per-lane invariant is
    true when no key breaks it (the table), the budget when its predicate holds on the jobs."""

    def predicate(self, parts: "tuple[set[LaneKey], SystemView]") -> bool:
        keys, jobs = parts
        if self.invariant.counts:   # a count over every job: the part holding them all
            return bool(self.invariant.predicate(jobs))
        name = self.invariant.name
        return not any(name in BROKEN_BY_KEY[key] for key in keys)


_ACROSS = tuple(_Across(inv) for inv in (*_SYSTEM.invariants, *SETTLED_AT_STEP_END))


class _Lane(_StandIn):
    """A lane as a step key's views show it: its state and committed length, nothing else."""

    __slots__ = ("committed_len",)

    def __init__(self, state: str, committed_len: int) -> None:
        super().__init__(state)
        self.committed_len = committed_len


StepKey = tuple[str, str, str, bool, "tuple[str, bool] | None", bool]
"""(event, lane state before, lane state after, committed length grew, bound job's (state, fault_reported) before
or UNBOUND, bound after): what a lane's step shows the step properties (module doc, *Steps*) — they read the binding
after the step only as ``post.unbound(i)``, so which job holds it after is not part of the key."""

_STEP_VERDICTS: dict[StepKey, frozenset[str]] = {}


def step_verdict(key: StepKey) -> frozenset[str]:
    """The declared step properties the one-lane step ``key`` breaks: ``broken_steps`` on its pre and post views
    (stand-ins carrying only a state and a committed length), evaluated once per key and kept."""
    verdict = _STEP_VERDICTS.get(key)
    if verdict is None:
        event, before, after, grew, job, bound = key
        jobs = [] if job is UNBOUND else [_Job(*job)]
        pre = SystemView([_Lane(before, 0)], jobs, [NONE if job is UNBOUND else 0], [0])
        post = SystemView([_Lane(after, int(grew))], jobs, [0 if bound and job is not UNBOUND else NONE], [0])
        verdict = _STEP_VERDICTS[key] = frozenset(_SYSTEM.broken_steps(pre, post, SystemStep(event)))
    return verdict


class _StepAcross:
    """A declared step property over a step's lane keys: true when no key's one-lane step breaks it."""

    __slots__ = ("name", "rid")

    def __init__(self, name: str, rid: str) -> None:
        self.name = name
        self.rid = rid

    def predicate(self, keys: "set[StepKey]") -> bool:
        name = self.name
        return not any(name in step_verdict(key) for key in keys)


_STEP_ACROSS = tuple(_StepAcross(sp.name, sp.rid) for sp in _SYSTEM.step_properties)


class JobLaneMonitor:
    """The live device jobs × KV lanes system, as JobLaneSystem's invariants read it."""

    def __init__(self, kv: Any, jobs: Any) -> None:
        self.kv = kv
        self.jobs = jobs
        # lane → the job (its DeviceJobMachine instance, the table's record) whose transaction it last opened: the
        # binding, kept by the jobs table at each submit (InflightTable.binding; the model's ``enlist``). An ended
        # job's record, with what it carried, stays there until another job takes the lane: at most one per lane
        self.batch: dict[int, Any] = jobs.binding

    def observe(self, job: Any, event: str) -> None:
        """The jobs table is about to fire ``event`` on ``job``, and the monitors' draw picked it: the state now is
        a step boundary, checked (the table draws, so an event that is not checked costs no call, issue #20)."""
        if self.kv.whole_pool_drawn():  # O(lanes): scaled like the pool's (#20)
            self.check(f"before {event} of job {job.job_id}")

    def boundary(self, after: str) -> None:
        """Another step boundary of the runtime (the engine's tick), checked at the sampled rate."""
        if MONITOR.enabled and next(MONITOR.draws):
            self.drawn(after)

    def drawn(self, after: str) -> None:
        """A step boundary the monitors' draw picked (``after`` names it; the scheduler's step draws itself)."""
        if self.kv.whole_pool_drawn():
            self.check(after)

    def parts(self) -> tuple[set[LaneKey], SystemView]:
        """What a check evaluates: every lane's key (its state, its job's (state, fault_reported) or UNBOUND; module
        doc, *A table*) and the view holding every job of the table and no lane (the budget's part)."""
        kv, batch = self.kv, self.batch
        opened = kv.open_list()
        keys = set()
        for i in range(kv.lanes):
            job = batch.get(i) if opened[i] else None  # bound while its step is open (#20)
            keys.add((kv.lane(i).state, UNBOUND if job is None else (job.state, job.fault_reported)))
        return keys, SystemView([], list(self.jobs), [], [])

    def broken(self) -> list[str]:
        """Every invariant false on the whole live system as one view (tests compare it with the parts)."""
        kv = self.kv
        jobs = list({id(m): m for m in (*self.batch.values(), *self.jobs)}.values())
        index = {id(m): k for k, m in enumerate(jobs)}
        opened = kv.open_list()
        binding = [index[id(self.batch[i])] if i in self.batch and opened[i] else NONE for i in range(kv.lanes)]
        view = SystemView([kv.lane(i) for i in range(kv.lanes)], jobs, binding,
                          [0] * kv.lanes)
        return [inv.name for inv in (*_SYSTEM.invariants, *SETTLED_AT_STEP_END) if not inv.predicate(view)]

    def verdict(self) -> list[str]:
        """The declared invariants the parts break (what :meth:`check` reports; the tests compare it with
        :meth:`broken`)."""
        parts = self.parts()
        return [inv.name for inv in _ACROSS if not inv.predicate(parts)]

    # ------------------------------------------------------------------ steps (module doc, *Steps*)

    def before(self, lanes: Sequence[int]) -> list[tuple[int, str, int, Any, tuple[str, bool] | None]]:
        """What the step properties read of ``lanes`` before the KV manager settles them: each lane's state and
        committed length, and the job it is bound to (its step open: the table's binding) with that job's state and
        whether its completion reported a fault."""
        kv_lanes, opened, batch = self.kv.lane_list(), self.kv.open_list(), self.batch
        pre = []
        for i in lanes:
            machine = kv_lanes[i]
            job = batch.get(i) if opened[i] else None
            pre.append((i, machine.state, machine.committed_len, job,
                        None if job is None else (job.state, job.fault_reported)))
        return pre

    @staticmethod
    def answered(pre: list[tuple[int, str, int, Any, tuple[str, bool] | None]]
                 ) -> list[tuple[int, str, int, Any, tuple[str, bool] | None]]:
        """``pre`` (from :meth:`before`, taken before the job's event) with each bound job's state read again: what
        :meth:`before` would have read after that event and before the lanes' (issue #20: a B1 step's job, lane and
        request events fire as one generated composite, :mod:`.step_done`; the job event moves no lane and no
        binding, so only the job's state and ``fault_reported`` differ)."""
        return [(i, state, committed, job, None if job is None else (job.state, job.fault_reported))
                for i, state, committed, job, _ in pre]

    def step_keys(self, pre: list[tuple[int, str, int, Any, tuple[str, bool] | None]], event: str) -> set[StepKey]:
        """Each settled lane's step key (``pre`` from :meth:`before`, the lanes as they are now)."""
        kv_lanes, opened, batch = self.kv.lane_list(), self.kv.open_list(), self.batch
        keys = set()
        for i, state, committed, job, job_state in pre:
            machine = kv_lanes[i]
            keys.add((event, state, machine.state, machine.committed_len > committed,
                      UNBOUND if job is None else job_state, bool(opened[i]) and batch.get(i) is not None))
        return keys

    def after(self, pre: list[tuple[int, str, int, Any, tuple[str, bool] | None]], event: str,
              job: Any = None) -> None:
        """The lanes of ``pre`` were settled by ``event`` at the end of ``job`` (None: no job's end, e.g. a
        recovery): the declared step properties on that step, reported by MONITOR like the invariants."""
        ending = "" if job is None else f" at the end of job {job.job_id}"
        MONITOR.check_whole(_SYSTEM.name, _STEP_ACROSS, self.step_keys(pre, event),
                            f"{event} of lanes {[p[0] for p in pre]}{ending}", state=_State(self))

    def index_faults(self) -> list[tuple[str, str]]:
        """The jobs table against the binding: two jobs on the device never hold the same lane (R14.4)."""
        held: dict[int, int] = {}
        for job in self.jobs:
            if job.state in _ON_DEVICE:
                for lane in lanes_of(job.work):
                    if held.setdefault(lane, job.job_id) != job.job_id:
                        return [("lane_in_two_batches_on_the_device", "R14.4")]
        return []

    def check(self, after: str = "check") -> None:
        """Every declared invariant (and the step-end property) on the live lanes and jobs, reported by MONITOR
        (the live state is attached to a report only when something is broken)."""
        MONITOR.check_whole(_SYSTEM.name, _ACROSS, self.parts(), after, state=_State(self), extra=self.index_faults())


class _State:
    """The live lanes and jobs as a report shows them, built only when printed (a check that passes never is)."""

    def __init__(self, monitor: JobLaneMonitor) -> None:
        self._monitor = monitor

    def __repr__(self) -> str:
        m = self._monitor
        return repr({"lanes": {i: (m.kv.lane(i).state, getattr(m.batch.get(i), "job_id", None))
                               for i in range(m.kv.lanes)},
                     "jobs": {j.job_id: j.state for j in m.jobs}})

    __str__ = __repr__


def attach(jobs: Any, kv: Any) -> JobLaneMonitor:
    """A monitor for ``jobs`` (an :class:`InflightTable`) and ``kv`` (a ``KvLaneManager``), hooked into the table."""
    monitor = JobLaneMonitor(kv, jobs)
    jobs.check = monitor.observe
    kv.steps = monitor  # the step properties where the lanes' steps end (module doc, *Steps*)
    return monitor
