"""#17: redundancy is reported at pool and joint-system level like per machine — an invariant the
others imply alone is named; an independent one is not."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.redundancy import check_pool_redundancy, check_system_redundancy
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.model_couplings import GenerationJobSystem
from calculet.machines.request_lanes import RequestLaneSystem


def _implied(results):
    return {r.subject for r in results if r.detail.startswith("implied")}


@pytest.mark.req("R17.2.3")
def test_a_twin_pool_invariant_is_reported_redundant():
    p = KvLanePool.definition
    assert _implied(check_pool_redundancy(p)) == set()  # every pool property adds strength
    twin = dataclasses.replace(p.invariants[0], name="twin")
    doubled = dataclasses.replace(p, invariants=(*p.invariants, twin))
    assert _implied(check_pool_redundancy(doubled)) == {p.invariants[0].name, "twin"}


@pytest.mark.req("R17.2.3")
@pytest.mark.parametrize("system", [RequestLaneSystem, GenerationJobSystem], ids=lambda s: s.definition.name)
def test_a_twin_system_invariant_is_reported_redundant(system):
    sd = system.definition
    before = _implied(check_system_redundancy(sd))
    target = next(inv for inv in sd.invariants if inv.name not in before)
    twin = dataclasses.replace(target, name="twin")
    doubled = dataclasses.replace(sd, invariants=(*sd.invariants, twin))
    assert {target.name, "twin"} <= _implied(check_system_redundancy(doubled))
