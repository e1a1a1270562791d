"""Writing a sweep's ``report.md`` and ``summary.json``.

Why this exists: the shared load-simulation report (:mod:`calculet.loadsim.report`: tables and
plots per policy) is extended here with what only a sweep knows — the setup notes, the
acceptance figures, the headline table against the device-bound and workload limits, and the
storm and tenant sections — and the figures are written as JSON for diffs across runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calculet.bench.acceptance import acceptance, acceptance_table
from calculet.bench.figures import decode_efficiency, limits_text, ms, ratio_text
from calculet.bench.goodput_section import estimator_json, goodput_json, goodput_section
from calculet.bench.storm import storm_section
from calculet.bench.sweep import Cell, SweepResult
from calculet.bench.tenants import tenant_section
from calculet.config import DegradeConfig
from calculet.loadsim.analysis import service_timeline
from calculet.loadsim.report import PolicyResult, write_report
from calculet.loadsim.workload import offered_load

__all__ = ["write_sweep_report"]

M2_P99_REGRESSION = DegradeConfig().p99_regression_ratio
"""The shipped §14/M2 P99 gate (+5%) the ping/pong policies run without; reported, not applied."""


def write_sweep_report(result: SweepResult, out: Path, command_line: str) -> Path:
    """``report.md`` (the shared tables and plots, then this sweep's own sections) and ``summary.json``."""
    w = result.workload
    results = [PolicyResult(c.policy.name, c.load, c.summary,
                            service_timeline(c.run.requests, weights=w.weights(), start_s=0.0),
                            goodput_per_s=None if c.goodput is None else c.goodput.goodput_per_s,
                            on_time_fraction=None if c.goodput is None else c.goodput.on_time_fraction,
                            bound_per_s=None if c.bound is None or not c.summary.window_s
                            else c.bound.bound / c.summary.window_s)
               for c in result.cells]
    notes = _setup_notes(result)
    files = write_report(results, out, command_line=command_line, title=f"Calculet load simulation — {w.name}",
                         load_label="load scale", device_bound_tokens_per_s=result.device_bound,
                         workload_limits=result.workload_limits(), notes=notes)
    extra = _extra_sections(result)
    text = files.markdown.read_text(encoding="utf-8")
    head, sep, tail = text.partition("\n## ")
    files.markdown.write_text(head.rstrip() + "\n\n" + extra + ("\n## " + tail if sep else ""), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(_summary_json(result, command_line), indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
    return files.markdown


def _setup_notes(result: SweepResult) -> list[str]:
    w, cost = result.workload, result.cost
    offered = ", ".join(
        f"{load:g}: {o.requests_per_s:.2f} req/s, {o.prompt_tokens_per_s:.0f} prompt + {o.output_tokens_per_s:.0f} "
        f"output tok/s" for load in result.loads for o in [offered_load(w, None, load)])
    notes = [
        f"Workload `{w.name}`: {w.description}",
        f"Offered load by load scale (expected values): {offered}.",
        f"Cost model (an assumption, not an NPU measurement): prefill {cost.prefill_fixed_s * 1e3:g} ms + "
        f"{cost.prefill_per_token_s * 1e3:g} ms/token; decode step {cost.decode_fixed_s * 1e3:g} ms + "
        f"{cost.decode_per_lane_s * 1e3:g} ms per compiled lane; a job overlapped with the other engine's "
        f"progresses at {cost.pingpong_overlap:g}x (ping/pong).",
        "Simulated NPU: the `future` package (B1/B4/B8/B16, ping/pong, multi-profile residency as simulated "
        "capabilities), 40960-token context, reference-model memory; numerics off, virtual time.",
        "Policies: " + "; ".join(f"`{p.name}` — {p.description}"
                                 + (f" ({p.lanes} KV lanes)" if p.kind == "engine" else "") for p in result.policies)
        + ". Engine policies use the shipped scheduler defaults otherwise (waiting queue 128, WRR 8:4:2:1, "
          "long-prefill quota 1); ping/pong policies run with the P99-regression degrade gate disarmed "
          "(see `calculet/loadsim/policies.py`).",
        f"Starvation: a request waiting more than {result.starvation_threshold_s:g} s while a later arrival of "
        "its own prompt class (short/medium/long) starts service, or expiring unserved while one does — so long "
        "prompts waiting in arrival order for the §6 long-task quota are queued, not starved; the longest queue "
        "wait per class is in each policy's tables. Jain's index: tokens served / the weighted max-min fair "
        "share of the tokens delivered, over stretches where the set of tenants with waiting requests is "
        "constant (waiting tenants' demand unbounded, the others' = what they got), token-weighted mean; 1.0 = "
        "every tenant got its fair share. Throughput window: first arrival to last event (the drain after the "
        "last arrival included).",
    ]
    return notes


def _degrade_text(c: Cell, ratio: float) -> str:
    """What the §14 degrade monitor saw, and what the disarmed M2 P99 gate would have decided."""
    run = c.run
    if run.statistics is None or c.policy.max_inflight != 2:
        return "—"
    d = run.statistics.executor.degrade
    state = f"degraded ({d.reason.split(':')[0]})" if d.degraded else "on"
    if not d.p99_solo_s or not d.pingpong_samples:
        return state
    regression = d.p99_pingpong_s / d.p99_solo_s - 1.0
    verdict = "the M2 gate would degrade" if regression > ratio else "within the M2 gate"
    return (f"{state}; P99 solo {d.p99_solo_s * 1e3:.0f} ms, overlapped {d.p99_pingpong_s * 1e3:.0f} ms "
            f"({regression:+.0%}: {verdict})")


def _headline(result: SweepResult) -> list[str]:
    bound = result.device_bound
    lines = ["## Headline figures", "",
             limits_text(result) + " Goodput and on time: see the Goodput section. `× limit` = throughput / the decode-only limit; `× workload limit` = "
             "throughput / the workload limit at that load; `× B1 serial` = throughput / the "
             "`b1-serial-fcfs` baseline's at the same load. Device work = what the cost model charges the jobs "
             "submitted (nominal; with ping/pong two jobs overlap, so work can exceed the run time). "
             "`decode eff.` = tokens produced by decode steps per second of decode work, over the limit of the "
             "policy's own largest profile (1.0 = every decode step ran full). Sim speed = virtual / wall time.", "",
             "| load | policy | goodput /s | on time | out tok/s | × limit | × workload limit | × B1 serial | TTFT P50/P99 ms | completed | "
             "rejected | prefill share of work | decode eff. | fill | sim speed | ping/pong |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for load in result.loads:
        serial = result.cell("b1-serial-fcfs", load)
        for policy in result.policies:
            c = result.cell(policy.name, load)
            if c is None:
                continue
            s, run = c.summary, c.run
            work = run.prefill_work_s + run.decode_work_s
            base = serial.summary.output_tokens_per_s if serial is not None else 0.0
            speed = f"{run.speedup:.0f}x" if run.statistics is not None else "closed form"
            g = c.goodput
            lines.append(
                f"| {load:g} | {policy.name} | {'—' if g is None else f'{g.goodput_per_s:.3f}'} | "
                f"{'—' if g is None else f'{g.on_time_fraction:.0%}'} | {s.output_tokens_per_s:.1f} | {s.output_tokens_per_s / bound:.2f} | "
                f"{ratio_text(s.output_tokens_per_s / c.workload_limit if c.workload_limit else None)} | "
                f"{ratio_text(s.output_tokens_per_s / base if base else None)} | "
                f"{ms(s.ttft_s.p50)}/{ms(s.ttft_s.p99)} | {s.completed} | {s.rejected} | "
                f"{ratio_text(run.prefill_work_s / work if work else None)} | "
                f"{ratio_text(decode_efficiency(c, result.cost))} | {ratio_text(s.fill_ratio)} | {speed} | "
                f"{_degrade_text(c, M2_P99_REGRESSION)} |")
    return lines + [""]


def _targets(result: SweepResult) -> list[str]:
    rows, notes = acceptance(result)
    if not rows:
        return []
    lines = ["## Acceptance figures", "", *acceptance_table(rows)]
    return lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


def _extra_sections(result: SweepResult) -> str:
    lines = goodput_section(result) + _targets(result) + _headline(result) + storm_section(result)
    lines += tenant_section(result)
    lines += [f"Sweep wall time: {result.wall_s:.1f} s.", ""]
    return "\n".join(lines)


def _summary_json(result: SweepResult, command_line: str) -> dict[str, Any]:
    def row(c: Cell) -> dict[str, Any]:
        s = c.summary
        limit = c.workload_limit
        return {"policy": c.policy.name, "load": c.load, "output_tokens_per_s": round(s.output_tokens_per_s, 4),
                "device_bound_ratio": round(s.output_tokens_per_s / result.device_bound, 4),
                "workload_limit_tokens_per_s": None if limit is None else round(limit, 4),
                "workload_limit_ratio": None if not limit else round(s.output_tokens_per_s / limit, 4),
                "ttft_p50_s": s.ttft_s.p50, "ttft_p99_s": s.ttft_s.p99,
                "ttft_p99_by_class_s": {k: v.p99 for k, v in s.ttft_by_class_s.items()},
                "itl_p99_s": s.itl_s.p99, "requests": s.requests, "completed": s.completed, "rejected": s.rejected,
                "rejections_by_reason": dict(s.rejections_by_reason), "fill_ratio": s.fill_ratio,
                "jain": s.jain_fairness, "starvation_events": s.starvation_events,
                "prefill_work_s": round(c.run.prefill_work_s, 4), "decode_work_s": round(c.run.decode_work_s, 4),
                "virtual_s": round(c.run.end_s, 4), "wall_s": round(c.run.wall_s, 4), **goodput_json(c)}

    return {"workload": result.workload.name, "command": command_line, "device_bound_tokens_per_s": result.device_bound,
            "loads": list(result.loads), "runs": [row(c) for c in result.cells],
            "deadline_scale": result.deadline_scale, "estimator_error": estimator_json(result),
            "reference": result.reference_label, "reference_runs": [row(c) for c in result.reference]}
