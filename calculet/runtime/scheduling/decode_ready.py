"""The decode Ready set of one generation: its tenants' queues and the bookkeeping of when entries arrived.

Split from :mod:`.decode` (issue #20, size limits): the scheduler there decides *order* (priorities,
tags, the tick's merge); this module holds the per-generation containers that order reads — the index
of tenants with ready work, the arrivals in time order (the oldest candidate's wait, for the batching
window and §16 queues), and the side heaps (watch, put-back arrivals, deadlines) whose dead entries are
dropped lazily. An entry is the :mod:`.ready_queue` list ``[priority, tag, virtual finish, seq, record]``;
a record of None marks it dead.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from calculet.runtime.scheduling.ready_queue import TenantQueue


class ReadyBucket:
    """The ready sequences of one generation."""

    __slots__ = ("tenants", "parked", "left", "arrivals", "last_arrival", "since", "count", "watch", "deadlines")

    def __init__(self) -> None:
        self.tenants: dict[str, TenantQueue] = {}
        """The index of tenants with ready work: a tenant's queue is dropped once it is found empty
        (issue #20: a tick must not walk the tenants that have none)."""
        self.parked: dict[str, TenantQueue] = {}
        """The (empty) queues of tenants dropped from ``tenants``, taken back when their tenant has work again
        (:meth:`rejoin`): a one-stream rotation empties its tenant's queue at every step and refills it at the
        step's result, which built a queue per step (issue #20)."""
        self.left = 0
        """Tenants dropped from ``tenants`` since it was last rebuilt (:meth:`compact`)."""
        self.arrivals: deque[tuple[float, list[Any]]] = deque()
        """(ready since, entry) in the order entries arrived, whose ``since`` never decreases (every
        entry that arrives now): the oldest live one is at the left, found in O(1) amortized — a heap
        cost a log-n pop per dead head, 16 per B16 tick (issue #20). Kept (with ``since`` and
        ``deadlines``) only under a batching window, the one reader per tick (issue #20: a tuple and an
        append per lane per step, and a compaction pass every few hundred steps, for nothing else)."""
        self.last_arrival = -math.inf
        self.since: list[tuple[float, int, list[Any]]] = []
        """Entries that arrive with an older ``since`` than ``arrivals``' last (a batch put back, a
        promotion keeping its wait): a heap, rarely used."""
        self.count = 0
        self.watch: list[tuple[float, int, list[Any]]] = []
        """Entries not yet at risk, by the instant they become at risk."""
        self.deadlines: list[tuple[float, int, list[Any]]] = []
        """Every entry by deadline (kept only with a batching window, for its deadline bound)."""

    def compact(self) -> None:
        """Rebuild the index of tenants with work, once as many tenants have left it as remain (64 at least:
        the decode tick's merge asks, :func:`~.decode_select.select_candidates`): amortized O(1) per departure.

        A dict keeps the slot of a deleted key until it next grows, and iterating it walks those slots: with
        1 000 configured tenants that had work once and 8 that still have, the tick's merge walked 1 000
        slots for 8 queues (bench/scheduler.py's idle-tenant row, issue #20); at 4 000, 3.4 µs a tick (timeit of
        the walk), and that row's ratio went 1.052-1.055x -> 1.026-1.032x once rebuilt."""
        self.tenants = dict(self.tenants)
        self.left = 0

    def rejoin(self, tenant: str) -> TenantQueue:
        """``tenant``, not in the index, has work again: its parked queue (or a new one) back in the index."""
        queue = self.parked.pop(tenant, None)
        if queue is None:
            queue = TenantQueue()
        self.tenants[tenant] = queue
        return queue

    def arrive(self, now: float) -> None:
        """Entries are about to arrive at ``now`` (not before the last arrival): drop the arrivals' dead
        entries when they are mostly dead (amortized O(1) per arrival)."""
        arrivals = self.arrivals
        if len(arrivals) > 64 and len(arrivals) > 4 * (self.count + 1):
            self.arrivals = deque(x for x in arrivals if x[1][4] is not None)
        self.last_arrival = now

    def oldest_since(self) -> float:
        """The earliest ``since`` of a live entry: the first live arrival, or an older one put back."""
        arrivals = self.arrivals
        while arrivals and arrivals[0][1][4] is None:
            arrivals.popleft()
        since = self.since
        while since and since[0][2][4] is None:
            heapq.heappop(since)
        if since and (not arrivals or since[0][0] < arrivals[0][0]):
            return since[0][0]
        return arrivals[0][0] if arrivals else 0.0


def push_compacting(heap: list[tuple[float, int, list[Any]]], item: tuple[float, int, list[Any]],
                    live: int) -> list[tuple[float, int, list[Any]]]:
    """Push onto a side heap whose dead entries are dropped lazily; rebuild it when mostly dead.

    Every decode step re-pushes its sequences, so without this a side heap would keep one
    dead entry per step until its key came due (amortized O(log n) per push either way).
    """
    if len(heap) > 64 and len(heap) > 4 * (live + 1):
        heap = [x for x in heap if x[2][4] is not None]
        heapq.heapify(heap)
    heapq.heappush(heap, item)
    return heap
