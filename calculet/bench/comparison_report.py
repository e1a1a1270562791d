"""The goodput comparison's ``report.md`` and ``summary.json`` (issue #13 item 7).

Why this exists: the comparison is read as one table — per device, deadline setting and capacity
multiple, every policy's goodput, on-time fraction, wasted share and the offline bound — and one
acceptance matrix computed from the same figures (:mod:`calculet.bench.comparison_checks`).
Each arm's full sweep report (latency, throughput, plots of goodput vs load with the bound) is
written beside it in a folder of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calculet.bench.comparison import Arm, Comparison
from calculet.bench.comparison_checks import Check, PointFigures, point_checks, point_figures
from calculet.bench.report import write_sweep_report

__all__ = [
    "acceptance_matrix", "arm_folder", "checks_from_json", "comparison_json", "comparison_rows", "matrix_lines",
    "write_comparison_report",
]


def arm_folder(arm: Arm) -> str:
    """``b1-tight``: the folder of an arm's own sweep report."""
    return arm.label.lower().replace(" ", "-")


def _points(arm: Arm) -> list[tuple[float, float, list[PointFigures]]]:
    """(capacity multiple, load scale, every policy's figures) per point of an arm."""
    out = []
    for multiple in arm.multiples:
        load = arm.load_of(multiple)
        cells = [arm.result.cell(p.name, load) for p in arm.result.policies]
        out.append((multiple, load, [point_figures(c) for c in cells if c is not None]))
    return out


def comparison_rows(arm: Arm) -> list[tuple[float, float, list[Check]]]:
    """(multiple, load, checks of the default order) per point of ``arm``."""
    return [(m, load, point_checks(figs, arm.device, m)) for m, load, figs in _points(arm)]


def _figures_table(comparison: Comparison) -> list[str]:
    lines = ["| arm | × capacity | load scale | policy | goodput /s | on time | on-time fraction | wasted share | "
             "offline bound (method) | on time / bound | admitted → deadline_exceeded |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in comparison.arms:
        for multiple, load, figures in _points(arm):
            for f in figures:
                name = f"**{f.policy}**" if f.policy == arm.device else f.policy
                ratio = "—" if f.bound_ratio is None else f"{f.bound_ratio:.2f}×"
                lines.append(f"| {arm.label} | {multiple:g}× | {load:g} | {name} | {f.goodput_per_s:.3f} | "
                             f"{f.on_time}/{f.offered} | {f.on_time_fraction:.0%} | {f.wasted_share:.1%} | "
                             f"{f.bound} ({f.bound_method}) | {ratio} | {f.expired}/{f.admitted} |")
    return lines


def _verdict(check: Check) -> str:
    tag = "" if check.met is None else (" met" if check.met else " **missed**")
    return f"{check.value}{tag}"


def matrix_lines(points: Sequence[tuple[str, float, str, Sequence[Check]]]) -> tuple[list[str], int, int]:
    """An acceptance matrix from (arm label, multiple, default order, checks) per point (one row
    per point, one column per check) and its (met, judged) counts."""
    met = judged = 0
    header: list[str] = []
    rows: list[str] = []
    for label, multiple, device, checks in points:
        header = header or [c.criterion for c in checks]
        rows.append(f"| {label} | {multiple:g}× | {device} | " + " | ".join(_verdict(c) for c in checks) + " |")
        judged += sum(1 for c in checks if c.met is not None)
        met += sum(1 for c in checks if c.met)
    lines = ["| arm | × capacity | default order | " + " | ".join(header) + " |",
             "|---|---|---|" + "---|" * len(header)] + rows
    return lines, met, judged


def acceptance_matrix(comparison: Comparison) -> tuple[list[str], int, int]:
    """The acceptance matrix of one comparison and its (met, judged) counts."""
    return matrix_lines([(arm.label, multiple, arm.device, checks)
                         for arm in comparison.arms for multiple, _, checks in comparison_rows(arm)])


def write_comparison_report(comparison: Comparison, out: Path, command_line: str) -> Path:
    """Each arm's sweep report in ``out/<arm>/``, then ``out/report.md`` and ``out/summary.json``."""
    out.mkdir(parents=True, exist_ok=True)
    for arm in comparison.arms:
        write_sweep_report(arm.result, out / arm_folder(arm), command_line)
    matrix, met, judged = acceptance_matrix(comparison)
    w = comparison.workload
    lines = [f"# Goodput comparison — {w.name} (issue #13 item 7)", "", "```", command_line, "```", "",
             f"Workload `{w.name}`: {w.description} Every arm runs the same requests per load (generated once, "
             "compressed in time by the load scale) under B1 FCFS (`b1-serial-fcfs`, the llama.cpp-style serial "
             "baseline), strict EDF (`@strict`), `@at_risk` and the shipped default `on_time` (the unsuffixed "
             "engine policy, in bold). × capacity = the offered request rate over the device's capacity for the "
             "trace: each prefill once and every decode step full (`calculet/bench/comparison.py`). Tight = the "
             "preset's deadlines, loose = ×4. Virtual time on `CostModel.reference()`: assumptions, not NPU "
             "measurements. Each arm's full report (latency, throughput, plots): "
             + ", ".join(f"[{arm.label}]({arm_folder(arm)}/report.md) (1× = load {arm.capacity_load:g})"
                         for arm in comparison.arms) + ".", "",
             "## Acceptance", "",
             f"{met} of {judged} judged checks met. The bound is judged at 2× capacity only (shown elsewhere); "
             "on-time counts are compared (same offered requests), not goodput per second (each run's window "
             "ends at its own last event).", "", *matrix, "",
             "## Figures", "", *_figures_table(comparison), "",
             f"Wall time: {comparison.wall_s:.0f} s.", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(comparison_json(comparison, command_line), indent=2,
                                                 sort_keys=True) + "\n", encoding="utf-8")
    return report


def comparison_json(comparison: Comparison, command_line: str) -> dict[str, Any]:
    """The figures behind every check (the checks can be recomputed from them)."""
    arms: list[dict[str, Any]] = []
    for arm in comparison.arms:
        points = [{"multiple": m, "load": load, "figures": [f.as_json() for f in figs],
                   "checks": [{"criterion": c.criterion, "value": c.value, "met": c.met}
                              for c in point_checks(figs, arm.device, m)]}
                  for m, load, figs in _points(arm)]
        arms.append({"device": arm.device, "deadline": arm.deadline, "deadline_scale": arm.deadline_scale,
                     "capacity_load": arm.capacity_load, "points": points})
    return {"workload": comparison.workload.name, "command": command_line, "arms": arms}


def checks_from_json(data: dict[str, Any]) -> list[tuple[str, float, Sequence[Check]]]:
    """(device, multiple, checks) recomputed from a ``summary.json`` written by this module."""
    return [(arm["device"], p["multiple"],
             point_checks([PointFigures.from_json(f) for f in p["figures"]], arm["device"], p["multiple"]))
            for arm in data["arms"] for p in arm["points"]]
