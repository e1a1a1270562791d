"""Reachability of every coupled-system step by an explicit-state search, each witness run
replayed through the z3 encoding (issue #17: reachability at every level, within ``--fast``).

Reachability is an *existential* property: one real run from the initial system that takes a
step proves it fires from a reachable state. The symbolic search of
:func:`calculet.invariants.reachability.check_system_reachability` unrolls every run up to the
depth at once, which is what a *bug finder* needs but is more than an existence question asks:
for ``GenerationRequestSystem`` the last steps need runs of 11 steps (a generation Ready after 4,
a request pinned, admitted, prefilled, decoded, closed) and that unrolling took 24 s of CPU.

Here the question is answered on a finite instance by breadth-first search over *concrete*
systems, executing the declaration itself: the same guard, effect and wiring lambdas the proofs
encode, evaluated on plain values (DESIGN: declare once). The instance is finite — R requests
and L lanes, parameters taken from each machine's declared ``examples``, event and step
arguments drawn from small candidate sets (the type's first values and every integer the
current state holds, so "the job id this request waits for" is always a candidate) — so the
search is exact *for that instance*: every step it reports taken is taken on a real run.

What keeps this from becoming a second source of truth: every transition on the witness runs
(the breadth-first tree's edges to each step's first firing) is replayed through
:class:`~calculet.invariants.system_encoding.Move` — the encoding induction and bounded model
checking use — on the concrete pre-state; z3 must find the move enabled and its post-state
equal to the search's. A disagreement fails the check and names the step.

A step the search does not reach (a dead step, or one whose run needs arguments outside the
candidates) is handed to the symbolic search of ``reachability`` at the declared depth, which
either finds a run or proves none exists within the depth — so a missing step is never
reported reachable, and a dead step still fails the check (``test_reachability``).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any, Iterable, Iterator

import z3

from calculet.invariants.checks import CheckResult
from calculet.invariants.system_encoding import Frame, Move
from calculet.logic.symbolic import SymbolicVars
from calculet.logic.types import Bool, EnumType, Int, VarType
from calculet.machines.definition import Definition, Transition
from calculet.machines.system import NONE, SystemDefinition, SystemView, Variant

__all__ = ["ExplicitSearch", "check_system_reachability_explicit"]

# One instance: (state name, values of the parameters then the variables, in declaration order).
Inst = tuple[str, tuple[Any, ...]]
# The system: (requests, lanes, bindings); seq ids are fixed (request i has seq i + 1).
State = tuple[tuple[Inst, ...], tuple[Inst, ...], tuple[int, ...]]
Edge = tuple[State, Variant, int, int, dict[str, Any]]


class _Concrete:
    """A concrete instance read like a live one (``v.prompt_tokens``, ``v.at(...)``): what the
    declared lambdas are evaluated on."""

    def __init__(self, d: Definition, inst: Inst) -> None:
        names = (*d.params, *d.vars)
        self.__dict__.update(zip(names, inst[1]))
        self.__dict__["_definition"] = d
        self.__dict__["_state"] = inst[0]

    def at(self, *states: str) -> bool:
        return self.__dict__["_state"] in states


def _initials(d: Definition, mixed: bool = False) -> list[Inst]:
    """One initial instance per declared example (the parameters a proof's witness would use); with
    ``mixed``, every combination of the values the examples give each parameter (a request's
    example may need a lane's example it was not written beside: a context that fits)."""
    examples = d.examples or ({},)
    if mixed:
        values = [sorted({e.get(p, d.params[p].type.default) for e in examples}) for p in d.params]
        combos = list(itertools.product(*values))
    else:
        combos = [tuple(e.get(p, d.params[p].type.default) for p in d.params) for e in examples]
    start = tuple(d.initial_values()[n] for n in d.vars)
    return [(d.initial, tuple(c) + start) for c in dict.fromkeys(combos)]


def _candidates(typ: VarType, held: frozenset[int]) -> tuple[Any, ...]:
    """The values tried for an argument of type ``typ``: both booleans, every enum member, and for
    an integer its three smallest values plus every integer the system holds within its bounds."""
    if isinstance(typ, Bool):
        return (False, True)
    if isinstance(typ, EnumType):
        return tuple(typ.enum_cls)
    if isinstance(typ, Int):
        low = typ.ge if typ.ge is not None else 0
        values = set(range(low, low + 3)) | {h for h in held if h >= low}
        return tuple(sorted(v for v in values if typ.le is None or v <= typ.le))
    return (typ.default,)


class ExplicitSearch:
    """Breadth-first search over the concrete systems of ``requests`` × ``lanes`` instances."""

    def __init__(self, sd: SystemDefinition, requests: int = 1, lanes: int = 1, mixed: bool = False) -> None:
        self.sd, self.requests, self.lanes, self.mixed = sd, requests, lanes, mixed
        self.rd, self.ld = sd.request.definition, sd.lane.definition
        self.seq = tuple(range(1, requests + 1))
        # Variants by the source state of their first request row and first lane row (None: no row).
        self.by_source: dict[tuple[str | None, str | None], list[Variant]] = {}
        for v in sd.variants:
            key = (v.request_rows[0].source if v.request_rows else None, v.lane_rows[0].source if v.lane_rows else None)
            self.by_source.setdefault(key, []).append(v)
        self.parent: dict[State, Edge | None] = {}
        self.first: dict[str, Edge] = {}  # step name -> the edge that first took it
        self.states = 0

    def initial_states(self) -> list[State]:
        return [(tuple(reqs), tuple(lns), (NONE,) * self.requests)
                for reqs in itertools.product(_initials(self.rd, self.mixed), repeat=self.requests)
                for lns in itertools.product(_initials(self.ld, self.mixed), repeat=self.lanes)]

    def run(self, depth: int, max_states: int = 200_000) -> None:
        """Search until every step is taken, ``depth`` levels are explored or ``max_states`` seen."""
        wanted = {s.name for s in self.sd.steps}
        level = self.initial_states()
        for s in level:
            self.parent[s] = None
        for _ in range(depth):
            nxt: list[State] = []
            for state in level:
                for edge, post in self.successors(state):
                    self.first.setdefault(edge[1].step.name, edge)
                    if post not in self.parent:
                        self.parent[post] = edge
                        nxt.append(post)
                if len(self.parent) >= max_states or wanted <= self.first.keys():
                    break
            self.states = len(self.parent)
            if not nxt or len(self.parent) >= max_states or wanted <= self.first.keys():
                return
            level = nxt

    def successors(self, state: State) -> Iterator[tuple[Edge, State]]:
        """Every (edge, post-state) one step of the system takes from ``state``."""
        reqs, lns, binding = state
        view = SystemView([_Concrete(self.rd, r) for r in reqs], [_Concrete(self.ld, x) for x in lns],
                          list(binding), list(self.seq))
        held = frozenset(x for inst in (*reqs, *lns) for x in inst[1] if type(x) is int) | frozenset(self.seq)
        at_r: dict[str | None, list[int]] = {None: list(range(self.requests))}
        for k, inst in enumerate(reqs):
            at_r.setdefault(inst[0], []).append(k)
        at_l: dict[str | None, list[int]] = {None: list(range(self.lanes))}
        for k, inst in enumerate(lns):
            at_l.setdefault(inst[0], []).append(k)
        for rs, movable_r in at_r.items():
            for ls, movable_l in at_l.items():
                for v in self.by_source.get((rs, ls), ()):
                    # The instances the variant can move: those in its rows' source states; an instance
                    # it only reads (``involves="both"`` with rows on one side) may be any of its kind.
                    rows_i = movable_r if rs is not None or v.involves != "lane" else (0,)
                    rows_j = movable_l if ls is not None or v.involves != "request" else (0,)
                    for i, j in itertools.product(rows_i, rows_j):
                        for args in self._arguments(v, held):
                            post = self.fire(state, view, v, i, j, args)
                            if post is not None:
                                yield (state, v, i, j, args), post

    def _arguments(self, v: Variant, held: frozenset[int]) -> Iterable[dict[str, Any]]:
        step = v.step
        names = [*v.guard_args, *v.request_wiring_args, *v.lane_wiring_args]
        if step.request_args is None:
            names += v.request_needs
        if step.lane_args is None:
            names += v.lane_needs
        names = list(dict.fromkeys(names))
        if not names:
            return ({},)
        domains = [_candidates(self.sd.step_args[n], held) for n in names]
        return (dict(zip(names, combo)) for combo in itertools.product(*domains))

    def fire(self, state: State, view: SystemView, v: Variant, i: int, j: int,
             args: dict[str, Any]) -> State | None:
        """The system after variant ``v`` on (request i, lane j) with ``args``, or None if not enabled
        (its step guard, the wired arguments' types, each row's own guard in order, and no earlier
        row of the same event enabled — the runtime fires an event's first enabled row)."""
        step = v.step
        if step.guard is not None and not step.guard(view, i, j, **{a: args[a] for a in v.guard_args}):
            return None
        reqs, lns, binding = state
        new_reqs, new_lns = reqs, lns
        for side, machine_rows, wiring, names, needs, index in (
                ("request", v.request_rows, step.request_args, v.request_wiring_args, v.request_needs, i),
                ("lane", v.lane_rows, step.lane_args, v.lane_wiring_args, v.lane_needs, j)):
            if not machine_rows:
                continue
            d = self.rd if side == "request" else self.ld
            given = dict(wiring(view, i, j, **{a: args[a] for a in names})) if wiring else {a: args[a] for a in needs}
            for row in machine_rows:
                for a, typ in d.events[row.event].args.items():
                    if typ.check(given[a]) is not None:
                        return None
            inst = (reqs if side == "request" else lns)[index]
            after = _chain(d, machine_rows, inst, given)
            if after is None:
                return None
            if side == "request":
                new_reqs = reqs[:index] + (after,) + reqs[index + 1:]
            else:
                new_lns = lns[:index] + (after,) + lns[index + 1:]
        new_binding = binding
        if step.binding != "keep":
            new_binding = binding[:i] + (j if step.binding == "bind" else NONE,) + binding[i + 1:]
        return new_reqs, new_lns, new_binding

    def witness(self, name: str) -> list[Edge]:
        """The run from an initial system to the first firing of step ``name``."""
        edge: Edge | None = self.first[name]
        path = [edge]
        while True:
            prior = self.parent[path[-1][0]]
            if prior is None:
                return list(reversed(path))
            path.append(prior)


def _row_enabled(row: Transition, v: _Concrete, args: dict[str, Any]) -> bool:
    return row.guard is None or bool(row.guard(v, *[args[a] for a in row.guard_args]))


def _chain(d: Definition, rows: tuple[Transition, ...], inst: Inst, args: dict[str, Any]) -> Inst | None:
    """Fire ``rows`` in order on ``inst`` (each the first enabled row of its event), or None."""
    names = (*d.params, *d.vars)
    current = inst
    for row in rows:
        v = _Concrete(d, current)
        if current[0] != row.source or not _row_enabled(row, v, args):
            return None
        for earlier in d.transitions_from(row.source, row.event):
            if earlier is row:
                break
            if _row_enabled(earlier, v, args):
                return None
        updates = {} if row.effect is None else dict(row.effect(v, *[args[a] for a in row.effect_args]))
        values = tuple(_plain(d, n, updates[n]) if n in updates else value for n, value in zip(names, current[1]))
        current = (row.target, values)
    return current


def _plain(d: Definition, name: str, value: Any) -> Any:
    typ = d.vars[name].type
    if isinstance(typ, Bool):
        return bool(value)
    if isinstance(typ, EnumType):
        return typ.enum_cls(int(value))
    return int(value)


# ------------------------------------------------------------------------------------------------
# replay through the z3 encoding


def _z3_value(value: Any) -> Any:
    return z3.BoolVal(value) if isinstance(value, bool) else z3.IntVal(int(value))


def _symbolic(d: Definition, inst: Inst, tag: str) -> SymbolicVars:
    names = (*d.params, *d.vars)
    return SymbolicVars(d, tag, state=z3.IntVal(list(d.states).index(inst[0])),
                        values={n: _z3_value(x) for n, x in zip(names, inst[1])})


def _frame(search: ExplicitSearch, state: State, tag: str) -> Frame:
    reqs, lns, binding = state
    return Frame([_symbolic(search.rd, r, f"_x{tag}r{i}") for i, r in enumerate(reqs)],
                 [_symbolic(search.ld, x, f"_x{tag}l{j}") for j, x in enumerate(lns)],
                 [z3.IntVal(b) for b in binding], [z3.IntVal(s) for s in search.seq])


def _same(a: Any, b: Any) -> bool:
    return z3.is_true(z3.simplify(a == b))


def replay(search: ExplicitSearch, edge: Edge, post: State) -> str | None:
    """None if the z3 encoding agrees that ``edge`` is enabled and leads to ``post``; else why not."""
    state, v, i, j, args = edge
    sd = search.sd
    frame = _frame(search, state, "")
    move = Move(sd, v, frame, i, j, {a: _z3_value(x) for a, x in args.items()})
    if not z3.is_true(z3.simplify(move.enabled)):
        return f"{v.name} on request {i}, lane {j} with {args}: the z3 encoding finds it not enabled"
    after = move.after(frame)
    expected = _frame(search, post, "p")
    for side, got, want in (("request", after.requests, expected.requests), ("lane", after.lanes, expected.lanes)):
        d = search.rd if side == "request" else search.ld
        for k, (g, w) in enumerate(zip(got, want)):
            if not _same(g.state, w.state) or not all(_same(g.value(n), w.value(n)) for n in (*d.params, *d.vars)):
                return f"{v.name}: {side} {k} after the step differs between the search and the z3 encoding"
    if not all(_same(g, w) for g, w in zip(after.binding, expected.binding)):
        return f"{v.name}: the binding after the step differs between the search and the z3 encoding"
    return None


def check_system_reachability_explicit(sd: SystemDefinition, requests: int = 1, lanes: int = 1, depth: int = 16,
                                       max_states: int = 100_000) -> tuple[CheckResult, set[str]]:
    """Every step taken on a real run from the initial system, found by explicit-state search and
    each run's transitions replayed through the z3 encoding. The search runs on the declared
    examples' parameters first and, if a step is missing, again on every mix of their values.
    Returns the result (not ok when a replay disagrees or a step is missing) and the steps not
    reached (for the symbolic search to settle)."""
    start = time.process_time()
    search = ExplicitSearch(sd, requests, lanes)
    search.run(depth, max_states)
    searched = search.states
    if len(search.first) < len(sd.steps):
        search = ExplicitSearch(sd, requests, lanes, mixed=True)
        search.run(depth, max_states)
        searched += search.states
    found = set(search.first)
    edges: dict[int, tuple[Edge, State]] = {}
    longest = 0
    for name in found:
        path = search.witness(name)
        longest = max(longest, len(path))
        for k, edge in enumerate(path):
            post = path[k + 1][0] if k + 1 < len(path) else search.fire(
                edge[0], _view(search, edge[0]), edge[1], edge[2], edge[3], edge[4])
            edges.setdefault(id(edge), (edge, post))
    problems = [p for edge, post in edges.values() if (p := replay(search, edge, post)) is not None]
    missing = {s.name for s in sd.steps} - found
    subject = f"R={requests}, L={lanes}, explicit"
    if problems:
        return CheckResult("system-reachability", sd.name, subject, False, time.process_time() - start,
                           "the explicit search and the z3 encoding disagree: " + "; ".join(problems[:3]),
                           broken=sorted({e[1].step.name for e, _ in edges.values()})), set()
    params = "every mix of the declared examples' parameters" if search.mixed else "the declared examples' parameters"
    detail = (f"{len(found)}/{len(sd.steps)} steps taken on runs of ≤{longest} steps from the initial system, found by "
              f"explicit-state search over {searched} states ({requests} request(s) × {lanes} lane(s), {params}); "
              f"the {len(edges)} transitions of those runs replayed through the z3 encoding")
    return CheckResult("system-reachability", sd.name, subject, not missing, time.process_time() - start, detail,
                       queries=len(edges), broken=sorted(missing)), missing


def _view(search: ExplicitSearch, state: State) -> SystemView:
    reqs, lns, binding = state
    return SystemView([_Concrete(search.rd, r) for r in reqs], [_Concrete(search.ld, x) for x in lns],
                      list(binding), list(search.seq))
