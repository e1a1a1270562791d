"""The information bound on any admission-time finish estimate: the arithmetic (issue #13).

Why this exists: the bench scores the estimate given at submit by the P90 of
``|estimated - finish| / (finish - arrival)`` over completed requests, every load pooled
(:func:`calculet.loadsim.goodput.estimate_error`). Sessions of estimator work left rows above the
issue's 25 %; this module answers what no estimate made at submit can beat. For a request r with
finish samples ``F_k`` drawn from its finish's law given the present (past arrivals, r's own
attributes; :mod:`calculet.bench.estimate_bound_runs` draws them), a point estimate ``e`` is within
``tau`` of sample k iff ``e`` lies in ``[F_k - tau L_k, F_k + tau L_k]`` (``L_k = F_k - t_r``), so
the best any estimate can do is ``c_r(tau)``, the largest share of those K closed intervals one
point lies in (an exact sweep). The expected share of a row's scored requests within ``tau`` is at
most the count-weighted mean of ``c_r(tau)``; the smallest ``tau`` at which that mean reaches 0.9
is a lower bound on the expected P90 of every estimator that sees only the present.

``c_r`` is a step function of ``tau``: it changes only where two intervals start to touch,
``tau_ij = |F_i - F_j| / (L_i + L_j)``, so it is kept exactly as (breakpoints, values) and the pooled
bound is found over the union of every request's breakpoints (no grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calculet.errors import DefinitionError

__all__ = ["Steps", "best_coverage", "coverage_steps", "estimate_steps", "rollout_steps", "pooled_bound",
           "bootstrap_bound"]

TOUCH_S = 1e-9
"""Interval ends this close (virtual seconds) count as touching: a breakpoint computed in floating
point must reach the value it stands for."""


@dataclass(frozen=True)
class Steps:
    """A right-continuous step function of ``tau >= 0``: ``values[i]`` holds on ``[taus[i], taus[i+1])``."""

    taus: np.ndarray
    values: np.ndarray

    def at(self, tau: np.ndarray | float) -> np.ndarray:
        index = np.searchsorted(self.taus, tau, side="right") - 1
        return self.values[np.maximum(index, 0)] * (index >= 0)


def _check(finishes: Sequence[float], arrival_s: float) -> np.ndarray:
    f = np.asarray(finishes, dtype=np.float64)
    if f.size == 0:
        raise DefinitionError("need at least one finish sample")
    if not np.all(f > arrival_s):
        raise DefinitionError(f"every finish must follow the arrival {arrival_s}: {f.tolist()}")
    return f


def best_coverage(finishes: Sequence[float], arrival_s: float, tau: float) -> tuple[float, float]:
    """``(c, e)``: the largest share of samples one estimate ``e`` is within ``tau`` of (relative to
    each sample's latency), and the smallest such ``e``. Closed intervals: ends that meet overlap."""
    f = _check(finishes, arrival_s)
    lat = f - arrival_s
    starts, ends = f - tau * lat, f + tau * lat + TOUCH_S
    # at one position a start is counted before an end (kind 0 < 1): closed intervals
    events = sorted([(s, 0) for s in starts] + [(e, 1) for e in ends])
    count = best = 0
    where = float(starts.min())
    for position, kind in events:
        count += 1 if kind == 0 else -1
        if count > best:
            best, where = count, position
    return best / f.size, where


def coverage_steps(finishes: Sequence[float], arrival_s: float) -> Steps:
    """``c_r`` of :func:`best_coverage` as an exact step function of ``tau``."""
    f = _check(finishes, arrival_s)
    lat = f - arrival_s
    pairs = np.abs(f[:, None] - f[None, :]) / (lat[:, None] + lat[None, :])
    taus = np.unique(np.concatenate([[0.0], pairs[np.triu_indices(f.size, 1)]]))
    values = np.array([best_coverage(f, arrival_s, float(t))[0] for t in taus])
    return Steps(taus, values)


def estimate_steps(finishes: Sequence[float], arrival_s: float, estimate_s: float) -> Steps:
    """The share of samples a *given* estimate is within ``tau`` of (today's estimator, same samples)."""
    f = _check(finishes, arrival_s)
    return _share_steps(np.abs(estimate_s - f) / (f - arrival_s))


def rollout_steps(finishes: Sequence[float], arrival_s: float) -> Steps:
    """The share of samples within ``tau`` of a *rollout* estimate: each sample scored against the median of
    the others. That is what an estimator reaches that simulates the scheduler forward from the present over
    K - 1 futures drawn from the law of arrivals and reports their median, without knowing which future comes:
    an achievable figure beside the bound (which lets the estimate be chosen knowing all K)."""
    f = _check(finishes, arrival_s)
    if f.size < 2:
        raise DefinitionError("a rollout estimate needs at least two finish samples (one to score, one to roll)")
    others = np.array([np.median(np.delete(f, k)) for k in range(f.size)])
    return _share_steps(np.abs(others - f) / (f - arrival_s))


def _share_steps(errors_in: np.ndarray) -> Steps:
    """The share of ``errors_in`` at or below ``tau``, as an exact step function."""
    errors = np.sort(errors_in)
    taus, first = np.unique(errors, return_index=True)
    counts = np.r_[first[1:], errors.size]  # samples with error <= taus[i]
    if taus[0] > 0:
        taus, counts = np.r_[0.0, taus], np.r_[0, counts]
    return Steps(taus, counts / errors.size)


def _grid(steps: Sequence[Steps]) -> np.ndarray:
    return np.unique(np.concatenate([s.taus for s in steps]))


def _matrix(steps: Sequence[Steps], grid: np.ndarray) -> np.ndarray:
    return np.vstack([s.at(grid) for s in steps])


def _first_reaching(matrix: np.ndarray, grid: np.ndarray, weights: np.ndarray, target: float) -> float:
    mean = weights @ matrix / weights.sum()
    hit = np.flatnonzero(mean >= target - 1e-12)
    return float(grid[hit[0]]) if hit.size else float("inf")


def pooled_bound(steps: Sequence[Steps], weights: Sequence[float], target: float = 0.9) -> float:
    """The smallest ``tau`` at which the weighted mean of the step functions reaches ``target``."""
    if len(steps) == 0 or len(steps) != len(weights):
        raise DefinitionError(f"need one weight per request, got {len(steps)} requests and {len(weights)} weights")
    grid = _grid(steps)
    return _first_reaching(_matrix(steps, grid), grid, np.asarray(weights, dtype=np.float64), target)


def bootstrap_bound(steps: Sequence[Steps], weights: Sequence[float], strata: Sequence[object], *,
                    target: float = 0.9, draws: int = 1000, level: float = 0.9,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of :func:`pooled_bound`, the requests resampled within each
    stratum (load) so that each load keeps its count-weight."""
    grid = _grid(steps)
    matrix = _matrix(steps, grid)
    w = np.asarray(weights, dtype=np.float64)
    groups = [np.flatnonzero(np.asarray([s == key for s in strata])) for key in dict.fromkeys(strata)]
    rng = np.random.default_rng(seed)
    taus = np.empty(draws)
    for d in range(draws):
        pick = np.concatenate([rng.choice(g, size=g.size, replace=True) for g in groups])
        taus[d] = _first_reaching(matrix[pick], grid, w[pick], target)
    low, high = np.percentile(taus, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)
