"""Run-time monitor of the requests × KV lanes coupling (§4, §9.2; issue #17).

:class:`~calculet.machines.request_lanes.RequestLaneSystem` proves how a request and its lane
move together; this evaluates the *same* invariants on the live objects — each request's
machine, the KV manager's lanes, each record's lease as the binding and its sequence id — so a
runtime that couples them differently from the proof is caught where it runs. It is fed every
request transition (``observe``) and checked between actor calls (``check``), when each coupled
step is complete: on in every test, sampled in production (the engine calls it each tick).

Why checking part of the system is enough. Every joint invariant is a ∀ over at most two
requests and one lane that reads only the instances it names (the shape the induction's cutoff
argument already relies on, :mod:`calculet.invariants.system_checks`). So after a check that
passed, a broken instance must involve something that changed since: a request that made a
transition, or a lane whose values changed (compared with the last check's snapshot). Each check
evaluates the declared predicates on a view of *every* lane and the requests such an instance
can involve: the changed requests (a transition, or a lease that moved), those bound to a changed lane or
to a changed request's lane, and those a changed lane names. A request still waiting, never leased and bound to nothing
satisfies every invariant whatever the rest is, so it is never kept. This keeps a check
proportional to what moved, not to the whole system.
"""

from __future__ import annotations

from typing import Any, Callable

from calculet.machines.monitor import MONITOR
from calculet.machines.request import ENDED, WAITING
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import NONE, SystemView

__all__ = ["JointMonitor"]

_SYSTEM = RequestLaneSystem.definition


def _lane_values(m: Any) -> tuple[Any, ...]:
    return (m.state, m.seq_id, m.generation, m.committed_len, m.reserved_len, m.pending)


class JointMonitor:
    """The live requests × lanes system, as the joint model's invariants read it."""

    def __init__(self) -> None:
        self.records: dict[int, Any] = {}   # requests that hold, held, or were leased a lane
        self.seq: dict[int, int] = {}       # their lease's seq id (the model's seq[i])
        self._dirty: set[int] = set()
        self._lingering: set[int] = set()   # ended, but a held lane still names them
        self._seen: list[tuple[Any, ...]] | None = None
        self._bound: dict[int, int] = {}    # each kept record's binding at the last check

    def observe(self, rec: Any, source: str = "", target: str = "") -> None:
        """A request transition (the registry's listener signature)."""
        rid = rec.request_id
        if rec.lease is not None:
            self.seq.setdefault(rid, rec.lease.seq_id)
        if rid in self.records or rec.lease is not None or rid in self.seq or rec.machine.state not in WAITING:
            self.records[rid] = rec
            self._dirty.add(rid)

    def view(self, kv: Any, ids: Any = None) -> tuple[SystemView, list[Any]]:
        """The system view over every lane and the records ``ids`` (default: all kept)."""
        recs = [self.records[i] for i in (self.records if ids is None else ids) if i in self.records]
        view = SystemView([rec.machine for rec in recs], [kv.lane(j) for j in range(kv.lanes)],
                          [rec.lease.lane if rec.lease is not None else NONE for rec in recs],
                          [self.seq.get(rec.request_id, -rec.request_id) for rec in recs])
        return view, recs

    def _involved(self, kv: Any) -> set[int]:
        """The requests a broken instance could involve, given what changed since the last check."""
        snapshot = [_lane_values(kv.lane(j)) for j in range(kv.lanes)]
        seen = self._seen
        lanes = {j for j, values in enumerate(snapshot) if seen is None or j >= len(seen) or seen[j] != values}
        named = {(values[1], values[2]) for j, values in enumerate(snapshot) if j in lanes and values[0] != "free"}
        self._seen = snapshot
        ids = set(self._dirty) | self._lingering
        bound = {rid: rec.lease.lane if rec.lease is not None else NONE for rid, rec in self.records.items()}
        ids |= {rid for rid, lane in bound.items() if self._bound.get(rid, NONE) != lane}  # a lease moved silently
        self._bound = bound
        lanes |= {bound[i] for i in ids if bound.get(i, NONE) != NONE}
        for rid, rec in self.records.items():
            if bound[rid] in lanes or (self.seq.get(rid), rec.machine.generation) in named:
                ids.add(rid)
        self._dirty.clear()
        return ids

    def _forget_ended(self, kv: Any, ids: set[int]) -> None:
        """An ended request no held lane names is done with lanes for good: dropped."""
        held = {(kv.lane(j).seq_id, kv.lane(j).generation) for j in range(kv.lanes) if kv.lane(j).state != "free"}
        for rid in ids:
            rec = self.records.get(rid)
            if rec is None or rec.machine.state not in ENDED:
                continue
            if (self.seq.get(rid), rec.machine.generation) in held:
                self._lingering.add(rid)
            else:
                self._lingering.discard(rid)
                del self.records[rid]
                self.seq.pop(rid, None)

    def broken(self, kv: Any) -> list[str]:
        """Every joint invariant that is false on the whole kept system (tests)."""
        view, _ = self.view(kv)
        return [inv.name for inv in _SYSTEM.invariants if not inv.predicate(view)]

    def check(self, kv: Any, after: str, extra: Callable[[], list[tuple[str, str]]] | None = None) -> None:
        """Every joint invariant on the part of the live system that moved (see the module doc);
        ``extra`` adds the faults of other indexes kept beside machines (reported the same way)."""
        if not MONITOR.enabled or not MONITOR.sampled():
            return
        ids = self._involved(kv)
        faults = extra() if extra is not None else []
        if ids or faults:
            view, recs = self.view(kv, sorted(ids))
            state = {"requests": {rec.request_id: (rec.machine.state, rec.lease.lane if rec.lease else None)
                                  for rec in recs},
                     "lanes": [(kv.lane(j).state, kv.lane(j).seq_id) for j in range(kv.lanes)]}
            MONITOR.check_whole(_SYSTEM.name, _SYSTEM.invariants, view, after, state=state, extra=faults)
        self._forget_ended(kv, ids)
