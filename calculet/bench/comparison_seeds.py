"""The goodput comparison judged over several request seeds (issue #13, "What it must show").

Why this exists: the comparison runs one seeded trace of the ``overload`` preset per load, and
its verdict depends on the seed (session 13: seed 13 meets 51 of 52 judged checks, seed 11 49,
seed 12 50). A policy judged on one trace can be tuned to it; an operator needs to know how
stable each verdict is. This module aggregates the per-seed figures — as each seed's
``summary.json`` holds them (:func:`calculet.bench.comparison_report.comparison_json`), so the
aggregation is arithmetic on written figures, testable without running anything — into, per
point (device, deadline setting, capacity multiple) and per check:

* **met on k of n seeds** — the check of :func:`~calculet.bench.comparison_checks.point_checks`
  on each seed's figures (n counts the seeds where the check is judged at that point);
* **pooled** — the same check on the figures pooled over the seeds: on-time, offered, admitted,
  late and bound totals per policy, wasted device time over device time. The pooled "best of the
  others" compares on-time totals, so a policy that wins by 2 on one seed and loses by 7 on
  another loses the pooled check; the pooled late share is late over admitted of all seeds.

The checks are declared once (``point_checks``); the pooled verdict is those checks applied to
pooled figures, never a second formula.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.bench.comparison_checks import Check, PointFigures, point_checks

__all__ = ["MAX_SEED_COUNT", "SeedPoint", "Tally", "pool_figures", "resolve_seeds", "seed_points", "seeds_json", "tally"]

MAX_SEED_COUNT = 10
"""The largest seed *count* ``--seeds N`` accepts: each seed is a full comparison (2-3 min on a
quiet machine), and a bare ``--seeds 13`` meant as seed 13 (the preset's) should fail at once
with a hint, not run for half an hour."""


def resolve_seeds(choice: int | tuple[int, ...], preset_seed: int) -> tuple[int, ...]:
    """``--seeds``: a list as given, or a count ``N``: the preset's seed and the ``N - 1`` after it."""
    if isinstance(choice, tuple):
        return choice
    return tuple(range(preset_seed, preset_seed + choice))


@dataclass(frozen=True)
class SeedPoint:
    """One point of the comparison over every seed: each seed's checks, the pooled figures and the
    pooled checks (same criteria, same order)."""

    device: str
    deadline: str
    label: str
    """The arm's label, ``B1 tight``."""
    multiple: float
    per_seed: tuple[tuple[int, tuple[Check, ...]], ...]
    seed_figures: tuple[tuple[int, tuple[PointFigures, ...]], ...]
    pooled_figures: tuple[PointFigures, ...]
    pooled: tuple[Check, ...]

    def met_on(self, index: int) -> tuple[int, int]:
        """(seeds where check ``index`` is met, seeds where it is judged)."""
        verdicts = [checks[index].met for _, checks in self.per_seed if checks[index].met is not None]
        return sum(1 for v in verdicts if v), len(verdicts)

    def missed_seeds(self, index: int) -> tuple[int, ...]:
        return tuple(seed for seed, checks in self.per_seed if checks[index].met is False)


def _pooled_wasted(figures: Sequence[PointFigures]) -> float:
    """Wasted device time over device time of all seeds; the worst seed's share when a summary
    carries no device time (written before ``device_s`` was recorded): never better than a seed."""
    if any(f.device_s is None for f in figures):
        return max(f.wasted_share for f in figures)
    device = sum(f.device_s or 0.0 for f in figures)
    return sum(f.wasted_share * (f.device_s or 0.0) for f in figures) / device if device > 0 else 0.0


def pool_figures(per_seed: Sequence[Sequence[PointFigures]]) -> tuple[PointFigures, ...]:
    """Each policy's figures summed over the seeds (in the first seed's policy order).

    Goodput per second is the mean of the seeds' (each run's window is its own); the bound is the
    sum of the seeds' bounds (a bound per trace sums to a bound on the traces), None if any is
    missing. Every seed must have run the same policies.
    """
    if not per_seed:
        raise ValueError("no seeds to pool")
    names = [f.policy for f in per_seed[0]]
    for figs in per_seed[1:]:
        if sorted(f.policy for f in figs) != sorted(names):
            raise ValueError(f"seeds ran different policies: {sorted(names)} vs {sorted(f.policy for f in figs)}")
    pooled: list[PointFigures] = []
    for name in names:
        rows = [next(f for f in figs if f.policy == name) for figs in per_seed]
        bounds = [f.bound for f in rows]
        methods = sorted({f.bound_method for f in rows if f.bound_method})
        pooled.append(PointFigures(
            name, sum(f.offered for f in rows), sum(f.on_time for f in rows),
            sum(f.goodput_per_s for f in rows) / len(rows), sum(f.admitted for f in rows),
            sum(f.expired for f in rows), _pooled_wasted(rows),
            None if any(b is None for b in bounds) else sum(b or 0 for b in bounds),
            "/".join(methods) or None,
            None if any(f.device_s is None for f in rows) else sum(f.device_s or 0.0 for f in rows)))
    return tuple(pooled)


def _arm_points(summary: Mapping[str, Any]) -> dict[tuple[str, str, float], list[PointFigures]]:
    return {(arm["device"], arm["deadline"], float(p["multiple"])): [PointFigures.from_json(f) for f in p["figures"]]
            for arm in summary["arms"] for p in arm["points"]}


def seed_points(summaries: Sequence[tuple[int, Mapping[str, Any]]],
                labels: Mapping[str, str]) -> tuple[SeedPoint, ...]:
    """Every point of the comparison over the seeds, from each seed's ``summary.json``.

    ``labels`` maps a device (engine policy) to its arm prefix (``B1``). Every seed must hold the
    same points (same devices, deadline settings and multiples): the figures of different
    comparisons are not pooled.
    """
    if not summaries:
        raise ValueError("no seeds to aggregate")
    tables = [(seed, _arm_points(summary)) for seed, summary in summaries]
    keys = list(tables[0][1])
    for seed, table in tables[1:]:
        if sorted(table) != sorted(keys):
            raise ValueError(f"seed {seed} holds other points than seed {tables[0][0]}")
    out: list[SeedPoint] = []
    for device, deadline, multiple in keys:
        per_seed = [(seed, table[(device, deadline, multiple)]) for seed, table in tables]
        pooled = pool_figures([figs for _, figs in per_seed])
        out.append(SeedPoint(
            device, deadline, f"{labels.get(device, device)} {deadline}", multiple,
            tuple((seed, tuple(point_checks(figs, device, multiple))) for seed, figs in per_seed),
            tuple((seed, tuple(figs)) for seed, figs in per_seed), pooled,
            tuple(point_checks(pooled, device, multiple))))
    return tuple(out)


@dataclass(frozen=True)
class Tally:
    """Judged checks counted over the points: per seed, pooled, and met on every seed."""

    per_seed: dict[int, tuple[int, int]]
    """seed → (met, judged)."""
    pooled: tuple[int, int]
    every_seed: int
    """Checks judged at a point and met on every seed where judged."""


def tally(points: Sequence[SeedPoint]) -> Tally:
    per_seed: dict[int, list[int]] = {}
    pooled = [0, 0]
    every = 0
    for point in points:
        for seed, checks in point.per_seed:
            row = per_seed.setdefault(seed, [0, 0])
            row[0] += sum(1 for c in checks if c.met)
            row[1] += sum(1 for c in checks if c.met is not None)
        for index, check in enumerate(point.pooled):
            if check.met is None:
                continue
            pooled[0] += bool(check.met)
            pooled[1] += 1
            met, judged = point.met_on(index)
            every += met == judged
    return Tally({s: (m, j) for s, (m, j) in per_seed.items()}, (pooled[0], pooled[1]), every)


def _check_json(check: Check) -> dict[str, Any]:
    return {"criterion": check.criterion, "value": check.value, "met": check.met}


def seeds_json(points: Sequence[SeedPoint], summaries: Sequence[tuple[int, Mapping[str, Any]]],
               command_line: str) -> dict[str, Any]:
    """The aggregate ``summary.json``: per point each seed's checks, the pooled figures, the pooled
    checks and met-on-k-of-n; each seed's own summary (figures behind every check) under ``seeds``."""
    t = tally(points)
    return {
        "command": command_line, "seeds": [seed for seed, _ in summaries],
        "tally": {"per_seed": {str(s): {"met": m, "judged": j} for s, (m, j) in t.per_seed.items()},
                  "pooled": {"met": t.pooled[0], "judged": t.pooled[1]}, "met_on_every_seed": t.every_seed},
        "points": [{"device": p.device, "deadline": p.deadline, "multiple": p.multiple,
                    "per_seed": {str(seed): [_check_json(c) for c in checks] for seed, checks in p.per_seed},
                    "pooled_figures": [f.as_json() for f in p.pooled_figures],
                    "pooled_checks": [_check_json(c) for c in p.pooled],
                    "met_on": [{"met": m, "judged": j} for m, j in (p.met_on(i) for i in range(len(p.pooled)))]}
                   for p in points],
        "per_seed_summaries": {str(seed): dict(summary) for seed, summary in summaries}}
