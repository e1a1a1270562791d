"""Pool properties: induction with symmetry, and bounded model checking from the empty pool.

Both encodings are built from a pool declaration (:mod:`calculet.machines.pool`) and its
instance machine's declaration; nothing is restated.

* **Induction** — assume N arbitrary instances that satisfy every instance invariant and every
  pool invariant; let instance 0 take any row (its own guard plus the pool guard); prove every
  pool invariant, instance invariant and step property after. Pool invariants are symmetric, so
  instance 0 stands for any instance. A failure here may be unreachable (the invariant is too
  weak to be inductive) — bounded model checking tells.
* **Bounded model checking** — from the initial pool (every instance initial, parameters
  arbitrary), unroll up to ``depth`` steps in which one chosen instance takes one enabled row,
  and look for a state breaking a property at any depth. A hit is a real, reachable bug,
  reported as a step-by-step trace.

  Symmetry makes this affordable: a run of ``k`` steps moves at most ``k`` instances, and
  instances are interchangeable, so it suffices to encode ``min(N, k)`` of them and let the
  ``j``-th instance move only after instance ``j-1`` has (the others stay initial). This is
  sound for pools whose properties and guards are neutral on an initial instance — a free
  lane holds no owner and no tokens — which :func:`check_pool_bmc` asserts for the
  declaration before relying on it. All depths are checked in one query.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import z3

from calculet.invariants.checks import (RLIMIT_SEARCH, CheckResult, Counterexample, Progress, Substitution, as_bool,
                                        initial_instance, invariants_hold, is_constant, moved_to, post_state, read_args,
                                        read_state, all_hold, solver, takes)
from calculet.logic.symbolic import SymbolicVars, arg_domain, symbolic_args, type_domain
from calculet.invariants.pool_reduction import reduction
from calculet.invariants.system_encoding import _Memo
from calculet.machines.definition import Step, Transition
from calculet.machines.pool import PoolDefinition, PoolView


def _lanes(p: PoolDefinition, n: int, tag: str) -> tuple[list[SymbolicVars], list[dict[str, Any]]]:
    d = p.instance.definition
    lanes = [SymbolicVars(d, f"_{tag}{j}") for j in range(n)]
    ghosts = [{g: z3.Int(f"{g}_{tag}{j}") for g in p.ghosts} for j in range(n)]
    return lanes, ghosts


def _pool_params(p: PoolDefinition, tag: str = "") -> dict[str, Any]:
    return {name: z3.Int(f"{name}{tag}") for name in p.params}


def _param_domain(p: PoolDefinition, params: dict[str, Any]) -> list[Any]:
    return type_domain(p.params, params)


def _ghost_domain(p: PoolDefinition, ghosts: list[dict[str, Any]]) -> list[Any]:
    return [c for g in ghosts for c in type_domain(p.ghosts, g)]


def _pool_guard(p: PoolDefinition, view: PoolView, lane: int, event: str, args: dict[str, Any]) -> Any:
    op = p.ops[event]
    if op.guard is None:
        return z3.BoolVal(True)
    return as_bool(op.guard(view, lane, **args))


def _ghost_updates(p: PoolDefinition, view: PoolView, lane: int, event: str, args: dict[str, Any]) -> dict[str, Any]:
    op = p.ops[event]
    return {} if op.ghost is None else dict(op.ghost(view, lane, **args))


def _as_term(value: Any) -> Any:
    """A ghost's value as a z3 term (an update may give a plain int)."""
    return value if isinstance(value, z3.ExprRef) else z3.IntVal(int(value))


def _pool_state(model: z3.ModelRef, p: PoolDefinition, lanes: list[SymbolicVars],
                ghosts: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    d = p.instance.definition
    out: dict[str, Any] = {name: model.eval(term, model_completion=True).as_long() for name, term in params.items()}
    for j, lane in enumerate(lanes):
        values = read_state(model, d, lane)
        values.update({g: model.eval(t, model_completion=True).as_long() for g, t in ghosts[j].items()})
        out[f"lane{j}"] = values
    return out


def check_pool_induction(p: PoolDefinition, n: int, progress: Progress | None = None) -> list[CheckResult]:
    """One result per row: lane 0 takes it from any pool satisfying every instance and pool
    invariant, and every property holds after. The pre-state is the same for every row, so one
    solver holds it and each row is a push/pop on top; the lanes' ``at(...)`` terms are built once
    (without that, building the O(N²) pool invariants' terms dominated the time)."""
    d = p.instance.definition
    results = []
    pre = _induction_pre_state(p, n)
    s, raw, view = pre.solver, pre.raw, pre.view
    for t in d.transitions:
        start = time.process_time()
        ev = d.events[t.event]
        args = symbolic_args(ev)
        s.push()
        s.add(*arg_domain(ev, args), takes(d, t, raw[0], args), _pool_guard(p, view, 0, t.event, args))
        moved = post_state(d, t, raw[0], args)
        post_ghosts = [dict(g) for g in pre.ghosts]
        post_ghosts[0].update(_ghost_updates(p, view, 0, t.event, args))
        goals = _induction_goals(p, pre, t, args, moved, post_ghosts)
        failure = _induction_failure(p, n, pre, t, args, moved, post_ghosts, goals, start)
        s.pop()
        results.append(failure or CheckResult("pool-induction", p.name, t.name, True, time.process_time() - start,
                                              f"N={n}: {len(goals)} properties preserved", queries=1))
        if progress:
            progress(t.name)
    return results


@dataclass
class _InductionPreState:
    """What every row of :func:`check_pool_induction` starts from: N lanes and their ghosts, the pool
    parameters, and a solver holding their domains and every instance and pool invariant (``held``,
    ``pool_pre``: the asserted terms, reused as the goals after a row when ``constant``)."""

    solver: z3.Solver
    raw: list[SymbolicVars]
    ghosts: list[dict[str, Any]]
    memo: _Memo
    lanes: list[Any]
    params: dict[str, Any]
    view: PoolView
    held: list[list[Any]]
    pool_pre: list[Any]
    constant: bool  # lane 0's state, variables and ghosts are plain constants (so goals can be substituted)


def _induction_pre_state(p: PoolDefinition, n: int) -> _InductionPreState:
    """The induction's pre-state, asserted once in a fresh solver (each row is a push/pop on top); the
    lanes' ``at(...)`` terms are built once, through one :class:`_Memo`."""
    d = p.instance.definition
    raw, ghosts = _lanes(p, n, "")
    memo = _Memo()
    lanes = [memo.proxy(lane) for lane in raw]
    params = _pool_params(p)
    view = PoolView(lanes, params, ghosts)
    s = solver()
    s.add(*_param_domain(p, params), *_ghost_domain(p, ghosts))
    held = [[as_bool(x) for x in invariants_hold(d, lane)] for lane in raw]
    for lane, holds in zip(raw, held):
        s.add(*lane.domain(), *holds)
    pool_pre = [as_bool(inv.predicate(view)) for inv in p.invariants]
    s.add(*pool_pre)
    constant = all(is_constant(x) for x in (raw[0].state, *[raw[0].value(k) for k in raw[0].names()],
                                             *ghosts[0].values()))
    return _InductionPreState(s, raw, ghosts, memo, lanes, params, view, held, pool_pre, constant)


def _induction_goals(p: PoolDefinition, pre: _InductionPreState, t: Transition, args: dict[str, Any],
                     moved: SymbolicVars, post_ghosts: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(name, rid, term) of every pool invariant, instance invariant and step property after lane 0
    takes row ``t`` (to ``moved``, its ghosts to ``post_ghosts[0]``)."""
    d = p.instance.definition
    raw, ghosts = pre.raw, pre.ghosts
    # The goals after a row are the pre-state's with lane 0's constants replaced by its post-terms (built once,
    # substituted per row: the O(N²) pool invariants were most of this check's time; #17, verify --fast).
    if pre.constant:
        after = Substitution(moved_to(raw[0], moved) + [
            (ghosts[0][g], _as_term(post_ghosts[0][g])) for g in ghosts[0]
            if not _as_term(post_ghosts[0][g]).eq(ghosts[0][g])])
        goals = [(inv.name, inv.rid, after(g)) for inv, g in zip(p.invariants, pre.pool_pre)]
        goals += [(inv.name, inv.rid, after(g)) for inv, g in zip(d.invariants, pre.held[0])]
    else:
        post_view = PoolView([pre.memo.proxy(moved)] + pre.lanes[1:], pre.params, post_ghosts)
        goals = [(inv.name, inv.rid, as_bool(inv.predicate(post_view))) for inv in p.invariants]
        goals += [(inv.name, inv.rid, as_bool(inv.predicate(moved))) for inv in d.invariants]
    goals += [(name, rid, as_bool(goal)) for name, rid, goal in d.step_goals(raw[0], moved, t, args)]
    return goals


def _induction_failure(p: PoolDefinition, n: int, pre: _InductionPreState, t: Transition, args: dict[str, Any],
                       moved: SymbolicVars, post_ghosts: list[dict[str, Any]], goals: list[tuple[str, str, Any]],
                       start: float) -> CheckResult | None:
    """The failed result for row ``t`` (the first goal not proved, with a counterexample when the solver
    finds one), or None when every goal holds — one query when they all do."""
    d = p.instance.definition
    s, raw, ghosts, params = pre.solver, pre.raw, pre.ghosts, pre.params
    for name, rid, goal in ([] if all_hold(s, [g for _, _, g in goals]) else goals):  # one query if fine
        s.push()
        s.add(z3.Not(goal))
        verdict = s.check()
        if verdict != z3.unsat:
            cx = None
            if verdict == z3.sat:
                m = s.model()
                cx = Counterexample(name, rid, f"lane0: {t.name}",
                                    pre=_pool_state(m, p, raw, ghosts, params),
                                    args=read_args(m, d, t.event, args),
                                    post=_pool_state(m, p, [moved] + raw[1:], post_ghosts, params))
            failure = CheckResult("pool-induction", p.name, t.name, False, time.process_time() - start,
                                  f"N={n}: breaks {name} ({rid})" if verdict == z3.sat
                                  else f"N={n}: {name}: solver answered {verdict}", cx, queries=len(goals))
            s.pop()
            return failure
        s.pop()
    return None


def _initial_is_neutral(p: PoolDefinition, n: int) -> bool:
    """Adding initial instances to a pool changes no pool guard or invariant (checked, not assumed)."""
    d = p.instance.definition
    lanes, ghosts = _lanes(p, n, "neutral")
    params = _pool_params(p, "_neutral")
    extra = initial_instance(d, "_extra")
    extra_ghost = {g: z3.IntVal(0) for g in p.ghosts}
    small = PoolView(lanes, params, ghosts)
    big = PoolView(lanes + [extra], params, ghosts + [extra_ghost])
    s = solver()
    s.add(*_param_domain(p, params), *_ghost_domain(p, ghosts))
    for lane in lanes:
        s.add(*lane.domain())
    same = [as_bool(inv.predicate(small)) == as_bool(inv.predicate(big)) for inv in p.invariants]
    for e, ev in d.events.items():
        args = symbolic_args(ev, "_neutral")
        for j in range(n):
            same.append(_pool_guard(p, small, j, e, args) == _pool_guard(p, big, j, e, args))
    s.add(z3.Not(z3.And(*same)))
    return s.check() == z3.unsat


class Unrolling(Protocol):
    """What a bounded search unrolls: a solver, each depth's properties, and a trace reader."""

    solver: z3.Solver
    all_props: list[list[tuple[str, str, Any]]]

    def unroll(self, k: int) -> None: ...

    def trace(self, model: z3.ModelRef, k: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Violation:
    """The shallowest broken frame of a bounded search and the run that reaches it."""

    depth: int
    broken: list[tuple[str, str]]
    trace: list[dict[str, Any]]


def search_unrolling(unrolling: Unrolling, depth: int, progress: Progress | None = None
                     ) -> tuple[z3.CheckSatResult, Violation | None]:
    """Unroll to ``depth``, then one query for every depth at once; the shallowest violation.

    ``all_props[k - 1]`` holds ``(name, rid, property)`` of the frame after step ``k``. Asking
    "is some property false at some depth ≤ K" once, without push/pop, keeps z3 on its
    non-incremental linear-arithmetic tactics, much faster here than K incremental queries.
    Shared by the pool and the joint-system BMCs.
    """
    for k in range(1, depth + 1):
        unrolling.unroll(k)
        if progress:
            progress(f"encoded depth {k}")
    s = unrolling.solver
    s.add(z3.Or(*[z3.Not(z3.And(*[prop for _, _, prop in props])) for props in unrolling.all_props]))
    # Solved in a context of its own: z3's search on this one large query depends on the ids its terms got, which
    # depend on every term the process built before (the requests x lanes search at depth 8 took 24 s after one
    # history of earlier checks and 37 s after another, 33 s alone). A copy in a fresh context numbers its terms by
    # the query alone, so its effort, and the rlimit it is bounded by, are the query's own (29 s; #17).
    fresh = s.translate(z3.Context())
    fresh.set("rlimit", RLIMIT_SEARCH)
    fresh.set("smt.arith.solver", 2)
    verdict = fresh.check()
    if verdict == z3.sat:
        model = fresh.model().translate(z3.main_ctx())
        for k, props in enumerate(unrolling.all_props, start=1):
            broken = [(nm, r) for nm, r, prop in props if z3.is_false(model.eval(prop, model_completion=True))]
            if broken:
                return verdict, Violation(k, broken, unrolling.trace(model, k))
    return verdict, None


def check_pool_bmc(p: PoolDefinition, n: int, depth: int, progress: Progress | None = None,
                   instance_properties: bool = False) -> CheckResult:
    """Search every run of up to ``depth`` steps from the initial pool of ``n`` instances.

    Pool invariants are searched always; each instance's own invariants and step properties
    (already proved by per-machine induction) only with ``instance_properties``.
    """
    start = time.process_time()
    subject = f"N={n}, depth≤{depth}"
    encoded = min(n, depth)
    if encoded < n and not _initial_is_neutral(p, 2):
        encoded = n  # the symmetry argument does not apply: encode every instance
    verdict, found = search_unrolling(_PoolUnrolling(p, encoded, instance_properties), depth, progress)
    if found is not None:
        name, rid = found.broken[0]
        cx = Counterexample(name, rid, found.trace[-1].get("transition", ""), trace=found.trace)
        return CheckResult("pool-bmc", p.name, subject, False, time.process_time() - start,
                           f"reachable at depth {found.depth}: breaks {name} ({rid})", cx, queries=1)
    if verdict != z3.unsat:
        return CheckResult("pool-bmc", p.name, subject, False, time.process_time() - start,
                           f"solver answered {verdict}", queries=1)
    how = f"{encoded} encoded by symmetry" if encoded < n else f"{n} encoded"
    return CheckResult("pool-bmc", p.name, subject, True, time.process_time() - start,
                       f"no property broken in any run of ≤{depth} steps over {n} lanes ({how})", queries=depth)


PoolFrame = tuple[list[SymbolicVars], list[dict[str, Any]]]  # instances and their ghosts


def _distances(d: Any) -> dict[str, int]:
    """The fewest transitions from the initial state to each state of the instance machine."""
    dist = {d.initial: 0}
    frontier = [d.initial]
    while frontier:
        reached = []
        for state in frontier:
            for t in d.transitions_from(state):
                if t.target not in dist:
                    dist[t.target] = dist[state] + 1
                    reached.append(t.target)
        frontier = reached
    return dist


class _PoolUnrolling:
    """The runs from the initial pool of ``encoded`` instances, one frame per depth: at depth
    ``k`` one chosen instance takes one chosen row (its guard and the pool guard hold)."""

    def __init__(self, p: PoolDefinition, encoded: int, instance_properties: bool) -> None:
        self.p, self.encoded, self.instance_properties = p, encoded, instance_properties
        self.d = d = p.instance.definition
        self.rows = list(d.transitions)
        self.params = _pool_params(p)
        lanes = [initial_instance(d, f"_0_{j}") for j in range(encoded)]
        ghosts = [{g: z3.IntVal(0) for g in p.ghosts} for _ in range(encoded)]
        self.solver = s = solver("QF_LIA", RLIMIT_SEARCH, search=True)
        s.add(*_param_domain(p, self.params))
        for lane in lanes:
            s.add(*lane.domain()[2:])  # instance parameters in their domains (fixed for the run)
        self.frames: list[PoolFrame] = [(lanes, ghosts)]
        self.choices: list[tuple[Any, Any, dict[str, dict[str, Any]]]] = []
        self.all_props: list[list[tuple[str, str, Any]]] = []
        self.highest: Any = z3.IntVal(-1)  # the highest instance moved so far (symmetry breaking)
        # Partial-order reduction (the canonical runs of calculet.invariants.pool_reduction, each
        # rule proved on this declaration first) and the fewest steps from the initial state to
        # each state: lane j is first touched at step j+1 at the earliest, so before step k it has
        # moved at most k-1-j times and only rows from states that close are encoded for it.
        self.reduction = reduction(p, encoded, lemmas=not instance_properties)
        self.local_rows = sorted(self.reduction.local)
        self.distance = _distances(d)
        self.previous: tuple[Any, Any, Any] | None = None  # (lane, local row, stutter) of the last step

    def unroll(self, k: int) -> None:
        """Encode step ``k``: the choice of instance and row, its reductions, and frame ``k``."""
        d, s = self.d, self.solver
        prev_lanes, prev_ghosts = self.frames[-1]
        view = PoolView(prev_lanes, self.params, prev_ghosts)
        lane_sel, row_sel = z3.Int(f"lane_sel_{k}"), z3.Int(f"row_sel_{k}")
        step_args = {e: symbolic_args(ev, f"_s{k}") for e, ev in d.events.items()}
        # row_sel == len(rows) is a stutter: nothing moves, and nothing moves after it — so runs
        # shorter than the depth (a pool where no row is enabled) are searched too.
        stutter = row_sel == len(self.rows)
        s.add(lane_sel >= 0, lane_sel < min(self.encoded, k), lane_sel <= self.highest + 1, row_sel >= 0,
              row_sel <= len(self.rows), z3.Implies(stutter, lane_sel == 0))
        self.highest = z3.If(lane_sel > self.highest, lane_sel, self.highest)
        is_local = z3.Or(*[row_sel == i for i in self.local_rows]) if self.local_rows else z3.BoolVal(False)
        if self.previous is not None:
            prev_lane, prev_local, prev_stutter = self.previous
            s.add(z3.Implies(prev_stutter, stutter))
            other = z3.And(lane_sel != prev_lane, z3.Not(stutter))
            s.add(z3.Implies(z3.And(prev_local, is_local, other), lane_sel > prev_lane))
            if self.reduction.guarded_commute:
                s.add(z3.Implies(z3.And(z3.Not(prev_local), z3.Not(is_local), other), lane_sel > prev_lane))
            if self.reduction.local_first:
                s.add(z3.Not(z3.And(z3.Not(prev_local), is_local, other)))
        self.previous = (lane_sel, is_local, stutter)
        s.add(*[c for e, ev in d.events.items() for c in arg_domain(ev, step_args[e])])
        new_lanes, new_ghosts, options = [], [], []
        for j in range(self.encoded):
            nxt, nxt_ghost = self._lane_after(k, j, (prev_lanes, prev_ghosts), view, lane_sel, row_sel, step_args,
                                              options)
            new_lanes.append(nxt)
            new_ghosts.append(nxt_ghost)
        s.add(z3.Or(*options, stutter))
        if not self.instance_properties:
            # Lemmas: every instance invariant is proved inductive per machine, so it holds in
            # every reachable frame; stating it prunes the search without changing its answer.
            for lane in new_lanes:
                s.add(*[as_bool(x) for x in invariants_hold(d, lane)])
        self.frames.append((new_lanes, new_ghosts))
        self.choices.append((lane_sel, row_sel, step_args))
        self.all_props.append(self._properties(new_lanes, new_ghosts, (prev_lanes, prev_ghosts)))

    def _lane_after(self, k: int, j: int, frame: PoolFrame, view: PoolView, lane_sel: Any, row_sel: Any,
                    step_args: dict[str, dict[str, Any]], options: list[Any]) -> tuple[SymbolicVars, dict[str, Any]]:
        """Instance ``j`` in frame ``k``: unchanged unless it is the chosen one and takes the chosen
        row; appends to ``options`` when each (instance, row) choice is allowed."""
        d, p = self.d, self.p
        prev = frame[0][j]
        rows = [(r, t) for r, t in enumerate(self.rows) if self.distance.get(t.source, k) <= k - 1 - j]
        if not rows:  # this lane cannot move yet: it is the same terms
            return prev, dict(frame[1][j])
        nxt = SymbolicVars(d, f"_{k}_{j}", values={q: prev.value(q) for q in d.params})
        nxt_ghost = {g: z3.Int(f"{g}_{k}_{j}") for g in p.ghosts}
        state_term: Any = prev.state
        var_terms = {name: prev.value(name) for name in d.vars}
        ghost_terms = dict(frame[1][j])
        for r_index, t in rows:
            args = step_args[t.event]
            chosen = z3.And(lane_sel == j, row_sel == r_index)
            options.append(z3.And(chosen, takes(d, t, prev, args), _pool_guard(p, view, j, t.event, args)))
            post = post_state(d, t, prev, args)
            state_term = z3.If(chosen, post.state, state_term)
            for name in d.vars:
                if post.value(name) is not prev.value(name):  # unchanged by this row: no term
                    var_terms[name] = z3.If(chosen, post.value(name), var_terms[name])
            for g, value in _ghost_updates(p, view, j, t.event, args).items():
                ghost_terms[g] = z3.If(chosen, value, ghost_terms[g])
        self.solver.add(nxt.state == state_term)
        self.solver.add(*[nxt.value(name) == var_terms[name] for name in d.vars])
        self.solver.add(*[nxt_ghost[g] == ghost_terms[g] for g in p.ghosts])
        return nxt, nxt_ghost

    def _properties(self, frame_lanes: list[SymbolicVars], frame_ghosts: list[dict[str, Any]],
                    prev: PoolFrame) -> list[tuple[str, str, Any]]:
        d, p = self.d, self.p
        view = PoolView(frame_lanes, self.params, frame_ghosts)
        props = [(inv.name, inv.rid, as_bool(inv.predicate(view))) for inv in p.invariants]
        if self.instance_properties:
            lane_sel, row_sel, step_args = self.choices[-1]
            for j, (before, after) in enumerate(zip(prev[0], frame_lanes)):
                props += [(inv.name, inv.rid, as_bool(inv.predicate(after))) for inv in d.invariants]
                props += [(sp.name, sp.rid, as_bool(sp.predicate(before, after))) for sp in d.step_properties]
                if d.event_properties:  # they see the row: one implication per row this lane may take
                    for r, t in enumerate(self.rows):
                        taken = z3.And(lane_sel == j, row_sel == r)
                        props += [(sp.name, sp.rid, z3.Implies(taken, as_bool(sp.predicate(
                            before, after, Step(t.event, t.name, step_args[t.event])))))
                            for sp in d.event_properties]
        return props

    def trace(self, model: z3.ModelRef, upto: int) -> list[dict[str, Any]]:
        """The run to depth ``upto`` that ``model`` chose, step by step."""
        p, d, frames = self.p, self.d, self.frames
        steps = [{"step": 0, "pool": _pool_state(model, p, frames[0][0], frames[0][1], self.params)}]
        for k in range(1, upto + 1):
            lane_sel, row_sel, step_args = self.choices[k - 1]
            j = model.eval(lane_sel, model_completion=True).as_long()
            r = model.eval(row_sel, model_completion=True).as_long()
            if r == len(self.rows):  # the run ended before this depth
                break
            row = self.rows[r]
            steps.append({"step": k, "lane": j, "transition": row.name,
                          "args": read_args(model, d, row.event, step_args[row.event]),
                          "pool": _pool_state(model, p, frames[k][0], frames[k][1], self.params)})
        return steps
