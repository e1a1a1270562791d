"""The pool's declared ``reserve`` guard, compiled over aggregates: O(1) per reservation (issue #17, #20).

:class:`~calculet.machines.kv_pool.KvLanePool` states its reserve guard over every lane: no other
held lane owns (seq, generation), and the other lanes' reserved tokens and held lanes stay
within ``max_kv_tokens`` and ``max_sequences`` (§9.2, §5.1). Evaluated as written on the live
pool it costs O(lanes) per admission (5-8 ms at 2 001 lanes). The runtime still executes the
declared guard — not a copy of its rules — but on a *reduced pool* of two lanes:

* lane 0 is the lane being reserved, lane 1 the lane that holds (seq, generation) now, if any
  (the manager's ``(generation, seq) → lane`` index), else a lane in the instance's initial
  state, which contributes nothing (``verify``'s "initial lane is neutral" check);
* every other lane is left out, and each pool budget the guard reads is lowered by what those
  lanes use: a *measure* per budget parameter (:data:`MEASURES`: reserved tokens for
  ``max_kv_tokens``, one per held lane for ``max_sequences``), whose pool-wide sums the manager
  keeps incrementally.

The guard is evaluated on z3 terms for that two-lane view and printed as Python (the same translation as the
machines' dispatch, :mod:`calculet.machines.codegen`), so a reservation reads a few attributes; so are the measures,
the totals' moves and the pool's invariants on a one-lane view (the monitor's usual part).

Where that code lives (session 24): it is a function of the pool's *declaration*
(:class:`~calculet.machines.kv_pool.KvLanePool`) and of :data:`MEASURES`, not of the configuration — the lanes and
the budgets' values are arguments at run time — so it takes the machines' route (``docs/machines_codegen.md``):
``python -m calculet.specgen`` writes it to ``calculet/machines/generated/kv_lane_pool.py`` (:func:`module_source`),
``specgen --check`` (CI) fails when that file is not what the declaration prints, and the runtime imports it. A
pool that is not the shipped declaration (a test's weakened one), or a written module whose recorded shape
(:func:`pool_shape`) is stale, has the same text generated and ``exec``'d here, as before (stale: with a warning).
Why this is the declared guard and not a weaker one:

* :func:`prove_reduction` proves with z3, for pools of ``n`` lanes, that the declared guard on
  the whole pool equals the compiled guard on the reduced one whenever the lanes left out do
  not hold (seq, generation) — a test runs it, so a guard term the measures do not capture (a
  new budget, a weakened measure) fails it;
* with monitors on, the KV pool monitor compares the kept aggregates with the measures summed over
  the lanes (its own sums, kept exact by diffing every lane against its last snapshot) and evaluates
  the declared guard on the whole live pool at sampled reservations, and reports any
  difference (:mod:`calculet.runtime.scheduling.kv_checks`);
* a declaration whose guard is weakened is executed weakened, so the pool invariants' monitor
  and the budget tests see it (there is no second copy of the rule to hide it).
"""

from __future__ import annotations

import hashlib
import inspect
from types import ModuleType
from typing import Any, Callable, Mapping

import z3

from calculet.logic.expr import If, Not
from calculet.logic.symbolic import SymbolicVars, symbolic_args
from calculet.machines.codegen import ExprPrinter
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.machines.written import GENERATED_PACKAGE, import_written, shape

__all__ = ["MEASURES", "WRITTEN", "ReserveGuard", "compile_measures", "compile_moves", "compile_one_lane_invariants",
           "compile_reserve_guard", "events_keeping_measures", "measure_totals", "module_source", "pool_shape",
           "prove_reduction"]

MEASURES: Mapping[str, Callable[[Any], Any]] = {
    "max_kv_tokens": lambda lane: lane.reserved_len,
    "max_sequences": lambda lane: If(Not(lane.at("free")), 1, 0),
}
"""What one lane uses of each pool budget parameter (the aggregate variables of the reduction)."""

_LANES = ("l0", "l1")

ReserveGuard = Callable[..., bool]
"""``guard(l0, l1, used, budgets, <reserve's arguments>) -> bool``: ``used`` is each budget's measure
summed over the whole pool and ``budgets`` the budget parameters (both in ``pool.params`` order); the
guard lowers each budget by what the lanes other than ``l0`` and ``l1`` use, ``budget - (used - m(l0) -
m(l1))``, in its own generated lines (issue #20: no list built per reservation)."""


class _ReducedPrinter(ExprPrinter):
    """Python for a term over the two lanes of the reduced view: ``<var>_l0`` reads ``l0.<var>``."""

    def __init__(self, d: Any, arg_names: set[str], ghosts: Any = ()) -> None:
        super().__init__(d, arg_names)
        self.ghosts = set(ghosts)

    def symbol(self, name: str) -> str:
        for lane in _LANES:
            if name.endswith(f"_{lane}") and name[: -len(lane) - 1] in self.ghosts:
                raise TypeError(f"the reserve guard reads the ghost {name!r}; the reduced view has no ghosts")
            if name == f"state_{lane}":
                return f"{lane}.state"
            if name.endswith(f"_{lane}"):
                return f"{lane}.{name[: -len(lane) - 1]}"
        if name in self.arg_names:
            return name
        raise TypeError(f"unknown symbol {name!r} in the reduced pool guard")

    def expr(self, e: Any) -> str:
        if isinstance(e, z3.ExprRef) and (z3.is_and(e) or z3.is_or(e)):
            # ``z3.simplify`` orders a conjunction's or disjunction's operands by term id, which depends on every
            # term made before in the process: printed in text order, the written module is the same whatever ran
            # first (``specgen --check``). The operands read attributes of two lanes and the arguments, and cannot
            # raise, so their order changes no verdict (as joint_codegen's parts).
            parts = sorted(self.expr(k) for k in e.children())
            return "(" + (self.AND if z3.is_and(e) else self.OR).join(parts) + ")"
        if isinstance(e, z3.ExprRef) and z3.is_eq(e):
            left, right = e.children()
            if z3.is_const(left) and left.decl().name() in (f"state_{lane}" for lane in _LANES) \
                    and z3.is_int_value(right):
                lane = left.decl().name().removeprefix("state_")
                return f"({lane}.state == {self.state_names[right.as_long()]!r})"
        return super().expr(e)

    def _enum_of(self, e: Any) -> Any:
        return None


def _symbolic_view(pool: PoolDefinition, budgets: Mapping[str, Any]) -> tuple[PoolView, list[SymbolicVars]]:
    inst = pool.instance.definition
    lanes = [SymbolicVars(inst, f"_{lane}") for lane in _LANES]
    ghosts = [{g: z3.Int(f"{g}_{lane}") for g in pool.ghosts} for lane in _LANES]
    return PoolView(lanes, dict(budgets), ghosts), lanes


def compile_reserve_guard(pool: PoolDefinition) -> tuple[ReserveGuard, str]:
    """The declared reserve guard of ``pool`` on the reduced view, as a Python function and its source (the written
    module's for the shipped pool, else generated and ``exec``'d now)."""
    return _function(pool, "reserve_guard")


def reserve_guard_source(pool: PoolDefinition) -> str:
    """The source of ``reserve_guard``: the declared reserve guard of ``pool`` printed on the reduced view."""
    op = pool.ops["reserve"]
    ev = pool.instance.definition.events["reserve"]
    budgets = {name: z3.Int(name) for name in pool.params}
    missing = sorted(set(pool.params) - set(MEASURES))
    if missing:
        raise TypeError(f"{pool.name}: no measure for the budget parameters {missing} (kv_guard.MEASURES)")
    view, lanes = _symbolic_view(pool, budgets)
    args = symbolic_args(ev)
    term = z3.BoolVal(True) if op.guard is None else op.guard(view, 0, **args)
    if isinstance(term, bool):
        term = z3.BoolVal(term)
    printer = _ReducedPrinter(pool.instance.definition, set(pool.params) | set(ev.args), pool.ghosts)
    params = ", ".join([*_LANES, "used", "budgets", *ev.args])
    lowered = "".join(
        f"    {name} = budgets[{k}] - used[{k}]"
        + "".join(f" + ({printer.expr(z3.simplify(_as_int(MEASURES[name](lane))))})" for lane in lanes) + "\n"
        for k, name in enumerate(pool.params))
    return (f"def reserve_guard({params}):  # {pool.name}.reserve on the reduced view (kv_guard)\n"
            f"{lowered}"
            f"    return {printer.expr(z3.simplify(term))}\n")


def measure_totals(pool: PoolDefinition, lanes: Any) -> list[int]:
    """Each budget's measure summed over ``lanes``, in ``pool.params`` order (the full
    recomputation, from the declared measures, that the monitor compares with the kept totals)."""
    return [sum(int(MEASURES[name](lane)) for lane in lanes) for name in pool.params]


def compile_measures(pool: PoolDefinition) -> tuple[Callable[[Any], tuple[int, ...]], str]:
    """``measures(lane)``: what the lane uses of each budget, in ``pool.params`` order, as Python (the written
    module's for the shipped pool, else generated and ``exec``'d now), and its source."""
    return _function(pool, "measures")


def measures_source(pool: PoolDefinition) -> str:
    """The source of ``measures(l0)``, printed from :data:`MEASURES` on one lane."""
    view, lanes = _symbolic_view(pool, {})
    printer = _ReducedPrinter(pool.instance.definition, set(), pool.ghosts)
    terms = [z3.simplify(_as_int(MEASURES[name](lanes[0]))) for name in pool.params]
    return (f"def measures(l0):  # {pool.name}: each budget's use by one lane (kv_guard.MEASURES)\n"
            f"    return ({''.join(printer.expr(t) + ', ' for t in terms)})\n")


class _OneLanePrinter(_ReducedPrinter):
    """Python for a term over one lane's view: ``<ghost>_l0`` reads the lane's ghosts ``g``, a budget its local."""

    def symbol(self, name: str) -> str:
        if name.endswith("_l0") and name[:-3] in self.ghosts:
            return f"g[{name[:-3]!r}]"
        return super().symbol(name)


def compile_one_lane_invariants(pool: PoolDefinition) -> tuple[Callable[[Any, Any, Mapping[str, int]], list[str]], str]:
    """``broken(l0, g, budgets)``: the names of ``pool``'s declared invariants false on the view of the one lane
    ``l0`` with ghosts ``g`` and the budget parameters ``budgets`` (lowered by the other lanes' use), as
    straight-line Python from the z3 terms of the declared predicates on that view — how the machines' own
    invariants are compiled (codegen.generate_invariant_check). The pool monitor's usual part is one lane
    (kv_checks, *Parts*): issue #20, the expression helpers walked per part and per invariant were most of a
    sampled check. The written module's for the shipped pool, else generated and ``exec``'d now; and its source."""
    return _function(pool, "one_lane_broken")


def one_lane_invariants_source(pool: PoolDefinition) -> str:
    """The source of ``one_lane_broken(l0, g, budgets)``: each declared invariant of ``pool`` printed on the view of
    one lane."""
    inst = pool.instance.definition
    budgets = {name: z3.Int(name) for name in pool.params}
    view = PoolView([SymbolicVars(inst, "_l0")], budgets, [{g: z3.Int(f"{g}_l0") for g in pool.ghosts}])
    printer = _OneLanePrinter(inst, set(pool.params), pool.ghosts)
    lines = [f"def one_lane_broken(l0, g, budgets):  # {pool.name}'s invariants on a one-lane view (kv_guard)",
             *(f"    {name} = budgets[{name!r}]" for name in pool.params), "    broken = []"]
    for inv in pool.invariants:
        term = inv.predicate(view)
        term = z3.BoolVal(term) if isinstance(term, bool) else term
        lines += [f"    if not {printer.expr(z3.simplify(term))}:", f"        broken.append({inv.name!r})"]
    return "\n".join([*lines, "    return broken"]) + "\n"


def compile_moves(pool: PoolDefinition) -> tuple[Callable[[list[int], tuple[int, ...], Any], None], str]:
    """``moves(totals, before, l0)``: each budget's total in ``totals`` (``pool.params`` order) moved by what
    lane ``l0`` uses now less what it used ``before`` (its :func:`compile_measures` tuple before an event),
    one generated line per budget (issue #20: no loop, no second tuple per event). The written module's for the
    shipped pool, else generated and ``exec``'d now; and its source."""
    return _function(pool, "moves")


def moves_source(pool: PoolDefinition) -> str:
    """The source of ``moves(totals, before, l0)``, printed from :data:`MEASURES` on one lane."""
    view, lanes = _symbolic_view(pool, {})
    printer = _ReducedPrinter(pool.instance.definition, set(), pool.ghosts)
    lines = "".join(f"    totals[{k}] += ({printer.expr(z3.simplify(_as_int(MEASURES[name](lanes[0]))))}) - before[{k}]\n"
                    for k, name in enumerate(pool.params))
    return (f"def moves(totals, before, l0):  # {pool.name}: the budget totals follow one lane (kv_guard.MEASURES)\n"
            + (lines or "    pass\n"))


# ------------------------------------------------------------------ the written module (session 24)

WRITTEN = f"{GENERATED_PACKAGE}.kv_lane_pool"
"""The written module of the shipped KvLanePool's generated functions (``python -m calculet.specgen``)."""

_SOURCES: dict[str, tuple[Callable[[PoolDefinition], str], str]] = {
    "reserve_guard": (reserve_guard_source, "pool guard"),
    "measures": (measures_source, "pool measures"),
    "moves": (moves_source, "pool moves"),
    "one_lane_broken": (one_lane_invariants_source, "pool invariants"),
}
"""Each generated function, in the written module's order: its printer and the label of its ``exec``'d form."""


def pool_shape(pool: PoolDefinition) -> str:
    """What the written module of ``pool`` depends on besides the bodies of its reserve guard, its invariants and
    :data:`MEASURES`: the pool's name, budget parameters, ghosts, operations (and whether reserve has a guard),
    invariants' names, the measures' names and its instance machine's shape (:func:`calculet.machines.written.shape`).
    Without z3: checked at each import; a changed body is what ``specgen --check`` catches."""
    parts = (pool.name, tuple(pool.params), tuple(pool.ghosts), tuple(pool.ops), "reserve" in pool.ops
             and pool.ops["reserve"].guard is None, tuple(inv.name for inv in pool.invariants), tuple(MEASURES),
             shape(pool.instance.definition))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def module_source(pool: PoolDefinition, declaration: str) -> str:
    """The module text of ``pool``'s four generated functions: what ``python -m calculet.specgen`` writes to
    ``calculet/machines/generated/`` for the shipped KvLanePool."""
    header = [
        f'"""The generated functions of {pool.name}\'s reduced reserve guard, budget measures and one-lane',
        "invariants — do not edit: regenerate with `python -m calculet.specgen`.",
        "",
        "Printed by calculet.runtime.scheduling.kv_guard (issues #17, #20) from the z3 terms of the guard and the",
        "invariants declared in",
        f"{declaration}",
        "and of kv_guard.MEASURES; `python -m calculet.specgen --check` fails when this file is not what they",
        "produce. The KV lane manager and its monitor import it instead of generating it at start.",
        '"""',
        "",
        f"DECLARATION = {declaration!r}",
        f"SHAPE = {pool_shape(pool)!r}",
        "",
    ]
    return "\n".join(header) + "\n" + "\n\n".join(printer(pool) for printer, _ in _SOURCES.values())


def _written(pool: PoolDefinition) -> ModuleType | None:
    """The written module when ``pool`` is the shipped KvLanePool's declaration and the module was made for its shape;
    else None (another pool, or a stale module: then generated here, with a warning)."""
    if pool is not KvLanePool.definition:
        return None
    return import_written(WRITTEN, {"SHAPE": pool_shape(pool)}, f"{pool.name}'s functions", stacklevel=4)


def _function(pool: PoolDefinition, name: str) -> tuple[Any, str]:
    """The generated function ``name`` of ``pool`` and its source: the written module's, else printed and
    ``exec``'d now."""
    module = _written(pool)
    if module is not None:
        function = getattr(module, name)
        return function, inspect.getsource(function)
    printer, label = _SOURCES[name]
    source = printer(pool)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<calculet {label} {pool.name}>", "exec"), namespace)  # noqa: S102 - generated
    return namespace[name], source


def events_keeping_measures(pool: PoolDefinition) -> frozenset[str]:
    """The instance events none of whose rows can change any measure, proved with z3 from the
    declared guards and effects (the manager's batch paths fire these without updating totals)."""
    inst = pool.instance.definition
    states = list(inst.states)
    changing: set[str] = set()
    for t in inst.transitions:
        pre = SymbolicVars(inst)
        args = symbolic_args(inst.events[t.event])
        updates = {} if t.effect is None else dict(t.effect(pre, *[args[n] for n in t.effect_args]))
        post = pre.with_updates(updates, z3.IntVal(states.index(t.target)))
        solver = z3.Solver()
        solver.add(*pre.domain(), pre.state == states.index(t.source))
        solver.add(*[inv.predicate(pre) for inv in inst.invariants])
        if t.guard is not None:
            solver.add(_as_bool(t.guard(pre, *[args[n] for n in t.guard_args])))
        solver.add(z3.Or(*[_as_int(m(pre)) != _as_int(m(post)) for m in MEASURES.values()]))
        if solver.check() != z3.unsat:
            changing.add(t.event)
    return frozenset(inst.events) - changing


def prove_reduction(pool: PoolDefinition, n: int) -> str | None:
    """None if, for every pool of ``n`` ≥ 2 lanes, the declared reserve guard of lane 0 on the whole
    pool equals the compiled guard on the reduced view (lane 0, lane 1; budgets lowered by lanes
    2..n-1's measures) whenever lanes 2..n-1 do not hold (seq, generation); else a counterexample."""
    inst = pool.instance.definition
    op = pool.ops["reserve"]
    ev = inst.events["reserve"]
    lanes = [SymbolicVars(inst, f"_p{j}") for j in range(n)]
    ghosts = [{g: z3.Int(f"{g}_p{j}") for g in pool.ghosts} for j in range(n)]
    budgets = {name: z3.Int(name) for name in pool.params}
    args = symbolic_args(ev)
    full = PoolView(lanes, budgets, ghosts)
    whole = op.guard(full, 0, **args) if op.guard is not None else True
    rest = lanes[2:]
    lowered = {name: budgets[name] - sum((MEASURES[name](lane) for lane in rest), 0) for name in pool.params}
    reduced = PoolView(lanes[:2], lowered, ghosts[:2])
    small = op.guard(reduced, 0, **args) if op.guard is not None else True
    solver = z3.Solver()
    for lane in lanes:
        solver.add(*lane.domain())
        solver.add(*[inv.predicate(lane) for inv in inst.invariants])
    for name, decl in pool.params.items():
        constraint = decl.constraint(budgets[name])
        if constraint is not None:
            solver.add(constraint)
    for name, typ in ev.args.items():
        constraint = typ.constraint(args[name])
        if constraint is not None:
            solver.add(constraint)
    for lane in rest:  # what the (generation, seq) index guarantees of the lanes left out
        solver.add(z3.Not(z3.And(z3.Not(lane.at("free")), lane.seq_id == args["seq"],
                                 lane.generation == args["gen"])))
    solver.add(z3.Xor(_as_bool(whole), _as_bool(small)))
    if solver.check() == z3.unsat:
        return None
    return str(solver.model())


def _as_int(term: Any) -> Any:
    return z3.IntVal(term) if isinstance(term, int) else term


def _as_bool(term: Any) -> Any:
    return z3.BoolVal(term) if isinstance(term, bool) else term
