"""Coupled-system induction: initiation, the inductive step per variant, and vacuity (§9.2, §4).

* **Initiation** — the initial system (requests New, lanes Free, nothing bound) satisfies every
  invariant.
* **Induction** — R requests and L lanes, all symbolic, satisfying every system invariant and
  every instance invariant (proved per machine); request 0 and lane 0 take a step (any
  variant); every system invariant, the moved instances' invariants and their rows' step
  properties must hold after. Why R = 3, L = 3 covers every size is argued in
  :mod:`calculet.invariants.system_checks`.
* **Vacuity** — every step can fire from some state that satisfies the invariants.
"""

from __future__ import annotations

import time
from typing import Iterable

import z3

from calculet.invariants.checks import CheckResult, Counterexample, Progress, model_value, solver
from calculet.invariants.system_encoding import (Move, assume_invariants, flat, fresh_frame, initial_frame, read_frame,
                                                 seq_domain, step_args, system_goals)
from calculet.machines.system import SystemDefinition

__all__ = ["check_system_induction", "check_system_initiation", "check_system_vacuity"]


def check_system_initiation(sd: SystemDefinition, requests: int = 3, lanes: int = 3) -> CheckResult:
    """The initial system satisfies every invariant (the base case of the induction)."""
    start = time.process_time()
    frame = initial_frame(sd, requests, lanes)
    s = solver("QF_LIA")
    s.add(*seq_domain(frame))
    for inst in (*frame.requests, *frame.lanes):
        s.add(*inst.domain()[2:])
    goals = system_goals(sd, frame)
    s.add(z3.Not(z3.And(*[g for _, _, g in goals])))
    verdict = s.check()
    if verdict == z3.unsat:
        return CheckResult("system-induction", sd.name, "(initial system)", True, time.process_time() - start,
                           f"{len(goals)} invariants hold initially")
    cx = None
    broken: list[str] = []
    if verdict == z3.sat:
        m = s.model()
        broken = [n for n, _, g in goals if z3.is_false(m.eval(g, model_completion=True))]
        cx = Counterexample(broken[0], next(r for n, r, _ in goals if n == broken[0]), "(initial system)",
                            pre=flat(read_frame(m, sd, frame)))
    return CheckResult("system-induction", sd.name, "(initial system)", False, time.process_time() - start,
                       f"initial system breaks {', '.join(broken)}" if broken else f"solver answered {verdict}", cx,
                       broken=broken)


def check_system_induction(sd: SystemDefinition, requests: int = 3, lanes: int = 3,
                           progress: Progress | None = None, steps: Iterable[str] | None = None) -> list[CheckResult]:
    """One result per variant (of ``steps``, default all): every invariant preserved when
    request 0 and lane 0 take it.

    The pre-state is the same for every variant, so one solver holds it and each variant is a
    push/pop on top (one query each: all goals at once, then which ones broke)."""
    wanted = None if steps is None else set(steps)
    local = len(sd.local) == len(sd.steps)
    counting = any(inv.counts for inv in sd.invariants)
    everywhere = local and not counting and requests >= 3 and lanes >= 2
    scope = (" (so every R, L)" if everywhere else " (this size only: a step reads other instances)" if not local
             else " (this size only: an invariant counts every request)")
    results = []
    frame = fresh_frame(sd, requests, lanes, "")
    args, arg_dom = step_args(sd, "")
    s = solver("QF_LIA")
    s.add(*arg_dom)
    assume_invariants(sd, s, frame, outside=True)
    for v in sd.variants:
        if wanted is not None and v.step.name not in wanted:
            continue
        start = time.process_time()
        move = Move(sd, v, frame, 0, 0, args)
        post = move.after(frame)
        goals = system_goals(sd, post) + move.instance_goals(sd)
        s.push()
        s.add(move.enabled, z3.Not(z3.And(*[g for _, _, g in goals])))
        verdict = s.check()
        if verdict == z3.unsat:
            results.append(CheckResult("system-induction", sd.name, v.name, True, time.process_time() - start,
                                       f"R={requests}, L={lanes}{scope}: {len(goals)} properties preserved",
                                       queries=1))
        elif verdict == z3.sat:
            m = s.model()
            broken = [name for name, _, g in goals if z3.is_false(m.eval(g, model_completion=True))]
            name, rid = next((n, r) for n, r, _ in goals if n == broken[0])
            cx = Counterexample(name, rid, f"request 0, lane 0: {v.name}", pre=flat(read_frame(m, sd, frame)),
                                args={a: model_value(m, t) for a, t in move.args.items()},
                                post=flat(read_frame(m, sd, post)))
            results.append(CheckResult("system-induction", sd.name, v.name, False, time.process_time() - start,
                                       f"R={requests}, L={lanes}: breaks {', '.join(broken)}", cx, queries=1,
                                       broken=broken))
        else:
            results.append(CheckResult("system-induction", sd.name, v.name, False, time.process_time() - start,
                                       f"solver answered {verdict}", queries=1))
        s.pop()
        if progress:
            progress(v.name)
    return results


def check_system_vacuity(sd: SystemDefinition, requests: int = 2, lanes: int = 2) -> list[CheckResult]:
    """Each step can fire from some state satisfying every invariant (no dead step)."""
    results = []
    frame = fresh_frame(sd, requests, lanes, "v")
    args, arg_dom = step_args(sd, "_v")
    s = solver("QF_LIA")
    s.add(*arg_dom)
    assume_invariants(sd, s, frame, outside=False)
    for step in sd.steps:
        start = time.process_time()
        s.push()
        s.add(z3.Or(*[Move(sd, v, frame, 0, 0, args).enabled for v in sd.variants_of(step.name)]))
        verdict = s.check()
        s.pop()
        results.append(CheckResult("system-vacuity", sd.name, step.name, verdict == z3.sat,
                                   time.process_time() - start,
                                   "can fire" if verdict == z3.sat else "can never fire under the invariants (dead step)"
                                   if verdict == z3.unsat else f"solver answered {verdict}"))
    return results

