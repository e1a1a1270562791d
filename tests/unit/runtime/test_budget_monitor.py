"""Issue #17: R5.1.2's admission budgets checked live against their declaration (the budget monitor).

The admission controller's counters are evaluated as an ``AdmissionBudgetMachine`` valuation by the
declared invariants after each operation that moves them (every operation in tests). Seeded faults:
a controller whose admission ignores ``max_sequences`` or ``max_kv_tokens``, and one whose screening
ignores ``max_waiting_requests`` or ``max_waiting_prompt_tokens``, are each caught at the operation that
passed the limit; the real controller driven to every limit is not. The counters are also recounted from the
live requests at each step boundary (``count_faults``): a release that keeps a request's KV tokens counted and a
cancel that leaves the waiting count up — drifts no limit sees — are caught at the next scheduler step.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from calculet.config import CapacityBudget
from calculet.machines.admission_budgets import AdmissionBudgetMachine, AdmissionBudgetSystem
from calculet.machines.errors import InvariantViolation
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.admission import AdmissionController, Decision
from calculet.machines.request import RequestMachine
from calculet.runtime.scheduling.budget_monitor import (BudgetValuation, broken, check_budget, count_faults, counted,
                                                        system_view)
from tests.unit.runtime.runtime_support import Harness


class _NoSequenceLimit(AdmissionController):
    """The fault: next_admissible with max_sequences (and max_kv_tokens) left out."""

    def next_admissible(self, free_lanes: int):  # type: ignore[no-untyped-def]
        budget = self.budget
        self.budget = CapacityBudget(10**6, 10**9, budget.max_waiting_requests, budget.max_waiting_prompt_tokens,
                                     budget.max_inflight_jobs)
        try:
            return super().next_admissible(free_lanes)
        finally:
            self.budget = budget


class _NoWaitingLimit(AdmissionController):
    """The fault: screening with the waiting-queue and waiting-token limits left out."""

    def screen(self, request, **kwargs):  # type: ignore[no-untyped-def]
        budget = self.budget
        self.budget = CapacityBudget(budget.max_sequences, budget.max_kv_tokens, 10**6, 10**9, budget.max_inflight_jobs)
        try:
            return super().screen(request, **kwargs)
        finally:
            self.budget = budget


def _with(h: Harness, cls: type) -> None:
    h.scheduler.admission.__class__ = cls


@pytest.mark.req("R5.1.2")
def test_the_monitor_reads_every_declared_invariant():
    """The monitor evaluates the declaration's predicates — the four limits and the counters' types."""
    names = {inv.name for inv in AdmissionBudgetMachine.definition.invariants}
    budget = CapacityBudget(2, 16, 2, 8, 1)
    assert broken(BudgetValuation(budget, 2, 8, 2, 16)) == []
    assert set(broken(BudgetValuation(budget, 3, 9, 3, 17))) == {
        "waiting_within_max_waiting_requests", "waiting_tokens_within_max_waiting_prompt_tokens",
        "active_within_max_sequences", "active_kv_within_max_kv_tokens"}
    assert set(broken(BudgetValuation(budget, -1, -1, -1, -1))) == {n for n in names if n.startswith("bounds_")}
    with pytest.raises(InvariantViolation) as info:
        check_budget(budget, 0, 0, 3, 6, "admitted")
    assert info.value.invariant == "active_within_max_sequences"


@pytest.mark.req("R5.1.2", "R5.2.2")
def test_an_admission_past_max_sequences_is_caught():
    h = Harness.build(sizes=(1,), lanes=8, admission={"max_sequences": 2})
    _with(h, _NoSequenceLimit)
    h.submit(prompt=8, new=2)
    h.submit(prompt=8, new=2)
    with pytest.raises(InvariantViolation) as info:
        h.submit(prompt=8, new=2)
    assert info.value.invariant == "active_within_max_sequences"
    assert info.value.machine == "AdmissionBudgetMachine"


@pytest.mark.req("R5.1.2", "R5.1.3")
def test_an_admission_past_max_kv_tokens_is_caught():
    h = Harness.build(sizes=(1,), lanes=8, kv_tokens=100)
    _with(h, _NoSequenceLimit)
    h.submit(prompt=40, new=20)
    with pytest.raises(InvariantViolation) as info:
        h.submit(prompt=30, new=20)
    assert info.value.invariant == "active_kv_within_max_kv_tokens"


@pytest.mark.req("R5.1.2", "R5.2.4")
def test_a_screening_past_max_waiting_requests_is_caught():
    h = Harness.build(sizes=(1,), lanes=1, admission={"max_waiting_requests": 2})
    _with(h, _NoWaitingLimit)
    subs = [h.submit(prompt=8, new=2) for _ in range(3)]  # one admitted, two waiting: the limit
    assert [s.outcome.decision for s in subs] == [Decision.ADMIT, Decision.QUEUE, Decision.QUEUE]
    with pytest.raises(InvariantViolation) as info:
        h.submit(prompt=8, new=2)
    assert info.value.invariant == "waiting_within_max_waiting_requests"


@pytest.mark.req("R5.1.2", "R5.2.4")
def test_a_screening_past_max_waiting_prompt_tokens_is_caught():
    h = Harness.build(sizes=(1,), lanes=1, admission={"max_waiting_prompt_tokens": 20})
    _with(h, _NoWaitingLimit)
    h.submit(prompt=8, new=2)
    h.submit(prompt=16, new=2)
    with pytest.raises(InvariantViolation) as info:
        h.submit(prompt=8, new=2)
    assert info.value.invariant == "waiting_tokens_within_max_waiting_prompt_tokens"


@pytest.mark.req("R5.1.2", "R5.2.2", "R5.2.4")
def test_the_real_controller_at_every_limit_passes_the_monitor():
    """The same loads on the controller as written: queued or refused at each limit, never a violation."""
    checks = MONITOR.statistics().checks
    h = Harness.build(sizes=(1,), lanes=8, kv_tokens=100,
                      admission={"max_sequences": 2, "max_waiting_requests": 2, "max_waiting_prompt_tokens": 40})
    subs = [h.submit(prompt=20, new=10) for _ in range(5)]
    assert [s.outcome.decision for s in subs] == [Decision.ADMIT, Decision.ADMIT, Decision.QUEUE, Decision.QUEUE,
                                                  Decision.REJECT_CAPACITY]
    h.drive()
    stats = h.scheduler.admission.statistics()
    assert (stats.waiting_requests, stats.active_sequences, stats.active_kv_tokens) == (0, 0, 0)
    assert MONITOR.statistics().checks > checks  # the monitor ran on each operation
    assert not any(machine == "AdmissionBudgetMachine" for machine, _ in MONITOR.statistics().violations)


# ------------------------------------------------------------------------------------------------
# The counters equal the live requests they count (#17: an index kept beside a machine is checked)


class _ForgetsKvOnRelease(AdmissionController):
    """The fault: ``released`` gives the sequence back but keeps its KV tokens counted (``active_kv`` drifts
    up, far below ``max_kv_tokens``: no limit notices)."""

    def released(self, rec):  # type: ignore[no-untyped-def]
        self._active_kv += rec.prompt_tokens + rec.max_new_tokens
        super().released(rec)



class _StatisticsForbidden(AdmissionController):
    """``statistics`` builds a row per configured tenant (2.5 ms at 1 000 tenants): not for a check in a step."""

    def statistics(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the recount read the per-tenant statistics")


@pytest.mark.req("R5.1.2")
def test_the_recount_reads_the_four_counters_not_the_statistics():
    """The step's recount (every step in tests) reads ``AdmissionController.counters``, whose cost does not grow
    with the configured tenants (issue #20: a sampled check made the tick O(tenants), 2.5 ms at 1 000 tenants,
    bench/scheduler.py's idle-tenant row). Mutant: ``_counters`` via ``statistics()`` again: this fails."""
    h = Harness.build(sizes=(1,), lanes=8)
    _with(h, _StatisticsForbidden)
    h.submit(prompt=8, new=2)
    h.drive()
    assert h.scheduler.admission.counters() == (0, 0, 0, 0)


class _CancelKeepsWaiting(AdmissionController):
    """The fault: a waiting request that is cancelled stays in the waiting count (and its prompt tokens)."""

    def leave_waiting(self, rec):  # type: ignore[no-untyped-def]
        if rec.state == "cancelled":
            self._waiting += 1
            self._waiting_tokens += rec.prompt_tokens
        super().leave_waiting(rec)


@pytest.mark.req("R5.1.2")
def test_a_released_request_whose_kv_tokens_stay_counted_is_caught_at_the_next_step():
    h = Harness.build(sizes=(1,), lanes=4)
    _with(h, _ForgetsKvOnRelease)
    h.submit(prompt=8, new=2)
    with pytest.raises(InvariantViolation) as info:
        h.drive()
    assert (info.value.machine, info.value.invariant, info.value.rid) == (
        "AdmissionBudgetSystem", "counters_are_the_counted_requests", "R5.1.2")
    assert info.value.transition == "scheduler step"
    stats = h.scheduler.admission.statistics()
    assert (stats.active_sequences, stats.active_kv_tokens) == (0, 10)
    # the limits alone pass the drifted counters: only the recount sees them
    assert broken(BudgetValuation(h.scheduler.admission.budget, 0, 0, 0, 10)) == []


@pytest.mark.req("R5.1.2", "R5.2.4")
def test_a_cancelled_waiting_request_left_in_the_waiting_count_is_caught():
    h = Harness.build(sizes=(1,), lanes=1)
    _with(h, _CancelKeepsWaiting)
    h.submit(prompt=8, new=2)
    waiting = h.submit(prompt=8, new=2)
    assert waiting.outcome.decision is Decision.QUEUE
    h.scheduler.cancel(waiting.request_id)
    with pytest.raises(InvariantViolation) as info:
        h.step()
    assert info.value.invariant == "counters_are_the_counted_requests"
    assert h.scheduler.admission.statistics().waiting_requests == 1 and h.state(waiting.request_id) == "cancelled"


@pytest.mark.req("R5.1.2")
def test_the_real_controller_keeps_its_counters_equal_to_the_live_requests():
    """Submissions, queueing, cancels (waiting and admitted), completions: the recount agrees at every
    scheduler step, and the check ran."""
    h = Harness.build(sizes=(1,), lanes=2, admission={"max_sequences": 2, "max_waiting_requests": 8})
    subs = [h.submit(prompt=4 + k, new=2 + k % 3) for k in range(6)]
    h.scheduler.cancel(subs[4].request_id)   # waiting
    h.scheduler.cancel(subs[0].request_id)   # admitted
    h.drive()
    live = h.scheduler.registry.live()
    assert count_faults(h.scheduler.admission, live) == [] and counted(live) == (0, 0, 0, 0)
    assert not any(machine == "AdmissionBudgetSystem" for machine, _ in MONITOR.statistics().violations)


class _Machine:
    """A request machine's view: its state and the two variables the budget counts."""

    definition = RequestMachine.definition

    def __init__(self, state: str, prompt: int, new: int) -> None:
        self.state, self.prompt_tokens, self.max_new_tokens = state, prompt, new

    def at(self, *states: str) -> bool:
        return self.state in states


class _Admission:
    def __init__(self, budget: CapacityBudget, counters: tuple[int, int, int, int]) -> None:
        self.budget = budget
        self._counters = counters

    def counters(self) -> tuple[int, int, int, int]:
        return self._counters


@pytest.mark.req("R5.1.2")
def test_the_recount_is_the_declared_count():
    """``counted`` (the monitor's recount) against ``AdmissionBudgetSystem``'s declared strengthening, on random
    live systems: counters equal to the recount satisfy ``counters_are_the_counted_requests`` on the live view,
    and counters off by any amount in any field break it (and ``count_faults`` names it, never its fallback)."""
    rnd = random.Random(17)
    states = list(RequestMachine.definition.states)
    budget = CapacityBudget(10**6, 10**9, 10**6, 10**9, 2)
    declared = next(inv for inv in AdmissionBudgetSystem.definition.invariants
                    if inv.name == "counters_are_the_counted_requests")
    drifted = 0
    for _ in range(400):
        live = [SimpleNamespace(machine=_Machine(rnd.choice(states), rnd.randint(1, 9), rnd.randint(1, 9)))
                for _ in range(rnd.randint(0, 6))]
        exact = counted(live)
        assert declared.predicate(system_view(_Admission(budget, exact), live))
        assert count_faults(_Admission(budget, exact), live) == []
        field, delta = rnd.randrange(4), rnd.choice((-3, -1, 1, 2))
        off = tuple(c + (delta if k == field else 0) for k, c in enumerate(exact))
        admission = _Admission(budget, off)
        assert not declared.predicate(system_view(admission, live))
        assert ("counters_are_the_counted_requests", "R5.1.2") in count_faults(admission, live)
        drifted += 1
    assert drifted == 400
