"""The inductive step's goals built once and moved by substitution are the goals built per variant (#17).

Likewise the pool induction's goals (lane 0's post-terms substituted) and per-machine consecution's.

``StepGoals`` (calculet/invariants/system_encoding.py) builds every system invariant and the moved
instances' invariants once on the symbolic pre-frame and substitutes the moved request's, lane's and
binding's post-terms into them, instead of evaluating the declared predicates again on each post-frame
(verify --fast ≤ 20 s of CPU). The verdicts of ``verify`` stay the same only if the goals are the same:
here, for every variant of every declared coupled system, the two builds give the same goals in the same
order (names and R-ids), each pair the same z3 term or proved equivalent by z3 (§9.2; the
proofs of the R-ids the systems state, issue #17).
"""

from __future__ import annotations

import pytest
import z3

from calculet.invariants import pool_checks, system_encoding
from calculet.invariants.checks import after, as_bool, canonical, moved_to, post_state
from calculet.invariants.pool_checks import check_pool_induction
from calculet.invariants.system_encoding import Move, StepGoals, fresh_frame, initial_frame, step_args, system_goals
from calculet.invariants.system_induction import check_system_induction
from calculet.logic.symbolic import symbolic_args
from calculet.machines import ALL_MACHINES
from calculet.machines.kv_pool import KvLanePool
from calculet.verify import SYSTEMS
from tests.property.test_mutants import MUTANTS, SYSTEM_MUTANTS


def _direct(sd, frame, move):  # type: ignore[no-untyped-def]
    return system_goals(sd, move.after(frame)) + move.instance_goals(sd)


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda s: s.definition.name)
def test_substituted_goals_are_the_goals_built_on_each_post_frame(system: type) -> None:
    sd = system.definition
    frame = fresh_frame(sd, 3, 3, "sg", beyond=True)
    args, _ = step_args(sd, "sg")
    built = StepGoals(sd, frame)
    assert built.constant
    same = proved = 0
    for v in sd.variants:
        move = Move(sd, v, frame, 0, 0, args)
        direct, moved = _direct(sd, frame, move), built.after(move)
        assert [(n, r) for n, r, _ in moved] == [(n, r) for n, r, _ in direct], v.name
        for (name, _, a), (_, _, b) in zip(direct, moved):
            if a.eq(b):
                same += 1
                continue
            s = z3.Solver()
            s.add(a != b)
            assert s.check() == z3.unsat, f"{v.name}: {name} differs after substitution"
            proved += 1
    assert same + proved > len(sd.variants) * len(sd.invariants) // 2
    assert same > proved  # nearly all come out as the very same term


def test_a_frame_of_values_that_are_not_constants_is_built_directly() -> None:
    """Substitution replaces constants only: from the initial frame (values are literals) the goals are
    built on the post-frame itself, and are exactly the direct ones."""
    sd = SYSTEMS[0].definition
    frame = initial_frame(sd, 2, 2)
    args, _ = step_args(sd, "sg0")
    built = StepGoals(sd, frame)
    assert not built.constant
    move = Move(sd, sd.variants[0], frame, 0, 0, args)
    assert all(a.eq(b) for (_, _, a), (_, _, b) in zip(built.after(move), _direct(sd, frame, move)))


def _verdicts(results):  # type: ignore[no-untyped-def]
    return [(r.check, r.subject, r.ok, r.detail, sorted(r.broken)) for r in results]


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.kind == "pool"] + [None],
                         ids=lambda m: "KvLanePool" if m is None else m.name)
def test_pool_induction_is_the_same_with_the_goals_built_on_each_post_state(mutant, monkeypatch):
    """Pool induction substitutes lane 0's post-terms into the pool invariants built once; with that turned off
    (every value taken for a non-constant, so each row's goals are built on its post-state) the real pool and
    every pool mutant get the same verdicts, details and broken properties."""
    pool = (KvLanePool if mutant is None else mutant.build()).definition
    substituted = check_pool_induction(pool, 4)
    monkeypatch.setattr(pool_checks, "is_constant", lambda term: False)
    assert _verdicts(check_pool_induction(pool, 4)) == _verdicts(substituted)
    assert mutant is None or not all(r.ok for r in substituted)


@pytest.mark.parametrize("mutant, step", [(m, step) for m, step, _ in SYSTEM_MUTANTS[:4]], ids=lambda m: getattr(m, "name", ""))
def test_system_induction_rejects_a_mutant_the_same_with_the_goals_built_on_each_post_frame(mutant, step, monkeypatch):
    """The same for a coupled system's induction: the substituted goals and the goals built on each post-frame
    reject the seeded faults with the same verdicts, each naming the invariant the fault breaks. (Which other
    invariants a failure lists is whatever else is false in the counterexample z3 picks, which may differ.)"""
    sd = mutant.build().definition
    substituted = check_system_induction(sd, steps=[step])
    monkeypatch.setattr(system_encoding, "is_constant", lambda term: False)
    direct = check_system_induction(sd, steps=[step])
    assert [(r.check, r.subject, r.ok) for r in direct] == [(r.check, r.subject, r.ok) for r in substituted]
    assert not all(r.ok for r in substituted)
    for results in (substituted, direct):
        assert any(mutant.expected_invariant in r.broken for r in results if not r.ok)


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_consecution_goals_substituted_are_the_goals_on_each_post_state(machine):
    """Per-machine consecution: each invariant on a row's post-state is the pre-state's (built once per
    declaration, ``checks.canonical``) with the row's changes substituted — the same term, or an equivalent one."""
    d = machine.definition
    v, _, held = canonical(d)
    for t in d.transitions:
        post = post_state(d, t, v, symbolic_args(d.events[t.event]))
        moved = moved_to(v, post)
        for inv, pre in zip(d.invariants, held):
            direct, substituted = as_bool(inv.predicate(post)), after(pre, moved)
            if not direct.eq(substituted):
                s = z3.Solver()
                s.add(direct != substituted)
                assert s.check() == z3.unsat, f"{t.name}: {inv.name}"
