"""The KV pool monitor checks only the lanes that moved, and that is the whole-pool verdict (issue #20, #17).

The two lemmas the restriction rests on are proved with z3 over every subset of a 4-lane pool for
every declared KvLanePool invariant, and fail for invariants of another shape; a Hypothesis test
drives random lives of a real KvLaneManager with silent corruptions of lanes and ghosts (state
changed behind the manager's back) and compares, after every step, the restricted verdict with
the declared predicates evaluated on the whole pool (R9.2.1, R9.2.4, R5.1.2, R17.2.4).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from calculet.clock import FakeClock
from calculet.errors import DefinitionError
from calculet.logic.expr import And, Implies, Not
from calculet.machines.errors import InvariantViolation, TransitionNotAllowed
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.machines.pool import PoolInvariant
from calculet.runtime.scheduling.kv import KvLaneManager, KvLease
from calculet.runtime.scheduling.kv_check_proof import prove_restriction, prove_split, related
from calculet.runtime.scheduling.kv_checks import _VALUES, PoolMonitor, _key, whole_verdict
from calculet.runtime.scheduling.kv_guard import measure_totals
from tests.unit.runtime.runtime_support import expression_calls

POOL = KvLanePool.definition


@pytest.mark.req("R9.2.1", "R5.1.2", "R9.2.4", "R17.2.4")
def test_the_restriction_and_the_split_are_proved_for_every_declared_invariant():
    assert prove_restriction(POOL, 4) == []
    assert prove_split(POOL, 4) == []


def _with(invariant: PoolInvariant):
    return dataclasses.replace(POOL, invariants=(*POOL.invariants, invariant))


def test_an_invariant_relating_lanes_the_monitor_does_not_relate_fails_the_proofs():
    """One seq id per lane across generations: two lanes of different generations are unrelated for the
    monitor, so checking only the moved lane's group would miss a clash — the lemmas say so."""
    across = PoolInvariant("R9.2.1", "one_seq_across_generations", lambda pool: And(*[
        Implies(And(Not(pool.lanes[a].at("free")), Not(pool.lanes[b].at("free"))),
                pool.lanes[a].seq_id != pool.lanes[b].seq_id)
        for a in range(len(pool.lanes)) for b in range(a + 1, len(pool.lanes))]))
    assert any("one_seq_across_generations" in f for f in prove_restriction(_with(across), 3))
    assert any("one_seq_across_generations" in f for f in prove_split(_with(across), 3))


def test_a_count_no_measure_captures_fails_the_proofs():
    """Committed tokens summed against a budget: the monitor lowers budgets by the declared measures
    (reserved tokens, held lanes), which do not account for committed tokens."""
    committed = PoolInvariant("R5.1.2", "committed_within_budget", lambda pool: sum(
        (pool.lanes[j].committed_len for j in range(len(pool.lanes))), 0) <= pool.max_sequences)
    assert any("committed_within_budget" in f for f in prove_split(_with(committed), 3))


# ---------------------------------------------------------------------------- random lives

OPS = ("reserve", "reserve_seq", "submit", "commit", "abort", "fault", "release", "confirm", "recover")
CORRUPTIONS = ("same_owner", "more_tokens", "held_free_lane", "free_lane_values", "other_gen")


def _pool() -> KvLaneManager:
    return KvLaneManager(5, 8, clock=FakeClock(), max_kv_tokens=20, max_sequences=4)


def _apply(kv: KvLaneManager, leases: list[KvLease], commands: list, op: str, pick: int) -> None:
    """One operation of the manager's API (refusals tolerated: a corrupted pool may refuse), or one
    corruption of a lane or ghost behind its back."""
    lane = kv.lane(pick % kv.lanes)
    held = [j for j in range(kv.lanes) if kv.lane(j).state != "free"]
    try:
        if op in ("reserve", "reserve_seq"):
            lease = kv.reserve(1 + pick % 2, 1 + pick % 6, seq_id=(pick % 3 + 1) if op == "reserve_seq" else None)
            if isinstance(lease, KvLease):
                leases.append(lease)
        elif op == "submit" and leases:
            kv.submit(leases[pick % len(leases)], 1)
        elif op in ("commit", "abort", "fault") and leases:
            kv.settle(leases[pick % len(leases)], op)
        elif op == "release" and leases:
            command = kv.release(leases.pop(pick % len(leases)))
            if command is not None:
                commands.append(command)
        elif op == "confirm" and commands:
            command = commands.pop(pick % len(commands))
            kv.confirm_release(command.lane, command.seq_id)
        elif op == "recover" and kv.lane(pick % kv.lanes).state == "unknown":
            commands.append(kv.recover(pick % kv.lanes))
    except (DefinitionError, TransitionNotAllowed, InvariantViolation):
        pass
    if op == "same_owner" and len(held) >= 2:
        a, b = kv.lane(held[pick % len(held)]), kv.lane(held[(pick + 1) % len(held)])
        a.seq_id, a.generation = b.seq_id, b.generation
    elif op == "more_tokens":
        lane.reserved_len += 6 + pick
    elif op == "held_free_lane" and lane.state == "free":
        lane._state = "reserved"
        lane.seq_id, lane.generation = 90 + pick, 1
    elif op == "free_lane_values" and lane.state == "free":
        lane.seq_id, lane.generation = 7, 1  # breaks nothing: a Free lane is related to none
    elif op == "other_gen" and held:
        kv.lane(held[pick % len(held)]).generation += 1


@pytest.mark.req("R9.2.1", "R5.1.2", "R9.2.4", "R17.2.4")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 11)), min_size=1, max_size=30),
       st.tuples(st.sampled_from(CORRUPTIONS), st.integers(0, 11)), st.integers(0, 30))
def test_the_restricted_verdict_is_the_whole_pools_after_every_step(ops, corruption, at):
    """After each step of a random life of manager operations with one silent corruption of a lane or a
    ghost at step ``at`` (state changed behind the manager's back), the invariants the restricted check
    finds broken are exactly those the declared predicates break on the whole pool. A check that found a
    fault forgets its snapshot (as ``check_pool`` does), so a pool that stays broken is reported at every
    later check, not only at the one that saw it break."""
    MONITOR.configure(enabled=True, mode="count")  # the manager's own checks count; this test compares verdicts
    kv, mon = _pool(), PoolMonitor()
    leases: list[KvLease] = []
    commands: list = []
    assert PoolMonitor.verdict(mon.advance(kv)) == whole_verdict(kv) == []
    for op, pick in [("reserve", 0), ("reserve_seq", 1), ("reserve", 3)] + ops[:at] + [corruption] + ops[at:]:
        _apply(kv, leases, commands, op, pick)
        restricted = PoolMonitor.verdict(mon.advance(kv))
        if restricted:
            mon.forget()
        assert restricted == whole_verdict(kv), f"after {op}({pick})"
        assert mon.totals() == measure_totals(POOL, kv.lane_list())  # the sums it lowers budgets by, kept exact
        lanes = kv.lane_list()
        for a in lanes:  # the monitor's key is the relation the lemmas are proved for
            for b in lanes:
                if a is not b:
                    ka = _key(_VALUES(a))
                    assert bool(related(a, b)) == (ka is not None and ka == _key(_VALUES(b)))


def test_a_check_evaluates_only_the_lanes_that_moved():
    """On a 64-lane pool, a commit evaluates one lane's group; nothing moved, nothing is evaluated."""
    kv = KvLaneManager(64, 8, clock=FakeClock())
    leases = [kv.reserve(1, 4) for _ in range(40)]
    mon = PoolMonitor()
    assert len(mon.advance(kv)) == 64  # the first check sees every lane
    assert mon.advance(kv) == []
    lease = leases[7]
    assert isinstance(lease, KvLease)
    kv.submit(lease, 1)
    kv.commit(lease)
    parts = mon.advance(kv)
    assert [p.lanes for p in parts] == [(lease.lane,)]
    assert PoolMonitor.verdict(parts) == []


def test_a_fault_is_reported_at_every_later_check_while_it_lasts():
    """Counted, not raised (production): the check that finds a fault forgets its snapshot, so the next
    check looks at every lane and counts it again, although nothing moved in between."""
    MONITOR.configure(enabled=True, mode="count")
    kv = _pool()
    a, b = kv.reserve(1, 2), kv.reserve(1, 2)
    assert isinstance(a, KvLease) and isinstance(b, KvLease)
    kv.lane(a.lane).seq_id = b.seq_id
    before = MONITOR.statistics().violations.get((POOL.name, "unique_owner_per_generation"), 0)
    kv.submit(b, 1)
    kv.commit(b)
    after = MONITOR.statistics().violations.get((POOL.name, "unique_owner_per_generation"), 0)
    assert after - before == 2


def test_a_lane_changed_behind_the_managers_back_is_found_with_its_related_lanes():
    """Only lane a moved (renamed to b's sequence): b did not, but it is related to a now, so it is kept in
    a's group and the clash is found; the manager's own monitor raises at its next operation."""
    kv, mon = _pool(), PoolMonitor()
    a, b = kv.reserve(1, 2), kv.reserve(1, 2)
    assert isinstance(a, KvLease) and isinstance(b, KvLease)
    mon.advance(kv)
    kv.lane(a.lane).seq_id = b.seq_id
    parts = mon.advance(kv)
    assert [p.lanes for p in parts] == [tuple(sorted((a.lane, b.lane)))]
    assert PoolMonitor.verdict(parts) == ["unique_owner_per_generation"]
    with pytest.raises(InvariantViolation) as caught:
        kv.reserve(1, 2)
    assert caught.value.invariant == "unique_owner_per_generation"


class _Lane:
    """A lane as the pool's predicates read it: a state and the declared variables."""

    def __init__(self, state: str, **values: int) -> None:
        self.state = state
        self.__dict__.update(values)

    def at(self, *states: str) -> bool:
        return self.state in states


@pytest.mark.req("R9.2.1", "R5.1.2", "R9.2.4")
def test_the_generated_one_lane_check_is_the_declared_predicates():
    """The one-lane part's check generated from the declared predicates' z3 terms (kv_guard, issue #20) names
    exactly the invariants the declared predicates find false on that view, on random lanes, ghosts and
    lowered budgets (mutants: a printer reading the ghost from the lane, an invariant left out)."""
    import random

    from calculet.machines.kv_sequence import KvSequenceMachine
    from calculet.machines.pool import PoolView
    from calculet.runtime.scheduling.kv_guard import compile_one_lane_invariants

    broken, _ = compile_one_lane_invariants(POOL)
    rnd = random.Random(20)
    states = list(KvSequenceMachine.definition.states)
    seen = set()
    for _ in range(2000):
        lane = _Lane(rnd.choice(states), **{v: rnd.randint(0, 4) for v in KvSequenceMachine.definition.vars})
        ghost = {g: rnd.randint(0, 4) for g in POOL.ghosts}
        budgets = {p: rnd.randint(-1, 4) for p in POOL.params}
        declared = [inv.name for inv in POOL.invariants if not inv.predicate(PoolView([lane], budgets, [ghost]))]
        assert broken(lane, ghost, budgets) == declared
        seen.update(declared)
    assert seen == {inv.name for inv in POOL.invariants} - {"unique_owner_per_generation"}  # pairs: none on one lane


@pytest.mark.req("R9.2.1", "R5.1.2")
def test_a_check_of_one_lane_parts_walks_no_declared_expression():
    """A sampled check whose parts are single lanes runs the generated check, not the expression helpers
    (mutant: ``AcrossParts.predicate`` evaluating the declared predicate on every part again; the verdicts stay
    equal)."""
    from calculet.runtime.scheduling.kv_checks import check_pool

    kv = KvLaneManager(8, 16, clock=FakeClock(), max_kv_tokens=64, max_sequences=8)
    for seq in (1, 2, 3):
        kv.reserve(1, 8, seq_id=seq)
    kv.pool_monitor.forget()
    _, walked = expression_calls(lambda: check_pool(kv, "test"))
    assert walked == []
