"""Coupled-system induction: initiation, the inductive step per variant, and vacuity (§9.2, §4).

* **Initiation** — the initial system (requests New, lanes Free, nothing bound) satisfies every
  invariant.
* **Induction** — R requests and L lanes, all symbolic, satisfying every system invariant and
  every instance invariant (proved per machine); request 0 and lane 0 take a step (any
  variant); every system invariant, the moved instances' invariants and their rows' step
  properties must hold after, and every system step property of (before, step, after). Why R = 3, L = 3 covers every size is argued in
  :mod:`calculet.invariants.system_checks`.
* **Vacuity** — every step can fire from some state that satisfies the invariants.

**Every size, with counts (#17).** The cutoff argument of ``system_checks`` needs ∀-shaped
invariants and local steps. A *count* — a generation's ``active_requests`` equals the requests
bound to it, at most two jobs hold a device slot — is a sum over every instance, and some guards
read other instances (a job's engine is free; fewer than two other jobs hold a slot). Those
systems are proved for every size by the same projection, with one ghost per count:

* every declared count goes through ``SystemView.beyond(name)`` (``_count`` in
  ``machines/model_couplings.py``, ``_on_device`` in ``machines/job_lanes.py``): on a live or
  fully encoded system it is 0; here it is a ghost integer ≥ 0 standing for the count's part over
  the instances *not* encoded (checked: a system with a ``counts=True`` invariant that does not
  read it is proved at the encoded size only, and its results say so);
* a step moves one request and one lane (``Move``: it writes request i, lane j and binding[i]
  only), so the part of a count over the instances not encoded is the same before and after:
  the pre- and post-state share the ghost. That is the ghost counter's update lemma — the change
  of the whole sum is the change of the encoded terms — and it needs each counted term to read
  only its own instance and binding (``bound(i, j)`` for a fixed generation ``j``; a job's state);
* the other invariants are ∀ over at most two requests and one lane, and each guard that reads
  other instances is a conjunction over them (``_engine_free``, ``_none_pending``) or a count;
  the arguments a step passes to its rows read only its own request and lane (checked: a step
  whose wiring reads another instance leaves the system proved at the encoded size only).

Take a counterexample to induction at any size: keep the moved request and lane and the
instances the broken invariant instance names (at most three requests and two lanes), make
bindings to dropped lanes ``elsewhere``, and set each ghost to its count over the dropped
instances. The kept pre-state satisfies every invariant (a ∀ restricted; a count now exactly
encoded + ghost), the step is enabled (a conjunction restricted to fewer instances is weaker; a
count is exact) and does the same, the ghosts do not move, and the broken instance is kept: a
counterexample here at R = 3, L = 3 with ghosts. None exists here, so none exists at any size.

A step this proof rejects but the plain R = 3, L = 3 induction accepts is a bug that needs more
instances than are encoded (``test_counting``: a generation that stops counting at its third
pinned request), or an invariant not inductive for every size; either fails ``verify``.
"""

from __future__ import annotations

import time
from typing import Iterable

import z3

from calculet.invariants.checks import CheckResult, Counterexample, Progress, model_value, solver
from calculet.invariants.system_encoding import (Move, StepGoals, assume_invariants, flat, fresh_frame, initial_frame,
                                                 read_frame, seq_domain, step_args, step_property_goals, system_goals)
from calculet.logic.symbolic import SymbolicVars
from calculet.machines.system import Opaque, SystemDefinition, SystemView

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
                           progress: Progress | None = None, steps: Iterable[str] | None = None,
                           goals: Iterable[str] | None = None) -> list[CheckResult]:
    """One result per variant (of ``steps``, default all): every invariant preserved when
    request 0 and lane 0 take it.

    A system whose steps are all local and whose invariants are ∀-shaped is proved for every size
    by the cutoff argument of :mod:`calculet.invariants.system_checks`. Otherwise (a count, or a
    step reading other instances) the counts' parts beyond the encoded instances are ghosts (the
    every-size induction, this module's docstring): a variant that proof does not settle fails,
    and its result says whether it holds at the encoded size alone (a bug that needs more
    instances than are encoded, or an invariant too weak for every size).

    The pre-state is the same for every variant, so one solver holds it and each variant is a
    push/pop on top (one query each: all goals at once, then which ones broke).

    ``goals`` (default: every invariant) names the properties whose preservation is asked; every invariant is
    still assumed of the pre-state. A test of a mutant asks for the one property it must break: with all goals at
    once, the counterexample z3 happens to find may break only another one (which one depends on the solver's
    state, e.g. the queries run before it in the same process)."""
    wanted = None if steps is None else set(steps)
    only = None if goals is None else frozenset(goals)
    local = len(sd.local) == len(sd.steps)
    counting = any(inv.counts for inv in sd.invariants)
    cutoff = requests >= 3 and lanes >= 2
    if local and not counting:
        return _induction(sd, requests, lanes, wanted, progress, beyond=False,
                          scope=" (so every R, L)" if cutoff else "", only=only)
    unhooked = [r.subject for r in _counts_read_beyond(sd, requests, lanes) if not r.ok]
    if unhooked:  # the ghost would stand for nothing: prove the encoded size, and say that is all
        return _induction(sd, requests, lanes, wanted, progress, beyond=False,
                          scope=" (this size only: a count reads no SystemView.beyond — "
                                + ", ".join(sorted(unhooked)) + ")", only=only)
    reading = _wirings_reading_others(sd)
    if reading:  # an effect's argument read from an instance the projection may drop
        return _induction(sd, requests, lanes, wanted, progress, beyond=False,
                          scope=" (this size only: the arguments of " + ", ".join(reading)
                                + " are read from other instances)", only=only)
    results = _induction(sd, requests, lanes, wanted, progress, beyond=True,
                         scope=" with ghost counts beyond them (so every R, L)" if cutoff else " with ghost counts",
                         only=only)
    unsettled = {r.subject for r in results if not r.ok}
    if not unsettled:
        return results
    encoded = {r.subject: r for r in _induction(sd, requests, lanes, unsettled, None, beyond=False, scope="",
                                                by_variant=True, only=only)}
    for r in results:
        if r.subject in encoded:
            r.detail += ("; at this size alone it holds — a bug that needs more instances than are encoded, "
                         "or an invariant not inductive for every size" if encoded[r.subject].ok else
                         f"; at this size alone too ({encoded[r.subject].detail})")
    return results


def _wirings_reading_others(sd: SystemDefinition) -> list[str]:
    """The steps whose wired event arguments (``request_args``/``lane_args``) read an instance other
    than their own request and lane: the projection argument needs a step's effect to depend only
    on what it moves (its guard may read others, as a conjunction over them or a count)."""
    requests = [SymbolicVars(sd.request.definition, f"_ow{i}") for i in range(2)]
    lanes = [SymbolicVars(sd.lane.definition, f"_owl{j}") for j in range(2)]
    args = {name: typ.symbol(f"{name}_ow") for name, typ in sd.step_args.items()}
    out = []
    for step in sd.steps:
        narrow = SystemView([requests[0], Opaque()], [lanes[0], Opaque()], [z3.Int("bind_ow"), Opaque()],
                            [z3.Int("seq_ow"), Opaque()])
        for v in sd.variants_of(step.name)[:1]:
            try:
                for wiring, names in ((step.request_args, v.request_wiring_args), (step.lane_args, v.lane_wiring_args)):
                    if wiring is not None:
                        wiring(narrow, 0, 0, **{a: args[a] for a in names})
            except Exception:  # read another instance (Opaque refuses)
                out.append(step.name)
    return out


def _counts_read_beyond(sd: SystemDefinition, requests: int, lanes: int) -> list[CheckResult]:
    """Each invariant declared ``counts`` reads ``SystemView.beyond``: a count over only the instances
    in view, taken for the whole count, would make the every-size induction assume too much."""
    out = []
    for inv in sd.invariants:
        if not inv.counts:
            continue
        start = time.process_time()
        frame = fresh_frame(sd, requests, lanes, "hook", beyond=True)
        inv.predicate(frame.view())
        ok = bool(frame.beyond and frame.beyond.ghosts)
        out.append(CheckResult("system-induction", sd.name, inv.name, ok, time.process_time() - start,
                               "its count includes the instances beyond the view" if ok else
                               "declared counts=True but reads no SystemView.beyond: its sum covers only the "
                               "instances in view, so no induction over it holds for every size", queries=0))
    return out


def _induction(sd: SystemDefinition, requests: int, lanes: int, wanted: set[str] | None,
               progress: Progress | None, beyond: bool, scope: str, by_variant: bool = False,
               only: frozenset[str] | None = None) -> list[CheckResult]:
    """The inductive step of every wanted variant (``by_variant``: ``wanted`` names variants, not
    steps); ``beyond`` adds the counts' ghost parts over the instances not encoded; ``only``: the goals asked
    (default all)."""
    results = []
    frame = fresh_frame(sd, requests, lanes, "", beyond=beyond)
    args, arg_dom = step_args(sd, "")
    s = solver("QF_LIA")
    s.add(*arg_dom)
    built = StepGoals(sd, frame)  # the goals once, moved to each variant's post-state by substitution
    assume_invariants(sd, s, frame, outside=True, system=built.system)
    for v in sd.variants:
        if wanted is not None and (v.name if by_variant else v.step.name) not in wanted:
            continue
        start = time.process_time()
        move = Move(sd, v, frame, 0, 0, args)
        post = move.after(frame)
        goals = built.after(move) + step_property_goals(sd, frame, move, v)
        if only is not None:
            goals = [goal for goal in goals if goal[0] in only]
        s.push()
        s.add(move.enabled, z3.Not(z3.And(*[g for _, _, g in goals])))
        if frame.beyond is not None:
            s.add(*frame.beyond.domain())
        verdict = s.check()
        if verdict == z3.unsat:
            results.append(CheckResult("system-induction", sd.name, v.name, True, time.process_time() - start,
                                       f"R={requests}, L={lanes}{scope}: {len(goals)} properties preserved",
                                       queries=1))
        elif verdict == z3.sat:
            m = s.model()
            broken = [name for name, _, g in goals if z3.is_false(m.eval(g, model_completion=True))]
            name, rid = next((n, r) for n, r, _ in goals if n == broken[0])
            pre = flat(read_frame(m, sd, frame))
            if frame.beyond is not None:
                pre.update({f"beyond {key}": model_value(m, g) for key, g in frame.beyond.ghosts.items()})
            cx = Counterexample(name, rid, f"request 0, lane 0: {v.name}", pre=pre,
                                args={a: model_value(m, t) for a, t in move.args.items()},
                                post=flat(read_frame(m, sd, post)))
            results.append(CheckResult("system-induction", sd.name, v.name, False, time.process_time() - start,
                                       f"R={requests}, L={lanes}{scope}: breaks {', '.join(broken)}", cx, queries=1,
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

