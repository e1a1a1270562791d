"""The declaration core: a machine is declared once, as data, and everything else is derived.

A declaration is a subclass of :class:`Machine` whose body lists

* ``State`` objects (one ``initial``; ``terminal`` ones are entered once and never left),
* ``Param`` (fixed at creation) and ``Var`` (changed only by effects) with bounded types,
* ``Event`` objects with typed arguments,
* ``transitions``: ``T(source, event, target, guard=..., effect=...)`` rows,
* ``invariants``: named state predicates and ``StepProperty`` predicates over (pre, post).

Guards, effects and invariants are plain callables over a *variables view* ``v`` (a live
instance, or its z3 twin) and the event's arguments, written with the helpers of
:mod:`calculet.logic.expr` so that the same code evaluates concretely and symbolically.
Effects are pure: they return the updated variables as a dict.

From the declaration come: a compiled dispatch table (:mod:`calculet.machines.compiled`), a
python-statemachine reference class (:mod:`calculet.machines.reference`), the z3 checks
(:mod:`calculet.invariants`), and the documents in ``specs/`` (:mod:`calculet.specgen`).
Faults a declaration can have are caught when its class is created, as ``InvalidDefinition``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping

import z3

from calculet.errors import CalculetError, DefinitionError
from calculet.logic.expr import And, Implies, is_symbolic
from calculet.logic.symbolic import SymbolicVars, symbolic_args
from calculet.logic.types import Bool, EnumType, Int, VarType

__all__ = [
    "Int", "Bool", "EnumType", "Param", "Var", "State", "Event", "T", "Transition",
    "Invariant", "StepProperty", "Machine", "Definition",
    "InvalidDefinition", "TransitionNotAllowed", "InvariantViolation",
]

# Names an instance uses for itself; variables, parameters and arguments may not take them.
RESERVED_NAMES = frozenset({"at", "fire", "state", "can_fire", "values", "snapshot", "definition",
                            "last_transition", "machine_id", "enabled_events"})


class InvalidDefinition(DefinitionError):
    """A declaration is wrong (unreachable state, unknown name, ...); raised at import."""

    def __init__(self, machine: str, fault: str) -> None:
        super().__init__(f"{machine}: {fault}", machine=machine, fault=fault)
        self.machine = machine
        self.fault = fault


class TransitionNotAllowed(CalculetError):
    """An event with no enabled transition; the instance's state and variables are unchanged."""

    http_status = 409
    code = "transition_not_allowed"

    def __init__(self, machine: str, state: str, event: str, reason: str) -> None:
        super().__init__(f"{machine}: event {event!r} not allowed in state {state!r}: {reason}",
                         machine=machine, state=state, event=event, reason=reason)
        self.machine = machine
        self.state = state
        self.event = event
        self.reason = reason


class InvariantViolation(DefinitionError):
    """A run-time monitor found a declared invariant false after a transition."""

    code = "invariant_violation"

    def __init__(self, machine: str, invariant: str, rid: str, transition: str,
                 pre: Mapping[str, Any], post: Mapping[str, Any]) -> None:
        super().__init__(
            f"{machine}: invariant {invariant} ({rid}) broken by {transition}: pre={dict(pre)} post={dict(post)}",
            machine=machine, invariant=invariant, rid=rid, transition=transition)
        self.machine = machine
        self.invariant = invariant
        self.rid = rid
        self.transition = transition
        self.pre = dict(pre)
        self.post = dict(post)


# --------------------------------------------------------------------------------------------
# Declaration elements


@dataclass
class Param:
    """Fixed when an instance is created (e.g. a KV sequence's ``max_seq``)."""

    type: VarType
    doc: str = ""
    name: str = ""


@dataclass
class Var:
    """Changed only by transition effects; starts at ``init`` (the type's default if omitted)."""

    type: VarType
    init: Any = None
    doc: str = ""
    name: str = ""

    def initial(self) -> Any:
        return self.type.default if self.init is None else self.init


@dataclass(eq=False)
class State:
    initial: bool = False
    terminal: bool = False
    doc: str = ""
    name: str = ""

    def __repr__(self) -> str:
        return f"State({self.name})"


@dataclass(eq=False)
class Event:
    """An event and its typed arguments; arguments outside their types are refused before any guard."""

    doc: str = ""
    args: dict[str, VarType] = field(default_factory=dict)
    name: str = ""

    def __init__(self, doc: str = "", **args: VarType) -> None:
        self.doc = doc
        self.args = dict(args)
        self.name = ""

    def __repr__(self) -> str:
        return f"Event({self.name})"


Guard = Callable[..., Any]
Effect = Callable[..., Mapping[str, Any]]


@dataclass(eq=False)
class T:
    """One declared row ``source --event[guard]/effect--> target``; ``source`` may be a tuple.

    ``choice=True`` marks a deliberate overlap with an earlier row of the same (state, event):
    the first enabled row in declaration order wins, and the determinism check allows it.
    ``emits`` names commands the engine executes through the adapter after the transition.
    """

    source: State | tuple[State, ...]
    event: Event
    target: State
    guard: Guard | None = None
    effect: Effect | None = None
    name: str | None = None
    choice: bool = False
    emits: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True, eq=False)
class Transition:
    """A resolved row for one source state (what ``T`` expands to)."""

    name: str
    machine: str
    source: str
    event: str
    target: str
    guard: Guard | None
    guard_args: tuple[str, ...]
    effect: Effect | None
    effect_args: tuple[str, ...]
    choice: bool
    emits: tuple[str, ...]
    doc: str
    order: int

    def __repr__(self) -> str:
        return f"Transition({self.name})"


@dataclass(eq=False)
class Invariant:
    """A named predicate over one state's variables that must hold in every reachable state."""

    rid: str
    predicate: Callable[[Any], Any]
    doc: str = ""
    name: str = ""


@dataclass(eq=False)
class StepProperty:
    """A named predicate over (pre, post) of every transition (e.g. a generation never changes)."""

    rid: str
    predicate: Callable[[Any, Any], Any]
    doc: str = ""
    name: str = ""


# --------------------------------------------------------------------------------------------
# The resolved definition


@dataclass(frozen=True, eq=False)
class Definition:
    name: str
    doc: str
    spec: str
    states: dict[str, State]
    initial: str
    terminal: frozenset[str]
    params: dict[str, Param]
    vars: dict[str, Var]
    events: dict[str, Event]
    transitions: tuple[Transition, ...]
    invariants: tuple[Invariant, ...]
    step_properties: tuple[StepProperty, ...]
    examples: tuple[dict[str, Any], ...] = ()

    def transitions_from(self, state: str, event: str | None = None) -> list[Transition]:
        return [t for t in self.transitions
                if t.source == state and (event is None or t.event == event)]

    def successors(self) -> dict[str, set[str]]:
        graph: dict[str, set[str]] = {s: set() for s in self.states}
        for t in self.transitions:
            graph[t.source].add(t.target)
        return graph

    def reachable_from(self, start: str) -> set[str]:
        graph = self.successors()
        seen = {start}
        todo = [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    @property
    def home(self) -> frozenset[str]:
        """Where every life must be able to end: the terminal states, or (for cyclic machines
        such as a KV lane, which is reused forever) the initial state."""
        return self.terminal if self.terminal else frozenset({self.initial})

    def initial_values(self) -> dict[str, Any]:
        return {name: var.initial() for name, var in self.vars.items()}


def _callable_args(fn: Callable[..., Any], leading: int) -> tuple[str, ...]:
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


class Machine:
    """Base class of every declaration. Subclassing it resolves, checks and compiles the machine."""

    definition: ClassVar[Definition]
    spec: ClassVar[str] = ""
    # Small parameter sets (short contexts, few tokens) that reach every row: used for witness
    # paths, bounded exploration and the documents' examples.
    examples: ClassVar[list[dict[str, Any]]] = [{}]
    transitions: ClassVar[Iterable[T]] = ()
    invariants: ClassVar[Iterable[Invariant | StepProperty]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.definition = _resolve(cls)
        structure = cls.__dict__.get("structure_checks", True)
        _check(cls.definition, structure=structure)
        from calculet.machines.compiled import compile_instance_type
        from calculet.machines.reference import build_reference_class

        cls.Instance = compile_instance_type(cls.definition)
        # python-statemachine validates the graph itself; a mutant skips it like ours.
        cls.Reference = build_reference_class(cls.definition) if structure else None

    @classmethod
    def create(cls, **params: Any) -> Any:
        """A new compiled instance (the runtime's form) in the initial state."""
        return cls.Instance(**params)

    @classmethod
    def reference(cls, **params: Any) -> Any:
        """A new python-statemachine instance (the reference semantics, for conformance tests)."""
        return cls.Reference(**params)


def _resolve(cls: type[Machine]) -> Definition:
    name = cls.__name__
    states: dict[str, State] = {}
    params: dict[str, Param] = {}
    variables: dict[str, Var] = {}
    events: dict[str, Event] = {}
    for attr, value in vars(cls).items():
        if isinstance(value, State):
            value.name = attr
            states[attr] = value
        elif isinstance(value, Param):
            value.name = attr
            params[attr] = value
        elif isinstance(value, Var):
            value.name = attr
            variables[attr] = value
        elif isinstance(value, Event):
            value.name = attr
            events[attr] = value

    def fault(msg: str) -> InvalidDefinition:
        return InvalidDefinition(name, msg)

    for attr in list(params) + list(variables):
        if attr in RESERVED_NAMES or attr.startswith("_"):
            raise fault(f"variable/parameter name {attr!r} is reserved")
    if set(params) & set(variables):
        raise fault(f"names both a parameter and a variable: {sorted(set(params) & set(variables))}")
    for ev in events.values():
        for arg in ev.args:
            if arg in RESERVED_NAMES or arg.startswith("_") or arg in params or arg in variables:
                raise fault(f"event {ev.name!r} argument {arg!r} clashes with a reserved, variable or parameter name")
    for var in variables.values():
        if var.type.check(var.initial()) is not None:
            raise fault(f"variable {var.name!r} initial value {var.initial()!r}: {var.type.check(var.initial())}")

    initials = [s.name for s in states.values() if s.initial]
    if len(initials) != 1:
        raise fault(f"needs exactly one initial state, has {initials or 'none'}")
    terminal = frozenset(s.name for s in states.values() if s.terminal)
    if initials[0] in terminal:
        raise fault(f"initial state {initials[0]!r} cannot be terminal")

    resolved: list[Transition] = []
    seen_names: set[str] = set()
    for order, row in enumerate(cls.transitions):
        if not isinstance(row, T):
            raise fault(f"transitions[{order}] is not a T(...) row: {row!r}")
        if not isinstance(row.event, Event) or row.event.name not in events:
            raise fault(f"transitions[{order}] names an event not declared on the machine: {row.event!r}")
        sources = row.source if isinstance(row.source, tuple) else (row.source,)
        for st in (*sources, row.target):
            if not isinstance(st, State) or st.name not in states:
                raise fault(f"transitions[{order}] names a state not declared on the machine: {st!r}")
        try:
            guard_args = _callable_args(row.guard, 1) if row.guard is not None else ()
            effect_args = _callable_args(row.effect, 1) if row.effect is not None else ()
        except TypeError as exc:
            raise fault(f"transitions[{order}] ({row.event.name}): guard/effect {exc}") from None
        for arg in guard_args + effect_args:
            if arg not in row.event.args:
                raise fault(f"transition on {row.event.name!r} reads unknown argument {arg!r}")
        for src in sources:
            tname = row.name if row.name and len(sources) == 1 else None
            if tname is None:
                base = f"{row.event.name}@{src.name}"
                tname = base if base not in seen_names else f"{base}->{row.target.name}"
                if row.name:
                    tname = f"{row.name}@{src.name}"
            if tname in seen_names:
                raise fault(f"two transitions are named {tname!r}; give one an explicit name=")
            seen_names.add(tname)
            resolved.append(Transition(
                name=tname, machine=name, source=src.name, event=row.event.name,
                target=row.target.name, guard=row.guard, guard_args=guard_args,
                effect=row.effect, effect_args=effect_args, choice=row.choice,
                emits=tuple(row.emits), doc=row.doc, order=order))

    invariants: list[Invariant] = []
    steps: list[StepProperty] = []
    seen_inv: set[str] = set()
    for item in cls.invariants:
        if isinstance(item, Invariant):
            invariants.append(item)
        elif isinstance(item, StepProperty):
            steps.append(item)
        else:
            raise fault(f"invariants holds {item!r}, which is neither Invariant nor StepProperty")
        if not item.name:
            raise fault(f"invariant for {item.rid} needs a name")
        if item.name in seen_inv:
            raise fault(f"two invariants are named {item.name!r}")
        seen_inv.add(item.name)
    # A terminal state is entered once and never left (§4): derived, so that a checker given a
    # mutated copy (a row out of a terminal state) reports it as a broken property.
    if terminal:
        steps.append(StepProperty(
            rid="R4.6", name="terminal_is_final", doc="a terminal state is never left",
            predicate=_terminal_predicate(tuple(sorted(terminal)))))
    # Declared bounds are invariants too: they are proved and monitored like any other.
    for var in variables.values():
        if var.type.constraint(var.type.symbol(var.name)) is not None:
            invariants.append(Invariant(
                rid="type", name=f"bounds_{var.name}", doc=f"{var.name} stays {var.type.describe()}",
                predicate=_bounds_predicate(var)))

    return Definition(
        name=name, doc=inspect.cleandoc(cls.__doc__ or ""), spec=cls.spec, states=states,
        initial=initials[0], terminal=terminal, params=params, vars=variables, events=events,
        transitions=tuple(resolved), invariants=tuple(invariants), step_properties=tuple(steps),
        examples=tuple(dict(e) for e in getattr(cls, "examples", [{}])))


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


def _check(d: Definition, structure: bool = True) -> None:
    """The faults that make a declaration meaningless, found at import (issue: definition errors).

    ``structure=False`` (only for the mutation suite's deliberately broken copies) skips the
    graph checks, so that the formal checks, not the import, are what must catch the fault.
    """
    def fault(msg: str) -> InvalidDefinition:
        return InvalidDefinition(d.name, msg)

    if not structure:
        return _check_expressions(d)
    # Transitions out of terminal states: a terminal state is entered once and never left (§4).
    for t in d.transitions:
        if t.source in d.terminal:
            raise fault(f"transition {t.name} leaves terminal state {t.source!r}")

    # Unreachable states.
    unreachable = set(d.states) - d.reachable_from(d.initial)
    if unreachable:
        raise fault(f"unreachable state(s) {sorted(unreachable)} from initial state {d.initial!r}")

    # Dead ends: a non-terminal state with no way out.
    graph = d.successors()
    for s in d.states:
        if s not in d.terminal and not graph[s]:
            raise fault(f"non-terminal state {s!r} has no outgoing transition")

    # Shadowed rows: an unguarded row makes every later row of the same (state, event) dead.
    by_key: dict[tuple[str, str], list[Transition]] = {}
    for t in d.transitions:
        by_key.setdefault((t.source, t.event), []).append(t)
    for (state, event), rows in by_key.items():
        for i, row in enumerate(rows[:-1]):
            if row.guard is None:
                later = ", ".join(r.name for r in rows[i + 1:])
                raise fault(f"unguarded transition {row.name} shadows {later} for ({state}, {event})")

    _check_expressions(d)


def _check_expressions(d: Definition) -> None:
    """Every expression names only declared variables, parameters and arguments, with the right
    sort. Evaluating it on z3 terms visits every branch, which plain values do not."""
    def fault(msg: str) -> InvalidDefinition:
        return InvalidDefinition(d.name, msg)

    v = SymbolicVars(d)
    for t in d.transitions:
        ev = d.events[t.event]
        args = symbolic_args(ev)
        try:
            if t.guard is not None:
                g = t.guard(v, *[args[a] for a in t.guard_args])
                if not (isinstance(g, bool) or z3.is_bool(g)):
                    raise fault(f"guard of {t.name} is not a boolean expression: {g!r}")
            if t.effect is not None:
                updates = t.effect(v, *[args[a] for a in t.effect_args])
                if not isinstance(updates, Mapping):
                    raise fault(f"effect of {t.name} must return a dict of updated variables")
                for key, value in updates.items():
                    if key in d.params:
                        raise fault(f"effect of {t.name} assigns parameter {key!r}, which is fixed at creation")
                    if key not in d.vars:
                        raise fault(f"effect of {t.name} assigns unknown variable {key!r}")
                    if not d.vars[key].type.is_sort_of(value):
                        raise fault(f"effect of {t.name} assigns {key!r} a value of the wrong type: {value!r}")
        except AttributeError as exc:
            raise fault(f"{t.name}: {exc}") from None
        except z3.Z3Exception as exc:
            raise fault(f"{t.name}: expression is not encodable ({exc}); use the And/Or/Not/If helpers") from None
    for inv in d.invariants:
        try:
            p = inv.predicate(v)
        except AttributeError as exc:
            raise fault(f"invariant {inv.name}: {exc}") from None
        if not (isinstance(p, bool) or z3.is_bool(p)):
            raise fault(f"invariant {inv.name} is not a boolean expression")
    post = SymbolicVars(d, "_post")
    for sp in d.step_properties:
        try:
            p = sp.predicate(v, post)
        except AttributeError as exc:
            raise fault(f"step property {sp.name}: {exc}") from None
        if not (isinstance(p, bool) or z3.is_bool(p)):
            raise fault(f"step property {sp.name} is not a boolean expression")
