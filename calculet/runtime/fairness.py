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
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Generic, Hashable, Iterable, Mapping, TypeVar

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

    def stamp(self, tenant: str, cost: int) -> int:
        """Tag an arriving request: its virtual finish; the tenant's virtual time moves to it."""
        start = self._tenant_vt[tenant]
        if self._global_vt > start:
            start = self._global_vt
        finish = start + cost * self._unit[tenant]
        self._tenant_vt[tenant] = finish
        return finish

    def served(self, tenant: str, tag: int, cost: int) -> None:
        """A request tagged ``tag`` entered service: global virtual time advances to it."""
        if tag > self._global_vt:
            self._global_vt = tag
        self._service[tenant] += cost

    def step_tag(self, tenant: str, tokens: int = 1) -> int:
        """Scaled virtual time of ``tokens`` decode steps for ``tenant`` (rotation among ties)."""
        return self.decode_weight * tokens * self._unit[tenant]

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

    Each flow is a FIFO (a tenant's tags only grow); a heap holds one entry per unparked,
    non-empty flow, keyed by its head's tag, so ``peek``/``pop`` cost O(log flows) and a
    removal is O(1) (the entry is marked dead and skipped later). A flow whose head cannot be
    served for a reason of its own (its tenant's active limit, the long-task quota) is
    *parked* so it does not block the others, and unparked when the reason goes away.
    """

    def __init__(self) -> None:
        self._flows: dict[Hashable, deque[list[Any]]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._in_heap: set[Hashable] = set()
        self._parked: set[Hashable] = set()
        self._seq = 0
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def push(self, flow: Hashable, tag: int, item: T) -> list[Any]:
        """Append ``item`` to ``flow``; the returned entry is the handle for :meth:`discard`."""
        self._seq += 1
        entry = [tag, self._seq, item]
        queue = self._flows.get(flow)
        if queue is None:
            queue = self._flows[flow] = deque()
        queue.append(entry)
        self._live += 1
        if flow not in self._in_heap and flow not in self._parked:
            self._head_changed(flow)
        return entry

    def discard(self, entry: list[Any]) -> bool:
        """Remove an entry wherever it is (lazily); False if it was already gone."""
        if entry[2] is None:
            return False
        entry[2] = None
        self._live -= 1
        return True

    def peek(self) -> tuple[Hashable, T] | None:
        """The unparked flow whose head has the smallest tag, and that head."""
        heap = self._heap
        while heap:
            tag, seq, flow = heap[0]
            queue = self._flows[flow]
            while queue and queue[0][2] is None:
                queue.popleft()
            if not queue:
                heapq.heappop(heap)
                self._in_heap.discard(flow)
                continue
            head = queue[0]
            if head[1] != seq:
                heapq.heapreplace(heap, (head[0], head[1], flow))
                continue
            return flow, head[2]
        return None

    def pop(self) -> T:
        """Remove and return the head found by the last :meth:`peek` (no call in between)."""
        tag, seq, flow = self._heap[0]
        queue = self._flows[flow]
        entry = queue.popleft()
        item: T = entry[2]
        entry[2] = None
        self._live -= 1
        while queue and queue[0][2] is None:
            queue.popleft()
        if queue:
            heapq.heapreplace(self._heap, (queue[0][0], queue[0][1], flow))
        else:
            heapq.heappop(self._heap)
            self._in_heap.discard(flow)
        return item

    def park(self, flow: Hashable) -> None:
        """Take the flow found by the last :meth:`peek` out of contention."""
        top = heapq.heappop(self._heap)
        assert top[2] == flow, "park() must follow peek() of the same flow"
        self._in_heap.discard(flow)
        self._parked.add(flow)

    def unpark(self, flows: Iterable[Hashable]) -> None:
        for flow in flows:
            if flow in self._parked:
                self._parked.discard(flow)
                self._head_changed(flow)

    def parked(self) -> frozenset[Hashable]:
        return frozenset(self._parked)

    def _head_changed(self, flow: Hashable) -> None:
        queue = self._flows.get(flow)
        while queue and queue[0][2] is None:
            queue.popleft()
        if queue and flow not in self._in_heap:
            heapq.heappush(self._heap, (queue[0][0], queue[0][1], flow))
            self._in_heap.add(flow)
