"""Coupled-system bounded model checking: every run of up to ``depth`` steps from the initial
system (parameters and seq ids symbolic), one query for all depths (§9.2, §4). A run breaks the
system when a frame breaks an invariant or a step breaks a step property (#20).

A hit is a real, reachable bug, reported as a step-by-step trace. Two reductions keep it
affordable, and neither loses a reachable violation within the depth (every depth is checked,
and each keeps every reachable state reachable within the same depth):

* symmetry: untouched requests are all New with fresh parameters and untouched lanes all Free,
  so they are interchangeable: the k-th request (lane) is touched only after the (k-1)-th;
* partial-order reduction: two consecutive *local* steps (``SystemDefinition.local``) on
  different requests and different lanes commute, so only the order with the lower request
  first is explored. Lane-only steps are never reordered.

**One copy of each local step per depth.** A depth's step names a request and a lane by two
selectors; the selected request and lane are copied into a one-request, one-lane frame (an
implication per index: "if request ``i`` is selected, the copy equals it"), and each local step
is encoded once, on that copy, instead of once per (request, lane) pair; what it leaves is
written back to the selected request and lane (every other instance keeps its values). A local
step reads only its own request (state, variables, parameters, ``binding[i]``, ``seq[i]``) and
lane (``SystemDefinition.local``, found by evaluation at declaration), so on the copy its guard,
wirings and rows are the very terms they are on (i, j) with the copy's constants in place of
request ``i``'s and lane ``j``'s: the same runs, the same states. The copy shows the binding as
a one-lane frame does: 0 for the selected lane, ``NONE``, or 1 (a lane elsewhere) — which a step
cannot tell from the real index, because declarations compare a binding only with the step's
own lane and ``NONE`` (the symmetry :mod:`calculet.machines.system` requires; the induction's
``elsewhere`` and the symmetry breaking above rest on it too). A step that reads other
instances is encoded per pair on the real frame, as before. At R = L = 3 this builds each local
step once instead of up to nine times, and the next frame is a choice among the copies instead
of an ``If`` chain over every pair. RequestLaneSystem at depth 8 (the ``admit_now`` row made it
407 s) measured 55.7 s of CPU in a full ``verify`` against 529.4 s for the per-pair encoding in
the same window (the whole run 91.1 s against 572.4 s, every verdict and detail the same); alone,
``bench/system_bmc.py``: 51.0 s against 539.4 s.
"""

from __future__ import annotations

import time
from typing import Any

import z3

from calculet.invariants.checks import RLIMIT_SEARCH, CheckResult, Counterexample, Progress, as_bool, model_value, solver
from calculet.invariants.pool_checks import search_unrolling
from calculet.invariants.system_encoding import Frame, Move, initial_frame, read_frame, seq_domain, step_args, system_goals
from calculet.logic.symbolic import SymbolicVars
from calculet.machines.system import NONE, SystemDefinition, SystemStep, Variant

__all__ = ["check_system_bmc"]


def check_system_bmc(sd: SystemDefinition, requests: int = 3, lanes: int = 3, depth: int = 6,
                     progress: Progress | None = None) -> CheckResult:
    """Search every run of up to ``depth`` steps from the initial system for a broken invariant
    (with the reductions of this module's docstring)."""
    start = time.process_time()
    subject = f"R={requests}, L={lanes}, depth≤{depth}"
    verdict, found = search_unrolling(_Unrolling(sd, requests, lanes), depth, progress)
    if found is not None:
        names = [n for n, _ in found.broken]
        cx = Counterexample(found.broken[0][0], found.broken[0][1], found.trace[-1]["transition"], trace=found.trace)
        return CheckResult("system-bmc", sd.name, subject, False, time.process_time() - start,
                           f"reachable at depth {found.depth}: breaks {', '.join(names)}", cx, queries=1,
                           broken=names)
    if verdict != z3.unsat:
        return CheckResult("system-bmc", sd.name, subject, False, time.process_time() - start,
                           f"solver answered {verdict}", queries=1)
    return CheckResult("system-bmc", sd.name, subject, True, time.process_time() - start,
                       f"no invariant broken in any run of ≤{depth} steps over {requests} requests × {lanes} lanes",
                       queries=1)


class _ReadsStep(Exception):
    """A step property read the step taken (raised by :class:`_UnreadStep`)."""


class _UnreadStep:
    """The step of a depth, for a step property that may not read it: any attribute refuses."""

    def __getattr__(self, name: str) -> Any:
        raise _ReadsStep(name)


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
    """One step of one depth, its variants merged (they are disjoint: each names a different row
    of an event, and ``takes`` rules out earlier rows): a local step on the selected pair's copy
    (``i`` and ``j`` None: the selectors say which pair), or another step on the fixed (i, j)."""

    def __init__(self, sd: SystemDefinition, step: Any, variants: list[Variant], frame: Frame, at: tuple[int, int],
                 args: dict[str, Any], fixed: bool) -> None:
        self.moves = [Move(sd, v, frame, *at, args) for v in variants]
        self.variants = variants
        self.step = step
        self.involves = variants[0].involves
        self.request, self.lane = frame.requests[at[0]], frame.lanes[at[1]]  # what the step starts from
        self.i, self.j = at if fixed else (None, None)
        self.enabled = z3.Or(*[mv.enabled for mv in self.moves]) if len(self.moves) > 1 else self.moves[0].enabled

    def name_of(self, mv: Move) -> str:
        return self.variants[self.moves.index(mv)].name


class _Selected:
    """One depth's choice: the step (``sel``; ``len(options)`` is a stutter), the request and lane
    it names, whether it touches a request / a lane, and the copy of the selected pair."""

    def __init__(self, sd: SystemDefinition, k: int, prev: Frame, s: z3.Solver) -> None:
        self.sel = z3.Int(f"step_sel_{k}")
        self.request, self.lane = z3.Int(f"req_sel_{k}"), z3.Int(f"lane_sel_{k}")
        self.touch_r, self.touch_l, self.local = z3.Bool(f"touch_r_{k}"), z3.Bool(f"touch_l_{k}"), z3.Bool(f"local_{k}")
        s.add(self.request >= 0, self.request < len(prev.requests), self.lane >= 0, self.lane < len(prev.lanes))
        self.copy, self.held = self._copy(sd, k, prev, s)

    def _copy(self, sd: SystemDefinition, k: int, prev: Frame, s: z3.Solver) -> tuple[Frame, Any]:
        """The selected request and lane as a one-request, one-lane frame (see the module docstring),
        and the selected request's real binding."""
        request, lane = SymbolicVars(sd.request.definition, f"_{k}pr"), SymbolicVars(sd.lane.definition, f"_{k}pl")
        held, seq = z3.Int(f"pbind_{k}"), z3.Int(f"pseq_{k}")
        for i, r in enumerate(prev.requests):
            s.add(z3.Implies(self.request == i, z3.And(*_equal(request, r), held == prev.binding[i], seq == prev.seq[i])))
        for j, other in enumerate(prev.lanes):
            s.add(z3.Implies(self.lane == j, z3.And(*_equal(lane, other))))
        shown = z3.If(held == self.lane, z3.IntVal(0), z3.If(held == NONE, z3.IntVal(NONE), z3.IntVal(1)))
        return Frame([request], [lane], [shown], [seq]), held


def _equal(a: SymbolicVars, b: SymbolicVars, skip: Any = ()) -> list[Any]:
    """``a`` equals ``b``: state, then each parameter and variable not in ``skip`` (a frame shares its
    parameters with the one before: they never change)."""
    return [a.state == b.state, *[a.value(n) == b.value(n) for n in a.names() if n not in skip]]


class _Unrolling:
    """The runs from the initial system, one frame per depth: at depth ``k`` a selector picks
    one enabled option (a step on a request/lane pair), and frame ``k`` is what it leaves."""

    def __init__(self, sd: SystemDefinition, requests: int, lanes: int) -> None:
        self.sd, self.requests, self.lanes = sd, requests, lanes
        init = initial_frame(sd, requests, lanes)
        self.solver = s = solver("QF_LIA", RLIMIT_SEARCH, search=True)
        s.add(*seq_domain(init))
        for inst in (*init.requests, *init.lanes):
            s.add(*inst.domain()[2:])  # parameters in their domains (fixed for the run)
        self.dist_r, self.dist_l = _distances(sd)
        self.frames = [init]
        self.chosen: list[tuple[Any, list[_Option]]] = []
        self.selected: list[_Selected] = []
        self.all_props: list[list[tuple[str, str, Any]]] = []
        self.high_r: Any = z3.IntVal(-1)  # the highest request / lane touched so far (symmetry breaking)
        self.high_l: Any = z3.IntVal(-1)

    def unroll(self, k: int) -> None:
        """Encode step ``k``: its options, the selector's constraints and frame ``k``."""
        prev = self.frames[-1]
        args, arg_dom = step_args(self.sd, f"_s{k}")
        self.solver.add(*arg_dom)
        chosen = _Selected(self.sd, k, prev, self.solver)
        options = self._options(k, prev, chosen.copy, args)
        self._select(chosen, options)
        nxt = self._next_frame(k, prev, chosen, options)
        self.frames.append(nxt)
        self.chosen.append((chosen.sel, options))
        self.selected.append(chosen)
        self.all_props.append(system_goals(self.sd, nxt) + self._step_goals(prev, nxt, chosen, options))

    def _step_goals(self, prev: Frame, nxt: Frame, c: "_Selected", options: list["_Option"]) -> list[tuple[str, str, Any]]:
        """Each step property on the step of depth k (frame ``prev`` to ``nxt``): evaluated once when it does not
        read the step taken, else once per move, under "this move was selected" (a stutter leaves the frame as it
        was, and the property is asked of that no-step as well — every declared one holds of it)."""
        pre, post = prev.view(), nxt.view()
        goals = []
        for sp in self.sd.step_properties:
            try:
                prop = as_bool(sp.predicate(pre, post, _UnreadStep()))
            except _ReadsStep:
                prop = z3.And(*[z3.Implies(z3.And(c.sel == o, mv.enabled),
                                           as_bool(sp.predicate(pre, post, SystemStep(opt.step.name, opt.name_of(mv),
                                                                                      mv.args))))
                                for o, opt in enumerate(options) for mv in opt.moves])
            goals.append((sp.name, sp.rid, prop))
        return goals

    def _ready(self, v: Variant, k: int, i: int, j: int) -> bool:
        """Before frame k an instance has moved at most k-1 times, less one for each instance of
        its kind that symmetry makes touch first: a variant from a state farther away cannot fire yet."""
        return ((v.involves == "lane" or self.dist_r.get(_source(v, "request"), 0) <= k - 1 - i)
                and (v.involves == "request" or self.dist_l.get(_source(v, "lane"), 0) <= k - 1 - j))

    def _options(self, k: int, prev: Frame, copy: Frame, args: dict[str, Any]) -> list[_Option]:
        options: list[_Option] = []
        for step in self.sd.steps:
            variants = self.sd.variants_of(step.name)
            involves = variants[0].involves
            if step.name in self.sd.local:
                ready = [v for v in variants if self._ready(v, k, 0, 0)]
                if ready:
                    options.append(_Option(self.sd, step, ready, copy, (0, 0), args, fixed=False))
                continue
            for i in (range(self.requests) if involves != "lane" else (0,)):
                for j in (range(self.lanes) if involves != "request" else (0,)):
                    ready = [v for v in variants if self._ready(v, k, i, j)]
                    if ready:
                        options.append(_Option(self.sd, step, ready, prev, (i, j), args, fixed=True))
        return options

    def _select(self, c: _Selected, options: list[_Option]) -> None:
        """``sel`` picks an enabled option; symmetry breaking and the partial-order reduction."""
        s = self.solver
        # sel == len(options) is a stutter: nothing moves, and nothing after it — so runs shorter
        # than the depth (a system where no step is enabled) are searched too.
        stutter = c.sel == len(options)
        s.add(c.sel >= 0, c.sel <= len(options), z3.Implies(stutter, z3.And(
            z3.Not(c.touch_r), z3.Not(c.touch_l), z3.Not(c.local), c.request == 0, c.lane == 0)))
        if self.selected:
            s.add(z3.Implies(self.selected[-1].sel == len(self.chosen[-1][1]), stutter))
        for o, opt in enumerate(options):
            # A fixed option names its pair; a local one leaves the selectors free, except the side it
            # does not touch (held at 0, as the fixed options hold it).
            pair = ([c.request == opt.i, c.lane == opt.j] if opt.i is not None else
                    [c.request == 0] if opt.involves == "lane" else [c.lane == 0] if opt.involves == "request" else [])
            s.add(z3.Implies(c.sel == o, z3.And(
                opt.enabled, *pair, c.touch_r == (opt.involves != "lane"), c.touch_l == (opt.involves != "request"),
                c.local == (opt.step.name in self.sd.local and opt.involves != "lane"))))
        s.add(z3.Implies(c.touch_r, c.request <= self.high_r + 1), z3.Implies(c.touch_l, c.lane <= self.high_l + 1))
        self.high_r = z3.If(z3.And(c.touch_r, c.request > self.high_r), c.request, self.high_r)
        self.high_l = z3.If(z3.And(c.touch_l, c.lane > self.high_l), c.lane, self.high_l)
        if self.selected:
            p = self.selected[-1]
            independent = z3.And(p.local, c.local, p.request != c.request,
                                 z3.Not(z3.And(p.touch_l, c.touch_l, p.lane == c.lane)))
            s.add(z3.Implies(independent, p.request < c.request))

    def _next_frame(self, k: int, prev: Frame, c: _Selected, options: list[_Option]) -> Frame:
        """Frame ``k``: the selected request and lane are what the selected option leaves of them
        (one post-state per side, whichever option), every other instance is unchanged."""
        rd, ld = self.sd.request.definition, self.sd.lane.definition
        s = self.solver
        nxt = Frame([SymbolicVars(rd, f"_{k}r{i}", values={p: prev.requests[i].value(p) for p in rd.params})
                     for i in range(self.requests)],
                    [SymbolicVars(ld, f"_{k}l{j}", values={p: prev.lanes[j].value(p) for p in ld.params})
                     for j in range(self.lanes)],
                    [z3.Int(f"bind_{k}_{i}") for i in range(self.requests)], prev.seq, prev.memo)
        request, lane, binding = SymbolicVars(rd, f"_{k}qr"), SymbolicVars(ld, f"_{k}ql"), z3.Int(f"qbind_{k}")
        for o, opt in enumerate(options):
            for mv in opt.moves:
                post = []
                if opt.involves != "lane":
                    post += _equal(request, mv.request or opt.request, rd.params)
                    post.append(binding == {"keep": c.held, "bind": c.lane, "unbind": z3.IntVal(NONE)}[opt.step.binding])
                if opt.involves != "request":
                    post += _equal(lane, mv.lane or opt.lane, ld.params)
                s.add(z3.Implies(c.sel == o if len(opt.moves) == 1 else z3.And(c.sel == o, mv.enabled), z3.And(*post)))
        for i in range(self.requests):
            hit = z3.And(c.touch_r, c.request == i)
            s.add(z3.Implies(hit, z3.And(*_equal(nxt.requests[i], request, rd.params), nxt.binding[i] == binding)),
                  z3.Implies(z3.Not(hit), z3.And(*_equal(nxt.requests[i], prev.requests[i], rd.params),
                                                 nxt.binding[i] == prev.binding[i])))
        for j in range(self.lanes):
            hit = z3.And(c.touch_l, c.lane == j)
            s.add(z3.Implies(hit, z3.And(*_equal(nxt.lanes[j], lane, ld.params))),
                  z3.Implies(z3.Not(hit), z3.And(*_equal(nxt.lanes[j], prev.lanes[j], ld.params))))
        return nxt

    def trace(self, m: z3.ModelRef, k: int) -> list[dict[str, Any]]:
        """The run to depth ``k`` that model ``m`` chose, step by step."""
        sd = self.sd
        trace: list[dict[str, Any]] = [{"step": 0, "system": read_frame(m, sd, self.frames[0])}]
        for step in range(1, k + 1):
            (sel, options), c = self.chosen[step - 1], self.selected[step - 1]
            picked = m.eval(sel, model_completion=True).as_long()
            if picked == len(options):  # the run ended before this depth
                break
            opt = options[picked]
            mv = next((mv for mv in opt.moves if z3.is_true(m.eval(mv.enabled, model_completion=True))),
                      opt.moves[0])
            trace.append({"step": step, "transition": opt.name_of(mv), "request": model_value(m, c.request),
                          "lane": model_value(m, c.lane), "involves": opt.involves,
                          "args": {a: model_value(m, t) for a, t in mv.args.items()},
                          "system": read_frame(m, sd, self.frames[step], params=False)})
        return trace
