"""Run-time monitor of the requests × KV lanes coupling (§4, §9.2; issue #17).

:class:`~calculet.machines.request_lanes.RequestLaneSystem` proves how a request and its lane
move together; this evaluates the *same* invariants on the live objects — each request's
machine, the KV manager's lanes, each record's lease as the binding and its sequence id — so a
runtime that couples them differently from the proof is caught where it runs. It is fed every
request transition (``observe``) and checked between actor calls (``check``), when each coupled
step is complete: on in every test, sampled in production (the engine calls it each tick).

Why checking part of the system is enough (issue #20: a check proportional to what moved).

*Shape.* Every declared joint invariant is a ∀ over at most two requests and one lane (``all_requests``,
``all_pairs``, or the explicit pair × lane ∀ of ``lane_bound_at_most_once``) whose instance reads only the
instances it names — the shape the induction's cutoff argument already relies on
(:mod:`calculet.invariants.system_checks`); none is a count over all lanes or requests
(``SystemInvariant.counts`` is false for every one, and the tests assert it).

*Relatedness.* Call lane ``j`` related to request ``i`` when ``i`` is bound to ``j`` (its lease) or ``j``'s
``seq_id`` is ``i``'s seq id (in any lane state). Every instance whose lane is related to none of its requests
holds whatever the values are, because each conjunct over a lane is guarded by one of those two facts:
``holding_request_owns_one_lane`` (``bound(i, j) → …`` and ``held ∧ owns(i, j) → bound(i, j)``; its
``binding[i] ≠ NONE`` reads no lane), ``lane_bound_at_most_once`` (``¬(bound(a, j) ∧ bound(b, j))``),
``decode_position_is_committed_len``, ``unknown_lane_unbound``, ``free_lane_unbound`` and
``request_and_lane_phases_agree`` (``bound(i, j) → …``), ``ended_request_holds_no_lane``
(``¬(working(j) ∧ owns(i, j))``, owns needing the seq id; its ``unbound(i)`` reads no lane),
``unadmitted_request_named_by_no_lane`` (``seq_id(j) = seq[i]``) and ``bound_exactly_while_holding`` (no
lane). The tests prove this lemma with z3 for every declared invariant (dropping a lane related to no
request never changes its value), so an invariant added with another shape fails there, not silently here.

*Requests.* After a check that passed, a broken instance must involve something that changed since: a request
that made a transition or whose lease moved, or a lane whose values changed (against the last check's
snapshot). So the kept requests are the changed ones, those bound to a changed lane or to a changed request's
lane, and those a changed lane names (same seq id and generation); a request still waiting, never leased and
bound to nothing satisfies every invariant whatever the rest is, so it is never kept.

*Lanes.* A broken instance whose lane changed has that lane in the view. One whose lane did not change has a
changed (so kept) request, and by relatedness its lane is related to a request of the instance: bound to a
kept request, or naming a kept request's seq id — or bound to / naming an unchanged request of a two-request
instance, which is ``lane_bound_at_most_once`` and false only when the lane is bound to *both*, so bound to
the kept one too. The view's lanes are therefore the changed lanes, the lanes bound to a kept request and the
lanes whose seq id is a kept request's — nothing else can be part of a newly broken instance.

*Parts.* By relatedness again, an instance that mixes requests and lanes of two connected components of the
relation (kept requests × those lanes) holds, so the declared predicates are evaluated on each component's
own view — usually one request and its lane — and the verdict is their conjunction: a check costs what moved,
not (kept requests)² × lanes as one view over everything would (``lane_bound_at_most_once`` is a ∀ over
pairs × lanes).

*Small parts.* A part of at most one request and one lane (a decode step's usual part) is judged by a check
generated from the declared predicates' z3 terms on a symbolic part of that shape (:mod:`.joint_codegen`), not by
walking the expression helpers per part and per invariant (issue #20: 16 decoding requests, every one moved,
143 -> 69-82 us CPU per check; with every event checked, as in the tests, that walk was half of a B16 run's host
CPU). A larger part evaluates the declared predicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from calculet.machines.monitor import MONITOR
from calculet.machines.request import ENDED, WAITING
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import NONE, SystemView
from calculet.runtime.scheduling.joint_codegen import compile_part_check
from calculet.runtime.scheduling.partwise import AcrossParts

__all__ = ["JointMonitor", "Part"]

_SYSTEM = RequestLaneSystem.definition
ELSEWHERE = -2  # a part's binding for a lease outside the part's lanes (not NONE, never an index)


def _lane_values(m: Any) -> tuple[Any, ...]:
    return (m.state, m.seq_id, m.generation, m.committed_len, m.reserved_len)


@dataclass(frozen=True)
class Part:
    """One connected component of the relation: its view, its records and its lanes' indices in the manager."""

    view: SystemView
    records: tuple[Any, ...]
    lanes: tuple[int, ...]
    broken: tuple[str, ...] | None = None
    """For a part of at most one request and one lane: the invariants it breaks, by the check generated from
    the declared predicates (:mod:`.joint_codegen`); None: the declared predicates are evaluated on the view."""



_ACROSS = tuple(AcrossParts(inv) for inv in _SYSTEM.invariants)
_PART_CHECKS = {(r, l): compile_part_check(_SYSTEM, r, l) for r in (0, 1) for l in (0, 1)}
"""The generated check of each small part shape (requests, lanes), None where the declaration is evaluated."""


def _small_part_broken(view: SystemView) -> tuple[str, ...] | None:
    check = _PART_CHECKS.get((len(view.requests), len(view.lanes)))
    if check is None:
        return None
    reqs, lanes = view.requests, view.lanes
    return tuple(check(reqs[0] if reqs else None, lanes[0] if lanes else None,
                       view.binding[0] if reqs else 0, view.seq[0] if reqs else 0))


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
        """A request transition (the registry's listener signature): a record is kept, and marked for the next
        check, once it holds or held a lane or left the waiting states (the model's requests are those; a
        waiting one is not yet in the system)."""
        rid = rec.request_id
        if rec.lease is not None:
            self.seq.setdefault(rid, rec.lease.seq_id)
        if rid in self.records or rec.lease is not None or rid in self.seq or rec.machine.state not in WAITING:
            self.records[rid] = rec
            self._dirty.add(rid)

    def observe_step(self, recs: Sequence[Any], source: str = "", targets: Sequence[str] = ()) -> None:
        """A decode step's moves (the registry's quiet listener signature, one call per step, #20): :meth:`observe`
        of each record. Each is in decode: it holds its lane, so :meth:`observe` keeps and marks it, and its lease's
        seq id is kept already (since the move that gave it the lease)."""
        records, dirty = self.records, self._dirty
        for rec in recs:
            rid = rec.request_id
            records[rid] = rec
            dirty.add(rid)

    def _seq_of(self, rec: Any) -> int:
        return self.seq.get(rec.request_id, -rec.request_id)

    def view(self, kv: Any, ids: Any = None, lanes: Sequence[int] | None = None) -> tuple[SystemView, list[Any]]:
        """The system view over the lanes ``lanes`` (default: every lane) and the records ``ids`` (default: all
        kept); a lease on a lane outside ``lanes`` is bound elsewhere (:data:`ELSEWHERE`)."""
        recs = [self.records[i] for i in (self.records if ids is None else ids) if i in self.records]
        lanes = range(kv.lanes) if lanes is None else lanes
        index = {j: k for k, j in enumerate(lanes)}
        binding = [NONE if rec.lease is None else index.get(rec.lease.lane, ELSEWHERE) for rec in recs]
        view = SystemView([rec.machine for rec in recs], [kv.lane(j) for j in lanes], binding,
                          [self._seq_of(rec) for rec in recs])
        return view, recs

    def _involved(self, kv: Any) -> tuple[set[int], set[int]]:
        """The requests and lanes a broken instance could involve, given what changed since the last check."""
        snapshot = [_lane_values(kv.lane(j)) for j in range(kv.lanes)]
        seen = self._seen
        lanes = {j for j, values in enumerate(snapshot) if seen is None or j >= len(seen) or seen[j] != values}
        changed = set(lanes)
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
        ids &= self.records.keys()
        # The view's lanes (module doc, *Lanes*): changed, bound to a kept request, or naming a kept one's seq id.
        seqs = {self._seq_of(self.records[i]) for i in ids}
        related = {bound[i] for i in ids if 0 <= bound[i] < kv.lanes}
        related |= {j for j, values in enumerate(snapshot) if values[1] in seqs}
        return ids, changed | related

    def parts(self, kv: Any, ids: set[int], lanes: set[int]) -> list[Part]:
        """The connected components of the relation over the records ``ids`` and the lanes ``lanes`` (module
        doc, *Parts*): a lane joins the requests bound to it and those whose seq id it names."""
        parent: dict[Any, Any] = {}

        def root(x: Any) -> Any:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        by_seq: dict[int, list[int]] = {}
        for rid in ids:
            root(("r", rid))
            by_seq.setdefault(self._seq_of(self.records[rid]), []).append(rid)
            lease = self.records[rid].lease
            if lease is not None and lease.lane in lanes:
                parent[root(("r", rid))] = root(("l", lease.lane))
        for j in lanes:
            root(("l", j))
            for rid in by_seq.get(kv.lane(j).seq_id, ()):
                parent[root(("r", rid))] = root(("l", j))
        groups: dict[Any, tuple[list[int], list[int]]] = {}
        for kind, x in list(parent):
            members = groups.setdefault(root((kind, x)), ([], []))
            members[0 if kind == "r" else 1].append(x)
        parts = []
        for rids, js in groups.values():
            view, recs = self.view(kv, sorted(rids), sorted(js))
            parts.append(Part(view, tuple(recs), tuple(sorted(js)), _small_part_broken(view)))
        return parts

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
        """Every joint invariant that is false on the whole kept system, every lane included (tests)."""
        view, _ = self.view(kv)
        return [inv.name for inv in _SYSTEM.invariants if not inv.predicate(view)]

    def advance(self, kv: Any) -> list[Part]:
        """What ``check`` evaluates: the parts over what moved since the last call, with that call's
        bookkeeping (ended requests no held lane names are forgotten); ``verdict`` names the invariants
        the parts break (the tests compare it with ``broken``)."""
        ids, lanes = self._involved(kv)
        parts = self.parts(kv, ids, lanes) if ids or lanes else []
        self._forget_ended(kv, ids)
        return parts

    @staticmethod
    def verdict(parts: Sequence[Part]) -> list[str]:
        """The declared invariants false on some part."""
        return [inv.name for inv in _ACROSS if not inv.predicate(parts)]

    def check(self, kv: Any, after: str, extra: Callable[[], list[tuple[str, str]]] | None = None) -> None:
        """Every joint invariant on the part of the live system that moved (see the module doc);
        ``extra`` adds the faults of other indexes kept beside machines (reported the same way)."""
        if not MONITOR.enabled or not next(MONITOR.draws):
            return
        parts = self.advance(kv)
        faults = extra() if extra is not None else []
        if parts or faults:
            state = {"requests": {rec.request_id: (rec.machine.state, rec.lease.lane if rec.lease else None)
                                  for p in parts for rec in p.records},
                     "lanes": {j: (kv.lane(j).state, kv.lane(j).seq_id) for p in parts for j in p.lanes}}
            MONITOR.check_whole(_SYSTEM.name, _ACROSS, parts, after, state=state, extra=faults)
