"""z3 encodings of a machine declaration's variables, parameters and event arguments.

The same guard/effect/invariant callables that the runtime evaluates on plain values are called
here on z3 terms (DESIGN: declare once, derive everything). Nothing in this module restates a
machine: it only builds the symbolic namespace that the declared expressions read.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import z3

from calculet.logic.expr import In
from calculet.logic.types import Bool, EnumType


class SymbolicVars:
    """A machine's state and variables as z3 constants, read exactly like a live instance.

    ``suffix`` keeps the pre- and post-states of a transition (or the lanes of a pool) apart.
    Reading a name the machine does not declare raises ``AttributeError``, which the declaration
    core turns into an ``InvalidDefinition`` at import.
    """

    def __init__(self, definition: Any, suffix: str = "", *, state: z3.ArithRef | None = None,
                 values: Mapping[str, Any] | None = None) -> None:
        self._definition = definition
        self._suffix = suffix
        self._state_names: tuple[str, ...] = tuple(definition.states)
        self.state = state if state is not None else z3.Int(f"state{suffix}")
        self._values: dict[str, Any] = {}
        for name, decl in list(definition.params.items()) + list(definition.vars.items()):
            if values is not None and name in values:
                self._values[name] = values[name]
            else:
                self._values[name] = decl.type.symbol(f"{name}{suffix}")

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        machine = self.__dict__.get("_definition")
        label = machine.name if machine is not None else "machine"
        raise AttributeError(f"{label} has no variable or parameter {name!r}")

    def at(self, *states: str) -> Any:
        """The symbolic twin of ``Instance.at``: the state is one of ``states``."""
        return In(self.state, [self.state_index(name) for name in states])

    def state_index(self, name: str) -> int:
        try:
            return self._state_names.index(name)
        except ValueError:
            raise AttributeError(f"{self._definition.name} has no state {name!r}") from None

    def domain(self) -> list[z3.BoolRef]:
        """Type constraints: state in range, every variable and parameter within its declared type."""
        constraints: list[z3.BoolRef] = [self.state >= 0, self.state < len(self._state_names)]
        for name, decl in list(self._definition.params.items()) + list(self._definition.vars.items()):
            constraint = decl.type.constraint(self._values[name])
            if constraint is not None:
                constraints.append(constraint)
        return constraints

    def with_updates(self, updates: Mapping[str, Any], state: Any) -> "SymbolicVars":
        """The post-state of a transition: same parameters, updated variables, new state."""
        values = dict(self._values)
        values.update(updates)
        return SymbolicVars(self._definition, self._suffix + "_post", state=state, values=values)

    def names(self) -> Iterable[str]:
        return self._values.keys()

    def value(self, name: str) -> Any:
        return self._values[name]


def symbolic_args(event: Any, suffix: str = "") -> dict[str, Any]:
    """Event arguments as z3 constants, plus their domain constraints (see ``arg_domain``)."""
    return {name: typ.symbol(f"{name}{suffix}") for name, typ in event.args.items()}


def type_domain(types: Mapping[str, Any], terms: Mapping[str, Any]) -> list[z3.BoolRef]:
    """The declared types' domain constraints on ``terms`` (e.g. ``ge=1`` → ``term >= 1``)."""
    constraints = []
    for name, typ in types.items():
        constraint = typ.constraint(terms[name])
        if constraint is not None:
            constraints.append(constraint)
    return constraints


def arg_domain(event: Any, args: Mapping[str, Any]) -> list[z3.BoolRef]:
    return type_domain(event.args, args)


def solve_arguments(instance: Any, transition: Any,
                    avoid: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """Event arguments that enable ``transition`` from ``instance``'s concrete state, or None.

    The guard is evaluated with the instance's own (plain) variables and symbolic arguments, so
    z3 answers "which arguments make this row fire now?". Used to steer fuzzing and the checker
    toward rows that random arguments rarely hit (a job id that must match exactly, say).
    """
    d = instance.definition
    if transition.source != instance.state:
        return None
    ev = d.events[transition.event]
    args = symbolic_args(ev, "_arg")
    solver = z3.Solver()
    solver.add(*arg_domain(ev, args))
    if transition.guard is not None:
        condition = transition.guard(instance, *[args[a] for a in transition.guard_args])
        solver.add(condition if isinstance(condition, z3.ExprRef) else z3.BoolVal(bool(condition)))
    # Earlier rows of the same (state, event) win when they are enabled: rule them out.
    for earlier in d.transitions_from(instance.state, transition.event):
        if earlier is transition:
            break
        if earlier.guard is not None:
            cond = earlier.guard(instance, *[args[a] for a in earlier.guard_args])
            solver.add(z3.Not(cond) if isinstance(cond, z3.ExprRef) else z3.BoolVal(not cond))
        else:
            return None
    for seen in avoid:  # ask for an argument set unlike the ones already tried
        if seen:
            solver.add(z3.Or(*[args[name] != int(value) if not isinstance(value, bool)
                               else args[name] != value for name, value in seen.items()]))
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    out: dict[str, Any] = {}
    for name, typ in ev.args.items():
        value = model.eval(args[name], model_completion=True)
        if isinstance(typ, Bool):
            out[name] = z3.is_true(value)
        elif isinstance(typ, EnumType):
            out[name] = typ.enum_cls(value.as_long())
        else:
            out[name] = value.as_long()
    return out
