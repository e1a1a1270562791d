"""Run-time checks of the KV lane pool as a whole (§9.2, §5.1; issue #17 "state outside the machines").

Each lane's own invariants are monitored by its compiled instance. What no single lane can
check is checked here, after every KvLaneManager operation while monitors are on:

* the pool's declared invariants (:class:`~calculet.machines.kv_pool.KvLanePool`: one owner per
  (seq, generation), the KV-token and sequence budgets, the bound position) on the live lanes —
  the predicates ``verify`` proves;
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
"""

from __future__ import annotations

from typing import Any

from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.kv_guard import measure_totals

__all__ = ["check_pool", "check_reserve_decision", "index_faults"]

_POOL = KvLanePool.definition
_OWNED = frozenset({"reserved", "active", "updating"})


def index_faults(kv: Any) -> list[tuple[str, str]]:
    """(index, R-id) for each index of ``kv`` that disagrees with its lanes."""
    free, owner, by_seq = kv.indexes()
    lanes = [kv.lane(i) for i in range(kv.lanes)]
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
    if kv.budget_totals() != measure_totals(_POOL, lanes):
        faults.append(("index_budget_totals_are_the_lanes_sums", "R5.1.2"))
    return faults


def check_pool(kv: Any, after: str) -> None:
    """The pool's invariants and the manager's indexes, after the operation ``after``."""
    MONITOR.check_whole(_POOL.name, _POOL.invariants, kv.view, after,
                        state={"lanes": [(m.state, m.seq_id, m.generation) for m in kv.view.lanes]},
                        extra=index_faults(kv))


def check_reserve_decision(kv: Any, lane: int, args: dict[str, Any], allowed: bool) -> None:
    """The compiled reserve guard's decision ``allowed`` for ``lane`` and ``args`` against the
    declared guard of KvLanePool evaluated on every live lane (O(lanes): sampled like the rest)."""
    guard = _POOL.ops["reserve"].guard
    declared = True if guard is None else bool(guard(kv.view, lane, **args))
    extra = [] if declared == bool(allowed) else [("reserve_guard_is_the_declared_one", "R5.1.2")]
    MONITOR.check_whole(_POOL.name, (), kv.view, "reserve (decision)",
                        state={"lane": lane, "args": args, "compiled": bool(allowed), "declared": declared},
                        extra=extra)
