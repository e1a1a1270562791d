"""Vacuity and reachability above one machine: every pool step and every joint-system step fires
on some run from the initial pool or system (issue #17, class 2).

A pool guard made unsatisfiable — a typo of one variable for another — makes every pool proof
hold vacuously: nothing ever takes that row. Per machine, vacuity and witness paths catch a
dead row; here the same is asked of the pool and the coupled system, on the bounded unrollings
the model checkers use (so the run is a real one, from the initial state, through the pool's
guards and the system's coupled steps):

* **vacuity** — each pool row, with its pool guard, can fire from some state satisfying every
  instance and pool invariant (one satisfiability query per row);
* **reachability** — each pool row and each system step is taken on some run of at most
  ``depth`` steps from the initial pool/system. A system's steps are first searched explicitly
  (:mod:`calculet.invariants.explicit_reach`: concrete runs of the declaration, replayed through
  the z3 encoding), which answers for every step of the real declarations in well under the
  symbolic search's time; what it misses goes to the symbolic search. One query asks for a run that takes *any* step
  not yet seen; every step that run takes is marked, and the loop repeats until all are seen
  (so a handful of queries cover every step) or the solver proves the rest unreachable within
  the depth, which fails the check and names them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import z3

from calculet.invariants.checks import CheckResult, as_bool, invariants_hold, solver, takes
from calculet.invariants.explicit_reach import check_system_reachability_explicit
from calculet.invariants.pool_checks import _PoolUnrolling, _lanes, _pool_guard, _pool_params
from calculet.invariants.system_bmc import _Unrolling as _SystemUnrolling
from calculet.logic.symbolic import arg_domain, symbolic_args, type_domain
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.machines.system import SystemDefinition

__all__ = ["check_pool_reachability", "check_pool_vacuity", "check_system_reachability"]


def _cover(s: z3.Solver, names: list[str], taken: Callable[[str], Any],
           read: Callable[[z3.ModelRef], set[str]]) -> tuple[set[str], int, z3.CheckSatResult]:
    """The names no run takes, the number of queries, and the last verdict."""
    remaining = set(names)
    queries = 0
    verdict = z3.sat
    want = 4  # ask for runs that take several unseen steps at once; fewer when none does
    while remaining:
        s.push()
        wanted = [taken(n) for n in sorted(remaining)]
        s.add(z3.AtLeast(*wanted, min(want, len(wanted))) if want > 1 else z3.Or(*wanted))
        verdict = s.check()
        queries += 1
        if verdict == z3.sat:
            remaining -= read(s.model())
        s.pop()
        if verdict != z3.sat:
            if want == 1:
                break
            want //= 2
    return remaining, queries, verdict


def _report(kind: str, owner: str, subject: str, start: float, missing: set[str], total: int, queries: int,
            verdict: z3.CheckSatResult, depth: int) -> CheckResult:
    if not missing:
        return CheckResult(kind, owner, subject, True, time.process_time() - start,
                           f"all {total} steps taken on runs of ≤{depth} steps from the initial state "
                           f"({queries} queries)", queries=queries)
    why = "no run of ≤%d steps takes them" % depth if verdict == z3.unsat else f"solver answered {verdict}"
    return CheckResult(kind, owner, subject, False, time.process_time() - start,
                       f"{why}: {', '.join(sorted(missing))}", queries=queries, broken=sorted(missing))


def check_pool_vacuity(p: PoolDefinition, n: int = 2) -> list[CheckResult]:
    """Each row of the pool can fire (instance guard and pool guard) from a state satisfying the
    instance and pool invariants."""
    d = p.instance.definition
    lanes, ghosts = _lanes(p, n, "vac")
    params = _pool_params(p, "_vac")
    view = PoolView(lanes, params, ghosts)
    s = solver()
    s.add(*type_domain(p.params, params), *[c for g in ghosts for c in type_domain(p.ghosts, g)])
    for lane in lanes:
        s.add(*lane.domain(), *[as_bool(x) for x in invariants_hold(d, lane)])
    s.add(*[as_bool(inv.predicate(view)) for inv in p.invariants])
    results = []
    for t in d.transitions:
        start = time.process_time()
        args = symbolic_args(d.events[t.event], "_vac")
        s.push()
        s.add(*arg_domain(d.events[t.event], args), takes(d, t, lanes[0], args), _pool_guard(p, view, 0, t.event, args))
        verdict = s.check()
        s.pop()
        results.append(CheckResult("pool-vacuity", p.name, t.name, verdict == z3.sat, time.process_time() - start,
                                   "can fire" if verdict == z3.sat else
                                   "can never fire under the invariants (dead row: its pool guard is unsatisfiable)"
                                   if verdict == z3.unsat else f"solver answered {verdict}"))
    return results


def check_pool_reachability(p: PoolDefinition, n: int = 2, depth: int = 6) -> CheckResult:
    """Every row of the pool is taken by some lane on a run of ≤ ``depth`` steps from the empty pool."""
    start = time.process_time()
    unrolling = _PoolUnrolling(p, n, False)
    for k in range(1, depth + 1):
        unrolling.unroll(k)
    rows = unrolling.rows
    index = {t.name: r for r, t in enumerate(rows)}
    selectors = [row_sel for _, row_sel, _ in unrolling.choices]

    def taken(name: str) -> Any:
        return z3.Or(*[sel == index[name] for sel in selectors])

    def read(model: z3.ModelRef) -> set[str]:
        picked = [model.eval(sel, model_completion=True).as_long() for sel in selectors]
        return {rows[r].name for r in picked if r < len(rows)}

    missing, queries, verdict = _cover(unrolling.solver, [t.name for t in rows], taken, read)
    return _report("pool-reachability", p.name, f"N={n}, depth≤{depth}", start, missing, len(rows), queries,
                   verdict, depth)


def check_system_reachability(sd: SystemDefinition, requests: int = 1, lanes: int = 1,
                              depth: int = 8) -> CheckResult:
    """Every step of the coupled system is taken on a run from the initial system (requests New,
    lanes Free): first by the explicit-state search of :mod:`calculet.invariants.explicit_reach`
    (real runs, each transition replayed through the z3 encoding; well under a second for most
    systems), then, for any step it did not reach, by the symbolic search over every run of
    ≤ ``depth`` steps — which finds a run or proves none exists, so a dead step still fails."""
    start = time.process_time()
    explicit, missing = check_system_reachability_explicit(sd, requests, lanes)
    if explicit.ok or not missing:
        return explicit
    symbolic = _symbolic_reachability(sd, requests, lanes, depth, sorted(missing))
    return dataclasses.replace(
        symbolic, subject=f"R={requests}, L={lanes}, explicit + depth≤{depth}", seconds=time.process_time() - start,
        detail=f"{explicit.detail}; the other {len(missing)} by the symbolic search: {symbolic.detail}")


def _symbolic_reachability(sd: SystemDefinition, requests: int, lanes: int, depth: int,
                           names: list[str]) -> CheckResult:
    """Each of ``names`` (steps) is taken on some run of ≤ ``depth`` steps from the initial system,
    or the solver proves no such run exists."""
    start = time.process_time()
    unrolling = _SystemUnrolling(sd, requests, lanes)
    for k in range(1, depth + 1):
        unrolling.unroll(k)
    chosen = unrolling.chosen

    def taken(name: str) -> Any:
        return z3.Or(*[sel == o for sel, options in chosen for o, opt in enumerate(options) if opt.step.name == name]
                     or [z3.BoolVal(False)])

    def read(model: z3.ModelRef) -> set[str]:
        picked = [(model.eval(sel, model_completion=True).as_long(), options) for sel, options in chosen]
        return {options[o].step.name for o, options in picked if o < len(options)}

    missing, queries, verdict = _cover(unrolling.solver, names, taken, read)
    return _report("system-reachability", sd.name, f"R={requests}, L={lanes}, depth≤{depth}", start, missing,
                   len(names), queries, verdict, depth)
