"""Coupled systems: R instances of one machine bound to L instances of another (§9.2, §4).

Why not a :class:`~calculet.machines.pool.Pool`: a pool is N instances of *one* machine, and
each of its steps moves one instance by one of its rows plus a pool guard. The coupling between
requests and KV lanes has another shape: one step of the runtime's actor fires a request's
event *and* its lane's events together (admission reserves the lane; a decode completion
commits the lane and advances the request; a request that ends releases its lane in the same
step, through the registry's listener), and the properties speak of both kinds at once ("a
decoding request's kv_length equals its lane's committed_len", §9.2). Teaching ``Pool`` two
instance types and multi-row steps would change the step shape every pool check relies on,
so a coupled system is this separate, small declaration; its checker
(:mod:`calculet.invariants.system_checks`) reuses the per-machine z3 encodings
(``SymbolicVars``, ``takes``, ``post_state``), so nothing of either machine is restated.

A declaration names

* the two machines, in the roles ``request`` (R instances) and ``lane`` (L instances);
* ``steps``: :class:`Coupled` rows. Each is one atomic step of the runtime on request ``i`` and
  lane ``j``: a sequence of request rows and a sequence of lane events (each fires the
  machine's first enabled row, as the runtime's ``fire`` does), a step guard over the whole
  system, the arguments the rows receive, and what happens to the binding;
* ``invariants``: :class:`SystemInvariant` predicates over a :class:`SystemView`;
* ``step_properties``: :class:`SystemStepProperty` predicates over a step of the whole system —
  its pre- and post-:class:`SystemView` and the :class:`SystemStep` taken — for what no state
  can say: "a lane's committed length grows only while the job it is bound to has completed"
  holds of every state whether or not a step broke it. Proved by the same induction as the
  invariants, for every size (``calculet/invariants/system_checks.py``); ``SystemDefinition.
  broken_steps`` is their run-time form, the declared predicates on live values.

The binding is a ghost map: ``binding[i]`` is the lane request ``i`` holds, or :data:`NONE`
(the runtime's ``RequestRecord.lease``). Each request also has ``seq[i]``, a positive id no
other request shares: the KV sequence id its lease names (the KvLaneManager draws it from a
counter, so it is fresh; a request is admitted at most once).

Guards, argument wirings and invariants are written with the expression helpers, so they
evaluate on z3 terms (the proofs) and on live instances (tests over the running scheduler).
They must treat requests and lanes symmetrically — only through quantification over all of
them and equality of indices and ids — which is what lets the checks move request 0 and lane 0
for every step, and break symmetry in bounded model checking.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import z3

from calculet.logic.expr import And
from calculet.logic.symbolic import SymbolicVars
from calculet.logic.types import VarType
from calculet.machines.core import Machine
from calculet.machines.definition import Transition
from calculet.machines.errors import InvalidDefinition
from calculet.machines.resolution import callable_args

NONE = -1  # binding value: the request holds no lane

BINDINGS = ("keep", "bind", "unbind")
INVOLVES = ("request", "lane", "both")


@dataclass(frozen=True)
class Coupled:
    """One atomic step of the system on request ``i`` and lane ``j``.

    ``request``/``lane`` list transition names (``"admit@waiting_admission"``) or event names
    (``"release"``: the machine's first enabled row of that event) fired in order. ``guard``,
    ``request_args`` and ``lane_args`` are ``f(sys, i, j, <step args by name>)``; the wirings
    return the event arguments of that side (by default the step's own arguments of the same
    names are passed through). ``binding``: ``bind`` sets ``binding[i] = j``, ``unbind`` clears
    it, ``keep`` leaves it. ``involves`` says which instances the step reads or moves
    (derived: ``both`` when it has rows on both sides).
    """

    name: str
    request: tuple[str, ...] = ()
    lane: tuple[str, ...] = ()
    binding: str = "keep"
    guard: Callable[..., Any] | None = None
    request_args: Callable[..., Mapping[str, Any]] | None = None
    lane_args: Callable[..., Mapping[str, Any]] | None = None
    args: Mapping[str, VarType] = field(default_factory=dict)
    involves: str = ""
    doc: str = ""


@dataclass(frozen=True)
class SystemInvariant:
    """A named predicate over the whole system; ``strengthening`` says why the proof needed it
    (the counterexample to induction it rules out), empty for the properties asked for."""

    rid: str
    name: str
    predicate: Callable[[Any], Any]
    doc: str = ""
    strengthening: str = ""
    # Negative witnesses: {"requests": [{...}], "lanes": [{...}], "binding": [...], "seq": [...]},
    # partial (instances default to their initial state), the predicate must be false on.
    rejects: tuple[Mapping[str, Any], ...] = ()
    # A count over every request (``active_requests == #pinned``), not a ∀ over at most two requests
    # and one lane: the induction then holds for the encoded size only (system_checks' argument
    # needs the ∀-shape), and the report says so.
    counts: bool = False


@dataclass(frozen=True)
class SystemStep:
    """What a system step property sees of the step taken: the declared step's name, the
    variant's (its row chain), and the step's arguments (z3 terms in the proofs; the run-time
    form passes what the runtime has, possibly none)."""

    name: str
    variant: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SystemStepProperty:
    """A named predicate ``predicate(pre, post, step)`` over every step of the system: ``pre``
    and ``post`` are the whole system before and after (:class:`SystemView`), ``step`` the
    :class:`SystemStep`. Like an invariant it must be a ∀ over at most two requests and one lane
    whose instance reads only the instances it names (before and after) — the shape the
    induction's cutoff argument needs (``calculet/invariants/system_checks.py``).

    ``rejects``: negative witnesses ``{"pre": {...}, "post": {...}, "step": name}`` — ``pre`` a
    partial system as an invariant's witness, ``post`` the same keys for what changed (an
    instance's entries merged over its pre-state; ``binding`` replaced), ``step`` a declared step
    name; the predicate must be false on each."""

    rid: str
    name: str
    predicate: Callable[[Any, Any, SystemStep], Any]
    doc: str = ""
    rejects: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, eq=False)
class Variant:
    """A step with each event resolved to one row (a step whose ``release`` may leave Reserved
    or Active has one variant per consistent chain of rows)."""

    step: Coupled
    name: str
    request_rows: tuple[Transition, ...]
    lane_rows: tuple[Transition, ...]
    involves: str
    guard_args: tuple[str, ...]
    request_wiring_args: tuple[str, ...]
    lane_wiring_args: tuple[str, ...]
    request_needs: tuple[str, ...]
    lane_needs: tuple[str, ...]


class SystemView:
    """What guards and invariants read: ``sys.requests[i]``, ``sys.lanes[j]``, ``sys.binding[i]``,
    ``sys.seq[i]``; plain values or z3 terms alike."""

    def __init__(self, requests: Sequence[Any], lanes: Sequence[Any], binding: Sequence[Any],
                 seq: Sequence[Any]) -> None:
        self.requests = list(requests)
        self.lanes = list(lanes)
        self.binding = list(binding)
        self.seq = list(seq)

    def bound(self, i: int, j: int) -> Any:
        """Request ``i`` holds lane ``j``."""
        return self.binding[i] == j

    def unbound(self, i: int) -> Any:
        return self.binding[i] == NONE

    def beyond(self, count: Any) -> Any:
        """The part of a declared count (``count`` names it) over instances not in this view: 0 here,
        where the view holds every instance; the every-size induction's view answers a ghost ≥ 0
        that no step changes (``calculet/invariants/system_induction.py``, #17)."""
        return 0

    def all_requests(self, predicate: Callable[[int], Any]) -> Any:
        return And(*[predicate(i) for i in range(len(self.requests))])

    def all_pairs(self, predicate: Callable[[int, int], Any]) -> Any:
        """``predicate(i, j)`` for every request ``i`` and lane ``j``."""
        return And(*[predicate(i, j) for i in range(len(self.requests)) for j in range(len(self.lanes))])


@dataclass(frozen=True)
class SystemDefinition:
    name: str
    doc: str
    spec: str
    request: type[Machine]
    lane: type[Machine]
    steps: tuple[Coupled, ...]
    variants: tuple[Variant, ...]
    invariants: tuple[SystemInvariant, ...]
    step_args: dict[str, VarType]
    omitted: tuple[tuple[str, str], ...] = ()
    # Steps whose guard and wirings read only the request and lane they involve (found by
    # evaluating them on a view where every other instance refuses to be read): such steps on
    # different requests and lanes commute (bounded model checking's partial-order reduction),
    # and they make the induction at a small size hold for every size (system_checks).
    local: frozenset[str] = frozenset()
    # How deep the reachability search goes (the longest shortest run to a step: a generation
    # needs four steps to be Ready before a request can be pinned to it).
    reach_depth: int = 8
    # Instances bounded model checking searches over (requests, lanes); None: verify's default.
    bmc_size: tuple[int, int] | None = None
    # Whether ``verify --fast`` (CI) also runs bounded model checking (the full run always does).
    fast_bmc: bool = True
    step_properties: tuple[SystemStepProperty, ...] = ()

    def variants_of(self, step: str) -> list[Variant]:
        return [v for v in self.variants if v.step.name == step]

    def untaken_rows(self) -> list[str]:
        """Rows of either machine that no step fires, as ``Machine.row`` (each should be listed
        in ``omitted`` with the reason the runtime never takes it)."""
        taken = {(t.machine, t.name) for v in self.variants for t in (*v.request_rows, *v.lane_rows)}
        return [f"{t.machine}.{t.name}" for m in (self.request, self.lane) for t in m.definition.transitions
                if (t.machine, t.name) not in taken]

    def broken_steps(self, pre: SystemView, post: SystemView, step: SystemStep) -> list[str]:
        """The run-time form of the step properties: the names of those false on a step the runtime
        took, ``pre`` and ``post`` views over the same live instances (a monitor snapshots what the
        step may move; the predicates evaluate on plain values as on z3 terms)."""
        return [sp.name for sp in self.step_properties if not sp.predicate(pre, post, step)]


def _chains(machine: type[Machine], items: tuple[str, ...], fault: Callable[[str], InvalidDefinition],
            step: str) -> list[tuple[Transition, ...]]:
    """Every consistent chain of rows for ``items`` (each row starts where the previous ended)."""
    d = machine.definition
    chains: list[tuple[Transition, ...]] = [()]
    for item in items:
        rows = [t for t in d.transitions if t.name == item] or [t for t in d.transitions if t.event == item]
        if not rows:
            raise fault(f"step {step!r} names {item!r}, neither a transition nor an event of {d.name}")
        chains = [chain + (row,) for chain in chains for row in rows if not chain or chain[-1].target == row.source]
        if not chains:
            raise fault(f"step {step!r}: no row of {item!r} can follow the previous rows of {d.name}")
    return chains


def _needs(machine: type[Machine], rows: tuple[Transition, ...]) -> tuple[str, ...]:
    d = machine.definition
    return tuple(dict.fromkeys(a for t in rows for a in d.events[t.event].args))


class CoupledSystem:
    """Base of coupled-system declarations; subclassing resolves and checks the declaration."""

    definition: ClassVar[SystemDefinition]
    request: ClassVar[type[Machine]]
    lane: ClassVar[type[Machine]]
    spec: ClassVar[str] = ""
    steps: ClassVar[Sequence[Coupled]] = ()
    invariants: ClassVar[Sequence[SystemInvariant]] = ()
    step_properties: ClassVar[Sequence[SystemStepProperty]] = ()
    # Rows of either machine no step takes, with the reason (shown in the documents).
    omitted: ClassVar[Sequence[tuple[str, str]]] = ()
    reach_depth: ClassVar[int] = 8
    bmc_size: ClassVar[tuple[int, int] | None] = None
    fast_bmc: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__name__

        def fault(msg: str) -> InvalidDefinition:
            return InvalidDefinition(name, msg)

        variants: list[Variant] = []
        seen: set[str] = set()
        step_args: dict[str, VarType] = {}
        for step in cls.steps:
            if step.name in seen:
                raise fault(f"two steps are named {step.name!r}")
            seen.add(step.name)
            involves, guard_args, req_wiring, lane_wiring = _step_shape(step, step_args, fault)
            req_chains = _chains(cls.request, step.request, fault, step.name)
            lane_chains = _chains(cls.lane, step.lane, fault, step.name)
            many = len(req_chains) * len(lane_chains) > 1
            for rc in req_chains:
                for lc in lane_chains:
                    label = step.name if not many else f"{step.name}[{'+'.join(t.name for t in (*rc, *lc))}]"
                    r_needs, l_needs = _needs(cls.request, rc), _needs(cls.lane, lc)
                    for side, wiring, needs in (("request", step.request_args, r_needs), ("lane", step.lane_args, l_needs)):
                        if wiring is None:
                            missing = [a for a in needs if a not in step.args]
                            if missing:
                                raise fault(f"step {step.name!r}: {side} rows need {missing}; declare them in "
                                            f"args or give {side}_args")
                    variants.append(Variant(step, label, rc, lc, involves, guard_args, req_wiring, lane_wiring,
                                            r_needs, l_needs))
        invariants = list(cls.invariants)
        names = [inv.name for inv in (*invariants, *cls.step_properties)]
        if len(set(names)) != len(names):
            raise fault("two invariants or step properties share a name")
        cls.definition = SystemDefinition(
            name=name, doc=inspect.cleandoc(cls.__doc__ or ""), spec=cls.spec, request=cls.request, lane=cls.lane,
            steps=tuple(cls.steps), variants=tuple(variants), invariants=tuple(invariants), step_args=step_args,
            omitted=tuple(cls.omitted), reach_depth=cls.reach_depth,
            bmc_size=cls.bmc_size, fast_bmc=cls.fast_bmc, step_properties=tuple(cls.step_properties))
        cls.definition = dataclasses.replace(cls.definition, local=frozenset(_check_wirings(cls.definition, fault)))

    @classmethod
    def derive(cls, name: str, replace: Mapping[str, Coupled | None] | None = None,
               add: Sequence[Coupled] = ()) -> type["CoupledSystem"]:
        """A copy with some steps replaced (``None`` drops one) or added — the mutation suite's
        deliberately broken systems; the invariants and step properties are unchanged."""
        replace = dict(replace or {})
        known = {s.name for s in cls.definition.steps}
        unknown = set(replace) - known
        if unknown:
            raise KeyError(f"no step named {sorted(unknown)}")
        steps = [replace.get(s.name, s) for s in cls.definition.steps]
        namespace = {"__doc__": f"Mutant {name} of {cls.definition.name}.", "spec": cls.definition.spec,
                     "request": cls.definition.request, "lane": cls.definition.lane,
                     "steps": [s for s in steps if s is not None] + list(add),
                     "invariants": list(cls.definition.invariants), "omitted": list(cls.definition.omitted),
                     "step_properties": list(cls.definition.step_properties)}
        return type(name, (CoupledSystem,), namespace)


class NotLocal(Exception):
    """An expression read an instance it was not given (see :class:`Opaque`)."""


class Opaque:
    """An instance a local step must not read: any attribute or comparison refuses."""

    def __getattr__(self, name: str) -> Any:
        raise NotLocal(name)

    def __eq__(self, other: object) -> Any:
        raise NotLocal("==")

    def __ne__(self, other: object) -> Any:
        raise NotLocal("!=")

    __hash__ = None  # type: ignore[assignment]


def _check_wirings(sd: SystemDefinition, fault: Callable[[str], InvalidDefinition]) -> set[str]:
    """Every guard, wiring and invariant reads only declared names and has the right sort:
    evaluated once on z3 terms (a two-request, two-lane system), which visits every branch.
    Returns the steps that read only their own request and lane (see ``SystemDefinition.local``)."""
    requests = [SymbolicVars(sd.request.definition, f"_wr{i}") for i in range(2)]
    lanes = [SymbolicVars(sd.lane.definition, f"_wl{j}") for j in range(2)]
    binding = [z3.Int(f"bind_w{i}") for i in range(2)]
    seq = [z3.Int(f"seq_w{i}") for i in range(2)]
    view = SystemView(requests, lanes, binding, seq)
    args = {name: typ.symbol(f"{name}_w") for name, typ in sd.step_args.items()}

    def evaluate(v: Variant, on: SystemView) -> None:
        step = v.step
        if step.guard is not None:
            g = step.guard(on, 0, 0, **{a: args[a] for a in v.guard_args})
            if not (isinstance(g, bool) or z3.is_bool(g)):
                raise fault(f"guard of step {step.name!r} is not a boolean expression")
        for side, wiring, names, needs in (("request", step.request_args, v.request_wiring_args, v.request_needs),
                                           ("lane", step.lane_args, v.lane_wiring_args, v.lane_needs)):
            if wiring is None:
                continue
            out = wiring(on, 0, 0, **{a: args[a] for a in names})
            missing = [a for a in needs if a not in out]
            if missing:
                raise fault(f"step {step.name!r}: {side}_args does not give {missing}")

    local: set[str] = {step.name for step in sd.steps}
    for v in sd.variants:
        try:
            evaluate(v, view)
        except AttributeError as exc:
            raise fault(f"step {v.step.name!r}: {exc}") from None
        mine_r = v.involves != "lane"
        mine_l = v.involves != "request"
        narrow = SystemView([requests[0] if mine_r else Opaque(), Opaque()],
                            [lanes[0] if mine_l else Opaque(), Opaque()],
                            [binding[0] if mine_r else Opaque(), Opaque()],
                            [seq[0] if mine_r else Opaque(), Opaque()])
        try:
            evaluate(v, narrow)
        except Exception:  # reads another instance (or anything of an uninvolved one)
            local.discard(v.step.name)
    for inv in sd.invariants:
        try:
            p = inv.predicate(view)
        except AttributeError as exc:
            raise fault(f"invariant {inv.name}: {exc}") from None
        if not (isinstance(p, bool) or z3.is_bool(p)):
            raise fault(f"invariant {inv.name} is not a boolean expression")
    _check_step_properties(sd, view, args, fault)
    return local


def _check_step_properties(sd: SystemDefinition, view: SystemView, args: dict[str, Any],
                          fault: Callable[[str], InvalidDefinition]) -> None:
    """Each step property, on ``view`` and a symbolic post-state, for every declared step: reads only
    declared names and is a boolean expression (a property reading the step sees each name once)."""
    after = SystemView([SymbolicVars(sd.request.definition, f"_wr{i}_post") for i in range(2)],
                       [SymbolicVars(sd.lane.definition, f"_wl{j}_post") for j in range(2)],
                       [z3.Int(f"bind_w{i}_post") for i in range(2)], view.seq)
    for sp in sd.step_properties:
        for step in sd.steps:
            try:
                p = sp.predicate(view, after, SystemStep(step.name, step.name, args))
            except AttributeError as exc:
                raise fault(f"step property {sp.name}: {exc}") from None
            if not (isinstance(p, bool) or z3.is_bool(p)):
                raise fault(f"step property {sp.name} is not a boolean expression")


__all__ = ["NONE", "Coupled", "NotLocal", "Opaque", "CoupledSystem", "SystemDefinition", "SystemInvariant", "SystemStep",
           "SystemStepProperty", "SystemView", "Variant"]


def _step_shape(step: Coupled, step_args: dict[str, VarType],
                fault: Callable[[str], InvalidDefinition]) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(involves, guard args, request wiring args, lane wiring args) of a declared step, checked; its
    argument types are merged into ``step_args`` (one type per name across the system)."""
    if step.binding not in BINDINGS:
        raise fault(f"step {step.name!r}: binding must be one of {BINDINGS}")
    involves = step.involves or ("both" if step.request and step.lane else "lane" if step.lane else "request")
    if involves not in INVOLVES:
        raise fault(f"step {step.name!r}: involves must be one of {INVOLVES}")
    if not step.request and not step.lane and step.binding == "keep":
        raise fault(f"step {step.name!r} fires nothing")  # one that only binds or unbinds is a step (#20)
    if step.binding != "keep" and involves != "both":
        raise fault(f"step {step.name!r} changes a binding, so it must involve a request and a lane")
    for arg, typ in step.args.items():
        if arg in step_args and step_args[arg] != typ:
            raise fault(f"step argument {arg!r} has two types: {step_args[arg]} and {typ}")
        step_args[arg] = typ
    try:
        guard_args = callable_args(step.guard, 3) if step.guard else ()
        req_wiring = callable_args(step.request_args, 3) if step.request_args else ()
        lane_wiring = callable_args(step.lane_args, 3) if step.lane_args else ()
    except TypeError as exc:
        raise fault(f"step {step.name!r}: {exc}") from None
    for arg in (*guard_args, *req_wiring, *lane_wiring):
        if arg not in step.args:
            raise fault(f"step {step.name!r} reads undeclared step argument {arg!r}")
    return involves, tuple(guard_args), tuple(req_wiring), tuple(lane_wiring)
