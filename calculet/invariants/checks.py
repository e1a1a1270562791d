"""Per-machine proofs over every declared transition, with z3.

Everything is encoded from the one declaration (:mod:`calculet.logic.symbolic`): the
checks below never restate a machine. For each machine:

* **initiation** — the initial state satisfies every invariant, for every parameter value;
* **consecution** — ``Inv(s) ∧ guard(s, e) ⇒ Inv(effect(s, e))`` for every row and invariant
  (and every step property over (s, effect(s, e))): a proof for all values, not a sample;
* **determinism** — no two rows of one (state, event) are enabled together unless the later
  is declared a ``choice`` (first enabled row wins);
* **completeness** — for each (state, event), whether some values enable no row, with an
  example: a refusal is then a visible decision (informational);
* **deadlock** — every non-terminal state has, for every invariant-satisfying valuation, some
  event and arguments that enable a row;
* **reachability** — every row, and so every state, is taken on a concrete run from the
  initial state (a witness path found with z3-chosen arguments over the declaration's examples);
* **home** — every state can reach a terminal state (or, for a machine whose lives cycle, the
  initial state) in the transition graph;
* **vacuity** — each row can fire: its guard is satisfiable with the invariants at its source.

Counterexamples are models of the failing query, shown as pre-state, arguments and post-state.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import z3

from calculet.invariants.witness import witness_paths
from calculet.logic.symbolic import SymbolicVars, arg_domain, symbolic_args
from calculet.logic.types import Bool, EnumType
from calculet.machines.definition import Definition, Transition

Progress = Callable[[str], None]  # told what a long check is doing (verify's progress bar)


@dataclass
class Counterexample:
    """Values that break a property: one step (pre, args, post) or a whole trace."""

    invariant: str
    rid: str
    transition: str
    pre: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    post: dict[str, Any] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "rid": self.rid, "transition": self.transition,
                "pre": self.pre, "args": self.args, "post": self.post, "trace": self.trace}


@dataclass
class CheckResult:
    check: str
    machine: str
    subject: str
    ok: bool
    seconds: float
    detail: str = ""
    counterexample: Counterexample | None = None
    informational: bool = False
    queries: int = 1
    broken: list[str] = field(default_factory=list)  # every property a failing check breaks

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "machine": self.machine, "subject": self.subject, "ok": self.ok,
                "seconds": round(self.seconds, 4), "detail": self.detail, "informational": self.informational,
                "queries": self.queries,
                "counterexample": self.counterexample.as_dict() if self.counterexample else None}


# ----------------------------------------------------------------------------------------------
# Reading models


def model_value(model: z3.ModelRef, term: Any, decl: Any = None) -> Any:
    if not isinstance(term, z3.ExprRef):
        return term.name if hasattr(term, "name") else term
    value = model.eval(term, model_completion=True)
    if z3.is_bool(value):
        return z3.is_true(value)
    number = value.as_long()
    if decl is not None and isinstance(decl.type, EnumType):
        try:
            return decl.type.enum_cls(number).name
        except ValueError:
            return number
    return number


def read_state(model: z3.ModelRef, d: Definition, v: SymbolicVars) -> dict[str, Any]:
    """A symbolic state's values in ``model``, with state and enum names spelled out."""
    index = model_value(model, v.state)
    names = list(d.states)
    out: dict[str, Any] = {"state": names[index] if 0 <= index < len(names) else index}
    for name, decl in list(d.params.items()) + list(d.vars.items()):
        out[name] = model_value(model, v.value(name), decl)
    return out


def read_args(model: z3.ModelRef, d: Definition, event: str, args: dict[str, Any]) -> dict[str, Any]:
    return {name: model_value(model, term) for name, term in args.items()}


# ----------------------------------------------------------------------------------------------
# Building blocks


def invariants_hold(d: Definition, v: SymbolicVars) -> list[Any]:
    return [inv.predicate(v) for inv in d.invariants]


def as_bool(expr: Any) -> Any:
    return expr if isinstance(expr, z3.ExprRef) else z3.BoolVal(bool(expr))


_CANONICAL: "weakref.WeakKeyDictionary[Definition, tuple[SymbolicVars, list[Any], list[Any]]]" = \
    weakref.WeakKeyDictionary()


def canonical(d: Definition) -> tuple[SymbolicVars, list[Any], list[Any]]:
    """The machine's symbolic state with no suffix, its type domain and its invariants as z3 booleans,
    built once per declaration. Every per-machine check starts from that state (z3 names its constants
    by name, so each fresh ``SymbolicVars(d)`` was the very same terms); building the invariants again
    for each row and each (state, event) was a third of the per-machine checks' time (#17: ``verify
    --fast`` ≤ 20 s of CPU). Keyed weakly by the declaration: a mutant is a new declaration."""
    hit = _CANONICAL.get(d)
    if hit is None:
        v = SymbolicVars(d)
        hit = _CANONICAL[d] = (v, v.domain(), [as_bool(p) for p in invariants_hold(d, v)])
    return hit


def terms_of(v: SymbolicVars) -> list[Any]:
    """A symbolic state's terms: its state, then its parameters and variables in declaration order."""
    return [v.state, *[v.value(n) for n in v.names()]]


def moved_to(pre: SymbolicVars, post: SymbolicVars) -> list[tuple[Any, Any]]:
    """(constant of ``pre``, term of ``post``) for each value a transition changes: substituted into a
    predicate built on ``pre`` they give the predicate on ``post`` (``pre``'s values are constants)."""
    return [(a, b) for a, b in zip(terms_of(pre), terms_of(post)) if not a.eq(b)]


def after(goal: Any, moved: list[tuple[Any, Any]]) -> Any:
    """``goal`` (built on a pre-state) on the post-state ``moved`` describes (see :func:`moved_to`)."""
    return z3.substitute(goal, *moved) if moved else goal


def is_constant(term: Any) -> bool:
    """An uninterpreted z3 constant: what a substitution may replace (a fresh state's values are)."""
    return isinstance(term, z3.ExprRef) and z3.is_const(term) and term.decl().kind() == z3.Z3_OP_UNINTERPRETED


class Substitution:
    """``z3.substitute(goal, *pairs)`` for many goals with one set of pairs: z3py's wrapper checks every
    pair's sorts again on each call, which cost more than the substitution itself (an inductive step
    substitutes ~20 goals with the same pairs); here the pairs are checked and marshalled once."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.size = len(pairs)
        if not pairs:
            return
        for a, b in pairs:
            if not (is_constant(a) and a.sort().eq(b.sort())):
                raise ValueError(f"cannot substitute {b} ({b.sort()}) for {a} ({a.sort()})")
        self.ctx = pairs[0][0].ctx
        self.src = (z3.Ast * self.size)(*[a.as_ast() for a, _ in pairs])
        self.dst = (z3.Ast * self.size)(*[b.as_ast() for _, b in pairs])

    def __call__(self, goal: Any) -> Any:
        if not self.size:
            return goal
        ctx = self.ctx
        return z3.z3._to_expr_ref(z3.Z3_substitute(ctx.ref(), goal.as_ast(), self.size, self.src, self.dst), ctx)


def initial_instance(d: Definition, tag: str) -> SymbolicVars:
    """An instance in the initial state with initial variables and symbolic parameters."""
    base = SymbolicVars(d, tag)
    typed = {k: (z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(int(v))) for k, v in d.initial_values().items()}
    return SymbolicVars(d, tag, state=z3.IntVal(list(d.states).index(d.initial)),
                        values={**{p: base.value(p) for p in d.params}, **typed})


def enabled(t: Transition, v: SymbolicVars, args: dict[str, Any]) -> Any:
    """The row's guard as a z3 term (True when unguarded)."""
    if t.guard is None:
        return z3.BoolVal(True)
    return as_bool(t.guard(v, *[args[a] for a in t.guard_args]))


def takes(d: Definition, t: Transition, v: SymbolicVars, args: dict[str, Any]) -> Any:
    """``t`` is the row taken: in its source state, its guard holds, no earlier row's does."""
    parts = [v.state == v.state_index(t.source), enabled(t, v, args)]
    for earlier in d.transitions_from(t.source, t.event):
        if earlier is t:
            break
        parts.append(z3.Not(enabled(earlier, v, args)))
    return z3.And(*parts)


def post_state(d: Definition, t: Transition, v: SymbolicVars, args: dict[str, Any]) -> SymbolicVars:
    updates = {} if t.effect is None else dict(t.effect(v, *[args[a] for a in t.effect_args]))
    # Python ints/bools from an effect become z3 values of the variable's sort.
    typed = {}
    for key, value in updates.items():
        if isinstance(value, z3.ExprRef):
            typed[key] = value
        elif isinstance(d.vars[key].type, Bool):
            typed[key] = z3.BoolVal(bool(value))
        else:
            typed[key] = z3.IntVal(int(value))
    return v.with_updates(typed, z3.IntVal(v.state_index(t.target)))


# Deterministic effort bounds. A wall-clock ``timeout`` made a proof pass or fail with the
# machine's load (issue #17: the pool BMC answered ``unknown`` after 104 s of CPU on a loaded
# machine); z3's ``rlimit`` counts the solver's own work, so the same query gets the same answer
# on any machine and any load. The limits are ~20x what the real declarations need (measured
# with ``statistics()["rlimit count"]``); a query past one answers ``unknown`` and fails the check.
RLIMIT_QUERY = 50_000_000          # one per-machine, induction or vacuity query
RLIMIT_SEARCH = 2_000_000_000      # one bounded model checking query (all depths at once)


def solver(logic: str | None = None, rlimit: int = RLIMIT_QUERY, search: bool = False) -> z3.Solver:
    """A z3 solver bounded by ``rlimit`` (never by time). ``search``: the bounded model checking
    profile — z3's older arithmetic solver, ~5x faster than the default on these unrollings
    (pool BMC at N=16, depth 8: 1.2 s against 6.3 s of CPU here)."""
    s = z3.SolverFor(logic) if logic else z3.Solver()
    s.set("rlimit", rlimit)
    if search:
        s.set("smt.arith.solver", 2)
    return s


def _solver() -> z3.Solver:
    return solver()


def all_hold(s: z3.Solver, goals: list[Any]) -> bool:
    """Whether every goal follows from ``s`` — one query for all; the caller asks goal by goal
    (to name the broken ones) only when this answers no or does not know."""
    s.push()
    s.add(z3.Not(z3.And(*goals)))
    verdict = s.check()
    s.pop()
    return verdict == z3.unsat


# ----------------------------------------------------------------------------------------------
# The checks


def check_initiation(d: Definition) -> CheckResult:
    start = time.process_time()
    params_only = SymbolicVars(d)
    initial = d.initial_values()
    typed = {k: (z3.BoolVal(val) if isinstance(val, bool) else z3.IntVal(int(val))) for k, val in initial.items()}
    v = SymbolicVars(d, state=z3.IntVal(list(d.states).index(d.initial)), values={
        **{p: params_only.value(p) for p in d.params}, **typed})
    for inv in d.invariants:
        s = _solver()
        s.add(*params_only.domain()[2:])  # parameter/variable domains; the state is fixed
        s.add(z3.Not(as_bool(inv.predicate(v))))
        if s.check() == z3.sat:
            cx = Counterexample(inv.name, inv.rid, "(initial state)", pre=read_state(s.model(), d, v))
            return CheckResult("initiation", d.name, d.initial, False, time.process_time() - start,
                               f"initial state breaks {inv.name} ({inv.rid})", cx, queries=len(d.invariants))
    return CheckResult("initiation", d.name, d.initial, True, time.process_time() - start,
                       f"{len(d.invariants)} invariants hold initially", queries=len(d.invariants))


def check_consecution(d: Definition, t: Transition) -> CheckResult:
    """One row against every invariant and step property; the first broken one is reported."""
    start = time.process_time()
    ev = d.events[t.event]
    v, domain, held = canonical(d)
    args = symbolic_args(ev)
    post = post_state(d, t, v, args)
    s = _solver()
    s.add(*domain, *arg_domain(ev, args), *held)
    s.add(takes(d, t, v, args))
    moved = moved_to(v, post)  # the invariants on the post-state: the pre-state's, substituted
    goals = [(inv.name, inv.rid, after(pre, moved)) for inv, pre in zip(d.invariants, held)]
    goals += [(name, rid, as_bool(goal)) for name, rid, goal in d.step_goals(v, post, t, args)]
    broken: list[str] = []
    first: Counterexample | None = None
    unknown: list[str] = []
    if all_hold(s, [g for _, _, g in goals]):  # one query when the row is fine (the usual case)
        return CheckResult("consecution", d.name, t.name, True, time.process_time() - start,
                           f"{len(goals)} properties preserved", queries=1)
    for name, rid, goal in goals:
        s.push()
        s.add(z3.Not(goal))
        verdict = s.check()
        if verdict == z3.sat:
            broken.append(f"{name} ({rid})")
            if first is None:
                m = s.model()
                first = Counterexample(name, rid, t.name, pre=read_state(m, d, v),
                                       args=read_args(m, d, t.event, args), post=read_state(m, d, post))
        elif verdict != z3.unsat:
            unknown.append(f"{name}: solver answered {verdict}")
        s.pop()
    if broken or unknown:
        return CheckResult("consecution", d.name, t.name, False, time.process_time() - start,
                           "; ".join(([f"breaks {', '.join(broken)}"] if broken else []) + unknown), first,
                           queries=len(goals), broken=[b.split(" (")[0] for b in broken])
    return CheckResult("consecution", d.name, t.name, True, time.process_time() - start,
                       f"{len(goals)} properties preserved", queries=len(goals))


def check_determinism(d: Definition) -> list[CheckResult]:
    out = []
    keys = sorted({(t.source, t.event) for t in d.transitions})
    for state, event in keys:
        rows = d.transitions_from(state, event)
        if len(rows) < 2:
            continue
        start = time.process_time()
        ev = d.events[event]
        v, domain, held = canonical(d)
        args = symbolic_args(ev)
        problem = None
        pairs = 0
        for i, first in enumerate(rows):
            for second in rows[i + 1:]:
                if second.choice:
                    continue
                pairs += 1
                s = _solver()
                s.add(*domain, *arg_domain(ev, args), *held,
                      v.state == v.state_index(state), enabled(first, v, args), enabled(second, v, args))
                if s.check() == z3.sat:
                    m = s.model()
                    problem = (first, second, Counterexample(
                        "determinism", "", f"{first.name} & {second.name}", pre=read_state(m, d, v),
                        args=read_args(m, d, event, args)))
                    break
            if problem:
                break
        subject = f"({state}, {event})"
        if problem:
            out.append(CheckResult("determinism", d.name, subject, False, time.process_time() - start,
                                   f"{problem[0].name} and {problem[1].name} are both enabled", problem[2],
                                   queries=pairs))
        else:
            out.append(CheckResult("determinism", d.name, subject, True, time.process_time() - start,
                                   f"{len(rows)} rows, guards disjoint", queries=pairs))
    return out


def check_completeness(d: Definition) -> list[CheckResult]:
    """Informational: where an event is refused although the state has rows for it."""
    out = []
    for state, event in sorted({(t.source, t.event) for t in d.transitions}):
        start = time.process_time()
        ev = d.events[event]
        v, domain, held = canonical(d)
        args = symbolic_args(ev)
        s = _solver()
        s.add(*domain, *arg_domain(ev, args), *held, v.state == v.state_index(state))
        s.add(*[z3.Not(enabled(t, v, args)) for t in d.transitions_from(state, event)])
        if s.check() == z3.sat:
            m = s.model()
            example = {**{k: val for k, val in read_state(m, d, v).items() if k in d.vars}, **read_args(m, d, event, args)}
            detail = f"refused for some values, e.g. {example}"
        else:
            detail = "always enabled (total)"
        out.append(CheckResult("completeness", d.name, f"({state}, {event})", True,
                               time.process_time() - start, detail, informational=True))
    return out


def check_deadlock(d: Definition) -> list[CheckResult]:
    out = []
    for state in d.states:
        if state in d.terminal:
            continue
        start = time.process_time()
        v, domain, held = canonical(d)
        s = _solver()
        s.add(*domain, *held, v.state == v.state_index(state))
        for event in sorted({t.event for t in d.transitions_from(state)}):
            ev = d.events[event]
            args = symbolic_args(ev, f"_{event}")
            some_row = z3.Or(*[enabled(t, v, args) for t in d.transitions_from(state, event)])
            domain = arg_domain(ev, args)
            body = z3.Implies(z3.And(*domain), z3.Not(some_row)) if domain else z3.Not(some_row)
            s.add(z3.ForAll(list(args.values()), body) if args else body)
        verdict = s.check()
        if verdict == z3.sat:
            cx = Counterexample("no_deadlock", "", f"(in {state})", pre=read_state(s.model(), d, v))
            out.append(CheckResult("deadlock", d.name, state, False, time.process_time() - start,
                                   "a reachable-by-invariant valuation enables no event", cx))
        else:
            out.append(CheckResult("deadlock", d.name, state, verdict == z3.unsat, time.process_time() - start,
                                   "some event is always enabled" if verdict == z3.unsat else f"solver answered {verdict}"))
    return out


def check_home(d: Definition) -> CheckResult:
    start = time.process_time()
    graph = d.successors()
    stuck = []
    for state in d.states:
        seen = d.reachable_from(state)
        if not (seen & d.home) or (state in d.home and state not in d.terminal and not (seen - {state}) and graph[state] == set()):
            stuck.append(state)
    what = "a terminal state" if d.terminal else f"the initial state {d.initial!r}"
    if stuck:
        return CheckResult("home", d.name, "graph", False, time.process_time() - start,
                           f"cannot reach {what}: {stuck}")
    return CheckResult("home", d.name, "graph", True, time.process_time() - start,
                       f"every state can reach {what}")


def check_reachability(machine: Any) -> CheckResult:
    start = time.process_time()
    d = machine.definition
    found, missing = witness_paths(machine, d.examples)
    states = {d.initial} | {t.target for t in d.transitions if t.name in found}
    if missing:
        return CheckResult("reachability", d.name, "witnesses", False, time.process_time() - start,
                           f"no run from the initial state takes {sorted(missing)}")
    longest = max((len(path) for _, path in found.values()), default=0)
    return CheckResult("reachability", d.name, "witnesses", True, time.process_time() - start,
                       f"all {len(found)} rows and {len(states)} states taken on concrete runs (longest {longest} steps)",
                       queries=len(found))


def check_vacuity(d: Definition, t: Transition) -> CheckResult:
    start = time.process_time()
    ev = d.events[t.event]
    v, domain, held = canonical(d)
    args = symbolic_args(ev)
    s = _solver()
    s.add(*domain, *arg_domain(ev, args), *held, takes(d, t, v, args))
    verdict = s.check()
    if verdict == z3.sat:
        return CheckResult("vacuity", d.name, t.name, True, time.process_time() - start, "can fire")
    return CheckResult("vacuity", d.name, t.name, False, time.process_time() - start,
                       "can never fire under the invariants (dead row)" if verdict == z3.unsat
                       else f"solver answered {verdict}")


def check_machine(d: Definition, include: Iterable[str] | None = None, machine: Any = None) -> list[CheckResult]:
    """Every per-machine check, in a stable order (``machine``, the class, enables reachability)."""
    wanted = set(include) if include is not None else None

    def on(name: str) -> bool:
        return wanted is None or name in wanted

    results: list[CheckResult] = []
    if on("initiation"):
        results.append(check_initiation(d))
    if on("consecution"):
        results += [check_consecution(d, t) for t in d.transitions]
    if on("determinism"):
        results += check_determinism(d)
    if on("deadlock"):
        results += check_deadlock(d)
    if on("reachability") and machine is not None:
        results.append(check_reachability(machine))
    if on("home"):
        results.append(check_home(d))
    if on("vacuity"):
        results += [check_vacuity(d, t) for t in d.transitions]
    if on("completeness"):
        results += check_completeness(d)
    return results
