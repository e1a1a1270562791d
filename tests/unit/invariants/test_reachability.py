"""Issue #17 class 2: pool and joint-system vacuity and reachability — nothing to report on the
real declarations, a deliberately dead step flagged."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.invariants.mutation import derive_pool
from calculet.invariants.reachability import check_pool_reachability, check_pool_vacuity, check_system_reachability
from calculet.invariants.system_induction import check_system_vacuity
from calculet.logic.expr import And
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.pool import PoolOp
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.verify import SYSTEMS

pytestmark = pytest.mark.req("R17.2.3", "R9.2.1")


def test_real_pool_rows_all_fire_and_are_reached():
    assert [r.subject for r in check_pool_vacuity(KvLanePool.definition) if not r.ok] == []
    reach = check_pool_reachability(KvLanePool.definition)
    assert reach.ok, reach.detail


def test_a_dead_pool_guard_is_flagged_by_vacuity_and_reachability():
    dead = derive_pool(KvLanePool, "PoolDeadCommit", [PoolOp(
        "commit", guard=lambda pool, i, tokens: And(tokens >= 1, tokens <= 0))])
    assert {r.subject for r in check_pool_vacuity(dead.definition) if not r.ok} == {"commit@reserved", "commit@active"}
    reach = check_pool_reachability(dead.definition)
    assert not reach.ok and {"commit@reserved", "commit@active"} <= set(reach.broken)


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda x: x.definition.name)
def test_real_system_steps_all_fire(system):
    """Every joint system verify checks: no step is dead under its invariants."""
    assert [r.subject for r in check_system_vacuity(system.definition) if not r.ok] == []


def test_a_dead_system_step_is_flagged_by_vacuity():
    original = next(s for s in RequestLaneSystem.definition.steps if s.name == "submit_decode")
    dead = RequestLaneSystem.derive("SysDeadDecode", replace={"submit_decode": dataclasses.replace(
        original, guard=lambda sys, i, j: And(sys.bound(i, j), sys.requests[i].generated_tokens < 0))})
    assert [r.subject for r in check_system_vacuity(dead.definition) if not r.ok] == ["submit_decode"]


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda x: x.definition.name)
def test_real_system_steps_are_all_reached_from_the_initial_system(system):
    # the explicit-state search (about a second each; the symbolic unrolling took ~10 s and was marked slow)
    reach = check_system_reachability(system.definition, depth=system.definition.reach_depth)
    assert reach.ok and reach.subject == "R=1, L=1, explicit", reach.detail
