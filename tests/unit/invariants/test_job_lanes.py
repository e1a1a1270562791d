"""Issue #17: device jobs × KV lanes (R14.3/R14.4) — the declaration, its witnesses and its vacuity."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.strength import check_system_witnesses
from calculet.invariants.system_induction import check_system_induction, check_system_vacuity
from calculet.invariants.traceability import proof_references
from calculet.logic.expr import And
from calculet.machines.job import DeviceJobMachine
from calculet.machines.job_lanes import JobLaneSystem
from calculet.machines.system import CoupledSystem
from calculet.verify import SYSTEMS


def _with_invariants(invariants) -> type[CoupledSystem]:
    d = JobLaneSystem.definition
    return type("Weakened", (CoupledSystem,), {
        "__doc__": "JobLaneSystem with an invariant weakened.", "spec": d.spec, "request": d.request,
        "lane": d.lane, "steps": list(d.steps), "invariants": invariants, "omitted": list(d.omitted)})


@pytest.mark.req("R14.4")
def test_every_job_row_is_a_step_and_every_untaken_lane_row_is_explained():
    """The steps come from the declarations: every DeviceJobMachine row is taken, and the
    KvSequenceMachine rows no step takes are exactly the documented omissions."""
    d = JobLaneSystem.definition
    taken = {t.name for v in d.variants for t in v.lane_rows}
    assert taken == {t.name for t in DeviceJobMachine.definition.transitions}
    assert sorted(d.untaken_rows()) == sorted(row for row, _ in d.omitted)
    assert JobLaneSystem in SYSTEMS  # verify checks it


@pytest.mark.req("R14.4")
def test_r14_4_is_credited_to_the_job_lane_properties():
    refs = proof_references()
    for name in ("open_step_lane_is_held", "unknown_lane_names_its_job",
                 "lane_commits_only_after_its_job_answered", "open_step_closes_only_after_its_job_answered"):
        assert f"JobLaneSystem.{name}" in refs["R14.4"]
    assert "JobLaneSystem.inflight_jobs_within_budget" in refs["R5.1.2"]


@pytest.mark.req("R14.4")
@pytest.mark.parametrize("name", [inv.name for inv in JobLaneSystem.definition.invariants])
def test_each_invariant_replaced_by_true_fails_on_its_negative_witness(name):
    invs = [dataclasses.replace(inv, predicate=lambda sys: True) if inv.name == name else inv
            for inv in JobLaneSystem.definition.invariants]
    assert check_system_witnesses(JobLaneSystem.definition).ok
    result = check_system_witnesses(_with_invariants(invs).definition)
    assert not result.ok and name in result.detail


@pytest.mark.req("R14.4")
def test_a_dead_step_is_flagged_by_vacuity_and_the_real_ones_are_not():
    assert all(r.ok for r in check_system_vacuity(JobLaneSystem.definition))
    commit = next(s for s in JobLaneSystem.definition.steps if s.name == "commit")
    dead = JobLaneSystem.derive("DeadCommit", replace={"commit": dataclasses.replace(
        commit, guard=lambda sys, i, j: And(sys.lanes[j].at("prepared"), sys.lanes[j].at("completed")))})
    flagged = [r for r in check_system_vacuity(dead.definition) if not r.ok]
    assert [r.subject for r in flagged] == ["commit"]


@pytest.mark.req("R14.4")
def test_the_strengthening_is_needed():
    """Without lanes_name_only_submitted_jobs, submitting a Prepared job that an Unknown lane is bound to breaks
    unknown_lane_names_its_job (the lane would name a job running in time): the reason it is declared."""
    invs = [inv for inv in JobLaneSystem.definition.invariants if inv.name != "lanes_name_only_submitted_jobs"]
    broken = [r for r in check_system_induction(_with_invariants(invs).definition, steps=["job:submit@prepared"])
              if not r.ok]
    assert broken and "unknown_lane_names_its_job" in broken[0].broken