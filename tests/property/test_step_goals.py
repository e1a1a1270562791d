"""The inductive step's goals built once and moved by substitution are the goals built per variant (#17).

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

from calculet.invariants.system_encoding import Move, StepGoals, fresh_frame, initial_frame, step_args, system_goals
from calculet.verify import SYSTEMS


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
