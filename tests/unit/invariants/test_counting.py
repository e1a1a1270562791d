"""Issue #17: the counting properties proved for every size (R10.2, R14.3, R5.1.2).

GenerationRequestSystem, GenerationJobSystem and JobLaneSystem state counts over every instance,
so the cutoff argument of the requests × lanes system does not apply to them; the induction with
ghost counts beyond the encoded instances (``system_induction``) proves them for every size. Here:
the real declarations pass it, a count that skips the ghost is refused, and a bug that needs a
fourth request — invisible to the 3 × 3 induction and to bounded model checking — is rejected."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.system_bmc import check_system_bmc
from calculet.invariants.system_document import proof_scope
from calculet.invariants.system_induction import _induction, check_system_induction
from calculet.logic.expr import And, If
from calculet.machines.job_lanes import JobLaneSystem
from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
from calculet.machines.system import Coupled, CoupledSystem

pytestmark = pytest.mark.req("R10.2", "R14.3", "R5.1.2", "R12.3")


@pytest.mark.parametrize("system", [GenerationRequestSystem, GenerationJobSystem, JobLaneSystem])
def test_counting_systems_are_proved_for_every_size(system: type[CoupledSystem]) -> None:
    results = check_system_induction(system.definition)
    assert [r.subject for r in results if not r.ok] == []
    assert all("ghost counts beyond them (so every R, L)" in r.detail for r in results)


def _saturating() -> type[CoupledSystem]:
    """A generation that stops counting at its third pinned request: from then on a bind pins the
    request without ``acquire`` (a counter that saturates, say a 2-bit field)."""
    steps = {s.name: s for s in GenerationRequestSystem.definition.steps}
    replace, add = {}, []
    for name in ("bind@new", "bind@waiting_model"):
        s = steps[name]
        replace[name] = dataclasses.replace(s, guard=lambda sys, i, j: sys.lanes[j].active_requests < 3)
        add.append(Coupled(f"{name}_uncounted", request=s.request, binding="bind", involves="both",
                           request_args=s.request_args,
                           guard=lambda sys, i, j: And(sys.lanes[j].at("ready"), sys.lanes[j].active_requests >= 3)))
    return GenerationRequestSystem.derive("GenReqSaturating", replace=replace, add=add)


def test_a_bug_that_needs_a_fourth_request_is_rejected_only_by_the_every_size_proof() -> None:
    mutant = _saturating().definition
    # the induction at the encoded size alone (3 requests × 3 generations) proves the mutant:
    # three requests cannot make a fourth bind, so the saturated branch never fires there
    assert all(r.ok for r in _induction(mutant, 3, 3, None, None, beyond=False, scope=""))
    # with the requests beyond the encoded ones as a ghost count, the fourth bind is found
    failed = [r for r in check_system_induction(mutant) if not r.ok]
    assert {r.subject for r in failed} == {"bind@new_uncounted", "bind@waiting_model_uncounted"}
    assert all(r.broken == ["active_requests_are_the_pinned_live_requests"] for r in failed)
    assert all("at this size alone it holds" in r.detail for r in failed)
    cx = failed[0].counterexample
    assert cx is not None and any(k.startswith("beyond") and v >= 1 for k, v in cx.pre.items())


def test_bounded_model_checking_at_its_size_misses_the_fourth_request_bug() -> None:
    result = check_system_bmc(_saturating().definition, 2, 1, 6)
    assert result.ok, result.detail  # two requests never reach the third pin: why the every-size proof matters


def test_a_count_that_skips_the_ghost_is_proved_for_the_encoded_size_only() -> None:
    unhooked = [dataclasses.replace(inv, predicate=lambda sys: And(*[
        sys.lanes[j].active_requests == sum(If(sys.bound(i, j), 1, 0) for i in range(len(sys.requests)))
        for j in range(len(sys.lanes))])) if inv.counts else inv for inv in GenerationRequestSystem.definition.invariants]
    namespace = {"__doc__": "counts only the requests in view", "spec": "§10", "request": GenerationRequestSystem.request,
                 "lane": GenerationRequestSystem.lane, "steps": list(GenerationRequestSystem.definition.steps),
                 "invariants": unhooked}
    system = type("GenReqUnhooked", (CoupledSystem,), namespace)
    results = check_system_induction(system.definition, steps=["bind@new", "close@finishing"])
    assert results and all(r.ok for r in results)
    assert all("this size only: a count reads no SystemView.beyond — active_requests_are_the_pinned_live_requests"
               in r.detail and "every R, L" not in r.detail for r in results)
    assert proof_scope(system.definition, results).startswith("Proved for every size: nothing. For the encoded "
                                                              "instances only: the induction of all 5 properties")


def test_the_report_says_what_holds_for_every_size_and_what_for_the_encoded_instances() -> None:
    sd = GenerationJobSystem.definition
    results = [*check_system_induction(sd), check_system_bmc(sd, 1, 1, 2)]
    text = proof_scope(sd, results)
    # no invariant is a count any more (issue #20: the generation keeps no count of its jobs); the count of a
    # generation's jobs on the device is read by the guards of the steps that hand it to the generation
    assert text.startswith("Proved for every size: initiation and the induction of all 6 properties — each count "
                           "a step guard reads split into its encoded terms")
    assert text.endswith("For the encoded instances only: bounded model checking (R=1, L=1, depth≤2): no bug within "
                         "the depth, for that many instances.")


def test_the_live_view_counts_only_what_it_holds() -> None:
    from calculet.machines.system import SystemView
    assert SystemView([], [], [], []).beyond(("bound to", 0)) == 0


def test_a_step_whose_arguments_read_another_instance_is_proved_for_the_encoded_size_only() -> None:
    bind = next(s for s in GenerationRequestSystem.definition.steps if s.name == "bind@new")
    mutant = GenerationRequestSystem.derive("GenReqBindsTheLastGeneration", replace={"bind@new": dataclasses.replace(
        bind, request_args=lambda sys, i, j: {"gen": sys.lanes[len(sys.lanes) - 1].generation})})
    results = check_system_induction(mutant.definition, steps=["bind@new"])
    assert results and all("this size only: the arguments of bind@new are read from other instances" in r.detail
                           for r in results)
    # and it is a real bug at that size: the request names another generation than the one counting it
    assert any("pinned_request_names_its_generation" in r.broken for r in results if not r.ok)
