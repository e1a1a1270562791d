"""The coupled system as z3 terms: frames of R requests × L lanes, and moves between them.

A *frame* is one symbolic state of a :class:`~calculet.machines.system.CoupledSystem` (each
request's and lane's :class:`~calculet.logic.symbolic.SymbolicVars`, the ghost binding and the
seq ids); a *move* is one declared variant applied to (request i, lane j) of a frame — when it is
enabled and what it changes — built from the per-machine blocks of
:mod:`calculet.invariants.checks` (``takes``, ``post_state``), so nothing of either machine is
restated. Induction (:mod:`calculet.invariants.system_induction`) and bounded model checking
(:mod:`calculet.invariants.system_bmc`) are both written over these two notions (§9.2, §4).
"""

from __future__ import annotations

from typing import Any

import z3

from calculet.invariants.checks import (Substitution, as_bool, initial_instance, invariants_hold, is_constant, model_value,
                                        moved_to, post_state, read_state, takes, terms_of)
from calculet.logic.symbolic import SymbolicVars, arg_domain
from calculet.logic.types import Bool
from calculet.machines.core import Machine
from calculet.machines.definition import Definition, Step
from calculet.machines.system import NONE, SystemDefinition, SystemStep, SystemView, Variant

__all__ = ["Beyond", "Frame", "Move", "StepGoals", "assume_invariants", "flat", "fresh_frame", "initial_frame", "read_frame", "seq_domain",
           "step_args", "step_property_goals", "system_goals"]


class _Memo:
    """Terms the declared predicates build again and again (``at(...)``, ``bound(i, j)``), built
    once per instance: most of a step's post-state is its pre-state, and without this the
    Python side of building the same z3 terms dominates the checks' time."""

    def __init__(self) -> None:
        self.proxies: dict[int, tuple[SymbolicVars, _Cached]] = {}
        self.eq: dict[tuple[int, int], tuple[Any, Any]] = {}

    def proxy(self, v: SymbolicVars) -> "_Cached":
        hit = self.proxies.get(id(v))
        if hit is None:
            hit = self.proxies[id(v)] = (v, _Cached(v))  # keeps v alive, so its id stays its own
        return hit[1]


class _Cached:
    """A ``SymbolicVars`` whose ``at(...)`` terms are built once."""

    __slots__ = ("_v", "_at")

    def __init__(self, v: SymbolicVars) -> None:
        self._v = v
        self._at: dict[tuple[str, ...], Any] = {}

    def at(self, *states: str) -> Any:
        term = self._at.get(states)
        if term is None:
            term = self._at[states] = self._v.at(*states)
        return term

    def __getattr__(self, name: str) -> Any:
        return getattr(self._v, name)


class Beyond:
    """The instances beyond the encoded ones, in the every-size induction: each declared count
    (``SystemView.beyond(name)``) gets a ghost integer ≥ 0 for its part over them. The step moves
    only encoded instances, so the pre- and the post-state share the ghost: the change of the
    whole count is the change over the encoded instances (see ``system_induction``)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.ghosts: dict[Any, Any] = {}

    def term(self, count: Any) -> Any:
        ghost = self.ghosts.get(count)
        if ghost is None:
            ghost = self.ghosts[count] = z3.Int(f"beyond{self.tag}_{len(self.ghosts)}")
        return ghost

    def domain(self) -> list[Any]:
        return [g >= 0 for g in self.ghosts.values()]


class _View(SystemView):
    def __init__(self, memo: _Memo, frame: "Frame") -> None:
        super().__init__([memo.proxy(r) for r in frame.requests], [memo.proxy(lane) for lane in frame.lanes],
                         frame.binding, frame.seq)
        self._memo = memo
        self._beyond = frame.beyond

    def beyond(self, count: Any) -> Any:
        return 0 if self._beyond is None else self._beyond.term(count)

    def bound(self, i: int, j: int) -> Any:
        term = self.binding[i]
        key = (term.get_id(), j)
        hit = self._memo.eq.get(key)
        if hit is None:
            hit = self._memo.eq[key] = (term == j, term)  # the pair keeps `term` (and its id) alive
        return hit[0]


class Frame:
    """One symbolic state of the system: requests, lanes, bindings and seq ids."""

    def __init__(self, requests: list[SymbolicVars], lanes: list[SymbolicVars], binding: list[Any],
                 seq: list[Any], memo: _Memo | None = None, beyond: Beyond | None = None) -> None:
        self.requests = requests
        self.lanes = lanes
        self.binding = binding
        self.seq = seq
        self.memo = memo or _Memo()
        self.beyond = beyond  # None: the encoded instances are the whole system

    def view(self) -> SystemView:
        return _View(self.memo, self)


def fresh_frame(sd: SystemDefinition, r: int, l: int, tag: str, beyond: bool = False) -> Frame:
    """A symbolic frame; with ``beyond``, the declared counts also have a ghost part over instances
    not encoded (the every-size induction)."""
    return Frame([SymbolicVars(sd.request.definition, f"_{tag}r{i}") for i in range(r)],
                 [SymbolicVars(sd.lane.definition, f"_{tag}l{j}") for j in range(l)],
                 [z3.Int(f"bind_{tag}{i}") for i in range(r)],
                 [z3.Int(f"seq_{tag}{i}") for i in range(r)], beyond=Beyond(tag) if beyond else None)


def seq_domain(frame: Frame) -> list[Any]:
    return [*[s >= 1 for s in frame.seq], *([z3.Distinct(*frame.seq)] if len(frame.seq) > 1 else [])]


def _typed(value: Any, typ: Any) -> Any:
    if isinstance(value, z3.ExprRef):
        return value
    return z3.BoolVal(bool(value)) if isinstance(typ, Bool) else z3.IntVal(int(value))


def _wire(machine: type[Machine], rows: tuple[Any, ...], wiring: Any, names: tuple[str, ...], needs: tuple[str, ...],
          view: SystemView, i: int, j: int, args: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The event arguments one side's rows receive, typed, with their declared domains."""
    d = machine.definition
    raw = dict(wiring(view, i, j, **{a: args[a] for a in names})) if wiring is not None else \
        {a: args[a] for a in needs}
    types = {a: t for row in rows for a, t in d.events[row.event].args.items()}
    typed = {a: _typed(raw[a], types[a]) for a in needs}
    domain = [c for row in rows for c in arg_domain(d.events[row.event], typed)]
    return typed, domain


def _chain(d: Definition, rows: tuple[Any, ...], start: SymbolicVars,
           args: dict[str, Any]) -> tuple[list[Any], list[tuple[Any, SymbolicVars, SymbolicVars]]]:
    """Fire ``rows`` in order from ``start``: (conditions, [(row, pre, post)])."""
    conditions, hops = [], []
    current = start
    for row in rows:
        conditions.append(takes(d, row, current, args))
        after = post_state(d, row, current, args)
        hops.append((row, current, after))
        current = after
    return conditions, hops


class Move:
    """A variant applied to (request i, lane j) of a frame: when it is enabled and what it changes."""

    def __init__(self, sd: SystemDefinition, v: Variant, frame: Frame, i: int, j: int, args: dict[str, Any]) -> None:
        view = frame.view()
        step = v.step
        parts: list[Any] = []
        if step.guard is not None:
            parts.append(as_bool(step.guard(view, i, j, **{a: args[a] for a in v.guard_args})))
        req_args, req_domain = _wire(sd.request, v.request_rows, step.request_args, v.request_wiring_args,
                                     v.request_needs, view, i, j, args)
        lane_args, lane_domain = _wire(sd.lane, v.lane_rows, step.lane_args, v.lane_wiring_args,
                                       v.lane_needs, view, i, j, args)
        parts += req_domain + lane_domain
        req_cond, self.request_hops = _chain(sd.request.definition, v.request_rows, frame.requests[i], req_args)
        lane_cond, self.lane_hops = _chain(sd.lane.definition, v.lane_rows, frame.lanes[j], lane_args)
        parts += req_cond + lane_cond
        self.enabled = z3.And(*parts) if parts else z3.BoolVal(True)
        self.request = self.request_hops[-1][2] if self.request_hops else None
        self.lane = self.lane_hops[-1][2] if self.lane_hops else None
        self.binding = {"keep": None, "bind": z3.IntVal(j), "unbind": z3.IntVal(NONE)}[step.binding]
        self.args = {**req_args, **lane_args, **{a: args[a] for a in step.args}}
        self.i, self.j = i, j

    def after(self, frame: Frame) -> Frame:
        requests, lanes, binding = list(frame.requests), list(frame.lanes), list(frame.binding)
        if self.request is not None:
            requests[self.i] = self.request
        if self.lane is not None:
            lanes[self.j] = self.lane
        if self.binding is not None:
            binding[self.i] = self.binding
        return Frame(requests, lanes, binding, frame.seq, frame.memo, frame.beyond)

    def instance_goals(self, sd: SystemDefinition) -> list[tuple[str, str, Any]]:
        """Instance invariants after the step and each row's step properties (proved per machine;
        restated so a chaining mistake in this encoding cannot hide)."""
        goals = []
        for machine, hops in ((sd.request, self.request_hops), (sd.lane, self.lane_hops)):
            d = machine.definition
            for row, pre, post in hops:
                goals += [(f"{d.name}.{name}", rid, as_bool(goal))
                          for name, rid, goal in d.step_goals(pre, post, row, self.args)]
            if hops:
                goals += [(f"{d.name}.{inv.name}", inv.rid, as_bool(inv.predicate(hops[-1][2]))) for inv in d.invariants]
        return goals


class StepGoals:
    """Every goal of the inductive step from one symbolic frame, built once and moved by substitution.

    The goals after a move are the system invariants on the post-frame, and the moved instances'
    invariants and step properties (``Move.instance_goals``). Built afresh per variant they were most
    of ``verify --fast``'s time (#17: ≤ 20 s of CPU): the declared predicates are Python building z3
    terms, ~3 ms per system invariant on the 3 × 3 frame, and a post-frame differs from the pre-frame
    only in request ``i``, lane ``j`` and ``binding[i]``. Since every value of a fresh frame is a z3
    constant, a predicate on the post-frame is the same predicate on the pre-frame with those constants
    replaced by their post-terms, which z3 does in C. The goals are the same terms (z3 shares equal
    terms: all but 2 of 2 045 system goals over the five systems come out as the very AST a direct
    build gives, the others equivalent — ``tests/property/test_step_goals.py`` checks every variant of
    every system both ways). A step property ``p(pre, post)`` is built once on the moved instance and a
    fresh post-state, then each row's (pre, post) is substituted in; the properties that see the event
    (``event_properties``) read the row, so they are built per row as before. A frame whose values are
    not all constants is built directly.
    """

    def __init__(self, sd: SystemDefinition, frame: Frame, i: int = 0, j: int = 0) -> None:
        self.sd, self.frame, self.i, self.j = sd, frame, i, j
        self.system = system_goals(sd, frame)
        self.constant = all(is_constant(t) for t in (*terms_of(frame.requests[i]), *terms_of(frame.lanes[j]),
                                                      frame.binding[i]))
        self.instances: dict[str, list[tuple[str, str, Any]]] = {}
        self.templates: dict[str, tuple[SymbolicVars, SymbolicVars, list[tuple[str, str, Any]]]] = {}
        for side, machine, pre in (("request", sd.request, frame.requests[i]), ("lane", sd.lane, frame.lanes[j])):
            d = machine.definition
            self.instances[side] = [(f"{d.name}.{inv.name}", inv.rid, as_bool(inv.predicate(pre)))
                                    for inv in d.invariants]
            post = SymbolicVars(d, f"{pre._suffix}_step")  # fresh constants for the post-state
            self.templates[side] = (pre, post, [(f"{d.name}.{sp.name}", sp.rid, as_bool(sp.predicate(pre, post)))
                                                for sp in d.step_properties])

    def after(self, move: Move) -> list[tuple[str, str, Any]]:
        """The goals after ``move`` (which must move request ``i`` and lane ``j`` of this frame), in the
        order of ``system_goals(sd, move.after(frame)) + move.instance_goals(sd)``."""
        frame = self.frame
        if not self.constant or (move.i, move.j) != (self.i, self.j):
            return system_goals(self.sd, move.after(frame)) + move.instance_goals(self.sd)
        sides = {"request": [] if move.request is None else moved_to(frame.requests[self.i], move.request),
                 "lane": [] if move.lane is None else moved_to(frame.lanes[self.j], move.lane)}
        moved = sides["request"] + sides["lane"]
        if move.binding is not None and not move.binding.eq(frame.binding[self.i]):
            moved.append((frame.binding[self.i], move.binding))
        whole = Substitution(moved)
        goals = [(n, r, whole(g)) for n, r, g in self.system]
        for side, machine, hops in (("request", self.sd.request, move.request_hops),
                                    ("lane", self.sd.lane, move.lane_hops)):
            d = machine.definition
            start, fresh, templates = self.templates[side]
            for row, pre, post in hops:
                step = Substitution(moved_to(start, pre) + list(zip(terms_of(fresh), terms_of(post))))
                goals += [(n, r, step(g)) for n, r, g in templates]
                goals += [(f"{d.name}.{sp.name}", sp.rid, as_bool(sp.predicate(pre, post, Step(row.event, row.name,
                                                                                                 move.args))))
                          for sp in d.event_properties]
            if hops:
                mine = Substitution(sides[side])
                goals += [(n, r, mine(g)) for n, r, g in self.instances[side]]
        return goals


def step_args(sd: SystemDefinition, tag: str) -> tuple[dict[str, Any], list[Any]]:
    args = {name: typ.symbol(f"{name}{tag}") for name, typ in sd.step_args.items()}
    domain = [c for name, typ in sd.step_args.items() if (c := typ.constraint(args[name])) is not None]
    return args, domain


def system_goals(sd: SystemDefinition, frame: Frame) -> list[tuple[str, str, Any]]:
    view = frame.view()
    return [(inv.name, inv.rid, as_bool(inv.predicate(view))) for inv in sd.invariants]


def step_property_goals(sd: SystemDefinition, frame: Frame, move: Move, v: Variant) -> list[tuple[str, str, Any]]:
    """Each system step property on ``move`` (variant ``v``) taken from ``frame``: the declared
    predicate on the pre-frame's view, the post-frame's view and the step. Built per variant (the
    step it sees differs), after the substituted goals of :class:`StepGoals`."""
    pre, post = frame.view(), move.after(frame).view()
    step = SystemStep(v.step.name, v.name, move.args)
    return [(sp.name, sp.rid, as_bool(sp.predicate(pre, post, step))) for sp in sd.step_properties]


def read_frame(model: z3.ModelRef, sd: SystemDefinition, frame: Frame, params: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, r in enumerate(frame.requests):
        values = read_state(model, sd.request.definition, r)
        if not params:
            values = {k: v for k, v in values.items() if k not in sd.request.definition.params}
        values["lane"] = _binding_name(model_value(model, frame.binding[i]), len(frame.lanes))
        values["seq"] = model_value(model, frame.seq[i])
        out[f"request{i}"] = values
    for j, lane in enumerate(frame.lanes):
        values = read_state(model, sd.lane.definition, lane)
        if not params:
            values = {k: v for k, v in values.items() if k not in sd.lane.definition.params}
        out[f"lane{j}"] = values
    return out


def _binding_name(value: int, lanes: int) -> Any:
    return "none" if value == NONE else ("elsewhere" if value >= lanes else value)


def flat(state: dict[str, dict[str, Any]]) -> dict[str, Any]:
    short = {"request": "r", "lane": "l"}
    out = {}
    for key, values in state.items():
        prefix = next(short[k] + key[len(k):] for k in short if key.startswith(k))
        out.update({f"{prefix}.{name}": value for name, value in values.items()})
    return out



def assume_invariants(sd: SystemDefinition, s: z3.Solver, frame: Frame, outside: bool,
                      system: list[tuple[str, str, Any]] | None = None) -> None:
    """Domains, every instance invariant and every system invariant on ``frame``; a binding is
    NONE, an encoded lane, or (``outside``) ``len(lanes)``: a lane outside the encoded ones.
    ``system``: the system invariants on ``frame`` when the caller has built them already."""
    rd, ld = sd.request.definition, sd.lane.definition
    top = len(frame.lanes) if outside else len(frame.lanes) - 1
    s.add(*seq_domain(frame), *[z3.And(b >= NONE, b <= top) for b in frame.binding])
    for r in frame.requests:
        s.add(*r.domain(), *[as_bool(x) for x in invariants_hold(rd, r)])
    for lane in frame.lanes:
        s.add(*lane.domain(), *[as_bool(x) for x in invariants_hold(ld, lane)])
    s.add(*[goal for _, _, goal in (system if system is not None else system_goals(sd, frame))])



def initial_frame(sd: SystemDefinition, requests: int, lanes: int) -> Frame:
    """Requests New, lanes Free, nothing bound; parameters and seq ids symbolic."""
    rd, ld = sd.request.definition, sd.lane.definition
    return Frame([initial_instance(rd, f"_0r{i}") for i in range(requests)],
                 [initial_instance(ld, f"_0l{j}") for j in range(lanes)],
                 [z3.IntVal(NONE)] * requests, [z3.Int(f"seq{i}") for i in range(requests)])

