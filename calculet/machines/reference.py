"""The reference semantics: a python-statemachine class generated from the declaration.

python-statemachine's own graph checks run when the class is built (at import). It is slow
(~100 µs per event), so the runtime never uses it; conformance tests fire the same random events
into it and into the compiled table and require identical results after every step.

Library ids are prefixed (``s_``/``e_``) because states and events share one class namespace
with the library's own attributes. ``StateMachine`` (strict) is used, not ``StateChart``, whose
defaults swallow exceptions and ignore events with no transition.
"""

from __future__ import annotations

from typing import Any

from statemachine import State as SMState
from statemachine import StateMachine
from statemachine.exceptions import TransitionNotAllowed as SMTransitionNotAllowed

from calculet.machines.definition import Definition, Transition
from calculet.machines.errors import TransitionNotAllowed


class _Vars:
    """The variables view the declared expressions read, backed by the reference machine."""

    def __init__(self, owner: "ReferenceMachine", values: dict[str, Any]) -> None:
        self._owner = owner
        self.__dict__.update(values)

    def at(self, *states: str) -> bool:
        return self._owner.state in states


class ReferenceMachine:
    """Wraps a generated python-statemachine instance with calculet's event interface."""

    definition: Definition
    sm_class: type[StateMachine]

    def __init__(self, **params: Any) -> None:
        d = self.definition
        for name, param in d.params.items():
            if name not in params:
                raise TypeError(f"{d.name}: missing parameter {name}")
            reason = param.type.check(params[name])
            if reason is not None:
                raise ValueError(f"{d.name}: parameter {name}={params[name]!r}: {reason}")
        values = dict(params)
        values.update(d.initial_values())
        self._vars = _Vars(self, values)
        self.last_transition: Transition | None = None
        self._sm = self.sm_class()

    @property
    def state(self) -> str:
        ids = [s.id for s in self._sm.configuration]
        return ids[0][2:]

    def values(self) -> dict[str, Any]:
        return {name: getattr(self._vars, name) for name in self.definition.vars}

    def fire(self, event: str, **args: Any) -> str:
        d = self.definition
        if event not in d.events:
            raise TransitionNotAllowed(d.name, self.state, event, "unknown event")
        declared = d.events[event].args
        if set(args) != set(declared):
            raise TransitionNotAllowed(d.name, self.state, event,
                                       f"arguments {sorted(args)} do not match {sorted(declared)}")
        for name, typ in declared.items():
            reason = typ.check(args[name])
            if reason is not None:
                raise TransitionNotAllowed(d.name, self.state, event, f"argument {name}: {reason}")
        state = self.state
        try:
            self._sm.send(f"e_{event}", _args=args)
        except SMTransitionNotAllowed:
            raise TransitionNotAllowed(d.name, state, event, "not allowed (reference)") from None
        return self.state

    # Callbacks given to the library; ``_args`` arrives through its dependency injection.
    def _guard(self, t: Transition, args: dict[str, Any]) -> bool:
        if t.guard is None:
            return True
        return bool(t.guard(self._vars, *[args[a] for a in t.guard_args]))

    def _apply(self, t: Transition, args: dict[str, Any]) -> None:
        if t.effect is not None:
            updates = t.effect(self._vars, *[args[a] for a in t.effect_args])
            self._vars.__dict__.update(updates)
        self.last_transition = t


def build_reference_class(d: Definition) -> type[ReferenceMachine]:
    attrs: dict[str, Any] = {}
    states = {name: SMState(name, initial=s.initial, final=s.terminal)
              for name, s in d.states.items()}
    for name, st in states.items():
        attrs[f"s_{name}"] = st

    def make_callbacks(t: Transition) -> tuple[Any, Any]:
        def cond(machine: Any, _args: dict[str, Any]) -> bool:
            return machine._calculet_owner._guard(t, _args)

        def on(machine: Any, _args: dict[str, Any]) -> None:
            machine._calculet_owner._apply(t, _args)

        return cond, on

    for event in d.events:
        rows = [t for t in d.transitions if t.event == event]
        if not rows:
            continue
        combined = None
        for t in rows:
            cond, on = make_callbacks(t)
            tl = states[t.source].to(states[t.target], cond=cond, on=on)
            combined = tl if combined is None else combined | tl
        attrs[f"e_{event}"] = combined
    sm_class = type(StateMachine)(f"{d.name}SM", (StateMachine,), attrs)

    class Bound(ReferenceMachine):
        def __init__(self, **params: Any) -> None:
            super().__init__(**params)
            self._sm._calculet_owner = self

    Bound.definition = d
    Bound.sm_class = sm_class
    Bound.__name__ = f"{d.name}Reference"
    return Bound
