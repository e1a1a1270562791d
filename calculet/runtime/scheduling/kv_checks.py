"""Run-time checks of the KV lane pool as a whole (§9.2, §5.1; issue #17 "state outside the machines").

Each lane's own invariants are monitored by its compiled instance. What no single lane can
check is checked here, after KvLaneManager operations while monitors are on (every operation in
tests, sampled in production):

* the pool's declared invariants (:class:`~calculet.machines.kv_pool.KvLanePool`: one owner per
  (seq, generation), the KV-token and sequence budgets, the bound position) on the live lanes —
  the predicates ``verify`` proves, evaluated on the part of the pool that moved (below);
* every index the manager keeps beside the machines against the machines themselves: the free
  list names exactly the Free lanes, once each; ``(generation, seq) → lane`` names exactly the
  held lanes' owners; a lease owns exactly the lanes its request may still use (Reserved, Active,
  Updating, or an Unknown lane not yet detached); each budget total the manager keeps for the
  compiled reserve guard equals the declared measure summed over the lanes
  (:mod:`calculet.runtime.scheduling.kv_guard`);
* at a sampled reservation, the decision of the compiled reserve guard against the declared
  guard evaluated on the whole live pool, before the lane moves (:func:`check_reserve_decision`).

A stale index is reported like a broken invariant (``InvariantViolation`` in tests, a count in
production), so it cannot drift from the machines unnoticed.

Why checking part of the pool is enough (issue #20: the whole-pool check was O(lanes²) — the
uniqueness invariant is a ∀ over pairs — and 87 % of a B16 run with every event checked).

*What moved.* The monitor keeps, per manager, each lane's values (state, variables, ghosts) as its
last check saw them and each budget measure's sum over the lanes. A check compares every lane
with that snapshot (O(lanes) tuple comparisons, no predicate), so a lane changed behind the
manager's back is seen like any other; the sums follow the changed lanes' measures.

*Kept lanes.* Call two held lanes related when they name the same (seq_id, generation). The kept
set ``S`` is the changed lanes and every held lane related to a changed one; it is closed: no
lane of ``S`` is related to a lane outside it.

*Restriction* (:func:`~calculet.runtime.scheduling.kv_check_proof.prove_restriction`, proved with z3
for every declared invariant in the tests): if the last check passed, the lanes outside ``S`` are
unchanged and ``S`` is closed, each invariant on the whole pool equals the same invariant on the
view of ``S`` alone with each budget parameter lowered by what the lanes outside ``S`` use of it
(:data:`~calculet.runtime.scheduling.kv_guard.MEASURES`).

*Parts* (:func:`~calculet.runtime.scheduling.kv_check_proof.prove_split`, proved the same way):
splitting a pool into two parts no lane of which is related across equals, for each invariant,
the conjunction of the invariant on each part with the budgets lowered by the other part's use.
So ``S`` is evaluated as its related groups — usually one lane each — and the verdict is their
conjunction: a check costs the lanes that moved, not (lanes)² pairs.

*One lane.* A one-lane group (the usual part) is judged by a function generated from the declared
predicates' z3 terms on a one-lane view (:func:`~calculet.runtime.scheduling.kv_guard.compile_one_lane_invariants`,
as the machines' own invariants are compiled), not by walking the expression helpers per part and per
invariant (issue #20: a 16-lane check, every lane held and moved, 145 -> 68 us CPU); a larger group evaluates
the declared predicates. The tests compare the generated check with the declared predicates on random lanes.

A check that finds a fault forgets its snapshot, so the next check looks at the whole pool again:
a state broken in production (where a violation is counted, not raised) is reported again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, count
from operator import attrgetter, itemgetter, ne
from typing import Any, Sequence

from calculet.machines import KvSequenceMachine
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.machines.pool import PoolView
from calculet.runtime.scheduling.kv_guard import compile_measures, compile_one_lane_invariants, measure_totals
from calculet.runtime.scheduling.partwise import AcrossParts

__all__ = ["Part", "PoolMonitor", "check_pool", "check_reserve_decision", "index_faults"]

_POOL = KvLanePool.definition
_OWNED = frozenset({"reserved", "active"})
_MEASURES, _ = compile_measures(_POOL)
_VALUES = attrgetter("state", *KvSequenceMachine.definition.vars)
"""A lane's state and every declared variable: what the pool's predicates and measures may read."""
_GHOSTS = itemgetter(*KvLanePool.definition.ghosts) if KvLanePool.definition.ghosts else (lambda g: ())
"""A lane's pool ghosts (what ``batch_position_is_committed_len`` reads besides the lane)."""
_SEQ = 1 + list(KvSequenceMachine.definition.vars).index("seq_id")
_GEN = 1 + list(KvSequenceMachine.definition.vars).index("generation")


def _key(values: tuple[Any, ...]) -> tuple[Any, Any] | None:
    """The relation's key of a lane: (seq_id, generation) while held, None for a Free lane (related to none)."""
    if values[0] == "free":
        return None
    return values[_SEQ], values[_GEN]


@dataclass(frozen=True)
class Part:
    """A related group of kept lanes: their view (budgets lowered by every other lane's use) and indices."""

    view: PoolView
    lanes: tuple[int, ...]
    broken: tuple[str, ...] | None = None
    """For a one-lane part: the invariants its view breaks, by the generated check (:func:`_compiled`); None:
    the declared predicates are evaluated on the view."""



_COMPILED: dict[int, tuple[Any, tuple[AcrossParts, ...], Any]] = {}


def _compiled(pool: Any) -> tuple[tuple[AcrossParts, ...], Any]:
    """``pool``'s invariants over the parts and their one-lane check generated from the declared predicates'
    z3 terms (:func:`~calculet.runtime.scheduling.kv_guard.compile_one_lane_invariants`), once per declaration
    (the monitor reads the module's ``_POOL`` at each check: a test may swap the declaration)."""
    hit = _COMPILED.get(id(pool))
    if hit is None or hit[0] is not pool:
        hit = _COMPILED[id(pool)] = (pool, tuple(AcrossParts(inv) for inv in pool.invariants),
                                     compile_one_lane_invariants(pool)[0])
    return hit[1], hit[2]


class PoolMonitor:
    """What the last check of one manager's pool saw, so that the next one evaluates only what moved."""

    def __init__(self) -> None:
        self._seen: list[tuple[Any, ...]] | None = None
        self._ghosts_seen: list[Any] = []
        self._measures: list[tuple[int, ...]] = []
        self._totals: list[int] = []
        self._by_key: dict[tuple[Any, Any], set[int]] = {}
        """The held lanes of each (seq_id, generation) in the snapshot (kept with it: the related lanes)."""

    def forget(self) -> None:
        """The next check looks at every lane (after a fault, so that it is reported again)."""
        self._seen = None

    def totals(self) -> list[int]:
        """Each budget measure summed over the lanes as of the last check (``pool.params`` order)."""
        return list(self._totals)

    def _changed(self, kv: Any) -> tuple[list[tuple[Any, ...]], list[int]]:
        """The snapshot now and the lanes whose values or ghosts differ from the last one (compared in C:
        ``map`` of the attribute getter and of ``!=``); measures, totals and the key index follow them."""
        lanes, ghosts = kv.lane_list(), kv.ghost_list()
        now = list(map(_VALUES, lanes))
        ghosts_now = list(map(_GHOSTS, ghosts))
        seen = self._seen
        if seen is None or len(seen) != len(now):
            self._measures = [tuple(_MEASURES(m)) for m in lanes]
            self._totals = [sum(column) for column in zip(*self._measures)] if lanes else []
            by_key: dict[tuple[Any, Any], set[int]] = {}
            for j, values in enumerate(now):
                key = _key(values)
                if key is not None:
                    by_key.setdefault(key, set()).add(j)
            self._by_key = by_key
            changed = list(range(len(now)))
        else:
            changed = sorted(set(compress(count(), map(ne, now, seen)))
                             | set(compress(count(), map(ne, ghosts_now, self._ghosts_seen))))
            totals, measures, by_key = self._totals, self._measures, self._by_key
            for j in changed:
                new = tuple(_MEASURES(lanes[j]))
                old = measures[j]
                for k, value in enumerate(new):
                    totals[k] += value - old[k]
                measures[j] = new
                before, after = _key(seen[j]), _key(now[j])
                if before != after:
                    if before is not None:
                        by_key[before].discard(j)
                        if not by_key[before]:
                            del by_key[before]
                    if after is not None:
                        by_key.setdefault(after, set()).add(j)
        self._seen = now
        self._ghosts_seen = ghosts_now
        return now, changed

    def advance(self, kv: Any) -> list[Part]:
        """The parts over what moved since the last call (module doc), the snapshot moved on to now:
        each changed lane's group is it and the held lanes of its (seq_id, generation)."""
        now, changed = self._changed(kv)
        if not changed:
            return []
        groups: dict[Any, set[int]] = {}
        by_key = self._by_key
        for j in changed:
            key = _key(now[j])
            if key is None:
                groups[("lane", j)] = {j}
            elif key not in groups:
                groups[key] = set(by_key[key])
        lanes, ghosts = kv.lane_list(), kv.ghost_list()
        params = kv.pool_params
        one_lane_broken = _compiled(_POOL)[1]
        totals, measures = self._totals, self._measures
        parts = []
        for group in groups.values():
            members = sorted(group)
            lowered = {}
            for k, name in enumerate(_POOL.params):
                outside = totals[k] - sum(measures[j][k] for j in members)
                lowered[name] = params[name] - outside
            view = PoolView([lanes[j] for j in members], lowered, [ghosts[j] for j in members])
            one = tuple(one_lane_broken(lanes[members[0]], ghosts[members[0]], lowered)) if len(members) == 1 else None
            parts.append(Part(view, tuple(members), one))
        return parts

    @staticmethod
    def verdict(parts: Sequence[Part], pool: Any = None) -> list[str]:
        """The declared invariants (of ``pool``, default KvLanePool) false on some part."""
        if pool is None or pool is _POOL:  # the parts' one-lane verdicts are _POOL's
            return [a.name for a in _compiled(_POOL)[0] if not a.predicate(parts)]
        return [inv.name for inv in pool.invariants if not all(inv.predicate(p.view) for p in parts)]


def whole_verdict(kv: Any, pool: Any = None) -> list[str]:
    """The declared invariants false on the whole live pool, evaluated as written (tests compare it
    with the restricted verdict; O(lanes²))."""
    invariants = (_POOL if pool is None else pool).invariants
    return [inv.name for inv in invariants if not inv.predicate(kv.view)]


def index_faults(kv: Any, totals: list[int] | None = None) -> list[tuple[str, str]]:
    """(index, R-id) for each index of ``kv`` that disagrees with its lanes. ``totals``: each
    budget's measure summed over the lanes, if the caller has it (else recomputed from the
    declared measures, O(lanes) predicate calls)."""
    free, owner, by_seq = kv.indexes()
    lanes = kv.lane_list()
    faults: list[tuple[str, str]] = []
    if sorted(free) != [i for i, m in enumerate(lanes) if m.state == "free"]:
        faults.append(("index_free_list_is_the_free_lanes", "R9.2.2"))
    held = {(m.generation, m.seq_id): i for i, m in enumerate(lanes) if m.state != "free"}
    if by_seq != held:
        faults.append(("index_seq_names_the_held_lanes", "R9.2.1"))
    for i, m in enumerate(lanes):
        if (m.state in _OWNED and owner[i] == 0) or (owner[i] != 0 and m.state not in _OWNED | {"unknown"}):
            faults.append(("index_lease_owns_a_usable_lane", "R9.2.2"))
            break
    if kv.budget_totals() != (measure_totals(_POOL, lanes) if totals is None else totals):
        faults.append(("index_budget_totals_are_the_lanes_sums", "R5.1.2"))
    return faults


def check_pool(kv: Any, after: str) -> None:
    """The pool's invariants on what moved since the last check, and the manager's indexes, after
    the operation ``after`` (the module doc says why the part that moved decides the whole)."""
    monitor: PoolMonitor = kv.pool_monitor
    parts = monitor.advance(kv)
    faults = index_faults(kv, monitor.totals())
    invariants = _compiled(_POOL)[0] if parts else ()
    state = {"lanes": {j: (m.state, m.seq_id, m.generation) for p in parts
                       for j, m in zip(p.lanes, p.view.lanes)}}
    try:
        broken = MONITOR.check_whole(_POOL.name, invariants, parts, after, state=state, extra=faults)
    except Exception:
        monitor.forget()
        raise
    if broken:
        monitor.forget()  # counted, not raised: look at the whole pool next time, so it is reported again


def check_reserve_decision(kv: Any, lane: int, args: dict[str, Any], allowed: bool) -> None:
    """The compiled reserve guard's decision ``allowed`` for ``lane`` and ``args`` against the
    declared guard of KvLanePool evaluated on every live lane (O(lanes): sampled like the rest)."""
    guard = _POOL.ops["reserve"].guard
    declared = True if guard is None else bool(guard(kv.view, lane, **args))
    extra = [] if declared == bool(allowed) else [("reserve_guard_is_the_declared_one", "R5.1.2")]
    MONITOR.check_whole(_POOL.name, (), kv.view, "reserve (decision)",
                        state={"lane": lane, "args": args, "compiled": bool(allowed), "declared": declared},
                        extra=extra)
