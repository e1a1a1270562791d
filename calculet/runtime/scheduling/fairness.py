"""Fairness (§5.3): weighted fair queuing across tenants, per-tenant limits, token buckets.

The spec's formulas, exactly::

    cost           = prompt_tokens + decode_weight * requested_output_tokens
    virtual_finish = max(tenant_virtual_time, global_virtual_time) + cost / weight

``decode_weight`` here is ``queues.wfq_decode_weight`` (ambiguity 7: kept apart from the WRR
weight of the same name). Virtual time is exact: a weight is read as the decimal the operator
wrote (``0.1`` is 1/10, not a binary float) and ``cost / weight`` is kept as an integer in
units of ``1 / scale``, where ``scale`` is the least common multiple of the weights'
numerators. Ordering is therefore deterministic and never depends on rounding.

Global virtual time follows self-clocked fair queuing: it is the finish tag of the last
request taken into service, so a tenant that was idle restarts from it and gains no credit
(R5.3.3). Weights and limits come only from configuration (R5.3.7).

*When* a request is tagged is the spec's silence, and it matters: a request is tagged when it
reaches the head of its flow (and keeps that tag), and a tenant's virtual time moves only when
one of its requests is taken into service. For a backlogged tenant this gives the same order as tagging
on arrival; the difference is what happens to a request that leaves the queue unserved
(deadline, cancel). Tagged on arrival, it would still have advanced its tenant's virtual time,
so an overloaded tenant whose old requests keep expiring would push every new request further
into the virtual future and stall for as long as its queue takes to expire (the load
simulation measured 30–60 s stalls at saturation). Tagged at the head, a request that never
starts is never charged. (A tenant with a short and a long flow can have both heads tagged
from the same virtual time: a credit of at most one request, bounded.)
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Generic, Hashable, Iterable, Mapping, TypeVar

from calculet.config import TenantConfig

T = TypeVar("T")


def exact(value: float | int | Fraction) -> Fraction:
    """A configured number as the exact decimal it was written as (``0.1`` → 1/10)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    return Fraction(repr(value))


def wfq_cost(prompt_tokens: int, requested_output_tokens: int, decode_weight: int) -> int:
    """§5.3 ``cost = prompt_tokens + decode_weight * requested_output_tokens`` (R5.3.2)."""
    return prompt_tokens + decode_weight * requested_output_tokens


def virtual_finish(tenant_virtual_time: Fraction | int, global_virtual_time: Fraction | int,
                   cost: int, weight: Fraction | float | int) -> Fraction:
    """§5.3 ``max(tenant_virtual_time, global_virtual_time) + cost/weight``, exactly (R5.3.3)."""
    return max(Fraction(tenant_virtual_time), Fraction(global_virtual_time)) + Fraction(cost) / exact(weight)


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's weight and limits, from configuration only (§5.3, R5.3.7)."""

    name: str
    weight: Fraction
    max_active_sequences: int | None = None
    max_waiting_tokens: int | None = None
    qps: Fraction | None = None

    @classmethod
    def from_config(cls, tenant: TenantConfig) -> TenantPolicy:
        return cls(tenant.name, exact(tenant.weight), tenant.max_active_sequences,
                   tenant.max_waiting_tokens, None if tenant.qps is None else exact(tenant.qps))


class WeightedFairClock:
    """Virtual times of the §5.3 WFQ as exact scaled integers (one unit = 1/scale)."""

    def __init__(self, weights: Mapping[str, Fraction], decode_weight: int) -> None:
        if not weights:
            raise ValueError("WFQ needs at least one tenant")
        for name, weight in weights.items():
            if weight <= 0:
                raise ValueError(f"tenant {name!r}: weight must be > 0, got {weight}")
        self.decode_weight = decode_weight
        self.scale = math.lcm(*(w.numerator for w in weights.values()))
        # cost/weight in scaled units = cost * denominator * (scale // numerator): exact.
        self._unit = {name: w.denominator * (self.scale // w.numerator) for name, w in weights.items()}
        self._tenant_vt = {name: 0 for name in weights}
        self._global_vt = 0
        self._service: Counter[str] = Counter()

    def cost(self, prompt_tokens: int, output_tokens: int) -> int:
        return wfq_cost(prompt_tokens, output_tokens, self.decode_weight)

    def tag(self, tenant: str, cost: int) -> int:
        """The virtual finish a request of ``tenant`` costing ``cost`` would get if served next.

        Pure: the tenant's virtual time moves only in :meth:`served`, so a request that leaves
        the queue unserved costs its tenant nothing.
        """
        start = self._tenant_vt[tenant]
        if self._global_vt > start:
            start = self._global_vt
        return start + cost * self._unit[tenant]

    def served(self, tenant: str, tag: int, cost: int) -> None:
        """A request tagged ``tag`` entered service: its tenant's and global virtual time move to it."""
        if tag > self._global_vt:
            self._global_vt = tag
        if tag > self._tenant_vt[tenant]:
            self._tenant_vt[tenant] = tag
        self._service[tenant] += cost

    def prefill_tag(self, tenant: str, tokens: int) -> int:
        """Scaled virtual time of ``tokens`` prompt tokens for ``tenant`` (a chunk's place in its class)."""
        return tokens * self._unit[tenant]

    def step_tag(self, tenant: str, tokens: int = 1) -> int:
        """Scaled virtual time of ``tokens`` decode steps for ``tenant`` (rotation among ties)."""
        return self.decode_weight * tokens * self._unit[tenant]

    def global_tag(self) -> int:
        """Global virtual time in scaled units (the tag of the last request taken into service)."""
        return self._global_vt

    def to_fraction(self, tag: int) -> Fraction:
        return Fraction(tag, self.scale)

    def tenant_virtual_time(self, tenant: str) -> Fraction:
        return Fraction(self._tenant_vt[tenant], self.scale)

    def global_virtual_time(self) -> Fraction:
        return Fraction(self._global_vt, self.scale)

    def service(self) -> dict[str, int]:
        return dict(self._service)

    def lag(self) -> dict[str, Fraction]:
        """Per tenant: how far its virtual time is ahead of global virtual time (§16 virtual lag)."""
        return {t: Fraction(v - self._global_vt, self.scale) for t, v in self._tenant_vt.items()}


class TokenBucket:
    """A QPS limit on the injected clock: ``rate`` tokens per second, ``burst`` at most.

    Time is read in whole microseconds and the level is a Fraction, so a bucket refills
    exactly (10 QPS admits exactly one request per 100 ms).
    """

    __slots__ = ("rate", "burst", "_level", "_last_us")

    def __init__(self, rate: Fraction, burst: Fraction, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._level = burst
        self._last_us = round(now * 1_000_000)

    def try_take(self, now: float) -> bool:
        now_us = round(now * 1_000_000)
        if now_us > self._last_us:
            self._level = min(self.burst, self._level + self.rate * Fraction(now_us - self._last_us, 1_000_000))
            self._last_us = now_us
        if self._level >= 1:
            self._level -= 1
            return True
        return False

    @property
    def level(self) -> Fraction:
        return self._level


class FairQueue(Generic[T]):
    """Items in ascending virtual-finish order, FIFO within a flow, with parkable flows.

    Each flow is a FIFO; a heap holds one entry per unparked, non-empty flow, keyed by its
    head's tag, so ``peek``/``pop`` cost O(log flows) and a removal is O(1) (the entry is
    marked dead and skipped later). An item's tag is computed by ``tag(flow, item)`` once,
    when the item becomes its flow's head and is first looked at, and is fixed from then on
    (head-of-flow tagging, see the module docstring). A flow whose head was just served is
    re-tagged at the next :meth:`peek`, after the caller has recorded that service, so the
    next head starts from its tenant's new virtual time.

    A flow whose head cannot be served for a reason of its own (its tenant's active limit,
    the long-task quota) is *parked* so it does not block the others, and unparked when the
    reason goes away.
    """

    def __init__(self, tag: Callable[[Hashable, T], int]) -> None:
        self._tag = tag
        self._flows: dict[Hashable, deque[list[Any]]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._in_heap: set[Hashable] = set()
        self._pending: set[Hashable] = set()
        self._parked: set[Hashable] = set()
        self._seq = 0
        self.live = 0
        """How many items are queued (parked flows included): what ``len`` answers, read without a call."""
        self.version = 0
        """Moves whenever the next :meth:`peek` may answer otherwise than the last one: a push that makes a flow
        contend (a flow already contending or parked keeps its head), a discard, a pop, a park, an unpark. While it
        stays, a peek finds the same head with the same tag (a head's tag is fixed once computed) — what lets
        admission answer a blocked pass again without one (``AdmissionController.next_admissible``, #20)."""

    def __len__(self) -> int:
        return self.live

    def push(self, flow: Hashable, item: T) -> list[Any]:
        """Append ``item`` to ``flow``; the returned entry is the handle for :meth:`discard`."""
        self._seq += 1
        entry: list[Any] = [None, self._seq, item]
        queue = self._flows.get(flow)
        if queue is None:
            queue = self._flows[flow] = deque()
        queue.append(entry)
        self.live += 1
        if flow not in self._in_heap and flow not in self._parked:
            self._pending.add(flow)
            self.version += 1
        return entry

    def discard(self, entry: list[Any]) -> bool:
        """Remove an entry wherever it is (lazily); False if it was already gone."""
        if entry[2] is None:
            return False
        entry[2] = None
        self.live -= 1
        self.version += 1
        return True

    def peek(self) -> tuple[Hashable, int, T] | None:
        """The unparked flow whose head has the smallest tag, that tag and that head."""
        if self._pending:
            for flow in self._pending:
                self._enter(flow)
            self._pending.clear()
        heap = self._heap
        while heap:
            _, seq, flow = heap[0]
            head = self._head(flow)
            if head is None:
                heapq.heappop(heap)
                self._in_heap.discard(flow)
                continue
            if head[1] != seq:
                heapq.heapreplace(heap, (head[0], head[1], flow))
                continue
            return flow, head[0], head[2]
        return None

    def pop(self) -> T:
        """Remove and return the head found by the last :meth:`peek` (no call in between)."""
        _, _, flow = heapq.heappop(self._heap)
        self._in_heap.discard(flow)
        entry = self._flows[flow].popleft()
        item: T = entry[2]
        entry[2] = None
        self.live -= 1
        self._pending.add(flow)
        self.version += 1
        return item

    def park(self, flow: Hashable) -> None:
        """Take the flow found by the last :meth:`peek` out of contention."""
        top = heapq.heappop(self._heap)
        assert top[2] == flow, "park() must follow peek() of the same flow"
        self._in_heap.discard(flow)
        self._parked.add(flow)
        self.version += 1

    def unpark(self, flows: Iterable[Hashable]) -> None:
        for flow in flows:
            if flow in self._parked:
                self._parked.discard(flow)
                self._pending.add(flow)
                self.version += 1

    def parked(self) -> frozenset[Hashable]:
        return frozenset(self._parked)

    def _head(self, flow: Hashable) -> list[Any] | None:
        """The flow's live head, tagged (skipping removed entries), or None if it is empty."""
        queue = self._flows[flow]
        while queue and queue[0][2] is None:
            queue.popleft()
        if not queue:
            return None
        head = queue[0]
        if head[0] is None:
            head[0] = self._tag(flow, head[2])
        return head

    def _enter(self, flow: Hashable) -> None:
        if flow in self._in_heap or flow in self._parked:
            return
        head = self._head(flow)
        if head is not None:
            heapq.heappush(self._heap, (head[0], head[1], flow))
            self._in_heap.add(flow)
