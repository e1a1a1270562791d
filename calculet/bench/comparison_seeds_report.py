"""The multi-seed goodput comparison: its runs, ``report.md`` and ``summary.json`` (issue #13).

Why a module of its own: ``goodput --seeds`` runs the one-seed comparison once per seed — each
written to ``OUT/seed-<S>/`` exactly as ``goodput --seed S --out OUT/seed-<S>`` writes it, with
that command in its header so any seed can be re-run alone — and then reads back only the
figures of each ``summary.json`` (:mod:`calculet.bench.comparison_seeds`), so the runs' records
are freed seed by seed and the aggregate is computed from what was written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from calculet.bench.comparison import Comparison
from calculet.bench.comparison_checks import Check
from calculet.bench.comparison_report import comparison_json, matrix_lines, write_comparison_report
from calculet.bench.comparison_seeds import SeedPoint, seed_points, seeds_json, tally
from calculet.loadsim.policies import GOODPUT_DEVICES, POLICIES

__all__ = ["run_seeds", "seed_folder", "write_seeds_report"]


def seed_folder(seed: int) -> str:
    return f"seed-{seed}"


def run_seeds(seeds: Sequence[int], out: Path, run: Callable[[int], Comparison], command_of: Callable[[int], str],
              command_line: str, console: Console, quiet: bool) -> tuple[Path, float]:
    """``run(seed)`` per seed, each written to ``out/seed-<S>/`` with ``command_of(seed)``; then the
    aggregate report quoting ``command_line``. Returns (report path, wall seconds of the runs)."""
    summaries: list[tuple[int, dict[str, Any]]] = []
    wall = 0.0
    for index, seed in enumerate(seeds, 1):
        if not quiet:
            console.print(f"seed {seed} ({index} of {len(seeds)})")
        comparison = run(seed)
        wall += comparison.wall_s
        command = command_of(seed)
        report = write_comparison_report(comparison, out / seed_folder(seed), command)
        summaries.append((seed, comparison_json(comparison, command)))
        del comparison  # the runs' records: one seed's at a time
        if not quiet:
            console.print(f"report: {report}")
    return write_seeds_report(summaries, out, wall, command_line), wall


def _labels() -> dict[str, str]:
    return {device: f"B{POLICIES[device].max_profile}" for device in GOODPUT_DEVICES}


def _aggregate_cell(point: SeedPoint, index: int) -> str:
    pooled: Check = point.pooled[index]
    met, judged = point.met_on(index)
    if pooled.met is None:
        return f"pooled {pooled.value}"
    missed = point.missed_seeds(index)
    where = f" (missed on {', '.join(map(str, missed))})" if missed else ""
    return f"{met}/{judged} seeds{where}; pooled {pooled.value} {'met' if pooled.met else '**missed**'}"


def _aggregate_matrix(points: Sequence[SeedPoint]) -> list[str]:
    header = [c.criterion for c in points[0].pooled]
    lines = ["| arm | × capacity | default order | " + " | ".join(header) + " |", "|---|---|---|" + "---|" * len(header)]
    for p in points:
        lines.append(f"| {p.label} | {p.multiple:g}× | {p.device} | "
                     + " | ".join(_aggregate_cell(p, i) for i in range(len(p.pooled))) + " |")
    return lines


def _pooled_table(points: Sequence[SeedPoint]) -> list[str]:
    lines = ["| arm | × capacity | policy | on time per seed | on time (sum) | on-time fraction | "
             "admitted → deadline_exceeded | wasted share | offline bound (sum) | on time / bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        for f in p.pooled_figures:
            per_seed = " / ".join(str(next(g.on_time for g in figs if g.policy == f.policy))
                                  for _, figs in p.seed_figures)
            name = f"**{f.policy}**" if f.policy == p.device else f.policy
            ratio = "—" if f.bound_ratio is None else f"{f.bound_ratio:.2f}×"
            lines.append(f"| {p.label} | {p.multiple:g}× | {name} | {per_seed} | {f.on_time}/{f.offered} | "
                         f"{f.on_time_fraction:.0%} | {f.expired}/{f.admitted} = {f.expired_share:.1%} | "
                         f"{f.wasted_share:.1%} | {f.bound} | {ratio} |")
    return lines


def _per_seed_sections(points: Sequence[SeedPoint], seeds: Sequence[int]) -> list[str]:
    lines: list[str] = []
    for seed in seeds:
        rows = [(p.label, p.multiple, p.device, dict(p.per_seed)[seed]) for p in points]
        matrix, met, judged = matrix_lines(rows)
        lines += [f"### Seed {seed}: {met} of {judged} ([report]({seed_folder(seed)}/report.md))", "", *matrix, ""]
    return lines


def write_seeds_report(summaries: Sequence[tuple[int, Mapping[str, Any]]], out: Path, wall_s: float,
                       command: str) -> Path:
    """``out/report.md`` and ``out/summary.json`` of the seeds' summaries, quoting ``command``."""
    seeds = [seed for seed, _ in summaries]
    points = seed_points(summaries, _labels())
    t = tally(points)
    workload = summaries[0][1]["workload"]
    per_seed = "; ".join(f"seed {s} {m} of {j}" for s, (m, j) in t.per_seed.items())
    lines = [f"# Goodput comparison over seeds {', '.join(map(str, seeds))} — {workload} (issue #13)", "",
             "```", command, "```", "",
             "Each seed is the one-seed comparison (`python -m calculet.bench goodput --seed S`: the same policies, "
             "devices, deadline settings and capacity multiples on the trace that seed generates), written in full "
             "to its own folder: " + ", ".join(f"[seed {s}]({seed_folder(s)}/report.md)" for s in seeds) + ". Per "
             "check: *k/n seeds* = met on k of the n seeds where it is judged; *pooled* = the same check on the "
             "figures summed over the seeds (on-time totals per policy, late over admitted of all seeds, wasted "
             "over device time of all seeds, the bounds summed; `calculet/bench/comparison_seeds.py`). Virtual "
             "time on the cost model: assumptions, not NPU measurements.", "",
             "## Acceptance over the seeds", "",
             f"Judged checks met: {per_seed}; pooled {t.pooled[0]} of {t.pooled[1]}; met on every seed "
             f"{t.every_seed} of {t.pooled[1]}.", "", *_aggregate_matrix(points), "",
             "## Checks per seed", "", *_per_seed_sections(points, seeds),
             "## Pooled figures", "", *_pooled_table(points), "",
             f"Wall time of the runs: {wall_s:.0f} s.", ""]
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(seeds_json(points, summaries, command), indent=2, sort_keys=True)
                                      + "\n", encoding="utf-8")
    return report
