"""Run-time monitor of R5.1.2's admission budgets (§5.1; issue #17).

:class:`~calculet.machines.admission_budgets.AdmissionBudgetMachine` declares the admission
controller's four counters and the budget guards that keep each within its limit, and ``verify``
proves it (per machine, and coupled with the requests the counters count:
``AdmissionBudgetSystem``). The controller itself (:mod:`calculet.runtime.scheduling.admission`)
keeps plain integers for speed and applies the limits in ``screen`` and ``next_admissible``; this
module binds the two: after each operation that moves a counter, the controller hands its counters
and its budget here, and the machine's *declared* invariants (each counter within its limit, and
the counters' types: never negative) are evaluated on them as one ``AdmissionBudgetMachine``
valuation — the same predicates z3 proves. An admission that ignores a budget (a screening that
accepts past ``max_waiting_requests``, an admission past ``max_sequences``) is caught at the
operation that passed the limit, reported like any broken invariant (raised in tests, counted and
logged in production).

Cost: one check is eight small predicates on ints (a few µs); it runs at the monitors' sampled rate
(``monitoring.sample_every``: every operation in the test suite, one in 256 on average by
default), and a skipped one costs one countdown decrement.
"""

from __future__ import annotations

from typing import Any

from calculet.machines.admission_budgets import AdmissionBudgetMachine
from calculet.machines.monitor import MONITOR

__all__ = ["BudgetValuation", "broken", "check_budget"]

_DEFINITION = AdmissionBudgetMachine.definition
_INVARIANTS = tuple(_DEFINITION.invariants)   # the declared ones, the counters' types included
_STATE = _DEFINITION.initial                   # the machine's one state


class BudgetValuation:
    """The controller's counters and budget as an ``AdmissionBudgetMachine`` valuation (what the
    declared predicates read)."""

    __slots__ = ("max_sequences", "max_kv_tokens", "max_waiting_requests", "max_waiting_prompt_tokens",
                 "waiting", "waiting_tokens", "active", "active_kv")

    def __init__(self, budget: Any, waiting: int, waiting_tokens: int, active: int, active_kv: int) -> None:
        self.max_sequences = budget.max_sequences
        self.max_kv_tokens = budget.max_kv_tokens
        self.max_waiting_requests = budget.max_waiting_requests
        self.max_waiting_prompt_tokens = budget.max_waiting_prompt_tokens
        self.waiting = waiting
        self.waiting_tokens = waiting_tokens
        self.active = active
        self.active_kv = active_kv

    @property
    def state(self) -> str:
        return _STATE

    def at(self, *states: str) -> bool:
        return _STATE in states

    def values(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def broken(view: BudgetValuation) -> list[str]:
    """The declared invariants ``view`` breaks (tests; the monitor reports the same through MONITOR)."""
    return [inv.name for inv in _INVARIANTS if not inv.predicate(view)]


def check_budget(budget: Any, waiting: int, waiting_tokens: int, active: int, active_kv: int, after: str) -> None:
    """The declared budget invariants on the controller's counters after the operation ``after``
    (``accept``, ``admitted``, ``leave_waiting``, ``released``), at the monitors' sampled rate."""
    if not MONITOR.enabled or not MONITOR.sampled():
        return
    view = BudgetValuation(budget, waiting, waiting_tokens, active, active_kv)
    MONITOR.check_whole(_DEFINITION.name, _INVARIANTS, view, f"AdmissionController.{after}", state=view.values())
