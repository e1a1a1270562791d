"""Redundancy of pool and joint-system invariants (informational; #17, like the per-machine report).

An invariant implied by the others alone adds no strength of its own, so a weakened copy could
hide behind a stronger twin. For each pool invariant: is it implied by the instance invariants of
every lane (proved per machine) and the pool's other invariants? For each joint-system invariant:
by the instance invariants of every request and lane and the system's other invariants? One
query each, on the same symbolic states the induction assumes (pool: ``lanes`` lanes; system: R
requests, L lanes with seq ids distinct). Reported, never failed: a strengthening the solver
forced may well be implied once the property it protects is assumed too.
"""

from __future__ import annotations

import time

import z3

from calculet.invariants.checks import CheckResult, as_bool, invariants_hold, solver
from calculet.invariants.pool_checks import _ghost_domain, _lanes, _param_domain, _pool_params
from calculet.invariants.system_encoding import fresh_frame, seq_domain, system_goals
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.machines.system import NONE, SystemDefinition

__all__ = ["check_pool_redundancy", "check_system_redundancy"]


def _verdict(check: str, name: str, subject: str, s: z3.Solver, goal: z3.BoolRef, start: float) -> CheckResult:
    s.push()
    s.add(z3.Not(goal))
    verdict = s.check()
    s.pop()
    detail = ("implied by the others alone (redundant: it adds no strength)" if verdict == z3.unsat
              else "independent: some state breaks it alone" if verdict == z3.sat
              else f"solver answered {verdict}")
    return CheckResult(check, name, subject, True, time.process_time() - start, detail, informational=True)


def check_pool_redundancy(p: PoolDefinition, lanes: int = 4) -> list[CheckResult]:
    d = p.instance.definition
    raw, ghosts = _lanes(p, lanes, "rd")
    params = _pool_params(p, "_rd")
    view = PoolView(raw, params, ghosts)
    terms = {inv.name: as_bool(inv.predicate(view)) for inv in p.invariants}
    results = []
    for inv in p.invariants:
        start = time.process_time()
        s = solver()
        s.add(*_param_domain(p, params), *_ghost_domain(p, ghosts))
        for lane in raw:
            s.add(*lane.domain(), *[as_bool(x) for x in invariants_hold(d, lane)])
        s.add(*[t for n, t in terms.items() if n != inv.name])
        results.append(_verdict("pool-redundancy", p.name, inv.name, s, terms[inv.name], start))
    return results


def check_system_redundancy(sd: SystemDefinition, requests: int = 3, lanes: int = 2) -> list[CheckResult]:
    frame = fresh_frame(sd, requests, lanes, "rd")
    goals = {name: goal for name, _, goal in system_goals(sd, frame)}
    rd, ld = sd.request.definition, sd.lane.definition
    results = []
    for inv in sd.invariants:
        start = time.process_time()
        s = solver("QF_LIA")
        s.add(*seq_domain(frame), *[z3.And(b >= NONE, b <= lanes) for b in frame.binding])
        for r in frame.requests:
            s.add(*r.domain(), *[as_bool(x) for x in invariants_hold(rd, r)])
        for lane in frame.lanes:
            s.add(*lane.domain(), *[as_bool(x) for x in invariants_hold(ld, lane)])
        s.add(*[g for n, g in goals.items() if n != inv.name])
        results.append(_verdict("system-redundancy", sd.name, inv.name, s, goals[inv.name], start))
    return results
