"""Checks that the proofs can fail: negative witnesses, redundancy, and guards no proof needs.

A proof of ``Inv`` says nothing if ``Inv`` is weak: weaken an invariant together with the guard
it protects and every consecution proof still passes (issue #17, class 1). So each invariant and
step property — per machine, pool and joint system — declares *negative witnesses*: concrete
(partial) valuations it must reject. This module checks, from the declarations alone:

* **witnesses** — every property has at least one, each lies within the declared types (so it is
  a state the property is meant to judge, not a type error), and the property is false on it.
  An invariant replaced by ``True`` fails here, naming itself;
* **redundancy** (informational) — an invariant implied by the machine's other invariants alone
  adds no strength of its own: reported, so a weakened copy cannot hide behind a stronger twin;
* **guards** — every guard of a row is needed: dropping it breaks some property of that row or
  makes it overlap another row of its (state, event); a guard no proof needs must say why it is
  there (``T(..., policy="...")``), so it cannot silently drift from the rule it enforces.

Witness valuations are evaluated as z3 constants through the same views the proofs use, so
state groups, event-aware steps and pool/system views behave exactly as in the proofs.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import z3

from calculet.invariants.checks import CheckResult, as_bool, enabled, invariants_hold, post_state, solver
from calculet.logic.symbolic import SymbolicVars, arg_domain, symbolic_args
from calculet.logic.types import Bool
from calculet.machines.definition import Definition, Step, Transition
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.machines.system import SystemDefinition, SystemStep, SystemView

__all__ = ["check_guards", "check_pool_witnesses", "check_redundancy", "check_system_witnesses",
           "check_witnesses", "valuation"]


def _const(d: Definition, name: str, value: Any) -> Any:
    decl = d.params.get(name) or d.vars[name]
    return z3.BoolVal(bool(value)) if isinstance(decl.type, Bool) else z3.IntVal(int(value))


def valuation(d: Definition, partial: Mapping[str, Any], tag: str = "_w") -> SymbolicVars:
    """A concrete state of ``d`` as z3 constants: ``partial`` over the initial state, the initial
    variable values and the parameters of the declaration's first example (1 where it has none)."""
    example = d.examples[0] if d.examples else {}
    values: dict[str, Any] = {p: example.get(p, 1) for p in d.params}
    values.update(d.initial_values())
    unknown = set(partial) - set(values) - {"state"}
    if unknown:
        raise KeyError(f"{d.name}: a witness names {sorted(unknown)}, which the machine does not declare")
    values.update({k: v for k, v in partial.items() if k != "state"})
    state = partial.get("state", d.initial)
    return SymbolicVars(d, tag, state=z3.IntVal(list(d.states).index(state)),
                        values={k: _const(d, k, v) for k, v in values.items()})


def _false(term: Any) -> bool:
    return z3.is_false(z3.simplify(as_bool(term)))


def _in_domain(*views: SymbolicVars) -> bool:
    return all(z3.is_true(z3.simplify(c)) for v in views for c in v.domain())


def _result(kind: str, owner: str, subject: str, start: float, faults: list[str], count: int) -> CheckResult:
    if faults:
        return CheckResult(kind, owner, subject, False, time.process_time() - start, "; ".join(faults),
                           broken=[f.split(":")[0] for f in faults], queries=count)
    return CheckResult(kind, owner, subject, True, time.process_time() - start,
                       f"{count} negative witnesses rejected", queries=count)


_Judged = tuple[Sequence[SymbolicVars], Callable[[], Any]]
"""One witness as a check sees it: the states it must lie within, and the property's verdict on it (lazy)."""


def _witness_faults(props: Iterable[Any], judge: Callable[[Any, Any], _Judged], faults: list[str]) -> int:
    """Each negative witness of each of ``props`` (invariants or step properties) judged; returns how many.

    ``judge(prop, w)`` gives the states whose declared types ``w`` must respect (none for a type bound, whose
    witness lies outside its type by design) and the property's verdict on ``w``, evaluated only for a witness
    within them. What is wrong goes to ``faults``, named by the property first (the machine's, pool's and
    system's checks below differ only by how a witness becomes a view)."""
    count = 0
    for prop in props:
        if not prop.rejects:
            faults.append(f"{prop.name}: declares no negative witness")
        for w in prop.rejects:
            count += 1
            states, verdict = judge(prop, w)
            shown = dict(w) if isinstance(w, Mapping) else w
            if not _in_domain(*states):
                faults.append(f"{prop.name}: witness {shown} lies outside the declared types")
            elif not _false(verdict()):
                faults.append(f"{prop.name}: accepts its negative witness {shown}")
    return count


def check_witnesses(d: Definition) -> CheckResult:
    """Each invariant and step property of ``d`` rejects each of its negative witnesses."""
    start = time.process_time()
    faults: list[str] = []

    def invariant(inv: Any, w: Mapping[str, Any]) -> _Judged:
        v = valuation(d, w)
        return (() if inv.rid == "type" else (v,)), lambda: inv.predicate(v)

    def step(sp: Any, w: Any) -> _Judged:
        pre, post = valuation(d, w[0]), valuation(d, {**w[0], **w[1]}, "_wpost")
        if sp in d.event_properties:
            row = next(t for t in d.transitions if t.name == w[2])
            return (pre, post), lambda: sp.predicate(pre, post, Step(row.event, row.name,
                                                                      symbolic_args(d.events[row.event])))
        return (pre, post), lambda: sp.predicate(pre, post)

    count = _witness_faults(d.invariants, invariant, faults) + _witness_faults(d.all_step_properties, step, faults)
    return _result("witnesses", d.name, "negative witnesses", start, faults, count)


def _pool_view(p: PoolDefinition, w: Mapping[str, Any], tag: str) -> tuple[PoolView, list[SymbolicVars]]:
    d = p.instance.definition
    lanes = [valuation(d, lane, f"{tag}{j}") for j, lane in enumerate(w.get("lanes", [{}]))]
    ghosts = [{g: z3.IntVal(int((w.get("ghosts") or [{}] * len(lanes))[j].get(g, 0))) for g in p.ghosts}
              for j in range(len(lanes))]
    params = {k: z3.IntVal(int(w.get("params", {}).get(k, 1))) for k in p.params}
    return PoolView(lanes, params, ghosts), lanes


def check_pool_witnesses(p: PoolDefinition) -> CheckResult:
    """Each pool invariant rejects each of its negative witnesses (lanes within their types)."""
    start = time.process_time()
    faults: list[str] = []

    def judge(inv: Any, w: Mapping[str, Any]) -> _Judged:
        view, lanes = _pool_view(p, w, "_pw")
        return lanes, lambda: inv.predicate(view)

    count = _witness_faults(p.invariants, judge, faults)
    return _result("pool-witnesses", p.name, "negative witnesses", start, faults, count)


def _system_view(sd: SystemDefinition, w: Mapping[str, Any], rtag: str, ltag: str
                 ) -> tuple[SystemView, tuple[SymbolicVars, ...]]:
    """A partial system witness as a view (instances default to their initial state) and its instances."""
    requests = [valuation(sd.request.definition, r, f"{rtag}{i}") for i, r in enumerate(w.get("requests", [{}]))]
    lanes = [valuation(sd.lane.definition, lane, f"{ltag}{j}") for j, lane in enumerate(w.get("lanes", [{}]))]
    binding = [z3.IntVal(b) for b in w.get("binding", [-1] * len(requests))]
    seq = [z3.IntVal(s) for s in w.get("seq", list(range(1, len(requests) + 1)))]
    return SystemView(requests, lanes, binding, seq), (*requests, *lanes)


def check_system_witnesses(sd: SystemDefinition) -> CheckResult:
    """Each joint-system invariant and step property rejects each of its negative witnesses."""
    start = time.process_time()
    faults: list[str] = []

    def judge(inv: Any, w: Mapping[str, Any]) -> _Judged:
        view, states = _system_view(sd, w, "_sr", "_sl")
        return states, lambda: inv.predicate(view)

    def step(sp: Any, w: Mapping[str, Any]) -> _Judged:
        pre, post = w.get("pre", {}), w.get("post", {})
        after = dict(pre)
        for key in ("requests", "lanes"):  # an instance's post entries merged over its pre-state
            if key in post:
                before = pre.get(key, [])
                after[key] = [{**(before[k] if k < len(before) else {}), **new} for k, new in enumerate(post[key])]
        after.update({key: post[key] for key in ("binding", "seq") if key in post})
        pre_view, pre_states = _system_view(sd, pre, "_sr", "_sl")
        post_view, post_states = _system_view(sd, after, "_sqr", "_sql")
        taken = SystemStep(w["step"], w["step"])
        return (*pre_states, *post_states), lambda: sp.predicate(pre_view, post_view, taken)

    count = _witness_faults(sd.invariants, judge, faults) + _witness_faults(sd.step_properties, step, faults)
    return _result("system-witnesses", sd.name, "negative witnesses", start, faults, count)


def check_redundancy(d: Definition) -> list[CheckResult]:
    """Informational: each declared invariant that the machine's other invariants imply alone."""
    results = []
    v = SymbolicVars(d, "_red")
    declared = [inv for inv in d.invariants if inv.rid != "type"]
    terms = {inv.name: as_bool(inv.predicate(v)) for inv in d.invariants}
    for inv in declared:
        start = time.process_time()
        s = solver()
        s.add(*v.domain(), *[t for n, t in terms.items() if n != inv.name], z3.Not(terms[inv.name]))
        verdict = s.check()
        detail = ("implied by the other invariants alone (redundant: it adds no strength)" if verdict == z3.unsat
                  else "independent: some valuation breaks it alone" if verdict == z3.sat
                  else f"solver answered {verdict}")
        results.append(CheckResult("redundancy", d.name, inv.name, True, time.process_time() - start, detail,
                                   informational=True))
    return results


def _needed(d: Definition, t: Transition) -> str:
    """Why the guard of ``t`` is needed ('' when no property and no other row needs it)."""
    ev = d.events[t.event]
    v = SymbolicVars(d, "_g")
    args = symbolic_args(ev)
    post = post_state(d, t, v, args)
    s = solver()
    s.add(*v.domain(), *arg_domain(ev, args), *[as_bool(p) for p in invariants_hold(d, v)],
          v.state == v.state_index(t.source))
    # Determinism: unguarded, the row would overlap another row of its (state, event).
    for other in d.transitions_from(t.source, t.event):
        if other is t or (other.choice and other.order > t.order) or (t.choice and other.order < t.order):
            continue
        s.push()
        s.add(enabled(other, v, args))
        overlap = s.check() == z3.sat
        s.pop()
        if overlap:
            return f"without it the row overlaps {other.name}"
    for earlier in d.transitions_from(t.source, t.event):
        if earlier is t:
            break
        s.add(z3.Not(enabled(earlier, v, args)))
    goals = [(inv.name, as_bool(inv.predicate(post))) for inv in d.invariants]
    goals += [(n, as_bool(g)) for n, _, g in d.step_goals(v, post, t, args)]
    s.add(z3.Not(z3.And(*[g for _, g in goals])))
    if s.check() == z3.sat:
        m = s.model()
        return "without it the row breaks " + ", ".join(n for n, g in goals if z3.is_false(m.eval(g, True)))
    return ""


def check_guards(d: Definition) -> list[CheckResult]:
    """Every guarded row: its guard is needed by a property or by determinism, or is a declared
    policy (``T(policy=...)``, shown in the report)."""
    results = []
    for t in d.transitions:
        if t.guard is None:
            continue
        start = time.process_time()
        why = _needed(d, t)
        policy = t.policy
        if why:
            results.append(CheckResult("guards", d.name, t.name, True, time.process_time() - start, why))
        elif policy:
            results.append(CheckResult("guards", d.name, t.name, True, time.process_time() - start,
                                       f"policy: {policy}"))
        else:
            results.append(CheckResult("guards", d.name, t.name, False, time.process_time() - start,
                                       "no property and no other row needs this guard; prove what it protects "
                                       "or declare it a policy guard (T(policy=...))"))
    return results
