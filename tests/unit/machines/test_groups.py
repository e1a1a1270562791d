"""Issue #17 class 3: one source of truth for terminal states and state groups."""

from __future__ import annotations

import pytest

from calculet.invariants.mutation import derive
from calculet.machines import InvalidDefinition, KvSequenceMachine, RequestMachine
from calculet.machines.core import Machine
from calculet.machines.definition import TERMINAL_GROUP, Event, Group, Invariant, State, T, is_terminal
from calculet.machines.request import ENDED, HOLDING, RUNNING, TERMINAL, WAITING, is_running
from calculet.runtime.scheduling.registry import RUNNING_STATES, TERMINAL_STATES, WAITING_STATES

pytestmark = pytest.mark.req("R2.3", "R4.6")


def test_groups_are_the_states_that_declare_them():
    d = RequestMachine.definition
    assert TERMINAL == d.terminal == frozenset(s for s, st in d.states.items() if st.terminal)
    assert RUNNING == frozenset(s for s, st in d.states.items() if "running" in st.groups)
    assert WAITING == d.group("waiting") and HOLDING == d.group("holding") and ENDED == d.group("ended")
    assert TERMINAL_STATES == TERMINAL and RUNNING_STATES == RUNNING and WAITING_STATES == WAITING - {d.initial}


def test_group_predicates_read_the_instance_declaration():
    r = RequestMachine.create(prompt_tokens=2, max_new_tokens=2, max_seq=8)
    assert not is_running(r) and not is_terminal(r)
    r.fire("cancel")
    assert is_terminal(r)
    assert is_terminal.of(KvSequenceMachine) == frozenset()


def test_unflagging_a_state_changes_the_terminal_group_and_the_derived_property():
    d = RequestMachine.definition
    completed = d.states["completed"]
    mutant = derive(RequestMachine, "Unflagged", lambda rows, _: rows,
                    states={"completed": State(terminal=False, doc=completed.doc, groups=completed.groups)})
    assert "completed" not in mutant.definition.terminal
    assert "completed" not in is_terminal.of(mutant)
    final = next(sp for sp in mutant.definition.step_properties if sp.name == "terminal_is_final")
    assert "completed" not in str(final.rejects) or final.rejects  # derived from the flags, not a tuple


def test_a_terminal_group_declared_by_hand_is_refused():
    with pytest.raises(InvalidDefinition, match="terminal group comes from terminal=True"):
        class Bad(Machine):
            a = State(initial=True)
            b = State(terminal=True, groups=("terminal",))
            go = Event()
            transitions = [T(a, go, b)]


def test_an_unknown_group_in_an_expression_is_refused():
    with pytest.raises(InvalidDefinition, match="no state group"):
        class Bad(Machine):
            a = State(initial=True)
            b = State(terminal=True)
            go = Event()
            transitions = [T(a, go, b)]
            invariants = [Invariant("R0", name="x", predicate=lambda v: Group("nowhere")(v),
                                    rejects=({"state": "a"},))]


def _completed_view(definition):
    """A view in state Completed of ``definition`` (what ``Group`` reads: the class's ``definition`` and ``at``)."""
    view = type("View", (), {"definition": definition, "at": lambda self, *states: "completed" in states})
    return view()


def test_a_group_keeps_each_declarations_members_apart():
    """``Group`` remembers its members per declaration (issue #20: the monitors call it for every invariant they
    check): the same group applied to a machine and to a derived one with Completed unflagged answers each from
    its own declaration, in either order. Mutant caught: one remembered member list for every declaration."""
    d = RequestMachine.definition
    completed = d.states["completed"]
    mutant = derive(RequestMachine, "UnflaggedAgain", lambda rows, _: rows,
                    states={"completed": State(terminal=False, doc=completed.doc, groups=completed.groups)})
    for order in ((d, mutant.definition), (mutant.definition, d)):
        group = Group(TERMINAL_GROUP)
        for definition in order:
            assert group(_completed_view(definition)) == (definition is d)
