"""Retry slots: where refused requests' ``Retry-After`` places them, so retries spread out (issue #13, §5.2).

Why this module exists: the ``on_time`` planner (:mod:`.on_time_planner`) refuses a request that cannot
finish on time and answers with a ``Retry-After``; this keeps the forecast of those retries (the ghosts)
so the next refusal's retry time is computed behind them. Moved out of the planner for the size limits;
the planner re-exports :class:`RetrySlots`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple, Sequence

from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S

__all__ = ["MAX_RETRY_SLOTS", "RETRY_GRACE_S", "Placement", "RetrySlots", "retry_placement"]


class Placement(NamedTuple):
    """Where a refused request's retry goes (:func:`retry_placement`)."""

    length: float
    """Lane seconds its ghost holds."""
    lower: float
    """Its earliest retry time."""
    drained: bool
    """It fits only alone: no earlier than every lane, the earlier refusals' ghosts included, is free."""

RETRY_GRACE_S = 2.0
"""A ghost outlives its retry time by this long (a client's retry takes a round trip or two)."""
MAX_RETRY_SLOTS = 512
"""Ghosts kept at most: beyond it (and an eighth more) the oldest go, so a flood of refusals stays bounded."""


def retry_placement(free: Sequence[float], now: float, length: float, alone: float, relative: float,
                    lower: float | None) -> Placement | None:
    """Where a refused request's retry goes, or None when it is late even on an idle device ("never", no
    ``Retry-After``). One rule for the planner's refusals and the HTTP front's
    (:mod:`calculet.runtime.engine.admission_snapshot`).

    ``length``: its service at the per-token time measured under the current load; ``alone``: on the device
    at its fastest for it, one lane and nobody else (:meth:`.OnTimePlanner.alone_model`); ``relative``: its
    deadline from ``now``; ``lower``: the estimator's earliest fitting instant under the current load (None:
    none). ``free``: the kept lanes' free times.

    Why (issue #13): the per-token time under load (on B16 ~91 ms with 13 decoding, prefills between the
    steps) is not what the same request gets alone (the smallest profile's step, ~42 ms on the reference
    cost): refused as "never" by the loaded figure, a request an idle device serves in time was told not to
    come back. One that fits under the load is placed as before, from ``lower``; one that fits only alone is
    placed once every kept lane and every earlier ghost is free, for its lone length (admission judges a
    candidate alone when nothing is kept: :func:`.on_time_refusal.fit_afresh`; two such retries at the same
    drain time would both be judged sharing the device). Fitting as the load drains part-way would need the
    per-token time at each occupancy, which nothing measures."""
    if alone > relative + ON_TIME_EPS_S:
        return None
    if lower is not None and length <= relative + ON_TIME_EPS_S:
        return Placement(length, lower, False)
    return Placement(alone, max(now, max(free, default=now)), True)


@dataclass(slots=True, eq=False)
class _Ghost:
    """One refused request's reserved retry. Compared by identity (``eq=False``)."""

    retry_at: float
    length: float
    """Lane seconds the refused request needs (its prefill and decode)."""
    tenant: str
    seq: int = 0
    """Its place in arrival order (ties among equal retry times go to the earlier)."""
    gone: bool = False
    """No longer held (expired, taken by an admission, dropped past the limit): its entries in the indexes of
    :class:`RetrySlots` are skipped where they surface, not searched for."""


_RETRY_AT = attrgetter("retry_at")
_Entry = tuple[float, int, _Ghost]
"""A ghost in a heap: (retry time, arrival, the ghost)."""


@dataclass
class RetrySlots:
    """Future capacity reserved for refused requests, so their retries spread out (issue #13).

    A refusal with a retry time places a *ghost*: the candidate's lane seconds, starting on the
    earliest lane free at or after its retry time, behind the kept set's EDF lane schedule and
    the earlier ghosts. The retry time handed out is the earliest whole second from ``now``
    (``Retry-After`` is delay-seconds, RFC 9110 §10.2.3) at which the candidate, queued behind
    all of that, still finishes within its relative deadline — and no earlier than the
    estimator's own answer (``lower``). A ghost is dropped (the rule is deliberately simple):

    * ``grace_s`` after its retry time (its client did not come back, or came back and ended);
    * when a request of the same tenant is admitted from ``grace_s`` before its retry time on
      (that request took its slot; the earliest such ghost goes);
    * when more than ``limit`` + ``limit // 8`` are held, the oldest go down to ``limit`` (a flood of
      refusals stays bounded; see :meth:`_drop_oldest` for why in batches).

    The lane heap is rebuilt from the kept schedule whenever that schedule (``key``) or the
    ghosts changed, O(ghosts × log lanes); otherwise a reservation is O(log lanes + log ghosts).
    Every other operation is O(log ghosts), amortised, whatever the slots held (issue #13: a
    distinct-prompt burst in process, ``bench/loop_profile.py --distinct``, spent 11 µs of the
    loop's ~105 µs per request here with 2 000-4 600 slots held, half of it in walks over every
    slot): a ghost is indexed by arrival (:attr:`_order`), by expiry (:attr:`_expiring`) and per
    tenant (:attr:`_by_tenant`); one that goes is marked ``gone`` and skipped where it surfaces,
    and the indexes are compacted once the gone ones outnumber the held ones (:meth:`_compact`).
    """

    grace_s: float = RETRY_GRACE_S
    limit: int = MAX_RETRY_SLOTS
    _order: list[_Ghost] = field(default_factory=list)
    """The ghosts in arrival order, gone ones among them until the next compaction."""
    _held: int = 0
    _dead: int = 0
    """Ghosts gone since the last compaction (each may still sit in the three indexes)."""
    _expiring: list[_Entry] = field(default_factory=list)
    """A heap of the ghosts by retry time (and arrival): the next to expire on top."""
    _by_tenant: dict[str, list[_Entry]] = field(default_factory=dict)
    """Per tenant, a heap of its ghosts by (retry time, arrival)."""
    _free: list[float] | None = None
    _key: object = None
    _seq: int = 0

    @property
    def ghosts(self) -> list[_Ghost]:
        """The held ghosts in arrival order (a new list: O(ghosts); :func:`len` of the slots counts them in O(1))."""
        return [g for g in self._order if not g.gone]

    def __len__(self) -> int:
        return self._held

    def reserve(self, base: Sequence[float], key: object, now: float, length: float, relative: float,
                lower: float, tenant: str = "", drained: bool = False) -> float:
        """The retry time of a refused candidate needing ``length`` lane seconds within ``relative``
        seconds of its arrival; its ghost is placed there. ``base``: the kept lanes' free times, read only
        when the lanes are rebuilt (which copies them: a caller need not copy them per refusal, issue #13).
        ``drained``: it fits only alone (:class:`Placement`), so no earlier than every lane is free."""
        self.expire(now)
        if self._free is None or key != self._key:
            self._rebuild(base, key, now)
        free = self._free
        assert free is not None
        lane = free[0]
        if drained:
            lower = max(lower, max(free))
        retry = now + max(0, math.ceil(max(lower, lane + length - relative) - now - 1e-9))
        heapq.heapreplace(free, max(retry, lane) + length)
        self._seq += 1
        ghost = _Ghost(retry, length, tenant, self._seq)
        entry = (retry, ghost.seq, ghost)
        self._order.append(ghost)
        heapq.heappush(self._expiring, entry)
        heapq.heappush(self._by_tenant.setdefault(tenant, []), entry)
        self._held += 1
        if self._held > self.limit + self.limit // 8:
            self._drop_oldest(self._held - self.limit)
        return retry

    def _drop_oldest(self, count: int) -> None:
        """Past the limit, the ``count`` oldest ghosts go at once. Why in batches (an eighth of the limit): dropping
        one changes the lanes, so the next reservation rebuilds them from every ghost; dropping one per refusal
        rebuilt at every refusal once the limit was reached — O(ghosts) each, 4 096 on the HTTP front (issue #13:
        in-process, a distinct-prompt burst's loop CPU went from ~0.15 to 7-18 ms a request once the front's slots
        were full). Now one rebuild per ``limit // 8`` refusals there."""
        order, cut = self._order, 0
        while count:
            ghost = order[cut]
            cut += 1
            if not ghost.gone:
                self._gone(ghost)
                count -= 1
        del order[:cut]
        self._compact_if_dead()

    def admitted(self, tenant: str, now: float) -> None:
        """A request of ``tenant`` was admitted: it takes the earliest of its tenant's due slots (ties: the one
        placed first). Found in the tenant's heap (issue #13: the walk over every ghost ran at each admission on the
        actor and at each forward the HTTP front counts)."""
        entries = self._by_tenant.get(tenant)
        while entries and entries[0][2].gone:
            heapq.heappop(entries)
        if entries and entries[0][0] <= now + self.grace_s:
            self._gone(heapq.heappop(entries)[2])
            self._compact_if_dead()

    def expire(self, now: float) -> None:
        """Drop the ghosts whose retry time is more than ``grace_s`` before ``now``: the earliest of the expiry heap,
        O(log ghosts) each (before issue #13's heap, a walk over every ghost once the earliest had expired)."""
        expiring, grace = self._expiring, self.grace_s
        while expiring and (expiring[0][2].gone or expiring[0][0] + grace < now):
            ghost = heapq.heappop(expiring)[2]
            if not ghost.gone:
                self._gone(ghost)
        self._compact_if_dead()

    def _gone(self, ghost: _Ghost) -> None:
        """``ghost`` is no longer held: the lanes are rebuilt at the next reservation."""
        ghost.gone = True
        self._held -= 1
        self._dead += 1
        self._free = None

    def _compact_if_dead(self) -> None:
        """The indexes without their gone ghosts once these outnumber the held ones: O(ghosts), once per as many
        ghosts gone, so each index stays O(held) amortised (a tenant never admitted again keeps none)."""
        if self._dead <= self._held + 64:
            return
        held = self.ghosts
        self._order, self._dead = held, 0
        self._expiring = [entry for entry in self._expiring if not entry[2].gone]
        heapq.heapify(self._expiring)
        self._by_tenant = _tenant_heaps(held)

    def _rebuild(self, base: Sequence[float], key: object, now: float) -> None:
        """The lanes from ``base`` with every ghost placed in retry-time order (ties in arrival order): O(ghosts),
        at a reservation after the kept schedule (``key``) or the ghosts changed. Issue #20 made its sort key and
        placement C-level (``attrgetter``, one comparison): 104 -> 57 µs per refusal in a distinct-prompt burst
        while a rebuild ran at every refusal past the limit."""
        free = [max(now, t) for t in base] or [now]
        heapq.heapify(free)
        replace = heapq.heapreplace
        for ghost in sorted(self.ghosts, key=_RETRY_AT):
            at, lane = ghost.retry_at, free[0]
            replace(free, (at if at > lane else lane) + ghost.length)
        self._free, self._key = free, key


def _tenant_heaps(ghosts: list[_Ghost]) -> dict[str, list[_Entry]]:
    """Per tenant, a heap of its ``ghosts`` by (retry time, arrival)."""
    index: dict[str, list[_Entry]] = {}
    for ghost in ghosts:
        index.setdefault(ghost.tenant, []).append((ghost.retry_at, ghost.seq, ghost))
    for entries in index.values():
        heapq.heapify(entries)
    return index
