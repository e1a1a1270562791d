"""The goodput section of a sweep report and its ``summary.json`` fields (issue #13).

Why it leads the report: a serving system is judged by the requests it finishes within their
deadlines (DESIGN "Goodput before throughput"), so the first table of every
``python -m calculet.bench`` report is on-time completions per second and the on-time fraction,
beside the offline bound of the same requests on the policy's device (with the method that
produced it), the share of device time thrown away on requests that then expired or failed, and
the scheduler's finish-estimate error where the scheduler gives an estimate.
"""

from __future__ import annotations

from typing import Any

from calculet.bench.sweep import Cell, SweepResult
from calculet.loadsim.goodput import EstimateError, estimate_error

__all__ = ["goodput_json", "goodput_section", "estimator_json", "pooled_estimate"]


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _bound_text(c: Cell) -> str:
    b = c.bound
    if b is None:
        return "—"
    share = c.goodput.on_time / b.bound if c.goodput is not None and b.bound else None
    return f"{b.bound} ({b.method}){'' if share is None else f', {share:.2f}x'}"


def _estimate_text(e: EstimateError | None) -> str:
    if e is None:
        return "—"
    return f"{e.median_abs:.0%} / {e.p90_abs:.0%} (n={e.count})"


def goodput_section(result: SweepResult) -> list[str]:
    """The report's first table: goodput, on-time fraction, bound, wasted share, estimate error."""
    scale = f" Deadlines scaled by {result.deadline_scale:g}." if result.deadline_scale != 1.0 else ""
    lines = ["## Goodput", "",
             "Goodput = requests completed at or before their deadline, per second of the run's window; on-time "
             "fraction = of the offered requests. Offline bound = on-time completions no schedule of the policy's "
             "device (largest profile, ping/pong, prefill chunk) can exceed on the same requests "
             "(`calculet/loadsim/bound.py`; the method is the weakest relaxation used; `×` = on time / bound). "
             "Wasted = device time spent on requests that then ended `deadline` or `error`, as a share of device "
             "time (engine: the core's count; baselines: charged from their records with the cost model). "
             "Estimate error = |estimated − actual finish| / (actual finish − arrival) over completed requests, "
             "median / P90, from the scheduler's estimate at admission (— when it gives none)." + scale, "",
             "| load | policy | goodput /s | on-time fraction | on time | bound (method, ×) | wasted share | late | "
             "estimate error median / P90 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for load in result.loads:
        for policy in result.policies:
            c = result.cell(policy.name, load)
            if c is None or c.goodput is None:
                continue
            g = c.goodput
            lines.append(f"| {load:g} | {policy.name} | {g.goodput_per_s:.3f} | {_pct(g.on_time_fraction)} | "
                         f"{g.on_time}/{g.offered} | {_bound_text(c)} | {_pct(g.wasted_share)} | {g.late} | "
                         f"{_estimate_text(g.estimate)} |")
    pooled = estimator_json(result)
    if pooled:
        lines += ["", "Estimator accuracy over every run of this preset (completed requests with an estimate): "
                  + "; ".join(f"`{name}` median {e['median_abs']:.0%}, P90 {e['p90_abs']:.0%} (n={e['count']})"
                              for name, e in pooled.items()) + "."]
    return lines + [""]


def goodput_json(c: Cell) -> dict[str, Any]:
    """A run's goodput fields for ``summary.json`` (empty without goodput figures)."""
    g = c.goodput
    if g is None:
        return {}
    out: dict[str, Any] = {
        "goodput_per_s": round(g.goodput_per_s, 6), "on_time_fraction": round(g.on_time_fraction, 6),
        "on_time": g.on_time, "late": g.late, "offered": g.offered, "wasted_share": round(g.wasted_share, 6),
        "wasted_device_s": round(g.wasted_device_s, 4), "device_s": round(g.device_s, 4),
        "wasted_tokens_delivered": g.wasted_tokens, "device_figures_from": g.source,
        "estimate_error": None if g.estimate is None else {
            "count": g.estimate.count, "median_abs": round(g.estimate.median_abs, 6),
            "p90_abs": round(g.estimate.p90_abs, 6), "median_signed": round(g.estimate.median_signed, 6)}}
    if c.bound is not None:
        out["offline_bound"] = {"on_time": c.bound.bound, "jobs": c.bound.jobs, "method": c.bound.method}
    return out


def pooled_estimate(cells: list[Cell]) -> EstimateError | None:
    """The estimate error over every completed request of ``cells`` that carries an estimate."""
    return estimate_error([r for c in cells for r in c.run.requests])


def estimator_json(result: SweepResult) -> dict[str, dict[str, Any]]:
    """Per engine policy, the estimate error pooled over the preset's loads (omitted without estimates)."""
    out: dict[str, dict[str, Any]] = {}
    for policy in result.policies:
        e = pooled_estimate([c for c in result.cells if c.policy.name == policy.name])
        if e is not None:
            out[policy.name] = {"count": e.count, "median_abs": round(e.median_abs, 6), "p90_abs": round(e.p90_abs, 6),
                                "median_signed": round(e.median_signed, 6)}
    return out
