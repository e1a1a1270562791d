"""A faulty declaration fails when its class is created, naming the machine and the fault."""

from __future__ import annotations

import pytest

from calculet.logic.expr import And
from calculet.logic.types import Int
from calculet.machines.core import Machine
from calculet.machines.definition import Event, Invariant, State, T, Var
from calculet.machines.errors import InvalidDefinition


def test_unreachable_state_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Orphan: unreachable state\(s\) \['island'\]"):
        class Orphan(Machine):
            a = State(initial=True)
            b = State(terminal=True)
            island = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b)]


def test_transition_out_of_terminal_state_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Zombie: transition go@done leaves terminal state 'done'"):
        class Zombie(Machine):
            a = State(initial=True)
            done = State(terminal=True)
            go = Event()
            transitions = [T(a, go, done), T(done, go, a)]


def test_expression_naming_unknown_variable_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Typo: go@a: Typo has no variable or parameter 'cuont'"):
        class Typo(Machine):
            count = Var(Int(ge=0))
            a = State(initial=True)
            b = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b, guard=lambda v: v.cuont >= 0)]


def test_expression_naming_unknown_argument_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Args: transition on 'go' reads unknown argument 'tokns'"):
        class Args(Machine):
            a = State(initial=True)
            b = State(terminal=True)
            go = Event(tokens=Int(ge=1))
            transitions = [T(a, go, b, guard=lambda v, tokns: tokns >= 1)]


def test_invariant_naming_unknown_variable_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Inv: invariant sane: Inv has no variable or parameter 'nope'"):
        class Inv(Machine):
            count = Var(Int(ge=0))
            a = State(initial=True)
            b = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b)]
            invariants = [Invariant("R0", name="sane", predicate=lambda v: And(v.count >= 0, v.nope))]


def test_effect_assigning_unknown_variable_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Eff: effect of go@a assigns unknown variable 'total'"):
        class Eff(Machine):
            count = Var(Int(ge=0))
            a = State(initial=True)
            b = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b, effect=lambda v: {"total": 1})]


def test_two_unguarded_transitions_for_one_state_and_event_are_refused():
    with pytest.raises(InvalidDefinition, match=r"Twins: unguarded transition go@a shadows go@a->c for \(a, go\)"):
        class Twins(Machine):
            a = State(initial=True)
            b = State(terminal=True)
            c = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b), T(a, go, c)]


def test_python_boolean_operators_are_refused():
    """`and`/`not` call bool() on a z3 term: the declaration must use the helpers."""
    with pytest.raises(InvalidDefinition, match=r"Py: go@a: expression is not encodable"):
        class Py(Machine):
            count = Var(Int(ge=0))
            a = State(initial=True)
            b = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b, guard=lambda v: v.count >= 0 and v.count <= 3)]


def test_dead_end_state_is_refused():
    with pytest.raises(InvalidDefinition, match=r"Stuck: non-terminal state 'b' has no outgoing transition"):
        class Stuck(Machine):
            a = State(initial=True)
            b = State()
            go = Event()
            transitions = [T(a, go, b)]


def test_two_initial_states_are_refused():
    with pytest.raises(InvalidDefinition, match=r"Twice: needs exactly one initial state"):
        class Twice(Machine):
            a = State(initial=True)
            b = State(initial=True)
            go = Event()
            transitions = [T(a, go, b), T(b, go, a)]
