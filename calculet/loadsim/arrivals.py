"""Arrival processes of the load simulator: Poisson and bursty on/off, by time rescaling.

Both processes are generated the same way: a unit-rate Poisson process (cumulative sums of
standard exponentials) is mapped through the inverse of the cumulative rate ``Λ(t)``. Why not
"draw a count, then uniform times"? Because time rescaling gives two properties that load
sweeps rely on:

* **prefix stability** — a longer duration only appends arrivals; the first ones do not move;
* **scale consistency** — multiplying every rate by ``s`` divides every arrival time by ``s``,
  so a sweep over offered load replays *the same* requests at a different intensity instead of
  a fresh random sample per point (differences between points are then load, not noise).

Everything here is a pure function of a ``numpy.random.Generator``: the same generator state
gives the same arrivals.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from calculet.errors import DefinitionError

__all__ = ["on_off_arrivals", "poisson_arrivals", "rescaled_arrivals", "spread_arrivals"]


def rescaled_arrivals(rng: np.random.Generator, total_intensity: float,
                      inverse_cumulative_rate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Arrival times of a Poisson process given its cumulative rate's inverse.

    ``total_intensity`` is ``Λ(duration)`` (expected number of arrivals); the unit-rate points
    below it are mapped through ``inverse_cumulative_rate`` (a vectorised callable). Exponentials
    are drawn in chunks; numpy fills arrays from the stream sequentially, so the chunk size does
    not change the result (prefix stability).
    """
    if total_intensity < 0 or not math.isfinite(total_intensity):
        raise DefinitionError(f"arrival intensity must be finite and >= 0, got {total_intensity}")
    if total_intensity == 0:
        return np.empty(0, dtype=np.float64)
    chunk = int(total_intensity + 6.0 * math.sqrt(total_intensity) + 16)
    points: list[np.ndarray] = []
    last = 0.0
    while True:
        gaps = rng.standard_exponential(chunk)
        cum = last + np.cumsum(gaps)
        inside = cum[cum < total_intensity]
        points.append(inside)
        if inside.size < cum.size:
            break
        last = float(cum[-1])
    unit = np.concatenate(points)
    return np.asarray(inverse_cumulative_rate(unit), dtype=np.float64)


def poisson_arrivals(rng: np.random.Generator, rate_per_s: float, duration_s: float) -> np.ndarray:
    """Homogeneous Poisson arrivals in ``[0, duration_s)``: the steady background of §6."""
    _check_window(duration_s)
    if rate_per_s < 0:
        raise DefinitionError(f"rate_per_s must be >= 0, got {rate_per_s}")
    if rate_per_s == 0:
        return np.empty(0, dtype=np.float64)
    return rescaled_arrivals(rng, rate_per_s * duration_s, lambda u: u / rate_per_s)


def on_off_arrivals(rng: np.random.Generator, on_rate_per_s: float, off_rate_per_s: float,
                    on_s: float, off_s: float, duration_s: float) -> np.ndarray:
    """Bursty arrivals: rate ``on_rate`` for ``on_s`` seconds, then ``off_rate`` for ``off_s``, repeated.

    The cycle starts with the on phase at t = 0. An off rate of 0 is allowed (silent gaps).
    """
    _check_window(duration_s)
    if on_rate_per_s <= 0 or off_rate_per_s < 0 or on_s <= 0 or off_s <= 0:
        raise DefinitionError("on/off arrivals need on_rate > 0, off_rate >= 0, on_s > 0, off_s > 0")
    period = on_s + off_s
    on_mass = on_rate_per_s * on_s
    per_period = on_mass + off_rate_per_s * off_s

    def cumulative(t: float) -> float:
        k, rem = divmod(t, period)
        return k * per_period + (on_rate_per_s * rem if rem < on_s
                                 else on_mass + off_rate_per_s * (rem - on_s))

    def inverse(u: np.ndarray) -> np.ndarray:
        k = np.floor(u / per_period)
        rem = u - k * per_period
        in_on = rem < on_mass
        # in the off phase rem >= on_mass, and off_rate > 0 there whenever a point can land in it
        # (with off_rate == 0 no unit point falls in [on_mass, per_period) since that span is empty)
        off_part = np.where(in_on, 0.0, (rem - on_mass) / (off_rate_per_s if off_rate_per_s > 0 else 1.0))
        return k * period + np.where(in_on, rem / on_rate_per_s, on_s + off_part)

    return rescaled_arrivals(rng, cumulative(duration_s), inverse)


def spread_arrivals(start_s: float, count: int, spread_s: float) -> np.ndarray:
    """``count`` arrivals evenly spaced over ``[start_s, start_s + spread_s)``.

    Scripted events (a long-prefill storm, §6) are placed deterministically, not sampled: the
    point of a storm is to hit the scheduler at a known moment, e.g. during steady decode.
    """
    if count < 0 or spread_s < 0 or start_s < 0:
        raise DefinitionError("spread_arrivals needs start_s >= 0, count >= 0, spread_s >= 0")
    return start_s + spread_s * np.arange(count, dtype=np.float64) / max(count, 1)


def _check_window(duration_s: float) -> None:
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise DefinitionError(f"duration_s must be finite and > 0, got {duration_s}")
