"""The KV pool's reserve guard runs as declared, in O(1) (issue #17 "the runtime executes what is
proved", issue #20 admission cost): compiled from KvLanePool over budget totals, proved equal to
the declared guard on the whole pool, and checked against it by the monitor; a weakened guard or
measure, or a drifted total, is rejected."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.clock import FakeClock
from calculet.errors import DefinitionError
from calculet.logic.expr import And, Not
from calculet.machines.errors import InvariantViolation
from calculet.machines.kv_pool import KvLanePool, _held_count
from calculet.machines.pool import PoolOp
from calculet.invariants.mutation import derive_pool
from calculet.runtime.scheduling import kv as kv_module
from calculet.runtime.scheduling import kv_checks
from calculet.runtime.scheduling.kv import KvLaneManager, KvLease, NoCapacity
from calculet.runtime.scheduling.kv_guard import (MEASURES, compile_reserve_guard, events_keeping_measures,
                                                  measure_totals, prove_reduction)

POOL = KvLanePool.definition


def _no_kv_budget():
    """The declared guard with its KV-token budget dropped (uniqueness and the sequence budget stay)."""
    return derive_pool(KvLanePool, "NoKvBudget", [PoolOp(
        "reserve", guard=lambda pool, i, seq, gen, tokens: And(
            *[Not(And(Not(pool.lanes[j].at("free")), pool.lanes[j].seq_id == seq, pool.lanes[j].generation == gen))
              for j in pool.others(i)],
            _held_count(pool, pool.others(i)) + 1 <= pool.max_sequences))]).definition


def budget_faults(kv: KvLaneManager) -> list[str]:
    """What is wrong with ``kv``'s budgets (R5.1.2): a 4-lane pool, 10 KV tokens, 3 sequences."""
    faults = []
    first = kv.reserve(1, 6)
    second = kv.reserve(1, 4)
    if not (isinstance(first, KvLease) and isinstance(second, KvLease)):
        faults.append("refused within the budget")
    if not isinstance(kv.reserve(1, 1), NoCapacity):
        faults.append("granted an 11th KV token")
    if isinstance(second, KvLease):
        kv.confirm_release(second.lane, kv.release(second).seq_id)  # type: ignore[union-attr]
    if not isinstance(kv.reserve(1, 2), KvLease) or not isinstance(kv.reserve(1, 2), KvLease):
        faults.append("refused after a release returned tokens")
    if not isinstance(kv.reserve(1, 1), NoCapacity):
        faults.append("granted a 4th sequence")
    return faults


def _pool() -> KvLaneManager:
    return KvLaneManager(4, 8, clock=FakeClock(), max_kv_tokens=10, max_sequences=3)


@pytest.mark.req("R5.1.2", "R9.2.1")
@pytest.mark.parametrize("lanes", [2, 3, 4, 6])
def test_the_reduced_guard_is_the_declared_guard_on_the_whole_pool(lanes: int):
    assert prove_reduction(POOL, lanes) is None


@pytest.mark.req("R5.1.2")
def test_a_measure_that_misses_what_a_budget_counts_is_caught_by_the_proof(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(MEASURES, "max_sequences", lambda lane: 0)  # held lanes no longer counted
    assert prove_reduction(POOL, 3) is not None


@pytest.mark.req("R5.1.2")
def test_the_runtime_enforces_the_declared_budgets():
    assert budget_faults(_pool()) == []


@pytest.mark.req("R5.1.2", "R17.2.3")
def test_a_runtime_guard_that_drops_the_kv_budget_is_rejected_by_the_monitor(monkeypatch: pytest.MonkeyPatch):
    """The seeded runtime fault: the manager compiled from a guard without the KV budget while the
    declaration keeps it — the monitor's whole-pool evaluation of the declared guard disagrees."""
    weak, _ = compile_reserve_guard(_no_kv_budget())
    monkeypatch.setattr(kv_module, "_RESERVE_GUARD", weak)
    with pytest.raises(InvariantViolation) as caught:
        budget_faults(_pool())
    assert caught.value.invariant == "reserve_guard_is_the_declared_one"


@pytest.mark.req("R5.1.2", "R17.2.3")
def test_a_declaration_that_drops_the_kv_budget_is_executed_weakened_and_rejected(monkeypatch: pytest.MonkeyPatch):
    """The seeded declaration fault (issue #17 class 1: the guard weakened together with the
    invariant it protects): the runtime executes the declared guard, so it now grants the 11th
    token, and the budget test above fails on it — no hand-written copy hides the change."""
    weak_pool = _no_kv_budget()
    weak_pool = dataclasses.replace(weak_pool, invariants=tuple(
        inv for inv in weak_pool.invariants if inv.name != "kv_tokens_within_budget"))
    weak, _ = compile_reserve_guard(weak_pool)
    monkeypatch.setattr(kv_module, "_RESERVE_GUARD", weak)
    monkeypatch.setattr(kv_checks, "_POOL", weak_pool)  # the monitors read the same weakened declaration
    assert "granted an 11th KV token" in budget_faults(_pool())


@pytest.mark.req("R5.1.2", "R17.2.3")
def test_budget_totals_that_drift_from_the_lanes_are_reported():
    kv = _pool()
    kv.reserve(1, 3)
    kv._totals[0] -= 1  # the seeded fault: a total no longer the lanes' sum
    with pytest.raises(InvariantViolation) as caught:
        kv.reserve(1, 2)
    assert caught.value.invariant in ("index_budget_totals_are_the_lanes_sums", "reserve_guard_is_the_declared_one")


@pytest.mark.req("R5.1.2")
def test_totals_follow_every_operation():
    kv = _pool()
    a = kv.reserve(1, 5)
    b = kv.reserve(1, 3)
    assert isinstance(a, KvLease) and isinstance(b, KvLease)
    kv.submit(a, 2)
    kv.fault(a)
    kv.release(a)
    kv.confirm_release(*(lambda c: (c.lane, c.seq_id))(kv.recover(a.lane)))
    kv.confirm_release(*(lambda c: (c.lane, c.seq_id))(kv.release(b)))
    lanes = [kv.lane(i) for i in range(kv.lanes)]
    assert kv.budget_totals() == measure_totals(POOL, lanes) == [0, 0]


def test_the_batch_paths_fire_only_events_that_provably_keep_the_totals():
    keeps = events_keeping_measures(POOL)
    assert {"commit", "fault"} <= keeps  # the events the batch paths fire (#20: a step opens and aborts with none)
    assert "reserve" not in keeps and "confirm_release" not in keeps


@pytest.mark.req("R9.2.1")
def test_a_second_lane_for_the_same_sequence_is_a_program_error():
    kv = _pool()
    lease = kv.reserve(1, 2, seq_id=7)
    assert isinstance(lease, KvLease)
    with pytest.raises(DefinitionError, match="already holds lane"):
        kv.reserve(1, 2, seq_id=7)
    assert isinstance(kv.reserve(2, 2, seq_id=7), KvLease)  # another generation may use the id


def test_the_test_suite_checks_the_whole_pool_at_every_operation_whatever_its_size():
    """Production samples a pool above POOL_CHECK_LANES lanes less often (its check is O(lanes²));
    the suite, which checks every event, checks every operation of any pool."""
    from calculet.machines.monitor import MONITOR
    from calculet.runtime.scheduling.kv import POOL_CHECK_LANES

    kv = KvLaneManager(2 * POOL_CHECK_LANES, 4, clock=FakeClock())
    before = MONITOR.statistics().checks
    for _ in range(5):
        kv.reserve(1, 2)
    assert MONITOR.statistics().checks - before >= 10  # the decision and the whole pool, each time


@pytest.mark.req("R5.1.2")
def test_the_generated_total_moves_are_the_declared_ones():
    """The per-step form generated from KvLanePool (issue #20) gives what the declaration gives: each budget
    total's move by one lane."""
    kv = KvLaneManager(4, 64, clock=FakeClock())
    totals = [100, 100]
    before = kv_module._MEASURES(kv.lane(0))
    kv.reserve(1, 7)
    kv_module._MOVES(totals, before, kv.lane(0))
    assert totals == [100 + 7, 100 + 1] == [100 + m for m in measure_totals(POOL, [kv.lane(0)])]

