"""In which order will the §5.3 waiting queue admit the requests waiting now (issue #13, the estimate)?

Why this module exists: where every sequence that holds KV is in every decode step (one KV lane
on B1, B16 with 16 sequences), who finishes when is decided by the order the waiting queue
*admits* in, and the finish estimate (:func:`.finish_estimate.admission_order_finish`) needs that
order. It used to be approximated per tenant — each tenant's requests tagged from the global
virtual time in arrival order — which is not what the queue does. The queue
(:class:`~calculet.runtime.scheduling.fairness.FairQueue`, self-clocked WFQ) tags a request when it
reaches the head of its *flow* (a tenant's short and long prompts are two flows) and keeps that
tag: a head that has waited since global virtual time was lower keeps its lower tag and goes
before a newcomer whose tag starts from today's global time. Issue #13 measured this on
``steady`` with one KV lane: a request estimated to wait 0.6 s behind the request in service
waited 10.3 s behind the other tenant's head, tagged 90 s earlier; such cases made most of the
estimate's P90 error there (it is early by a signed median of 8-13 %).

:func:`admission_ranks` replays the queue's own rule on a snapshot, with nothing arriving,
leaving or parked: every untagged head is tagged ``global + cost / weight``; the smallest tag
(ties: the older entry) is admitted and global virtual time moves to its tag
(:meth:`~calculet.runtime.scheduling.fairness.WeightedFairClock.served`: global virtual time is
the largest tag served, so a tenant's own virtual time never exceeds it and the tag's start is
the global time). What it cannot know — later arrivals tagged before a request, cancellations
and sheds ahead of it, a flow parked by its tenant's limit or the long-prefill quota — is the
estimate's remaining error. Pure: plain values in, plain values out.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Sequence

__all__ = ["QueuedRequest", "admission_ranks"]


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One waiting request as the §5.3 queue holds it."""

    id: int
    flow: Hashable
    """Its flow: requests of one flow are admitted first in, first out."""
    seq: int
    """Its entry's age in the queue (smaller: older; breaks equal tags as the queue does)."""
    cost: float
    """``cost / weight`` of its tenant (§5.3), in the units of the tags."""
    tag: float | None = None
    """Its virtual finish if it is a flow's head already tagged (fixed from then on), else None."""


def admission_ranks(waiting: Sequence[QueuedRequest], global_vt: float,
                    admitted: dict[int, float] | None = None) -> dict[int, int]:
    """The rank (0: admitted next) of every request of ``waiting``, by the queue's own rule (module doc).

    ``global_vt`` is the global virtual time now (the tag of the last request taken into service).
    A tag given for a request that is not its flow's oldest is ignored (only a head is tagged).
    O(n log flows). ``admitted``, if given, receives the tag each request is admitted with (nondecreasing in
    rank: the planner's incremental order, :mod:`.on_time_order`, inserts newcomers by it).
    """
    flows: dict[Hashable, list[QueuedRequest]] = {}
    for item in sorted(waiting, key=lambda w: w.seq, reverse=True):
        flows.setdefault(item.flow, []).append(item)  # newest first: a flow's head is its last item
    heap: list[tuple[float, int, int, Hashable]] = []
    order = 0  # a unique key per heap entry, so flows (any hashable) are never compared

    def enter(flow: Hashable, fixed: bool) -> None:
        nonlocal order
        head = flows[flow][-1]
        tag = head.tag if fixed and head.tag is not None else global_vt + head.cost
        heapq.heappush(heap, (tag, head.seq, order, flow))
        order += 1

    for flow in flows:
        enter(flow, True)
    ranks: dict[int, int] = {}
    while heap:
        tag, _, _, flow = heapq.heappop(heap)
        head = flows[flow].pop()
        ranks[head.id] = len(ranks)
        if admitted is not None:
            admitted[head.id] = tag
        if tag > global_vt:
            global_vt = tag
        if flows[flow]:
            enter(flow, False)
    return ranks
