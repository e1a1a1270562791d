"""Issue #17: R5.1.2's admission budgets — a budget guard dropped from the declaration fails verify, and
a mutant admission that admits past a budget is rejected by induction and found by bounded model checking."""

from __future__ import annotations

import pytest

from calculet.invariants.checks import check_machine
from calculet.invariants.mutation import derive, replace_row
from calculet.invariants.system_bmc import check_system_bmc
from calculet.invariants.system_induction import check_system_induction
from calculet.logic.expr import And
from calculet.machines.admission_budgets import AdmissionBudgetMachine, AdmissionBudgetSystem
from calculet.machines.system import CoupledSystem

SD = AdmissionBudgetSystem.definition

# Each fault: the budget row, its guard without one limit, the machine invariant and the system
# property (stated over the requests) that must break, and the system step that fires the row.
FAULTS = [
    pytest.param("admit@open", lambda v, prompt, need: And(v.waiting >= 1, v.waiting_tokens >= prompt,
                                                           v.active_kv + need <= v.max_kv_tokens),
                 "active_within_max_sequences", "active_sequences_within_budget", "admit@waiting_admission",
                 id="AdmitPastMaxSequences"),
    pytest.param("admit@open", lambda v, prompt, need: And(v.waiting >= 1, v.waiting_tokens >= prompt,
                                                           v.active + 1 <= v.max_sequences),
                 "active_kv_within_max_kv_tokens", "active_kv_tokens_within_budget", "admit@waiting_admission",
                 id="AdmitPastMaxKvTokens"),
    pytest.param("admit_now@open", lambda v, prompt, need: And(v.waiting + 1 <= v.max_waiting_requests,
                                                               v.waiting_tokens + prompt <= v.max_waiting_prompt_tokens,
                                                               v.active_kv + need <= v.max_kv_tokens),
                 "active_within_max_sequences", "active_sequences_within_budget", "admit_now@new",
                 id="AdmitNowPastMaxSequences"),
    pytest.param("admit_now@open", lambda v, prompt, need: And(v.waiting + 1 <= v.max_waiting_requests,
                                                               v.waiting_tokens + prompt <= v.max_waiting_prompt_tokens,
                                                               v.active + 1 <= v.max_sequences),
                 "active_kv_within_max_kv_tokens", "active_kv_tokens_within_budget", "admit_now@new",
                 id="AdmitNowPastMaxKvTokens"),
    pytest.param("accept@open", lambda v, prompt: v.waiting_tokens + prompt <= v.max_waiting_prompt_tokens,
                 "waiting_within_max_waiting_requests", "waiting_requests_within_budget", "bind@new",
                 id="AcceptPastMaxWaitingRequests"),
    pytest.param("accept@open", lambda v, prompt: v.waiting + 1 <= v.max_waiting_requests,
                 "waiting_tokens_within_max_waiting_prompt_tokens", "waiting_prompt_tokens_within_budget", "bind@new",
                 id="AcceptPastMaxWaitingPromptTokens"),
]


def _mutant(row: str, guard) -> tuple[type, type[CoupledSystem]]:  # type: ignore[no-untyped-def]
    machine = derive(AdmissionBudgetMachine, "WeakBudget", lambda rows, d: replace_row(rows, row, guard=guard))
    system = type("WeakBudgetSystem", (CoupledSystem,), {
        "__doc__": "AdmissionBudgetSystem over a budget missing one guard.", "spec": SD.spec, "request": SD.request,
        "lane": machine, "steps": list(SD.steps), "invariants": list(SD.invariants), "omitted": list(SD.omitted),
        "bmc_size": SD.bmc_size})
    return machine, system


@pytest.mark.req("R5.1.2")
@pytest.mark.parametrize("row, guard, machine_invariant, system_invariant, step", FAULTS)
def test_a_dropped_budget_guard_fails_verify(row, guard, machine_invariant, system_invariant, step):
    """Per machine: consecution of the weakened row names the limit; coupled: the induction over the step
    that fires the row breaks both the budget's invariant and the bound over the requests."""
    machine, system = _mutant(row, guard)
    failed = [r for r in check_machine(machine.definition, include=["consecution"]) if not r.ok]
    assert [r.subject for r in failed] == [row] and machine_invariant in failed[0].detail, [r.detail for r in failed]
    induction = [r for r in check_system_induction(system.definition, steps=[step]) if not r.ok]
    assert induction and {f"WeakBudget.{machine_invariant}", system_invariant} <= set(induction[0].broken), induction[0].detail


@pytest.mark.req("R5.1.2", "R5.2.2", "R5.2.4")
@pytest.mark.parametrize("row, guard, machine_invariant, system_invariant, step", FAULTS)
def test_a_mutant_admission_past_a_budget_is_found_by_bmc(row, guard, machine_invariant, system_invariant, step):
    """Bounded model checking from the initial system (2 requests × 1 budget) finds a run that passes the
    limit, ending on a step that fires the weakened row; the declared budget passes the same search."""
    _, system = _mutant(row, guard)
    bmc = check_system_bmc(system.definition, 2, 1, 4)
    assert not bmc.ok and system_invariant in bmc.broken, bmc.detail
    firing = {v.step.name for v in system.definition.variants if any(t.name == row for t in v.lane_rows)}
    assert step in firing and bmc.counterexample.trace[-1]["transition"] in firing  # a step firing the weak row
    assert check_system_bmc(SD, 2, 1, 4).ok
