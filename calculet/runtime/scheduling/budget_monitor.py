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
default), and a skipped one costs one draw from the monitor's precomputed sampling pattern.

*The counters are what they count* (#17: "any index kept beside a machine is checked against it by a
monitor"). A counter can drift while staying within its limit — a release that forgets a request's KV
tokens, a cancel that leaves the waiting count up — and the limits above never see it, though every
later admission decision reads the wrong number. :func:`count_faults` recounts the live requests the way
``AdmissionBudgetSystem`` declares (accepted and waiting: the ``waiting`` group but ``new``; admitted
and holding a lease: the ``holding`` group; prompt and prompt + ``max_new_tokens`` from each request's
own machine) and compares the controller's four counters with the sums; when they differ, the system's
declared invariants are evaluated on the whole live system (the requests, the counters as the budget
instance, each request bound to it while the declaration counts it) and the broken ones are reported —
``counters_are_the_counted_requests`` for a drift, a bound over requests for an admission past a limit.
The counters and the request states agree only between operations (an admission grows the counters just
before the request's ``admit`` fires), so the recount runs at step boundaries: the start of each
scheduler step (:func:`check_counts`) and the end of each engine tick or actor call with the other
whole-system checks (the engine's joint checks' ``extra``). It is O(live requests), at the sampled rate,
like the generation counters' check (``ModelManager.counter_faults``).
"""

from __future__ import annotations

import random
from typing import Any, Iterable

from calculet.machines.admission_budgets import COUNTED_WAITING, AdmissionBudgetMachine, AdmissionBudgetSystem
from calculet.machines.monitor import MONITOR
from calculet.machines.request import HOLDING
from calculet.machines.system import NONE, SystemView

__all__ = ["BudgetValuation", "broken", "check_budget", "check_budget_drawn", "check_counts", "check_counts_drawn",
           "count_faults", "counted", "system_view"]

_DEFINITION = AdmissionBudgetMachine.definition
_INVARIANTS = tuple(_DEFINITION.invariants)   # the declared ones, the counters' types included
_STATE = _DEFINITION.initial                   # the machine's one state
_SYSTEM = AdmissionBudgetSystem.definition
_WAITS = COUNTED_WAITING                       # accepted, not yet admitted (the declaration's own set)
_HOLDS = HOLDING                               # admitted and holding a KV lease


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
    if MONITOR.enabled and next(MONITOR.draws):
        check_budget_drawn(budget, waiting, waiting_tokens, active, active_kv, after)


def check_budget_drawn(budget: Any, waiting: int, waiting_tokens: int, active: int, active_kv: int,
                       after: str) -> None:
    """:func:`check_budget` once the monitor drew this operation (a hot caller draws inline:
    ``if MONITOR.enabled and next(MONITOR.draws)``, issue #20)."""
    view = BudgetValuation(budget, waiting, waiting_tokens, active, active_kv)
    MONITOR.check_whole(_DEFINITION.name, _INVARIANTS, view, f"AdmissionController.{after}", state=view.values())


def counted(live: Iterable[Any]) -> tuple[int, int, int, int]:
    """(waiting, waiting_tokens, active, active_kv) over ``live`` request records as
    ``AdmissionBudgetSystem`` counts them: the requests accepted and waiting with their prompts, and the
    admitted requests holding a lease with their KV need (prompt + max_new_tokens), read from each
    request's machine."""
    waiting = waiting_tokens = active = active_kv = 0
    for rec in live:
        m = rec.machine
        state = m.state
        if state in _WAITS:
            waiting += 1
            waiting_tokens += m.prompt_tokens
        elif state in _HOLDS:
            active += 1
            active_kv += m.prompt_tokens + m.max_new_tokens
    return waiting, waiting_tokens, active, active_kv


def _counters(admission: Any) -> tuple[int, int, int, int]:
    return admission.counters()  # not statistics(): its per-tenant rows made a check O(configured tenants)


def system_view(admission: Any, live: list[Any]) -> SystemView:
    """The live requests × the controller's budget as ``AdmissionBudgetSystem`` reads it: each request bound
    to the one budget while the declaration counts it (the model's ghost binding)."""
    budget = BudgetValuation(admission.budget, *_counters(admission))
    binding = [0 if rec.machine.state in _WAITS or rec.machine.state in _HOLDS else NONE for rec in live]
    return SystemView([rec.machine for rec in live], [budget], binding, [0] * len(live))


def count_faults(admission: Any, live: list[Any]) -> list[tuple[str, str]]:
    """(name, R-id) of each ``AdmissionBudgetSystem`` invariant the live system breaks, if the controller's
    counters differ from the live requests they count (module doc); none when they agree."""
    if counted(live) == _counters(admission):
        return []
    view = system_view(admission, live)
    found = [(inv.name, inv.rid) for inv in _SYSTEM.invariants if not inv.predicate(view)]
    # The recount and the declared predicates must agree (tests); if they ever do not, say so loudly.
    return found or [("admission_counters_recount_disagrees_with_the_declaration", "R5.1.2")]


RECOUNT_REQUESTS = 64
"""Live requests up to which a sampled :func:`check_counts` always recounts; above, one sampled step in
live / this many does (as :data:`~calculet.runtime.scheduling.kv.POOL_CHECK_LANES` scales the pool's
whole-pool checks), so the recount's amortized cost per step stays O(1) when sampling (#20)."""
_RECOUNT_DRAW = random.Random(RECOUNT_REQUESTS).random


def check_counts(admission: Any, registry: Any, after: str) -> None:
    """The controller's counters against the live requests of ``registry`` at a step boundary (``after``
    names it), at the monitors' sampled rate; reported like a broken invariant.

    The recount walks every live request: at 65 536 live ones a sampled step cost milliseconds, so when
    sampling (``sample_every`` > 1) and more than :data:`RECOUNT_REQUESTS` are live it runs on one sampled
    step in live / that many, at random — a drifted counter stays drifted, so it is still found, a few
    hundred steps later. With every event checked (the tests) it runs on every step (§9.2, R5.1.2)."""
    if MONITOR.enabled and next(MONITOR.draws):
        check_counts_drawn(admission, registry, after)


def check_counts_drawn(admission: Any, registry: Any, after: str) -> None:
    """:func:`check_counts` on a step boundary the monitors' draw already picked: a caller that checks several
    whole-system monitors at one boundary draws once for all of them (``Scheduler.step``, issue #20)."""
    live_count = len(registry)
    if live_count > RECOUNT_REQUESTS and MONITOR.sample_every > 1 and _RECOUNT_DRAW() * live_count >= RECOUNT_REQUESTS:
        return
    live = registry.live()
    faults = count_faults(admission, live)
    state = {"counters": _counters(admission), "recount": counted(live)} if faults else None
    MONITOR.check_whole(_SYSTEM.name, (), None, after, state=state, extra=faults)
