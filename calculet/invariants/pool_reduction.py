"""Which interleavings the pool's bounded model checking may skip, checked before it relies on it.

A run of the pool moves one lane per step. Many runs differ only in the order of steps on
different lanes and end in the same pool, so the search need explore one order of each (a
partial-order reduction). The orders kept are the *canonical* runs: among all runs equivalent to
a run (by the swaps below and by renaming lanes — the pool is symmetric), the one whose sequence
of (kind, lane) keys is lexicographically least, where a *local* row (no pool guard; its ghost
update reads only its own lane) ranks before a *guarded* one (a pool guard reads other lanes).
Such a run has:

* first touches in lane order (renaming lanes to first-touch order is the least renaming);
* two adjacent local steps on different lanes in lane order (they always commute);
* two adjacent guarded steps on different lanes in lane order — if guarded rows commute:
  ``g1(a); g2(b)`` enabled implies ``g2(b); g1(a)`` enabled (``guarded_commute``);
* never a guarded step followed by a local step on another lane — if a local step never
  disables a guarded one on another lane: ``g(a); x(b)`` enabled implies ``x(b); g(a)`` enabled
  (``local_first``; for KvLanePool: freeing, committing or releasing a lane never takes budget
  or an owner away from a reservation elsewhere).

Swapping two steps on different lanes leaves the same pool (effects and ghost updates are
per-lane), so each canonical run ends where its class does, at the same depth, and every depth
is checked: no reachable violation within the depth is lost. Each premise is proved with z3 on
the pool's own declaration, at the size the search encodes; a premise that does not hold only
drops its rule (the search gets slower, never unsound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from calculet.invariants.checks import as_bool, invariants_hold, post_state, solver, takes
from calculet.logic.symbolic import SymbolicVars, arg_domain, symbolic_args, type_domain
from calculet.machines.definition import Transition
from calculet.machines.pool import PoolDefinition, PoolView
from calculet.machines.system import Opaque, NotLocal

__all__ = ["Reduction", "reduction"]


@dataclass(frozen=True)
class Reduction:
    """The rows the search treats as local, and which reordering rules were proved sound."""

    local: frozenset[int]          # indexes into the instance's transitions
    guarded_commute: bool
    local_first: bool


def _ghost_is_local(p: PoolDefinition, event: str, n: int) -> bool:
    """The op's ghost update reads only the moving lane (evaluated with every other lane opaque)."""
    op = p.ops[event]
    if op.ghost is None:
        return True
    d = p.instance.definition
    lane = SymbolicVars(d, "_gl")
    ghosts = [{g: z3.Int(f"{g}_gl{j}") for g in p.ghosts} for j in range(n)]
    view = PoolView([lane] + [Opaque() for _ in range(n - 1)], {k: z3.Int(k) for k in p.params}, ghosts)
    try:
        op.ghost(view, 0, **symbolic_args(d.events[event], "_gl"))
    except NotLocal:
        return False
    return True


class _Pair:
    """Two lanes a=0 and b=1 of an ``n``-lane pool in an arbitrary state (types only)."""

    def __init__(self, p: PoolDefinition, n: int, lemmas: bool) -> None:
        d = p.instance.definition
        self.p, self.d = p, d
        self.lanes = [SymbolicVars(d, f"_pr{j}") for j in range(n)]
        self.ghosts = [{g: z3.Int(f"{g}_pr{j}") for g in p.ghosts} for j in range(n)]
        self.params = {k: z3.Int(f"{k}_pr") for k in p.params}
        self.domain = [*type_domain(p.params, self.params),
                       *[c for g in self.ghosts for c in type_domain(p.ghosts, g)],
                       *[c for lane in self.lanes for c in lane.domain()]]
        if lemmas:  # the instance invariants, which the search itself assumes in every frame
            self.domain += [as_bool(x) for lane in self.lanes for x in invariants_hold(d, lane)]

    def view(self, lanes: list[Any]) -> PoolView:
        return PoolView(lanes, self.params, self.ghosts)

    def move(self, lanes: list[Any], j: int, t: Transition, args: dict[str, Any]) -> tuple[Any, list[Any]]:
        """(enabled, lanes after) for lane ``j`` taking ``t`` in ``lanes``."""
        op = self.p.ops[t.event]
        guard = z3.BoolVal(True) if op.guard is None else as_bool(op.guard(self.view(lanes), j, **args))
        after = list(lanes)
        after[j] = post_state(self.d, t, lanes[j], args)
        return z3.And(takes(self.d, t, lanes[j], args), guard), after

    def holds(self, premise: Any, conclusion: Any, args: list[tuple[dict[str, Any], str]]) -> bool:
        s = solver()
        s.add(*self.domain, *[c for a, t in args for c in arg_domain(self.d.events[t], a)], premise,
              z3.Not(conclusion))
        return s.check() == z3.unsat


def reduction(p: PoolDefinition, n: int, lemmas: bool = True) -> Reduction:
    """The partial-order reduction ``check_pool_bmc`` may use on ``p`` at ``n`` encoded lanes.

    ``lemmas``: the lanes satisfy their machine's invariants (true of every reachable lane once
    the per-machine proofs hold, and assumed by the search in that mode); without it the premises
    are proved for any values of the declared types."""
    d = p.instance.definition
    rows = list(d.transitions)
    ghosts_local = {e: _ghost_is_local(p, e, max(n, 2)) for e in d.events}
    local = frozenset(i for i, t in enumerate(rows) if p.ops[t.event].guard is None and ghosts_local[t.event])
    guarded = [t for i, t in enumerate(rows) if i not in local]
    if not all(ghosts_local.values()):  # a swap could change a ghost: only local pairs reorder
        return Reduction(local, False, False)
    if not guarded or n < 2:
        return Reduction(local, True, True)
    pair = _Pair(p, n, lemmas)
    commute = True
    for g1 in guarded:
        for g2 in guarded:
            a1, a2 = symbolic_args(d.events[g1.event], "_c1"), symbolic_args(d.events[g2.event], "_c2")
            first, mid = pair.move(pair.lanes, 0, g1, a1)
            second, _ = pair.move(mid, 1, g2, a2)
            swapped_first, mid2 = pair.move(pair.lanes, 1, g2, a2)
            swapped_second, _ = pair.move(mid2, 0, g1, a1)
            if not pair.holds(z3.And(first, second), z3.And(swapped_first, swapped_second),
                              [(a1, g1.event), (a2, g2.event)]):
                commute = False
    first_local = True
    for g in guarded:
        for i in sorted(local):
            x = rows[i]
            ag, ax = symbolic_args(d.events[g.event], "_lg"), symbolic_args(d.events[x.event], "_lx")
            g_on, mid = pair.move(pair.lanes, 0, g, ag)
            x_on, _ = pair.move(mid, 1, x, ax)
            x_first, mid2 = pair.move(pair.lanes, 1, x, ax)
            g_after, _ = pair.move(mid2, 0, g, ag)
            if not pair.holds(z3.And(g_on, x_on), z3.And(x_first, g_after), [(ag, g.event), (ax, x.event)]):
                first_local = False
    return Reduction(local, commute, first_local)
