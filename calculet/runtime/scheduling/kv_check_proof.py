"""Why the KV pool monitor may check only the lanes that moved: the two lemmas, proved with z3.

:mod:`calculet.runtime.scheduling.kv_checks` evaluates the declared pool invariants on the lanes
changed since its last check and the held lanes related to them (same (seq_id, generation)),
split into related groups, each group's budgets lowered by what every other lane uses. That is
the whole-pool verdict because of two lemmas about the *declared* invariants — proved here over
every subset of a pool of ``n`` lanes, on the same predicates ``verify`` proves and the monitor
evaluates, so an invariant of another shape (a count of something no measure captures, a
relation between unrelated lanes) makes a proof fail in the tests rather than the monitor
silently check too little (issue #20, the treatment the joint check got; issue #17: the runtime
checks what is proved):

* :func:`prove_restriction` — if the whole pool satisfied every invariant at the last check, the
  lanes outside ``S`` kept every value and no lane of ``S`` is related to one outside it, then each
  invariant on the whole pool now equals that invariant on the view of ``S`` with each budget
  parameter lowered by the measures of the lanes outside ``S`` (for ``S`` empty: it holds);
* :func:`prove_split` — for any budgets, if no lane of ``A`` is related to one outside it, each
  invariant on the pool equals its conjunction over the views of ``A`` and of the rest, each with
  the budgets lowered by the other's measures.

Applying the second lemma repeatedly splits ``S`` into its related groups. The measures are
:data:`~calculet.runtime.scheduling.kv_guard.MEASURES`, the ones the compiled reserve guard is
proved with.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Iterator, Sequence

import z3

from calculet.logic.expr import And, Not
from calculet.logic.symbolic import SymbolicVars
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.runtime.scheduling.kv_guard import MEASURES

__all__ = ["prove_restriction", "prove_split", "related"]


def related(a: Any, b: Any) -> Any:
    """The monitor's relation between two lanes (kv_checks ``_key``): both held, same (seq_id, generation)."""
    return And(Not(a.at("free")), Not(b.at("free")), a.seq_id == b.seq_id, a.generation == b.generation)


def _bool(term: Any) -> Any:
    return z3.BoolVal(term) if isinstance(term, bool) else term


def _int(term: Any) -> Any:
    return z3.IntVal(term) if isinstance(term, int) else term


def _subsets(n: int) -> Iterator[tuple[int, ...]]:
    for size in range(n + 1):
        yield from combinations(range(n), size)


def _lanes(pool: PoolDefinition, n: int, tag: str) -> tuple[list[SymbolicVars], list[dict[str, Any]]]:
    inst = pool.instance.definition
    return ([SymbolicVars(inst, f"_{tag}{j}") for j in range(n)],
            [{g: z3.Int(f"{g}_{tag}{j}") for g in pool.ghosts} for j in range(n)])


def _lowered(pool: PoolDefinition, params: dict[str, Any], lanes: Sequence[Any]) -> dict[str, Any]:
    """Each budget parameter minus what ``lanes`` use of it."""
    return {name: params[name] - sum((_int(MEASURES[name](lane)) for lane in lanes), z3.IntVal(0))
            for name in pool.params}


def _view(pool: PoolDefinition, lanes: list[Any], ghosts: list[Any], params: dict[str, Any], keep: Sequence[int],
          ) -> PoolView:
    """The view of the lanes ``keep``, the budgets lowered by every other lane's measures."""
    rest = [lanes[j] for j in range(len(lanes)) if j not in keep]
    return PoolView([lanes[j] for j in keep], _lowered(pool, params, rest), [ghosts[j] for j in keep])


def _closed(lanes: list[Any], keep: Sequence[int]) -> list[Any]:
    """No lane of ``keep`` is related to a lane outside it."""
    out = [j for j in range(len(lanes)) if j not in keep]
    return [Not(_bool(related(lanes[a], lanes[b]))) for a in keep for b in out]


def _same(pool: PoolDefinition, x: SymbolicVars, gx: dict[str, Any], o: SymbolicVars, go: dict[str, Any]) -> list[Any]:
    return [x.state == o.state, *[x.value(name) == o.value(name) for name in x.names()],
            *[gx[g] == go[g] for g in pool.ghosts]]


def prove_restriction(pool: PoolDefinition, n: int) -> list[str]:
    """Counterexamples (empty: proved) to the restriction lemma (module doc) for every declared
    invariant of ``pool`` and every subset ``S`` of ``n`` lanes."""
    old, old_ghosts = _lanes(pool, n, "o")
    new, new_ghosts = _lanes(pool, n, "x")
    params = {name: z3.Int(name) for name in pool.params}
    base = [c for lane in old + new for c in lane.domain()]
    base += [c for name, decl in pool.params.items() if (c := decl.constraint(params[name])) is not None]
    base += [_bool(inv.predicate(PoolView(old, params, old_ghosts))) for inv in pool.invariants]
    failures = []
    for keep in _subsets(n):
        assumptions = list(base) + _closed(new, keep)
        for j in range(n):
            if j not in keep:
                assumptions += _same(pool, new[j], new_ghosts[j], old[j], old_ghosts[j])
        for inv in pool.invariants:
            whole = _bool(inv.predicate(PoolView(new, params, new_ghosts)))
            part = _bool(inv.predicate(_view(pool, new, new_ghosts, params, keep))) if keep else z3.BoolVal(True)
            solver = z3.Solver()
            solver.add(*assumptions, z3.Xor(whole, part))
            if solver.check() != z3.unsat:
                failures.append(f"{inv.name} with lanes {keep} kept of {n}: {solver.model()}")
    return failures


def prove_split(pool: PoolDefinition, n: int) -> list[str]:
    """Counterexamples (empty: proved) to the split lemma (module doc) for every declared invariant
    of ``pool`` and every split of ``n`` lanes into two non-empty parts, whatever the budgets."""
    lanes, ghosts = _lanes(pool, n, "s")
    params = {name: z3.Int(name) for name in pool.params}
    base = [c for lane in lanes for c in lane.domain()]
    failures = []
    for keep in _subsets(n):
        rest = tuple(j for j in range(n) if j not in keep)
        if not keep or not rest or keep > rest:  # each split once
            continue
        assumptions = base + _closed(lanes, keep)
        for inv in pool.invariants:
            whole = _bool(inv.predicate(PoolView(lanes, params, ghosts)))
            split = z3.And(_bool(inv.predicate(_view(pool, lanes, ghosts, params, keep))),
                           _bool(inv.predicate(_view(pool, lanes, ghosts, params, rest))))
            solver = z3.Solver()
            solver.add(*assumptions, z3.Xor(whole, split))
            if solver.check() != z3.unsat:
                failures.append(f"{inv.name} split {keep} | {rest}: {solver.model()}")
    return failures
