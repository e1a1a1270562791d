"""Conformance: the compiled dispatch behaves exactly like the python-statemachine reference.

One Hypothesis stateful test per machine fires random events — valid and invalid, with
random arguments biased toward the instance's own numbers so guards are hit — into both forms
and compares, after every step, the state, the variables, the accept/reject decision and the
transition taken. Afterwards, every declared transition must have been exercised.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from calculet.machines.monitor import MONITOR
from calculet.logic.symbolic import solve_arguments
from calculet.invariants.witness import witness_paths
from calculet.machines import ALL_MACHINES
from calculet.logic.types import Bool, EnumType, Int
from calculet.machines.core import Machine
from calculet.machines.errors import TransitionNotAllowed
from tests.machine_support import PARAMS


def _arg_strategy(typ, numbers):
    if isinstance(typ, Bool):
        return st.booleans()
    if isinstance(typ, EnumType):
        return st.sampled_from(list(typ.enum_cls))
    assert isinstance(typ, Int)
    near = sorted({n + d for n in numbers for d in (-1, 0, 1)})
    return st.one_of(st.integers(-1, 4), st.sampled_from(near)) if near else st.integers(-1, 4)


def make_conformance_test(machine: type[Machine], covered: set[str]):
    d = machine.definition
    events = sorted(d.events)

    class Conformance(RuleBasedStateMachine):
        @initialize(params=st.sampled_from(PARAMS[d.name]))
        def start(self, params):
            self.fast = machine.create(**params)
            self.ref = machine.reference(**params)
            if not hasattr(self, "seen"):
                self.seen: set[str] = set()  # this example's own coverage (keeps generation replayable)

        @precondition(lambda self: self.fast.state not in d.terminal)
        @rule(data=st.data(), event=st.sampled_from(events))
        def fire_any(self, data, event):
            self._fire(data, event)

        @precondition(lambda self: self.fast.state not in d.terminal)
        @rule(data=st.data())
        def fire_enabled(self, data):
            """An event with a row from the current state, preferring rows not yet exercised,
            so the deep paths (a whole request life) are reached within the step budget."""
            enabled = sorted(self.fast.enabled_events())
            fresh = [e for e in enabled
                     if any(t.name not in self.seen for t in d.transitions_from(self.fast.state, e))]
            self._fire(data, data.draw(st.sampled_from(fresh or enabled or events)))

        @precondition(lambda self: self.fast.state not in d.terminal)
        @rule(steps=st.integers(1, 6))
        def fire_solved(self, steps):
            """Up to ``steps`` transitions, each with arguments z3 finds to enable it now.

            Rows that keep the life going come first, then rows this example has not taken: a
            life must get deep (a whole request) before the rows found there can be taken. The
            random rules supply the variety (and most of the endings)."""
            for _ in range(steps):
                if self.fast.state in d.terminal:
                    return
                rows = sorted(d.transitions_from(self.fast.state), key=lambda t: (
                    t.target in d.terminal, t.name in self.seen, t.target == t.source, t.order))
                for row in rows:
                    args = solve_arguments(self.fast, row)
                    if args is not None:
                        self._fire_with(row.event, args)
                        break
                else:
                    return

        @precondition(lambda self: self.fast.state in d.terminal)
        @rule(params=st.sampled_from(PARAMS[d.name]))
        def restart(self, params):
            """A terminal instance accepts nothing more: begin another life."""
            self.start(params)

        def _fire(self, data, event):
            numbers = [v for v in list(self.fast.values().values()) + list(self.fast.params().values())
                       if isinstance(v, int) and not isinstance(v, bool)]
            args = {name: data.draw(_arg_strategy(typ, numbers), label=name)
                    for name, typ in d.events[event].args.items()}
            self._fire_with(event, args)

        def _fire_with(self, event, args):
            outcomes = []
            for inst in (self.fast, self.ref):
                try:
                    outcomes.append(("ok", inst.fire(event, **args), inst.last_transition.name))
                except TransitionNotAllowed:
                    outcomes.append(("refused", inst.state, None))
            assert outcomes[0] == outcomes[1], f"{event}({args}): compiled {outcomes[0]} != reference {outcomes[1]}"
            if outcomes[0][0] == "ok":
                covered.add(outcomes[0][2])
                self.seen.add(outcomes[0][2])

        @invariant()
        def same_configuration(self):
            if hasattr(self, "fast"):
                assert self.fast.state == self.ref.state
                assert self.fast.values() == self.ref.values()
                assert MONITOR.broken(self.fast) == []

    Conformance.__name__ = f"{d.name}Conformance"
    return Conformance


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_every_transition_taken_identically_by_both_forms(machine):
    """Directed: a witness path for every declared row, replayed on compiled and reference."""
    d = machine.definition
    paths, unreached = witness_paths(machine, PARAMS[d.name])
    assert not unreached, f"no witness path found for {sorted(unreached)}"
    for name, (params, path) in paths.items():
        fast, ref = machine.create(**params), machine.reference(**params)
        for event, args in path:
            assert fast.fire(event, **args) == ref.fire(event, **args)
            assert fast.last_transition.name == ref.last_transition.name
            assert fast.values() == ref.values()
        assert fast.last_transition.name == name
    print(f"{d.name}: {len(paths)}/{len(d.transitions)} transitions taken along witness paths")


# The default suite's random run per machine; the slow tier runs the profile's full count (150
# under `ci`, 3000 under `deep` in `make soak`). The directed test above takes every row on both
# forms either way.
FAST_EXAMPLES = 30


def _random_sequences_conform(machine: type[Machine], examples: int) -> None:
    covered: set[str] = set()
    test_class = make_conformance_test(machine, covered)
    run_state_machine_as_test(test_class, settings=settings(settings.default, max_examples=examples))
    declared = {t.name for t in machine.definition.transitions}
    print(f"{machine.definition.name}: random sequences exercised {len(covered & declared)}/{len(declared)} "
          f"transitions; never: {sorted(declared - covered)}")
    # The directed test takes every row; the random one must still get well past the start.
    assert len(covered & declared) >= 0.6 * len(declared)


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_random_event_sequences_conform_to_reference(machine):
    _random_sequences_conform(machine, min(settings.default.max_examples, FAST_EXAMPLES))


@pytest.mark.slow
@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: m.definition.name)
def test_random_event_sequences_conform_to_reference_at_full_count(machine):
    _random_sequences_conform(machine, settings.default.max_examples)
