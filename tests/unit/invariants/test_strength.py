"""Issue #17: the proofs bite — every property declares negative witnesses that ``verify`` checks,
an invariant weakened to True fails on its witness, guards are needed or declared policy, and
redundancy is reported."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.mutation import derive, replace_row
from calculet.invariants.report import VerifyOptions, run_checks
from calculet.invariants.strength import (check_guards, check_pool_witnesses, check_redundancy,
                                          check_system_witnesses, check_witnesses)
from calculet.machines import ALL_MACHINES, ModelMachine
from calculet.machines.kv_pool import KvLanePool
from calculet.verify import SYSTEMS

pytestmark = pytest.mark.req("R17.2.3")

MACHINE_PROPERTIES = [(m, p.name) for m in ALL_MACHINES
                      for p in (*m.definition.invariants, *m.definition.all_step_properties)]


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_every_property_of_the_real_machines_rejects_its_witnesses(machine):
    result = check_witnesses(machine.definition)
    assert result.ok, result.detail
    d = machine.definition
    assert all(p.rejects for p in (*d.invariants, *d.all_step_properties))


def test_pool_and_system_properties_reject_their_witnesses():
    assert check_pool_witnesses(KvLanePool.definition).ok
    for system in SYSTEMS:
        assert check_system_witnesses(system.definition).ok, system.definition.name
        assert all(inv.rejects for inv in system.definition.invariants), system.definition.name


def _weakened(d, name):
    """``d`` with property ``name`` replaced by True (a state, step or event-aware predicate)."""
    def true(*_):
        return True
    invariants = tuple(dataclasses.replace(p, predicate=lambda v: True) if p.name == name else p
                       for p in d.invariants)
    steps = tuple(dataclasses.replace(p, predicate=lambda pre, post: True) if p.name == name else p
                  for p in d.step_properties)
    events = tuple(dataclasses.replace(p, predicate=lambda pre, post, step: True) if p.name == name else p
                   for p in d.event_properties)
    return dataclasses.replace(d, invariants=invariants, step_properties=steps, event_properties=events)


@pytest.mark.parametrize("machine, name", MACHINE_PROPERTIES,
                         ids=[f"{m.definition.name}.{n}" for m, n in MACHINE_PROPERTIES])
def test_each_machine_property_replaced_by_true_fails_on_its_witness(machine, name):
    result = check_witnesses(_weakened(machine.definition, name))
    assert not result.ok and name in result.broken, result.detail


@pytest.mark.parametrize("name", [inv.name for inv in KvLanePool.definition.invariants])
def test_each_pool_invariant_replaced_by_true_fails_on_its_witness(name):
    p = KvLanePool.definition
    weak = dataclasses.replace(p, invariants=tuple(dataclasses.replace(i, predicate=lambda pool: True)
                                                   if i.name == name else i for i in p.invariants))
    result = check_pool_witnesses(weak)
    assert not result.ok and name in result.broken


SYSTEM_INVARIANTS = [(x, inv.name) for x in SYSTEMS for inv in x.definition.invariants]


@pytest.mark.parametrize("system, name", SYSTEM_INVARIANTS,
                         ids=[f"{x.definition.name}.{n}" for x, n in SYSTEM_INVARIANTS])
def test_each_system_invariant_replaced_by_true_fails_on_its_witness(system, name):
    """Every joint system ``verify`` checks (#17: "weakens each declared invariant in turn")."""
    sd = system.definition
    weak = dataclasses.replace(sd, invariants=tuple(dataclasses.replace(i, predicate=lambda sys: True)
                                                    if i.name == name else i for i in sd.invariants))
    result = check_system_witnesses(weak)
    assert not result.ok and name in result.broken


def test_verify_fails_when_an_invariant_is_weakened_to_true():
    """The whole per-machine run (what ``python -m calculet.verify`` calls) fails, naming the
    weakened invariant, although every consecution proof still passes."""
    from calculet.machines import KvSequenceMachine
    weak = derive(KvSequenceMachine, "KvTrueLengths", lambda rows, d: rows, properties=lambda props: [
        dataclasses.replace(p, predicate=lambda v: True) if p.name == "lengths_ordered" else p for p in props])
    run = run_checks(VerifyOptions(pools=False), [weak], [])
    failures = run.failures()
    assert {f.check for f in failures} == {"witnesses", "guards"}  # every proof passes; these bite
    assert "lengths_ordered" in next(f for f in failures if f.check == "witnesses").broken
    # the guards that protected it (reserve's tokens <= max_seq, commit's room) are now needed by nothing
    assert {"reserve@free", "commit@reserved"} <= {f.subject for f in failures if f.check == "guards"}


def test_a_property_without_a_witness_fails():
    d = ModelMachine.definition
    bare = dataclasses.replace(d, invariants=tuple(dataclasses.replace(i, rejects=()) if i.name == "unloaded_is_clean"
                                                   else i for i in d.invariants))
    result = check_witnesses(bare)
    assert not result.ok and "declares no negative witness" in result.detail


def test_a_witness_outside_the_types_is_refused():
    d = ModelMachine.definition
    odd = dataclasses.replace(d, invariants=tuple(
        dataclasses.replace(i, rejects=({"state": "ready", "active_requests": -3, "buffers": False},))
        if i.name == "serving_has_resources" else i for i in d.invariants))
    result = check_witnesses(odd)
    assert not result.ok and "outside the declared types" in result.detail


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_every_guard_of_the_real_machines_is_needed_or_a_declared_policy(machine):
    assert [r.subject for r in check_guards(machine.definition) if not r.ok] == []


def test_a_guard_no_proof_needs_must_be_declared_a_policy():
    """freed@unloading's guard protects no property: without its policy note it is refused."""
    bare = derive(ModelMachine, "ModelNoPolicy", lambda rows, d: replace_row(rows, "freed@unloading", policy=""))
    refused = [r.subject for r in check_guards(bare.definition) if not r.ok]
    assert refused == ["freed@unloading"]


def test_redundancy_is_reported_for_an_invariant_the_others_imply():
    d = ModelMachine.definition
    twin = dataclasses.replace(next(i for i in d.invariants if i.name == "serving_has_resources"),
                               name="serving_has_resources_twin")
    doubled = dataclasses.replace(d, invariants=d.invariants + (twin,))
    report = {r.subject: r.detail for r in check_redundancy(doubled)}
    assert "redundant" in report["serving_has_resources_twin"]
    assert all(r.informational for r in check_redundancy(doubled))
