"""Issue #17: R5.1.2's admission budgets — the declaration, its witnesses, its vacuity, and the
strengthenings the proof needs."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.checks import check_machine
from calculet.invariants.strength import check_guards, check_system_witnesses, check_witnesses
from calculet.invariants.system_induction import check_system_induction, check_system_initiation, check_system_vacuity
from calculet.invariants.traceability import proof_references
from calculet.logic.expr import And
from calculet.machines import ALL_MACHINES
from calculet.machines.admission_budgets import BUDGET_PARAMS, AdmissionBudgetMachine, AdmissionBudgetSystem
from calculet.machines.request import RequestMachine
from calculet.machines.system import CoupledSystem
from calculet.verify import SYSTEMS

SD = AdmissionBudgetSystem.definition


def _with_invariants(invariants) -> type[CoupledSystem]:
    return type("Weakened", (CoupledSystem,), {
        "__doc__": "AdmissionBudgetSystem with its invariants edited.", "spec": SD.spec, "request": SD.request,
        "lane": SD.lane, "steps": list(SD.steps), "invariants": invariants, "omitted": list(SD.omitted)})


@pytest.mark.req("R5.1.2")
def test_every_request_row_is_a_step_and_every_budget_row_is_taken():
    """The steps come from the declarations: one per RequestMachine row, and every budget row is fired by one."""
    assert [s.name for s in SD.steps] == [t.name for t in RequestMachine.definition.transitions]
    assert SD.untaken_rows() == []
    assert AdmissionBudgetSystem in SYSTEMS and AdmissionBudgetMachine in ALL_MACHINES  # verify checks both


@pytest.mark.req("R5.1.2")
def test_the_budget_is_the_spec_capacity_budget_and_r5_1_2_is_credited():
    from calculet.config import CapacityBudget
    assert set(BUDGET_PARAMS) | {"max_inflight_jobs"} == set(CapacityBudget.__dataclass_fields__)
    assert set(BUDGET_PARAMS) == set(AdmissionBudgetMachine.definition.params)
    refs = proof_references()["R5.1.2"]
    for name in ("waiting_requests_within_budget", "waiting_prompt_tokens_within_budget",
                 "active_sequences_within_budget", "active_kv_tokens_within_budget"):
        assert f"AdmissionBudgetSystem.{name}" in refs
    assert "JobLaneSystem.inflight_jobs_within_budget" in refs  # the fifth limit


@pytest.mark.req("R5.1.2")
def test_the_budget_machine_and_the_system_are_proved():
    assert all(r.ok for r in check_machine(AdmissionBudgetMachine.definition, machine=AdmissionBudgetMachine))
    assert all(r.ok for r in check_guards(AdmissionBudgetMachine.definition))
    assert check_system_initiation(SD).ok
    assert all(r.ok for r in check_system_induction(SD))
    assert all(r.ok for r in check_system_vacuity(SD))


@pytest.mark.req("R5.1.2")
@pytest.mark.parametrize("name", [inv.name for inv in SD.invariants])
def test_each_system_invariant_replaced_by_true_fails_on_its_negative_witness(name):
    invs = [dataclasses.replace(inv, predicate=lambda sys: True) if inv.name == name else inv for inv in SD.invariants]
    assert check_system_witnesses(SD).ok
    result = check_system_witnesses(_with_invariants(invs).definition)
    assert not result.ok and name in result.detail


@pytest.mark.req("R5.1.2")
def test_each_budget_invariant_has_a_witness_it_rejects():
    assert check_witnesses(AdmissionBudgetMachine.definition).ok
    declared = [inv for inv in AdmissionBudgetMachine.definition.invariants if inv.rid != "type"]
    assert len(declared) == 4 and all(inv.rejects for inv in declared)


@pytest.mark.req("R5.1.2")
def test_a_dead_step_is_flagged_by_vacuity():
    admit = next(s for s in SD.steps if s.name == "admit@waiting_admission")
    dead = AdmissionBudgetSystem.derive("DeadAdmit", replace={"admit@waiting_admission": dataclasses.replace(
        admit, guard=lambda sys, i, j: And(sys.bound(i, j), sys.unbound(i)))})
    flagged = [r for r in check_system_vacuity(dead.definition) if not r.ok]
    assert [r.subject for r in flagged] == ["admit@waiting_admission"]


@pytest.mark.req("R5.1.2")
def test_the_strengthening_is_needed():
    """Without the counters' equality to what they count, accepting a request breaks the bound over the
    waiting requests (the counter the guard reads may lag behind them): the reason it is declared."""
    assert [inv.name for inv in SD.invariants if inv.strengthening] == ["counters_are_the_counted_requests"]
    invs = [inv for inv in SD.invariants if inv.name != "counters_are_the_counted_requests"]
    # the one property asked for: with every goal at once, z3's counterexample may break only another one,
    # depending on the queries run before it in the process (seen once in a parallel run, session 24)
    failed = [r for r in check_system_induction(_with_invariants(invs).definition, steps=["bind@new"],
                                                goals=["waiting_requests_within_budget"]) if not r.ok]
    assert failed and "waiting_requests_within_budget" in failed[0].broken, [r.detail for r in failed]
