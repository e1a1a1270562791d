"""Coupled-system properties: induction, bounded model checking, vacuity (requests × lanes).

Everything is encoded from a :class:`~calculet.machines.system.CoupledSystem` declaration and
its two machines' declarations, with the per-machine building blocks of
:mod:`calculet.invariants.checks` (``takes``: a row is the one taken; ``post_state``: its
effect): a step is a chain of declared rows on request ``i`` and a chain on lane ``j``.

* **Initiation** — the initial system (requests New, lanes Free, nothing bound) satisfies every
  invariant.
* **Induction** — R requests and L lanes, all symbolic, satisfying every system invariant and
  every instance invariant (proved per machine); request 0 and lane 0 take a step (any
  variant: its guard, each row's own guard, in order); every system invariant, the moved
  instances' invariants and their rows' step properties must hold after. Invariants and steps
  are symmetric, so (0, 0) stands for any pair.

  *Why R = L = 3 covers every R and L.* A binding may also name a lane outside the encoded
  ones (``elsewhere``). Every invariant of RequestLaneSystem is a ∀ over at most two requests
  and one lane, whose atoms read only the named instances (and ``binding[i] == j``,
  ``binding[i] == NONE`` for a named request and lane), and every step reads and writes only
  its own request and lane (``SystemDefinition.local``, checked at declaration). Take a
  counterexample to induction in a system of any size: the broken instance of the invariant
  names at most two requests and one lane; keep those, the moved request and the moved lane —
  at most three requests and two lanes — and turn bindings to dropped lanes into
  ``elsewhere``. The kept pre-state still satisfies every invariant (a ∀ restricted to fewer
  instances), the step is still enabled and does the same (it reads only kept instances), and
  the broken instance is still broken; padded with fresh New requests and Free lanes (which
  satisfy every invariant and take no part) it is a counterexample at R = 3, L = 3. So none
  exists at any size when none exists here. ``check_system_induction`` reports whether the
  declaration's steps are all local; a new invariant must keep the ∀-shape (or raise R, L).
* **Bounded model checking** — from the initial system (parameters and seq ids symbolic),
  every run of up to ``depth`` steps, one query for all depths, with symmetry breaking and a
  partial-order reduction (see :func:`check_system_bmc`).
* **Vacuity** — every step can fire from some state that satisfies the invariants.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import z3

from calculet.invariants.checks import (CheckResult, Counterexample, _as_bool, _value, invariants_hold, post_state,
                                        read_state, takes)
from calculet.logic.symbolic import SymbolicVars, arg_domain
from calculet.invariants.pool_checks import first_violation
from calculet.logic.types import Bool
from calculet.machines.core import Machine
from calculet.machines.definition import Definition
from calculet.machines.system import NONE, SystemDefinition, SystemView, Variant

Progress = Callable[[str], None]


# ----------------------------------------------------------------------------------------------
# The symbolic system


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


class _View(SystemView):
    def __init__(self, memo: _Memo, frame: "_Frame") -> None:
        super().__init__([memo.proxy(r) for r in frame.requests], [memo.proxy(lane) for lane in frame.lanes],
                         frame.binding, frame.seq)
        self._memo = memo

    def bound(self, i: int, j: int) -> Any:
        term = self.binding[i]
        key = (term.get_id(), j)
        hit = self._memo.eq.get(key)
        if hit is None:
            hit = self._memo.eq[key] = (term == j, term)  # the pair keeps `term` (and its id) alive
        return hit[0]


class _Frame:
    """One symbolic state of the system: requests, lanes, bindings and seq ids."""

    def __init__(self, requests: list[SymbolicVars], lanes: list[SymbolicVars], binding: list[Any],
                 seq: list[Any], memo: _Memo | None = None) -> None:
        self.requests = requests
        self.lanes = lanes
        self.binding = binding
        self.seq = seq
        self.memo = memo or _Memo()

    def view(self) -> SystemView:
        return _View(self.memo, self)


def _fresh(sd: SystemDefinition, r: int, l: int, tag: str) -> _Frame:
    return _Frame([SymbolicVars(sd.request.definition, f"_{tag}r{i}") for i in range(r)],
                  [SymbolicVars(sd.lane.definition, f"_{tag}l{j}") for j in range(l)],
                  [z3.Int(f"bind_{tag}{i}") for i in range(r)],
                  [z3.Int(f"seq_{tag}{i}") for i in range(r)])


def _initial(d: Definition, tag: str) -> SymbolicVars:
    """An instance in the initial state with initial variables and symbolic parameters."""
    base = SymbolicVars(d, tag)
    typed = {k: (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(int(v))) for k, v in d.initial_values().items()}
    return SymbolicVars(d, tag, state=z3.IntVal(list(d.states).index(d.initial)),
                        values={**{p: base.value(p) for p in d.params}, **typed})


def _seq_domain(frame: _Frame) -> list[Any]:
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


class _Move:
    """A variant applied to (request i, lane j) of a frame: when it is enabled and what it changes."""

    def __init__(self, sd: SystemDefinition, v: Variant, frame: _Frame, i: int, j: int, args: dict[str, Any]) -> None:
        view = frame.view()
        step = v.step
        parts: list[Any] = []
        if step.guard is not None:
            parts.append(_as_bool(step.guard(view, i, j, **{a: args[a] for a in v.guard_args})))
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

    def after(self, frame: _Frame) -> _Frame:
        requests, lanes, binding = list(frame.requests), list(frame.lanes), list(frame.binding)
        if self.request is not None:
            requests[self.i] = self.request
        if self.lane is not None:
            lanes[self.j] = self.lane
        if self.binding is not None:
            binding[self.i] = self.binding
        return _Frame(requests, lanes, binding, frame.seq, frame.memo)

    def instance_goals(self, sd: SystemDefinition) -> list[tuple[str, str, Any]]:
        """Instance invariants after the step and each row's step properties (proved per machine;
        restated so a chaining mistake in this encoding cannot hide)."""
        goals = []
        for machine, hops in ((sd.request, self.request_hops), (sd.lane, self.lane_hops)):
            d = machine.definition
            for _, pre, post in hops:
                goals += [(f"{d.name}.{sp.name}", sp.rid, _as_bool(sp.predicate(pre, post))) for sp in d.step_properties]
            if hops:
                goals += [(f"{d.name}.{inv.name}", inv.rid, _as_bool(inv.predicate(hops[-1][2]))) for inv in d.invariants]
        return goals


def _step_args(sd: SystemDefinition, tag: str) -> tuple[dict[str, Any], list[Any]]:
    args = {name: typ.symbol(f"{name}{tag}") for name, typ in sd.step_args.items()}
    domain = [c for name, typ in sd.step_args.items() if (c := typ.constraint(args[name])) is not None]
    return args, domain


def _system_goals(sd: SystemDefinition, frame: _Frame) -> list[tuple[str, str, Any]]:
    view = frame.view()
    return [(inv.name, inv.rid, _as_bool(inv.predicate(view))) for inv in sd.invariants]


def _read_frame(model: z3.ModelRef, sd: SystemDefinition, frame: _Frame, params: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, r in enumerate(frame.requests):
        values = read_state(model, sd.request.definition, r)
        if not params:
            values = {k: v for k, v in values.items() if k not in sd.request.definition.params}
        values["lane"] = _binding_name(_value(model, frame.binding[i]), len(frame.lanes))
        values["seq"] = _value(model, frame.seq[i])
        out[f"request{i}"] = values
    for j, lane in enumerate(frame.lanes):
        values = read_state(model, sd.lane.definition, lane)
        if not params:
            values = {k: v for k, v in values.items() if k not in sd.lane.definition.params}
        out[f"lane{j}"] = values
    return out


def _binding_name(value: int, lanes: int) -> Any:
    return "none" if value == NONE else ("elsewhere" if value >= lanes else value)


def _flat(state: dict[str, dict[str, Any]]) -> dict[str, Any]:
    short = {"request": "r", "lane": "l"}
    out = {}
    for key, values in state.items():
        prefix = next(short[k] + key[len(k):] for k in short if key.startswith(k))
        out.update({f"{prefix}.{name}": value for name, value in values.items()})
    return out


# ----------------------------------------------------------------------------------------------
# Induction


def _assume_invariants(sd: SystemDefinition, s: z3.Solver, frame: _Frame, outside: bool) -> None:
    """Domains, every instance invariant and every system invariant on ``frame``; a binding is
    NONE, an encoded lane, or (``outside``) ``len(lanes)``: a lane outside the encoded ones."""
    rd, ld = sd.request.definition, sd.lane.definition
    top = len(frame.lanes) if outside else len(frame.lanes) - 1
    s.add(*_seq_domain(frame), *[z3.And(b >= NONE, b <= top) for b in frame.binding])
    for r in frame.requests:
        s.add(*r.domain(), *[_as_bool(x) for x in invariants_hold(rd, r)])
    for lane in frame.lanes:
        s.add(*lane.domain(), *[_as_bool(x) for x in invariants_hold(ld, lane)])
    s.add(*[goal for _, _, goal in _system_goals(sd, frame)])


def check_system_induction(sd: SystemDefinition, requests: int = 3, lanes: int = 3,
                           progress: Progress | None = None, steps: Iterable[str] | None = None) -> list[CheckResult]:
    """One result per variant (of ``steps``, default all): every invariant preserved when
    request 0 and lane 0 take it.

    The pre-state is the same for every variant, so one solver holds it and each variant is a
    push/pop on top (one query each: all goals at once, then which ones broke)."""
    wanted = None if steps is None else set(steps)
    everywhere = len(sd.local) == len(sd.steps) and requests >= 3 and lanes >= 2
    scope = " (so every R, L)" if everywhere else " (this size only: a step reads other instances)"
    results = []
    frame = _fresh(sd, requests, lanes, "")
    args, arg_dom = _step_args(sd, "")
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", 60000)
    s.add(*arg_dom)
    _assume_invariants(sd, s, frame, outside=True)
    for v in sd.variants:
        if wanted is not None and v.step.name not in wanted:
            continue
        start = time.perf_counter()
        move = _Move(sd, v, frame, 0, 0, args)
        post = move.after(frame)
        goals = _system_goals(sd, post) + move.instance_goals(sd)
        s.push()
        s.add(move.enabled, z3.Not(z3.And(*[g for _, _, g in goals])))
        verdict = s.check()
        if verdict == z3.unsat:
            results.append(CheckResult("system-induction", sd.name, v.name, True, time.perf_counter() - start,
                                       f"R={requests}, L={lanes}{scope}: {len(goals)} properties preserved",
                                       queries=1))
        elif verdict == z3.sat:
            m = s.model()
            broken = [name for name, _, g in goals if z3.is_false(m.eval(g, model_completion=True))]
            name, rid = next((n, r) for n, r, _ in goals if n == broken[0])
            cx = Counterexample(name, rid, f"request 0, lane 0: {v.name}", pre=_flat(_read_frame(m, sd, frame)),
                                args={a: _value(m, t) for a, t in move.args.items()},
                                post=_flat(_read_frame(m, sd, post)))
            results.append(CheckResult("system-induction", sd.name, v.name, False, time.perf_counter() - start,
                                       f"R={requests}, L={lanes}: breaks {', '.join(broken)}", cx, queries=1,
                                       broken=broken))
        else:
            results.append(CheckResult("system-induction", sd.name, v.name, False, time.perf_counter() - start,
                                       f"solver answered {verdict}", queries=1))
        s.pop()
        if progress:
            progress(v.name)
    return results


def _initial_frame(sd: SystemDefinition, requests: int, lanes: int) -> _Frame:
    """Requests New, lanes Free, nothing bound; parameters and seq ids symbolic."""
    rd, ld = sd.request.definition, sd.lane.definition
    return _Frame([_initial(rd, f"_0r{i}") for i in range(requests)],
                  [_initial(ld, f"_0l{j}") for j in range(lanes)],
                  [z3.IntVal(NONE)] * requests, [z3.Int(f"seq{i}") for i in range(requests)])


def check_system_initiation(sd: SystemDefinition, requests: int = 3, lanes: int = 3) -> CheckResult:
    """The initial system satisfies every invariant (the base case of the induction)."""
    start = time.perf_counter()
    frame = _initial_frame(sd, requests, lanes)
    s = z3.SolverFor("QF_LIA")
    s.add(*_seq_domain(frame))
    for inst in (*frame.requests, *frame.lanes):
        s.add(*inst.domain()[2:])
    goals = _system_goals(sd, frame)
    s.add(z3.Not(z3.And(*[g for _, _, g in goals])))
    verdict = s.check()
    if verdict == z3.unsat:
        return CheckResult("system-induction", sd.name, "(initial system)", True, time.perf_counter() - start,
                           f"{len(goals)} invariants hold initially")
    cx = None
    broken: list[str] = []
    if verdict == z3.sat:
        m = s.model()
        broken = [n for n, _, g in goals if z3.is_false(m.eval(g, model_completion=True))]
        cx = Counterexample(broken[0], next(r for n, r, _ in goals if n == broken[0]), "(initial system)",
                            pre=_flat(_read_frame(m, sd, frame)))
    return CheckResult("system-induction", sd.name, "(initial system)", False, time.perf_counter() - start,
                       f"initial system breaks {', '.join(broken)}" if broken else f"solver answered {verdict}", cx,
                       broken=broken)


# ----------------------------------------------------------------------------------------------
# Vacuity


def check_system_vacuity(sd: SystemDefinition, requests: int = 2, lanes: int = 2) -> list[CheckResult]:
    """Each step can fire from some state satisfying every invariant (no dead step)."""
    results = []
    frame = _fresh(sd, requests, lanes, "v")
    args, arg_dom = _step_args(sd, "_v")
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", 20000)
    s.add(*arg_dom)
    _assume_invariants(sd, s, frame, outside=False)
    for step in sd.steps:
        start = time.perf_counter()
        s.push()
        s.add(z3.Or(*[_Move(sd, v, frame, 0, 0, args).enabled for v in sd.variants_of(step.name)]))
        verdict = s.check()
        s.pop()
        results.append(CheckResult("system-vacuity", sd.name, step.name, verdict == z3.sat,
                                   time.perf_counter() - start,
                                   "can fire" if verdict == z3.sat else "can never fire under the invariants (dead step)"
                                   if verdict == z3.unsat else f"solver answered {verdict}"))
    return results


# ----------------------------------------------------------------------------------------------
# Bounded model checking


def _source(v: Variant, side: str) -> str | None:
    rows = v.request_rows if side == "request" else v.lane_rows
    return rows[0].source if rows else None


def _distances(sd: SystemDefinition) -> tuple[dict[str, int], dict[str, int]]:
    """The fewest steps that move a request (lane) from its initial state to each state, over
    the chains the steps fire: a lower bound on when a step from that state can first fire."""
    out = []
    for side, d in (("request", sd.request.definition), ("lane", sd.lane.definition)):
        edges: dict[str, set[str]] = {}
        for v in sd.variants:
            rows = v.request_rows if side == "request" else v.lane_rows
            if rows:
                edges.setdefault(rows[0].source, set()).add(rows[-1].target)
        dist = {d.initial: 0}
        frontier = [d.initial]
        while frontier:
            nxt = []
            for state in frontier:
                for target in edges.get(state, ()):
                    if target not in dist:
                        dist[target] = dist[state] + 1
                        nxt.append(target)
            frontier = nxt
        out.append(dist)
    return out[0], out[1]


class _Option:
    """One step on one (request, lane) pair in bounded model checking: its variants merged (they
    are disjoint: each names a different row of an event, and ``takes`` rules out earlier rows)."""

    def __init__(self, sd: SystemDefinition, step: Any, variants: list[Variant], frame: _Frame, i: int, j: int,
                 args: dict[str, Any]) -> None:
        self.moves = [_Move(sd, v, frame, i, j, args) for v in variants]
        self.variants = variants
        self.step = step
        self.involves = variants[0].involves
        self.i, self.j = i, j
        self.enabled = z3.Or(*[mv.enabled for mv in self.moves]) if len(self.moves) > 1 else self.moves[0].enabled

    def pick(self, get: Callable[[_Move], Any], default: Any) -> Any:
        """The value the taken variant gives (``default`` if it leaves it unchanged)."""
        value = default
        for mv in reversed(self.moves):
            mine = get(mv)
            if mine is not None:
                value = mine if len(self.moves) == 1 else z3.If(mv.enabled, mine, value)
        return value


def check_system_bmc(sd: SystemDefinition, requests: int = 3, lanes: int = 3, depth: int = 6,
                     progress: Progress | None = None) -> CheckResult:
    """Search every run of up to ``depth`` steps from the initial system for a broken invariant.

    Reductions (each keeps every reachable state reachable within the same depth, and every
    depth is checked, so no reachable violation within ``depth`` is missed):

    * symmetry: untouched requests are all New with fresh parameters and untouched lanes all
      Free, so they are interchangeable: the k-th request (lane) is touched only after the
      (k-1)-th;
    * partial-order reduction: two consecutive *local* steps (``SystemDefinition.local``) on
      different requests and different lanes commute, so only the order with the lower request
      first is explored. Lane-only steps are never reordered.
    """
    start = time.perf_counter()
    subject = f"R={requests}, L={lanes}, depth≤{depth}"
    rd, ld = sd.request.definition, sd.lane.definition
    init = _initial_frame(sd, requests, lanes)
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", 300000)
    s.add(*_seq_domain(init))
    for inst in (*init.requests, *init.lanes):
        s.add(*inst.domain()[2:])  # parameters in their domains (fixed for the run)
    dist_r, dist_l = _distances(sd)
    frames = [init]
    chosen: list[tuple[Any, list[_Option]]] = []
    all_props = []
    high_r: Any = z3.IntVal(-1)  # the highest request / lane touched so far (symmetry breaking)
    high_l: Any = z3.IntVal(-1)
    previous: tuple[Any, Any, Any, Any] | None = None
    for k in range(1, depth + 1):
        prev = frames[-1]
        args, arg_dom = _step_args(sd, f"_s{k}")
        s.add(*arg_dom)
        options: list[_Option] = []
        for step in sd.steps:
            variants = sd.variants_of(step.name)
            involves = variants[0].involves
            for i in (range(requests) if involves != "lane" else (0,)):
                for j in (range(lanes) if involves != "request" else (0,)):
                    # Before frame k an instance has moved at most k-1 times, less one for each
                    # instance of its kind that symmetry makes touch first: skip what cannot fire yet.
                    ready = [v for v in variants
                             if (involves == "lane" or dist_r.get(_source(v, "request"), 0) <= k - 1 - i)
                             and (involves == "request" or dist_l.get(_source(v, "lane"), 0) <= k - 1 - j)]
                    if ready:
                        options.append(_Option(sd, step, ready, prev, i, j, args))
        sel = z3.Int(f"step_sel_{k}")
        req_sel, lane_sel = z3.Int(f"req_sel_{k}"), z3.Int(f"lane_sel_{k}")
        touch_r, touch_l, local = z3.Bool(f"touch_r_{k}"), z3.Bool(f"touch_l_{k}"), z3.Bool(f"local_{k}")
        s.add(sel >= 0, sel < len(options))
        for o, opt in enumerate(options):
            s.add(z3.Implies(sel == o, z3.And(
                opt.enabled, req_sel == opt.i, lane_sel == opt.j, touch_r == (opt.involves != "lane"),
                touch_l == (opt.involves != "request"),
                local == (opt.step.name in sd.local and opt.involves != "lane"))))
        s.add(z3.Implies(touch_r, req_sel <= high_r + 1), z3.Implies(touch_l, lane_sel <= high_l + 1))
        high_r = z3.If(z3.And(touch_r, req_sel > high_r), req_sel, high_r)
        high_l = z3.If(z3.And(touch_l, lane_sel > high_l), lane_sel, high_l)
        if previous is not None:
            p_local, p_req, p_touch_l, p_lane = previous
            independent = z3.And(p_local, local, p_req != req_sel,
                                 z3.Not(z3.And(p_touch_l, touch_l, p_lane == lane_sel)))
            s.add(z3.Implies(independent, p_req < req_sel))
        previous = (local, req_sel, touch_l, lane_sel)
        nxt = _Frame([SymbolicVars(rd, f"_{k}r{i}", values={p: prev.requests[i].value(p) for p in rd.params})
                      for i in range(requests)],
                     [SymbolicVars(ld, f"_{k}l{j}", values={p: prev.lanes[j].value(p) for p in ld.params})
                      for j in range(lanes)],
                     [z3.Int(f"bind_{k}_{i}") for i in range(requests)], prev.seq, prev.memo)
        for i in range(requests):
            state, values, binding = prev.requests[i].state, {n: prev.requests[i].value(n) for n in rd.vars}, prev.binding[i]
            for o, opt in enumerate(options):
                if opt.i != i or opt.involves == "lane":
                    continue
                chosen_o = sel == o
                state = z3.If(chosen_o, opt.pick(lambda mv: mv.request.state if mv.request else None, state), state)
                values = {n: z3.If(chosen_o, opt.pick(lambda mv: mv.request.value(n) if mv.request else None,
                                                      values[n]), values[n]) for n in rd.vars}
                if opt.step.binding != "keep":
                    binding = z3.If(chosen_o, opt.pick(lambda mv: mv.binding, binding), binding)
            s.add(nxt.requests[i].state == state, *[nxt.requests[i].value(n) == values[n] for n in rd.vars],
                  nxt.binding[i] == binding)
        for j in range(lanes):
            state, values = prev.lanes[j].state, {n: prev.lanes[j].value(n) for n in ld.vars}
            for o, opt in enumerate(options):
                if opt.j != j or opt.involves == "request":
                    continue
                chosen_o = sel == o
                state = z3.If(chosen_o, opt.pick(lambda mv: mv.lane.state if mv.lane else None, state), state)
                values = {n: z3.If(chosen_o, opt.pick(lambda mv: mv.lane.value(n) if mv.lane else None, values[n]),
                                   values[n]) for n in ld.vars}
            s.add(nxt.lanes[j].state == state, *[nxt.lanes[j].value(n) == values[n] for n in ld.vars])
        # Lemmas: instance invariants are proved per machine, so they hold in every reachable frame.
        frames.append(nxt)
        chosen.append((sel, options))
        all_props.append(_system_goals(sd, nxt))
        if progress:
            progress(f"encoded depth {k}")
    verdict, found = first_violation(s, all_props)
    if found is not None:
        m, k, broken = found
        trace: list[dict[str, Any]] = [{"step": 0, "system": _read_frame(m, sd, frames[0])}]
        for step in range(1, k + 1):
            sel, options = chosen[step - 1]
            opt = options[m.eval(sel, model_completion=True).as_long()]
            mv = next((mv for mv in opt.moves if z3.is_true(m.eval(mv.enabled, model_completion=True))),
                      opt.moves[0])
            trace.append({"step": step, "transition": mv_name(opt, mv), "request": opt.i, "lane": opt.j,
                          "involves": opt.involves,
                          "args": {a: _value(m, t) for a, t in mv.args.items()},
                          "system": _read_frame(m, sd, frames[step], params=False)})
        cx = Counterexample(broken[0][0], broken[0][1], trace[-1]["transition"], trace=trace)
        return CheckResult("system-bmc", sd.name, subject, False, time.perf_counter() - start,
                           f"reachable at depth {k}: breaks {', '.join(n for n, _ in broken)}", cx, queries=1,
                           broken=[n for n, _ in broken])
    if verdict != z3.unsat:
        return CheckResult("system-bmc", sd.name, subject, False, time.perf_counter() - start,
                           f"solver answered {verdict}", queries=1)
    return CheckResult("system-bmc", sd.name, subject, True, time.perf_counter() - start,
                       f"no invariant broken in any run of ≤{depth} steps over {requests} requests × {lanes} lanes",
                       queries=1)


def mv_name(opt: _Option, mv: _Move) -> str:
    return opt.variants[opt.moves.index(mv)].name


def check_system(sd: SystemDefinition, *, requests: int = 3, lanes: int = 3, depth: int = 6,
                 progress: Progress | None = None) -> list[CheckResult]:
    results = [check_system_initiation(sd, requests, lanes), *check_system_induction(sd, requests, lanes)]
    if progress:
        progress(f"{sd.name}: induction over {len(sd.variants)} step variants")
    results += check_system_vacuity(sd)
    results.append(check_system_bmc(sd, requests, lanes, depth))
    if progress:
        progress(f"{sd.name}: bounded model checking to depth {depth}")
    return results


# ----------------------------------------------------------------------------------------------
# The document


def system_document(sd: SystemDefinition) -> str:
    """``specs/request_lanes.md``: the coupled steps, the binding and the invariants, all read
    from the declaration (registered with specgen by :mod:`calculet.invariants.report`)."""
    from calculet.specgen import BANNER

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    def rows(v: Variant) -> tuple[str, str]:
        return (" → ".join(f"`{t.name}`" for t in v.request_rows) or "—",
                " → ".join(f"`{t.name}`" for t in v.lane_rows) or "—")

    rd, ld = sd.request.definition, sd.lane.definition
    out = [BANNER, "", f"# {sd.name}", ""]
    if sd.spec:
        out += [f"Spec: {sd.spec}", ""]
    out += [sd.doc, "",
            f"Instances: R × `{rd.name}` ([request.md](request.md)) and L × `{ld.name}` "
            "([kv_sequence.md](kv_sequence.md)). Ghost state: `binding[i]` — the lane request *i* holds, "
            "or none; `seq[i]` — its KV sequence id (positive, shared with no other request). Lane *j* "
            "*names* request *i* when it holds `(seq[i], generation of i)`.", "",
            "## Steps", "",
            "Each step is atomic: the request rows and the lane rows fire together, on request *i* and "
            "lane *j*. An event (not a row name) fires the machine's first enabled row, as the runtime "
            "does; the row chains it can take are listed. *local*: the step reads only its own request "
            "and lane (so steps on other requests and lanes commute).", "",
            "| step | request rows | lane rows | binding | local | meaning |", "|---|---|---|---|---|---|"]
    for step in sd.steps:
        variants = sd.variants_of(step.name)
        req = sorted({rows(v)[0] for v in variants})
        lane = sorted({rows(v)[1] for v in variants})
        binding = {"keep": "—", "bind": "i → j", "unbind": "i → none"}[step.binding]
        out.append(f"| `{step.name}` | {'<br>'.join(req)} | {'<br>'.join(lane)} | {binding} | "
                   f"{'yes' if step.name in sd.local else 'no'} | {cell(step.doc)} |")
    out += ["", "## Invariants", "",
            "Proved by induction for every number of requests and lanes, and searched by bounded model "
            "checking from the initial system (`python -m calculet.verify`; results in "
            "[verification.md](verification.md)). *strengthening*: not asked for, but needed to make the "
            "others inductive; the note names the counterexample to induction it rules out.", "",
            "| invariant | requirement | kind | meaning |", "|---|---|---|---|"]
    for inv in sd.invariants:
        kind = "strengthening" if inv.strengthening else "asked"
        meaning = inv.doc + (f" — *needed because* {inv.strengthening}" if inv.strengthening else "")
        out.append(f"| `{inv.name}` | {inv.rid} | {kind} | {cell(meaning)} |")
    if sd.omitted:
        out += ["", "## Rows no step takes", ""]
        out += [f"- `{row}`: {why}" for row, why in sd.omitted]
    out.append("")
    return "\n".join(out)


__all__ = ["check_system", "check_system_bmc", "check_system_induction", "check_system_initiation",
           "check_system_vacuity", "system_document"]
