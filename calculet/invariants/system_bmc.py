"""Coupled-system bounded model checking: every run of up to ``depth`` steps from the initial
system (parameters and seq ids symbolic), one query for all depths (§9.2, §4).

A hit is a real, reachable bug, reported as a step-by-step trace. Two reductions keep it
affordable, and neither loses a reachable violation within the depth (every depth is checked,
and each keeps every reachable state reachable within the same depth):

* symmetry: untouched requests are all New with fresh parameters and untouched lanes all Free,
  so they are interchangeable: the k-th request (lane) is touched only after the (k-1)-th;
* partial-order reduction: two consecutive *local* steps (``SystemDefinition.local``) on
  different requests and different lanes commute, so only the order with the lower request
  first is explored. Lane-only steps are never reordered.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import z3

from calculet.invariants.checks import RLIMIT_SEARCH, CheckResult, Counterexample, Progress, model_value, solver
from calculet.invariants.pool_checks import search_unrolling
from calculet.invariants.system_encoding import Frame, Move, initial_frame, read_frame, seq_domain, step_args, system_goals
from calculet.logic.symbolic import SymbolicVars
from calculet.machines.system import SystemDefinition, Variant

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

    def __init__(self, sd: SystemDefinition, step: Any, variants: list[Variant], frame: Frame, i: int, j: int,
                 args: dict[str, Any]) -> None:
        self.moves = [Move(sd, v, frame, i, j, args) for v in variants]
        self.variants = variants
        self.step = step
        self.involves = variants[0].involves
        self.i, self.j = i, j
        self.enabled = z3.Or(*[mv.enabled for mv in self.moves]) if len(self.moves) > 1 else self.moves[0].enabled

    def pick(self, get: Callable[[Move], Any], default: Any) -> Any:
        """The value the taken variant gives (``default`` if it leaves it unchanged)."""
        value = default
        for mv in reversed(self.moves):
            mine = get(mv)
            if mine is not None:
                value = mine if len(self.moves) == 1 else z3.If(mv.enabled, mine, value)
        return value

    def name_of(self, mv: Move) -> str:
        return self.variants[self.moves.index(mv)].name


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
        self.all_props: list[list[tuple[str, str, Any]]] = []
        self.high_r: Any = z3.IntVal(-1)  # the highest request / lane touched so far (symmetry breaking)
        self.high_l: Any = z3.IntVal(-1)
        self.previous: tuple[Any, Any, Any, Any] | None = None
        self.previous_stutter: Any = None

    def unroll(self, k: int) -> None:
        """Encode step ``k``: its options, the selector's constraints and frame ``k``."""
        prev = self.frames[-1]
        args, arg_dom = step_args(self.sd, f"_s{k}")
        self.solver.add(*arg_dom)
        options = self._options(k, prev, args)
        sel = z3.Int(f"step_sel_{k}")
        self._select(k, sel, options)
        nxt = self._next_frame(k, prev, sel, options)
        self.frames.append(nxt)
        self.chosen.append((sel, options))
        self.all_props.append(system_goals(self.sd, nxt))

    def _options(self, k: int, prev: Frame, args: dict[str, Any]) -> list[_Option]:
        options: list[_Option] = []
        for step in self.sd.steps:
            variants = self.sd.variants_of(step.name)
            involves = variants[0].involves
            for i in (range(self.requests) if involves != "lane" else (0,)):
                for j in (range(self.lanes) if involves != "request" else (0,)):
                    # Before frame k an instance has moved at most k-1 times, less one for each
                    # instance of its kind that symmetry makes touch first: skip what cannot fire yet.
                    ready = [v for v in variants
                             if (involves == "lane" or self.dist_r.get(_source(v, "request"), 0) <= k - 1 - i)
                             and (involves == "request" or self.dist_l.get(_source(v, "lane"), 0) <= k - 1 - j)]
                    if ready:
                        options.append(_Option(self.sd, step, ready, prev, i, j, args))
        return options

    def _select(self, k: int, sel: Any, options: list[_Option]) -> None:
        """``sel`` picks an enabled option; symmetry breaking and the partial-order reduction."""
        s = self.solver
        req_sel, lane_sel = z3.Int(f"req_sel_{k}"), z3.Int(f"lane_sel_{k}")
        touch_r, touch_l, local = z3.Bool(f"touch_r_{k}"), z3.Bool(f"touch_l_{k}"), z3.Bool(f"local_{k}")
        # sel == len(options) is a stutter: nothing moves, and nothing after it — so runs shorter
        # than the depth (a system where no step is enabled) are searched too.
        stutter = sel == len(options)
        s.add(sel >= 0, sel <= len(options), z3.Implies(stutter, z3.And(z3.Not(touch_r), z3.Not(touch_l),
                                                                          z3.Not(local))))
        if self.previous_stutter is not None:
            s.add(z3.Implies(self.previous_stutter, stutter))
        self.previous_stutter = stutter
        for o, opt in enumerate(options):
            s.add(z3.Implies(sel == o, z3.And(
                opt.enabled, req_sel == opt.i, lane_sel == opt.j, touch_r == (opt.involves != "lane"),
                touch_l == (opt.involves != "request"),
                local == (opt.step.name in self.sd.local and opt.involves != "lane"))))
        s.add(z3.Implies(touch_r, req_sel <= self.high_r + 1), z3.Implies(touch_l, lane_sel <= self.high_l + 1))
        self.high_r = z3.If(z3.And(touch_r, req_sel > self.high_r), req_sel, self.high_r)
        self.high_l = z3.If(z3.And(touch_l, lane_sel > self.high_l), lane_sel, self.high_l)
        if self.previous is not None:
            p_local, p_req, p_touch_l, p_lane = self.previous
            independent = z3.And(p_local, local, p_req != req_sel,
                                 z3.Not(z3.And(p_touch_l, touch_l, p_lane == lane_sel)))
            s.add(z3.Implies(independent, p_req < req_sel))
        self.previous = (local, req_sel, touch_l, lane_sel)

    def _next_frame(self, k: int, prev: Frame, sel: Any, options: list[_Option]) -> Frame:
        """Frame ``k``: each instance is what the selected option makes of it, else unchanged."""
        rd, ld = self.sd.request.definition, self.sd.lane.definition
        nxt = Frame([SymbolicVars(rd, f"_{k}r{i}", values={p: prev.requests[i].value(p) for p in rd.params})
                     for i in range(self.requests)],
                    [SymbolicVars(ld, f"_{k}l{j}", values={p: prev.lanes[j].value(p) for p in ld.params})
                     for j in range(self.lanes)],
                    [z3.Int(f"bind_{k}_{i}") for i in range(self.requests)], prev.seq, prev.memo)
        for i in range(self.requests):
            self._request_after(i, prev, nxt, sel, options)
        for j in range(self.lanes):
            self._lane_after(j, prev, nxt, sel, options)
        return nxt

    def _request_after(self, i: int, prev: Frame, nxt: Frame, sel: Any, options: list[_Option]) -> None:
        rd = self.sd.request.definition
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
        self.solver.add(nxt.requests[i].state == state, *[nxt.requests[i].value(n) == values[n] for n in rd.vars],
                        nxt.binding[i] == binding)

    def _lane_after(self, j: int, prev: Frame, nxt: Frame, sel: Any, options: list[_Option]) -> None:
        ld = self.sd.lane.definition
        state, values = prev.lanes[j].state, {n: prev.lanes[j].value(n) for n in ld.vars}
        for o, opt in enumerate(options):
            if opt.j != j or opt.involves == "request":
                continue
            chosen_o = sel == o
            state = z3.If(chosen_o, opt.pick(lambda mv: mv.lane.state if mv.lane else None, state), state)
            values = {n: z3.If(chosen_o, opt.pick(lambda mv: mv.lane.value(n) if mv.lane else None, values[n]),
                               values[n]) for n in ld.vars}
        self.solver.add(nxt.lanes[j].state == state, *[nxt.lanes[j].value(n) == values[n] for n in ld.vars])

    def trace(self, m: z3.ModelRef, k: int) -> list[dict[str, Any]]:
        """The run to depth ``k`` that model ``m`` chose, step by step."""
        sd = self.sd
        trace: list[dict[str, Any]] = [{"step": 0, "system": read_frame(m, sd, self.frames[0])}]
        for step in range(1, k + 1):
            sel, options = self.chosen[step - 1]
            picked = m.eval(sel, model_completion=True).as_long()
            if picked == len(options):  # the run ended before this depth
                break
            opt = options[picked]
            mv = next((mv for mv in opt.moves if z3.is_true(m.eval(mv.enabled, model_completion=True))),
                      opt.moves[0])
            trace.append({"step": step, "transition": opt.name_of(mv), "request": opt.i, "lane": opt.j,
                          "involves": opt.involves,
                          "args": {a: model_value(m, t) for a, t in mv.args.items()},
                          "system": read_frame(m, sd, self.frames[step], params=False)})
        return trace
