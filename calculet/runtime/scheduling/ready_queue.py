"""One tenant's decode-Ready entries in key order, popped in O(1) when they arrive in order (issue #20).

The decode scheduler (:mod:`.decode`) keeps each tenant's Ready sequences ordered by the key
``(priority, decode tag, virtual finish, arrival seq)`` — an entry is the list
``[priority, tag, virtual_finish, seq, record]``, and a record of None marks it dead (lazy removal).
A heap gives that order at O(log n) per pop. But under the rotation the entries of one tenant
mostly *arrive* in key order: a sequence served at the head comes back with its tag moved by the
tenant's constant step cost, behind the others (decode.py's module doc). So this keeps two parts:
a FIFO of the entries in key order — each arrived not below the FIFO's last, or below its first — and
a heap of the rest (a newcomer tagged at the global virtual time, an at-risk entry keyed by its
deadline between others, a batch put back). The FIFO's front takes the entry served by deadline
(on_time's default order with no ITL target, §7.2 item 2): it comes back with the same deadline, below
every other, and went through the heap at every step (a push, a ``head`` call and a pop per token on B1,
issue #20). The head is the smaller of the two parts' heads, so the order is the
heap's exactly, whatever the arrival pattern; when arrivals are in order a pop is a ``popleft``.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import chain
from typing import Any, Iterator

Entry = list[Any]
"""``[priority, tag, virtual_finish, seq, record-or-None]``; seqs are unique, so records are never compared."""


class TenantQueue:
    """A tenant's entries: the FIFO part (arrived in key order) and the heap part (the others)."""

    __slots__ = ("fifo", "heap", "taken")

    def __init__(self) -> None:
        self.fifo: deque[Entry] = deque()
        self.heap: list[Entry] = []
        self.taken = 0
        """Scratch of the decode tick's merge (:mod:`.decode_select`): the lanes this tenant took in the batch
        being built, for its lane cap (an attribute, not a dictionary per tick, issue #20)."""

    def push(self, entry: Entry) -> None:
        """At the FIFO's end when not below its last, at its front when below its first (it stays in key order
        either way), else in the heap."""
        fifo = self.fifo
        if not fifo or entry > fifo[-1]:
            fifo.append(entry)
        elif entry < fifo[0]:
            fifo.appendleft(entry)
        else:
            heapq.heappush(self.heap, entry)

    def head(self) -> Entry | None:
        """The smallest live entry (dead ones at either part's front are dropped), or None."""
        fifo, heap = self.fifo, self.heap
        while fifo and fifo[0][4] is None:
            fifo.popleft()
        while heap and heap[0][4] is None:
            heapq.heappop(heap)
        if heap and (not fifo or heap[0] < fifo[0]):
            return heap[0]
        return fifo[0] if fifo else None

    def take(self, head: Entry) -> None:
        """Remove ``head``, the entry :meth:`head` returned (nothing changed in between)."""
        fifo = self.fifo
        if fifo and fifo[0] is head:
            fifo.popleft()
        else:
            heapq.heappop(self.heap)

    def __iter__(self) -> Iterator[Entry]:
        """Every entry, dead ones included, in no particular order."""
        return chain(self.fifo, self.heap)

    def __len__(self) -> int:
        return len(self.fifo) + len(self.heap)
