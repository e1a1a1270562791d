"""Distributions of measured durations (§16): count, sum, maximum and per-bucket counts.

Why: §16 lists batch wait, KV free latency, host time per tick and recovery time; an average and
a maximum hide the tail an operator alerts on (a p99 batch wait), and a Prometheus histogram
cannot be rebuilt from them. The component that measures a duration adds it here, on the
actor thread, for about the price of a ``bisect`` (no lock: one owner of state, DESIGN
principle 2); ``snapshot()`` is the frozen record its ``statistics()`` carries, from which the
metrics layer exports a histogram (``calculet.server.metrics_histograms``) and the existing
``*_avg_seconds`` / ``*_max_seconds`` gauges keep their meaning.

Bucket bounds are chosen per duration for LLM serving on the Calculet NPU (a B1 decode step is
milliseconds, a prefill of a long prompt up to seconds, a device reset seconds to minutes); a
value equal to a bound falls into that bound's bucket (Prometheus ``le``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

__all__ = ["BATCH_WAIT_BOUNDS", "FREE_LATENCY_BOUNDS", "HOST_TICK_BOUNDS", "RECOVERY_BOUNDS", "Distribution",
           "DistributionSnapshot"]

BATCH_WAIT_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0)
"""A decode batch's oldest lane in Ready: 0 under no load, the batching window (µs–ms), a
rotation of many streams on B1 (tens of ms), seconds only when the device is starved."""
FREE_LATENCY_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                       5.0, 30.0)
"""Release → confirmed Free of a KV lane: one tick when the device frees at once, longer while a
job still holds the lane or the device refuses the free (retried)."""
HOST_TICK_BOUNDS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                    0.05, 0.1, 0.25, 1.0)
"""Host time of one actor tick: tens of µs when idle, up to ms when a B16 batch is built and its
results applied; more than a device step means the host is the bottleneck."""
RECOVERY_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""A reset or restart (§14): a reconfigure of the simulated device is sub-second, a real NPU
reset with golden re-verification seconds to minutes; 600 s is the budget window."""


@dataclass(frozen=True)
class DistributionSnapshot:
    """A distribution at one moment: ``counts[i]`` values fell in ``(bounds[i-1], bounds[i]]``;
    the last count is above every bound (``+Inf``)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float
    max: float

    @property
    def avg(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, values <= bound)`` per bucket, ``+Inf`` last (Prometheus buckets)."""
        total = 0
        out: list[tuple[float, int]] = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out


class Distribution:
    """Values added one at a time (not thread-safe: its owner's thread adds and snapshots)."""

    __slots__ = ("bounds", "_counts", "count", "sum", "max")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must be strictly increasing: {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def add(self, value: float) -> None:
        self._counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value

    def snapshot(self) -> DistributionSnapshot:
        return DistributionSnapshot(self.bounds, tuple(self._counts), self.count, self.sum, self.max)

    @property
    def avg(self) -> float:
        return self.sum / self.count if self.count else 0.0
