"""From a declaration's class body to a checked :class:`~calculet.machines.definition.Definition`.

``resolve`` names the elements after their attributes, expands each ``T`` row per source state,
and adds the properties every declaration has without writing them: a terminal state is never
left (§4) and every variable stays in its declared bounds. ``check`` then refuses the faults
that make a declaration meaningless — a row out of a terminal state, an unreachable state, a
dead end, a shadowed row, an expression over an unknown name or of the wrong sort — so that
they surface at import as :class:`~calculet.machines.errors.InvalidDefinition`, not at run time.

It reads the class body only (it never imports :class:`~calculet.machines.core.Machine`), so
the base class can call it and the derived forms can share its helpers without a cycle.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping

import z3

from calculet.logic.expr import And, Implies, is_symbolic
from calculet.logic.symbolic import SymbolicVars, symbolic_args
from calculet.logic.types import EnumType
from calculet.machines.definition import (TERMINAL_GROUP, Definition, Event, Invariant, Param, State, Step, StepProperty,
                                         T, Transition, Var)
from calculet.machines.errors import InvalidDefinition

__all__ = ["RESERVED_NAMES", "callable_args", "check", "resolve"]

# Names an instance uses for itself; variables, parameters and arguments may not take them.
RESERVED_NAMES = frozenset({"at", "fire", "state", "can_fire", "values", "snapshot", "definition",
                            "last_transition", "machine_id", "enabled_events"})

Elements = tuple[dict[str, State], dict[str, Param], dict[str, Var], dict[str, Event]]


def callable_args(fn: Callable[..., Any], leading: int) -> tuple[str, ...]:
    """The argument names a guard/effect reads after its ``leading`` view parameter(s)."""
    params = list(inspect.signature(fn).parameters.values())
    if len(params) < leading:
        raise TypeError(f"needs at least {leading} positional parameter(s) for the variables view")
    names = []
    for p in params[leading:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError("must name the event arguments it reads (no *args/**kwargs)")
        names.append(p.name)
    return tuple(names)


# --------------------------------------------------------------------------------------------
# Resolution


def resolve(declaration: type) -> Definition:
    """The definition a declaration class states; raises ``InvalidDefinition`` on a naming fault."""
    name = declaration.__name__
    states, params, variables, events = _elements(declaration)
    _check_names(name, params, variables, events)
    initial, terminal = _initial_and_terminal(name, states)
    transitions = _resolve_rows(name, getattr(declaration, "transitions", ()), states, events)
    invariants, all_steps = _properties(name, getattr(declaration, "invariants", ()), terminal, variables,
                                        list(states))
    steps = tuple(sp for sp in all_steps if not _sees_step(name, sp))
    event_steps = tuple(sp for sp in all_steps if _sees_step(name, sp))
    groups = _groups(name, states, terminal)
    return Definition(
        name=name, doc=inspect.cleandoc(declaration.__doc__ or ""), spec=getattr(declaration, "spec", ""),
        states=states, initial=initial, terminal=terminal, params=params, vars=variables, events=events,
        transitions=transitions, invariants=invariants, step_properties=steps,
        examples=tuple(dict(e) for e in getattr(declaration, "examples", [{}])), groups=groups,
        event_properties=event_steps)


def _sees_step(name: str, sp: StepProperty) -> bool:
    """A step property's predicate takes (pre, post) or (pre, post, step)."""
    params = [p for p in inspect.signature(sp.predicate).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) not in (2, 3):
        raise InvalidDefinition(name, f"step property {sp.name} must take (pre, post) or (pre, post, step)")
    return len(params) == 3


def _groups(name: str, states: dict[str, State], terminal: frozenset[str]) -> dict[str, frozenset[str]]:
    """The declared state groups, and ``terminal`` from the flags (never declared by hand)."""
    groups: dict[str, set[str]] = {}
    for state in states.values():
        for group in state.groups:
            if group == TERMINAL_GROUP:
                raise InvalidDefinition(name, f"state {state.name!r}: the terminal group comes from terminal=True")
            groups.setdefault(group, set()).add(state.name)
    return {TERMINAL_GROUP: terminal, **{g: frozenset(members) for g, members in groups.items()}}


def _elements(declaration: type) -> Elements:
    """The states, parameters, variables and events of a class body, named after their attributes."""
    states: dict[str, State] = {}
    params: dict[str, Param] = {}
    variables: dict[str, Var] = {}
    events: dict[str, Event] = {}
    for attr, value in vars(declaration).items():
        for kind, found in ((State, states), (Param, params), (Var, variables), (Event, events)):
            if isinstance(value, kind):
                value.name = attr
                found[attr] = value  # type: ignore[index]
                break
    return states, params, variables, events


def _check_names(name: str, params: dict[str, Param], variables: dict[str, Var], events: dict[str, Event]) -> None:
    for attr in list(params) + list(variables):
        if attr in RESERVED_NAMES or attr.startswith("_"):
            raise InvalidDefinition(name, f"variable/parameter name {attr!r} is reserved")
    if set(params) & set(variables):
        raise InvalidDefinition(
            name, f"names both a parameter and a variable: {sorted(set(params) & set(variables))}")
    for ev in events.values():
        for arg in ev.args:
            if arg in RESERVED_NAMES or arg.startswith("_") or arg in params or arg in variables:
                raise InvalidDefinition(
                    name, f"event {ev.name!r} argument {arg!r} clashes with a reserved, variable or parameter name")
    for var in variables.values():
        if var.type.check(var.initial()) is not None:
            raise InvalidDefinition(
                name, f"variable {var.name!r} initial value {var.initial()!r}: {var.type.check(var.initial())}")


def _initial_and_terminal(name: str, states: dict[str, State]) -> tuple[str, frozenset[str]]:
    initials = [s.name for s in states.values() if s.initial]
    if len(initials) != 1:
        raise InvalidDefinition(name, f"needs exactly one initial state, has {initials or 'none'}")
    terminal = frozenset(s.name for s in states.values() if s.terminal)
    if initials[0] in terminal:
        raise InvalidDefinition(name, f"initial state {initials[0]!r} cannot be terminal")
    return initials[0], terminal


def _resolve_rows(name: str, rows: Iterable[Any], states: dict[str, State],
                  events: dict[str, Event]) -> tuple[Transition, ...]:
    """Each ``T`` row expanded to one ``Transition`` per source state, in declaration order."""
    resolved: list[Transition] = []
    seen_names: set[str] = set()
    for order, row in enumerate(rows):
        sources = _row_sources(name, order, row, states, events)
        guard_args, effect_args = _row_arguments(name, order, row)
        for src in sources:
            tname = _row_name(row, src, len(sources), seen_names)
            if tname in seen_names:
                raise InvalidDefinition(name, f"two transitions are named {tname!r}; give one an explicit name=")
            seen_names.add(tname)
            resolved.append(Transition(
                name=tname, machine=name, source=src.name, event=row.event.name,
                target=row.target.name, guard=row.guard, guard_args=guard_args,
                effect=row.effect, effect_args=effect_args, choice=row.choice,
                emits=tuple(row.emits), doc=row.doc, order=order, policy=row.policy))
    return tuple(resolved)


def _row_sources(name: str, order: int, row: Any, states: dict[str, State],
                 events: dict[str, Event]) -> tuple[State, ...]:
    """The row's source states, after checking it names only declared states and events."""
    if not isinstance(row, T):
        raise InvalidDefinition(name, f"transitions[{order}] is not a T(...) row: {row!r}")
    if not isinstance(row.event, Event) or row.event.name not in events:
        raise InvalidDefinition(name, f"transitions[{order}] names an event not declared on the machine: {row.event!r}")
    sources = row.source if isinstance(row.source, tuple) else (row.source,)
    for st in (*sources, row.target):
        if not isinstance(st, State) or st.name not in states:
            raise InvalidDefinition(name, f"transitions[{order}] names a state not declared on the machine: {st!r}")
    return sources


def _row_arguments(name: str, order: int, row: T) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The event arguments the row's guard and effect read (each must be one of the event's)."""
    try:
        guard_args = callable_args(row.guard, 1) if row.guard is not None else ()
        effect_args = callable_args(row.effect, 1) if row.effect is not None else ()
    except TypeError as exc:
        raise InvalidDefinition(name, f"transitions[{order}] ({row.event.name}): guard/effect {exc}") from None
    for arg in guard_args + effect_args:
        if arg not in row.event.args:
            raise InvalidDefinition(name, f"transition on {row.event.name!r} reads unknown argument {arg!r}")
    return guard_args, effect_args


def _row_name(row: T, src: State, n_sources: int, seen_names: set[str]) -> str:
    """``name=`` if given for a single source; else ``event@source`` (``->target`` if taken)."""
    if row.name and n_sources == 1:
        return row.name
    if row.name:
        return f"{row.name}@{src.name}"
    base = f"{row.event.name}@{src.name}"
    return base if base not in seen_names else f"{base}->{row.target.name}"


def _properties(name: str, declared: Iterable[Any], terminal: frozenset[str], variables: dict[str, Var],
                states_order: Iterable[str] = ()) -> tuple[tuple[Invariant, ...], tuple[StepProperty, ...]]:
    """The declared invariants and step properties, then the derived ones."""
    invariants: list[Invariant] = []
    steps: list[StepProperty] = []
    seen_inv: set[str] = set()
    for item in declared:
        if isinstance(item, Invariant):
            invariants.append(item)
        elif isinstance(item, StepProperty):
            steps.append(item)
        else:
            raise InvalidDefinition(name, f"invariants holds {item!r}, which is neither Invariant nor StepProperty")
        if not item.name:
            raise InvalidDefinition(name, f"invariant for {item.rid} needs a name")
        if item.name in seen_inv:
            raise InvalidDefinition(name, f"two invariants are named {item.name!r}")
        seen_inv.add(item.name)
    # A terminal state is entered once and never left (§4): derived, so that a checker given a
    # mutated copy (a row out of a terminal state) reports it as a broken property.
    if terminal:
        some_terminal = sorted(terminal)[0]
        leaving = next(s for s in states_order if s not in terminal)
        steps.append(StepProperty(
            rid="R4.6", name="terminal_is_final", doc="a terminal state is never left",
            predicate=_terminal_predicate(tuple(sorted(terminal))),
            rejects=(({"state": some_terminal}, {"state": leaving}),)))
    # Declared bounds are invariants too: they are proved and monitored like any other.
    for var in variables.values():
        if var.type.constraint(var.type.symbol(var.name)) is not None:
            invariants.append(Invariant(
                rid="type", name=f"bounds_{var.name}", doc=f"{var.name} stays {var.type.describe()}",
                predicate=_bounds_predicate(var), rejects=_out_of_bounds(var)))
    return tuple(invariants), tuple(steps)


def _out_of_bounds(var: Var) -> tuple[dict[str, Any], ...]:
    """A value just outside each declared bound of ``var`` (the derived invariant's witnesses)."""
    typ: Any = var.type
    if isinstance(typ, EnumType):
        return ({var.name: max(int(m) for m in typ.enum_cls) + 1},)
    out = []
    if getattr(typ, "ge", None) is not None:
        out.append({var.name: typ.ge - 1})
    if getattr(typ, "le", None) is not None:
        out.append({var.name: typ.le + 1})
    return tuple(out)


def _terminal_predicate(terminal: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    return lambda pre, post: And(*[Implies(pre.at(s), post.at(s)) for s in terminal])


def _bounds_predicate(var: Var) -> Callable[[Any], Any]:
    typ = var.type
    attr = var.name

    def holds(v: Any) -> Any:
        value = getattr(v, attr)
        if is_symbolic(value):
            return typ.constraint(value)
        if isinstance(typ, EnumType):
            return typ.check(value) is None
        return And(*(c for c in ((typ.ge is None or value >= typ.ge),  # type: ignore[attr-defined]
                                 (typ.le is None or value <= typ.le))))  # type: ignore[attr-defined]

    return holds


# --------------------------------------------------------------------------------------------
# Checks


def check(d: Definition, structure: bool = True) -> None:
    """The faults that make a declaration meaningless, found at import (issue: definition errors).

    ``structure=False`` (only for the mutation suite's deliberately broken copies) skips the
    graph checks, so that the formal checks, not the import, are what must catch the fault.
    """
    if structure:
        _check_graph(d)
        _check_shadowing(d)
    _check_expressions(d)


def _check_graph(d: Definition) -> None:
    # Transitions out of terminal states: a terminal state is entered once and never left (§4).
    for t in d.transitions:
        if t.source in d.terminal:
            raise InvalidDefinition(d.name, f"transition {t.name} leaves terminal state {t.source!r}")
    unreachable = set(d.states) - d.reachable_from(d.initial)
    if unreachable:
        raise InvalidDefinition(
            d.name, f"unreachable state(s) {sorted(unreachable)} from initial state {d.initial!r}")
    # Dead ends: a non-terminal state with no way out.
    graph = d.successors()
    for s in d.states:
        if s not in d.terminal and not graph[s]:
            raise InvalidDefinition(d.name, f"non-terminal state {s!r} has no outgoing transition")


def _check_shadowing(d: Definition) -> None:
    """An unguarded row makes every later row of the same (state, event) dead."""
    by_key: dict[tuple[str, str], list[Transition]] = {}
    for t in d.transitions:
        by_key.setdefault((t.source, t.event), []).append(t)
    for (state, event), rows in by_key.items():
        for i, row in enumerate(rows[:-1]):
            if row.guard is None:
                later = ", ".join(r.name for r in rows[i + 1:])
                raise InvalidDefinition(d.name, f"unguarded transition {row.name} shadows {later} for ({state}, {event})")


def _check_expressions(d: Definition) -> None:
    """Every expression names only declared variables, parameters and arguments, with the right
    sort. Evaluating it on z3 terms visits every branch, which plain values do not."""
    v = SymbolicVars(d)
    for t in d.transitions:
        try:
            _check_row_expressions(d, t, v)
        except AttributeError as exc:
            raise InvalidDefinition(d.name, f"{t.name}: {exc}") from None
        except z3.Z3Exception as exc:
            raise InvalidDefinition(
                d.name, f"{t.name}: expression is not encodable ({exc}); use the And/Or/Not/If helpers") from None
    for inv in d.invariants:
        _check_predicate(d, f"invariant {inv.name}", lambda: inv.predicate(v))
    post = SymbolicVars(d, "_post")
    for sp in d.step_properties:
        _check_predicate(d, f"step property {sp.name}", lambda: sp.predicate(v, post))
    for sp in d.event_properties:
        for t in d.transitions:
            step = Step(t.event, t.name, symbolic_args(d.events[t.event]))
            _check_predicate(d, f"step property {sp.name} on {t.name}", lambda: sp.predicate(v, post, step))


def _check_row_expressions(d: Definition, t: Transition, v: SymbolicVars) -> None:
    args = symbolic_args(d.events[t.event])
    if t.guard is not None:
        g = t.guard(v, *[args[a] for a in t.guard_args])
        if not (isinstance(g, bool) or z3.is_bool(g)):
            raise InvalidDefinition(d.name, f"guard of {t.name} is not a boolean expression: {g!r}")
    if t.effect is None:
        return
    updates = t.effect(v, *[args[a] for a in t.effect_args])
    if not isinstance(updates, Mapping):
        raise InvalidDefinition(d.name, f"effect of {t.name} must return a dict of updated variables")
    for key, value in updates.items():
        if key in d.params:
            raise InvalidDefinition(d.name, f"effect of {t.name} assigns parameter {key!r}, which is fixed at creation")
        if key not in d.vars:
            raise InvalidDefinition(d.name, f"effect of {t.name} assigns unknown variable {key!r}")
        if not d.vars[key].type.is_sort_of(value):
            raise InvalidDefinition(d.name, f"effect of {t.name} assigns {key!r} a value of the wrong type: {value!r}")


def _check_predicate(d: Definition, what: str, evaluate: Callable[[], Any]) -> None:
    try:
        p = evaluate()
    except AttributeError as exc:
        raise InvalidDefinition(d.name, f"{what}: {exc}") from None
    if not (isinstance(p, bool) or z3.is_bool(p)):
        raise InvalidDefinition(d.name, f"{what} is not a boolean expression")
