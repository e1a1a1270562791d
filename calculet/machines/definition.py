"""The declaration elements and the resolved :class:`Definition` every derived form reads.

A declaration (a :class:`~calculet.machines.core.Machine` subclass) lists these elements in its
class body; :mod:`calculet.machines.resolution` turns them into one frozen ``Definition``. The
compiled dispatch, the reference class, the generated code, the z3 checks and the documents in
``specs/`` all read that ``Definition`` and nothing else (DESIGN: declare once). This module
holds data only, so that all of them can import it while ``Machine`` — which derives the
compiled instance and the reference class when a declaration is created — sits above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from calculet.logic.types import VarType

__all__ = ["Definition", "Effect", "Event", "Group", "Guard", "Invariant", "Param", "State", "Step", "StepProperty", "T",
           "TERMINAL_GROUP", "Transition", "Var", "definition_of", "is_terminal"]


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
    """A state; ``groups`` names the sets it belongs to (``waiting``, ``running``, ...), which the
    resolution collects into ``Definition.groups`` — the one place such sets exist (issue #17:
    a parallel tuple of "terminal" states let the proofs and the flags disagree). The group
    ``terminal`` is derived from the ``terminal`` flags and cannot be declared by hand."""

    initial: bool = False
    terminal: bool = False
    doc: str = ""
    name: str = ""
    groups: tuple[str, ...] = ()

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
    ``policy`` says why a guard is there when no property and no other row needs it (a policy
    of the spec, not a safety rule): ``verify`` refuses a guard that is neither (issue #17).
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
    policy: str = ""


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
    policy: str = ""

    def __repr__(self) -> str:
        return f"Transition({self.name})"


@dataclass(eq=False)
class Invariant:
    """A named predicate over one state's variables that must hold in every reachable state.

    ``rejects``: negative witnesses — partial valuations (``{"state": ..., var: value}``; the rest
    from the initial values and the first example) the predicate must be false on. ``verify``
    checks each, so an invariant weakened until it accepts them fails loudly (issue #17).
    """

    rid: str
    predicate: Callable[[Any], Any]
    doc: str = ""
    name: str = ""
    rejects: tuple[Mapping[str, Any], ...] = ()


@dataclass(eq=False)
class StepProperty:
    """A named predicate over (pre, post) of every transition (e.g. a generation never changes).

    A predicate with a third parameter sees the step itself (:class:`Step`: the event, the row
    and its arguments), so a property can tell a commit from an abort where (pre, post) alone
    cannot (issue #17: "abort commits the pending tokens" satisfied a (pre, post) property).
    """

    rid: str
    predicate: Callable[..., Any]
    doc: str = ""
    name: str = ""
    # Negative witnesses: (pre, post) partial valuations — or (pre, post, row name) for a
    # property that sees the step — the predicate must be false on.
    rejects: tuple[tuple[Any, ...], ...] = ()


@dataclass(frozen=True)
class Step:
    """What an event-aware step property sees of a transition: its event, its row and its
    arguments (z3 terms in the proofs; the run-time monitor passes none)."""

    event: str
    row: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Definition:
    """A declaration after resolution: named elements, rows expanded per source state, derived
    properties added (see :func:`calculet.machines.resolution.resolve`)."""

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
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    event_properties: tuple[StepProperty, ...] = ()  # step properties that see the step

    @property
    def all_step_properties(self) -> tuple[StepProperty, ...]:
        return self.step_properties + self.event_properties

    def step_goals(self, pre: Any, post: Any, t: Transition, args: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
        """(name, R-id, predicate) of every step property for ``t`` taken from ``pre`` to ``post``."""
        out = [(sp.name, sp.rid, sp.predicate(pre, post)) for sp in self.step_properties]
        step = Step(t.event, t.name, args)
        return out + [(sp.name, sp.rid, sp.predicate(pre, post, step)) for sp in self.event_properties]

    def group(self, name: str) -> frozenset[str]:
        """The states of a named group (``terminal`` included); unknown names are an error."""
        try:
            return self.groups[name]
        except KeyError:
            raise AttributeError(f"{self.name} declares no state group {name!r}") from None

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


TERMINAL_GROUP = "terminal"


def definition_of(view: Any) -> Definition:
    """The declaration a variables view belongs to: a compiled instance (class attribute), a z3
    view (``SymbolicVars._definition``) or the reference machine's view (its owner's)."""
    d = getattr(type(view), "definition", None)
    if isinstance(d, Definition):
        return d
    own = getattr(view, "__dict__", {})
    if isinstance(own.get("_definition"), Definition):
        return own["_definition"]  # type: ignore[no-any-return]
    owner = own.get("_owner")
    if owner is not None and isinstance(getattr(owner, "definition", None), Definition):
        return owner.definition  # type: ignore[no-any-return]
    raise AttributeError(f"cannot tell which machine {view!r} belongs to")


class Group:
    """A named set of states, read from the declaration of the instance it is applied to.

    ``group(v)`` is ``v.at(<the group's states>)`` — on live instances and z3 terms alike — and
    ``group.of(Machine)`` the set itself, for runtime code. Neither restates the members: they
    are the states that declare the group (or, for ``terminal``, carry the flag), so a state
    unflagged or regrouped in the declaration changes every proof, monitor and runtime test at once.
    """

    def __init__(self, *names: str) -> None:
        self.names = names
        self._members: dict[Definition, tuple[str, ...]] = {}
        """Per declaration (a Definition hashes by identity and never changes): the members in declaration
        order, as ``__call__`` passes them to ``at``. The run-time monitors evaluate the groups in every
        invariant they check; the set was rebuilt on each call (issue #20)."""

    def states(self, d: Definition) -> frozenset[str]:
        return frozenset().union(*[d.group(n) for n in self.names])

    def of(self, machine: Any) -> frozenset[str]:
        return self.states(machine if isinstance(machine, Definition) else machine.definition)

    def __call__(self, v: Any) -> Any:
        d = definition_of(v)
        members = self._members.get(d)
        if members is None:
            group = self.states(d)
            members = self._members[d] = tuple(s for s in d.states if s in group)
        return v.at(*members)

    def __repr__(self) -> str:
        return f"Group({', '.join(self.names)})"


is_terminal = Group(TERMINAL_GROUP)
