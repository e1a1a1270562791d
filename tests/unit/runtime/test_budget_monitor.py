"""Issue #17: R5.1.2's admission budgets checked live against their declaration (the budget monitor).

The admission controller's counters are evaluated as an ``AdmissionBudgetMachine`` valuation by the
declared invariants after each operation that moves them (every operation in tests). Seeded faults:
a controller whose admission ignores ``max_sequences`` or ``max_kv_tokens``, and one whose screening
ignores ``max_waiting_requests`` or ``max_waiting_prompt_tokens``, are each caught at the operation that
passed the limit; the real controller driven to every limit is not.
"""

from __future__ import annotations

import pytest

from calculet.config import CapacityBudget
from calculet.machines.admission_budgets import AdmissionBudgetMachine
from calculet.machines.errors import InvariantViolation
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.admission import AdmissionController, Decision
from calculet.runtime.scheduling.budget_monitor import BudgetValuation, broken, check_budget
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
