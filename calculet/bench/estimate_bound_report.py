"""``python -m calculet.bench estimate-bound``: the information bound per row, summary.json and report.md.

Why this exists: issue #13 scores the finish estimate given at submit by its P90 relative error
(≤ 25 % on the steady and bursty presets). This command computes, per row (a policy on a preset,
every load pooled as the bench pools), the smallest P90 any estimate made at submit could reach
under the same scheduler (:mod:`calculet.bench.estimate_bound`, samples from
:mod:`calculet.bench.estimate_bound_runs`), beside today's. Rows accumulate in one folder: a row run
again replaces its previous figures, the others are kept, and report.md lists them all.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from calculet.bench.commands import BadInput, command_line, policies_of, workload_of
from calculet.bench.estimate_bound import (Steps, best_coverage, bootstrap_bound, coverage_steps, estimate_steps,
                                           pooled_bound, rollout_steps)
from calculet.bench.estimate_bound_runs import FUTURE_LAWS, LoadSamples, RowSpec, sample_load
from calculet.bench.sweep import COSTS, DEFAULT_LOADS, PRESET_LOADS
from calculet.loadsim.policies import PolicySpec

__all__ = ["add_estimate_bound_parser", "cmd_estimate_bound", "row_figures", "write_report"]

TARGET = 0.9
"""The bench scores the P90: the bound is where 90 % of the scored requests can be within tau."""
MAX_PROCESSES = 2


def _steps(loads: Sequence[LoadSamples], last_seed: int | None = None) -> tuple[list[Steps], list[float], list[float]]:
    """Per sampled request its ``c_r`` (the actual run and the futures of seeds up to ``last_seed``),
    its count-weight (its load's scored requests over those sampled) and its load."""
    steps, weights, strata = [], [], []
    for ls in loads:
        weight = len(ls.scored_errors) / len(ls.requests) if ls.requests else 0.0
        for r in ls.requests:
            finishes = tuple(f for f, s in zip(r.finishes, r.seeds) if last_seed is None or s <= last_seed)
            steps.append(coverage_steps(finishes, r.arrival_s))
            weights.append(weight)
            strata.append(ls.load)
    return steps, weights, strata


def _today_model(loads: Sequence[LoadSamples]) -> float:
    """Today's estimate scored on the same samples: the expected P90 the bound is compared with."""
    steps = [estimate_steps(r.finishes, r.arrival_s, r.estimate_s) for ls in loads for r in ls.requests]
    weights = [len(ls.scored_errors) / len(ls.requests) for ls in loads for _ in ls.requests]
    return pooled_bound(steps, weights, TARGET)


def _per_request(loads: Sequence[LoadSamples], bound: float) -> list[dict[str, Any]]:
    rows = []
    for ls in loads:
        for r in ls.requests:
            coverage, best = best_coverage(r.finishes, r.arrival_s, bound)
            rows.append({"load": ls.load, "index": r.index, "arrival_s": round(r.arrival_s, 4),
                         "estimate_s": round(r.estimate_s, 4), "best_estimate_s": round(best, 4),
                         "coverage_at_bound": round(coverage, 4), "drawn": r.drawn,
                         "finishes_s": [round(f, 4) for f in r.finishes], "seeds": list(r.seeds)})
    return rows


def row_figures(preset: str, policy: str, loads: Sequence[LoadSamples], *, futures: int, future_seed: int,
                draws: int, command: str) -> dict[str, Any]:
    """The bound of one row (every load pooled), its bootstrap interval, today's figures beside it."""
    steps, weights, strata = _steps(loads)
    bound = pooled_bound(steps, weights, TARGET)
    low, high = bootstrap_bound(steps, weights, strata, target=TARGET, draws=draws)
    errors = np.abs(np.concatenate([ls.scored_errors for ls in loads]))
    half = max(1, futures // 2)
    per_load = {f"{ls.load:g}": {"scored": len(ls.scored_errors), "sampled": len(ls.requests),
                                 "bound": pooled_bound(*_steps([ls])[:2], TARGET),
                                 "today_p90": float(np.percentile(np.abs(ls.scored_errors), 90, method="linear"))}
                for ls in loads}
    return {"preset": preset, "policy": policy, "command": command, "futures": futures,
            "loads": [ls.load for ls in loads], "sampled": sum(len(ls.requests) for ls in loads),
            "bound_p90": bound, "bound_interval": [low, high], "bootstrap_draws": draws,
            "bound_p90_half_futures": pooled_bound(*_steps(loads, future_seed + half - 1)[:2], TARGET),
            "half_futures": half,
            "today_p90": float(np.percentile(errors, 90, method="linear")),
            "today_p90_on_samples": _today_model(loads), "per_load": per_load,
            "runs": sum(ls.runs for ls in loads), "cpu_s": round(sum(ls.cpu_s for ls in loads), 1),
            "estimate_mismatches": sum(ls.mismatches for ls in loads),
            "beyond_horizon": sum(ls.beyond_horizon for ls in loads),
            "requests": _per_request(loads, bound)}


def _cross(rows: dict[str, dict[str, Any]]) -> None:
    """A what-if row's best estimates scored on its base row's samples (the true law): the P90 an estimate
    that knew the present exactly but assumed the what-if law of arrivals would reach."""
    for key, row in rows.items():
        base = rows.get(key.split("@")[0]) if "@" in key else None
        if base is None:
            continue
        best = {(r["load"], r["index"]): r["best_estimate_s"] for r in row["requests"]}
        steps, weights = [], []
        for r in base["requests"]:
            if (r["load"], r["index"]) in best:
                steps.append(estimate_steps(r["finishes_s"], r["arrival_s"], best[(r["load"], r["index"])]))
                per_load = base["per_load"][f"{r['load']:g}"]
                weights.append(per_load["scored"] / per_load["sampled"])
        row["best_estimate_on_true_law_p90"] = pooled_bound(steps, weights, TARGET) if steps else None


def _rollout(rows: dict[str, dict[str, Any]]) -> None:
    """Each row's rollout estimate (:func:`rollout_steps`) pooled like the bound, from its stored samples
    (not for a what-if row: its samples follow another law than the trace's)."""
    for row in rows.values():
        if row.get("future_law", "workload") != "workload":
            continue
        steps, weights = [], []
        for r in row["requests"]:
            if len(r["finishes_s"]) >= 2:
                steps.append(rollout_steps(r["finishes_s"], r["arrival_s"]))
                per_load = row["per_load"][f"{r['load']:g}"]
                weights.append(per_load["scored"] / per_load["sampled"])
        row["rollout_p90"] = pooled_bound(steps, weights, TARGET) if steps else None


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f} %"


def write_report(rows: dict[str, dict[str, Any]], out: Path) -> Path:
    """summary.json (every row, its per-request samples) and report.md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    _rollout(rows)
    (out / "summary.json").write_text(json.dumps({"rows": rows}, indent=1, sort_keys=True), encoding="utf-8")
    lines = ["# An information bound on any admission-time finish estimate (issue #13)", "",
             "Per row, the smallest P90 relative finish error any estimate made at submit could reach under the "
             "same scheduler: for each sampled scored request, its finish in the actual run and in runs whose "
             "arrivals after its submit come from fresh seeds; the best point estimate's coverage pooled with the "
             "bench's weights (each load's scored count). Method and reading: `docs/estimator.md`, section "
             "\"An information bound on any admission-time estimate (session 19)\".", "",
             "\"rollout\": each sample scored against the median of the others, what an estimator that simulates "
             "the scheduler forward over K - 1 futures drawn from the law of arrivals would reach (achievable, "
             "unlike the bound, given the law and the present).", "",
             "| preset | policy | today's P90 | today's on the samples | bound P90 | 90 % interval | bound, K/2 | "
             "rollout P90 | K | requests | runs | CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    what_if = []
    for row in sorted(rows.values(), key=lambda r: (r["preset"], r["policy"])):
        if row.get("future_law", "workload") != "workload":
            what_if.append(f"* {row['preset']} {row['policy']}, futures from the {row['future_law']} law: its own "
                           f"\"bound\" {_pct(row['bound_p90'])} (not a bound: the wrong law); its best estimates "
                           f"scored on the true law's samples: P90 {_pct(row.get('best_estimate_on_true_law_p90'))}")
            continue
        low, high = row["bound_interval"]
        lines.append(f"| {row['preset']} | {row['policy']} | {_pct(row['today_p90'])} | "
                     f"{_pct(row['today_p90_on_samples'])} | **{_pct(row['bound_p90'])}** | {_pct(low)} - "
                     f"{_pct(high)} | {_pct(row['bound_p90_half_futures'])} (K={row['half_futures']}) | "
                     f"{_pct(row['rollout_p90'])} | {row['futures']} | {row['sampled']} | {row['runs']} | {row['cpu_s']:.0f} |")
    if what_if:
        lines += ["", "What-ifs (an estimate that knows the present exactly but assumes another law of arrivals):",
                  "", *what_if]
    lines += ["", "Per load (bound alone / today's P90 on every scored request):", ""]
    for row in sorted(rows.values(), key=lambda r: (r["preset"], r["policy"])):
        parts = [f"{load}x {_pct(v['bound'])} / {_pct(v['today_p90'])} ({v['sampled']} of {v['scored']})"
                 for load, v in row["per_load"].items()]
        checks = f"estimate mismatches {row['estimate_mismatches']}, beyond horizon {row['beyond_horizon']}"
        law = "" if row.get("future_law", "workload") == "workload" else f" (futures: {row['future_law']} law)"
        lines.append(f"* {row['preset']} {row['policy']}{law}: " + "; ".join(parts) + f" ({checks})")
    lines += ["", "Commands:", ""] + [f"* `{row['command']}`" for row in sorted(rows.values(),
                                                                            key=lambda r: (r["preset"], r["policy"]))]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report


def _row(args: argparse.Namespace, spec: RowSpec, loads: Sequence[float], bar: Progress, label: str) -> list[LoadSamples]:
    task = bar.add_task(label, total=None)
    samples = []
    for load in loads:
        bar.update(task, description=f"{label} @ {load:g}", completed=0, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        samples.append(sample_load(spec, load, requests=args.requests, futures=args.futures,
                                   future_seed=args.future_seed, processes=args.processes, progress=progress))
    return samples


def _checked_policies(text: str) -> tuple[PolicySpec, ...]:
    policies = policies_of(text)
    baselines = [p.name for p in policies if p.kind != "engine"]
    if baselines:
        raise BadInput(f"{', '.join(baselines)}: a baseline gives no finish estimate; name calculet policies")
    return policies


def cmd_estimate_bound(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    workload = workload_of(args.preset, args.workload)
    policies = _checked_policies(args.policies)
    if args.processes > MAX_PROCESSES:
        raise BadInput(f"--processes {args.processes}: at most {MAX_PROCESSES} (a shared machine)")
    loads = args.loads or PRESET_LOADS.get(workload.name, DEFAULT_LOADS)
    summary = args.out / "summary.json"
    try:
        rows = json.loads(summary.read_text(encoding="utf-8"))["rows"] if summary.exists() else {}
    except (ValueError, KeyError) as exc:
        raise BadInput(f"{summary} is not an estimate-bound summary ({exc}); choose another --out") from None
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, disable=args.quiet or not console.is_terminal) as bar:
        for policy in policies:
            start = time.perf_counter()
            spec = RowSpec(workload, policy, COSTS[args.cost](), args.duration, args.seed, args.future_law)
            samples = _row(args, spec, loads, bar, policy.name)
            row = row_figures(workload.name, policy.name, samples, futures=args.futures,
                              future_seed=args.future_seed, draws=args.bootstrap,
                              command=command_line(argv))
            row["wall_s"] = round(time.perf_counter() - start, 1)
            row["future_law"] = args.future_law
            suffix = "" if args.future_law == "workload" else f"@{args.future_law}"
            rows[f"{workload.name}/{policy.name}{suffix}"] = row
            _cross(rows)
            console.print(f"{workload.name} {policy.name}: bound P90 {_pct(row['bound_p90'])} "
                          f"({_pct(row['bound_interval'][0])} - {_pct(row['bound_interval'][1])}), today's "
                          f"{_pct(row['today_p90'])}; {row['runs']} runs, {row['cpu_s']:.0f} s CPU")
            write_report(rows, args.out)
    console.print(f"report: {args.out / 'report.md'}")
    return 0


def add_estimate_bound_parser(sub: Any, parse_loads: Any, positive: Any, non_negative_int: Any) -> None:
    """The ``estimate-bound`` subcommand (registered by :mod:`calculet.bench.cli`)."""
    cmd = sub.add_parser("estimate-bound", help="the smallest P90 finish-estimate error any estimate made at submit "
                                                "could reach under the same scheduler (issue #13); per policy")
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help="a bundled workload, e.g. steady or bursty")
    source.add_argument("--workload", type=Path, help="a calculet-loadsim/v1 YAML file")
    cmd.add_argument("--policies", required=True, help="comma-separated calculet policies, e.g. calculet-b16")
    cmd.add_argument("--loads", type=parse_loads, default=None, help="load scales (default: the preset's sweep)")
    cmd.add_argument("--requests", type=positive(int), default=25, help="scored requests sampled per load (default 25)")
    cmd.add_argument("--futures", type=positive(int), default=10,
                     help="samples of each request's finish, the actual run's included (default 10)")
    cmd.add_argument("--future-seed", type=non_negative_int, default=1_000_000,
                     help="fresh futures use seeds FUTURE_SEED+1 .. FUTURE_SEED+FUTURES-1 (default 1000000)")
    cmd.add_argument("--future-law", choices=FUTURE_LAWS, default="workload",
                     help="workload (default): futures from the workload's arrival law, the bound; stationary: a "
                          "what-if, futures from a Poisson law at its mean rate (an estimate blind to bursts)")
    cmd.add_argument("--duration", type=positive(float), default=None, help="virtual seconds of arrivals (default: the workload's)")
    cmd.add_argument("--seed", type=non_negative_int, default=None, help="the trace's seed (default: the workload's)")
    cmd.add_argument("--cost", choices=sorted(COSTS), default="reference", help="cost model (default reference)")
    cmd.add_argument("--processes", type=positive(int), default=1, help=f"worker processes (1..{MAX_PROCESSES})")
    cmd.add_argument("--bootstrap", type=positive(int), default=1000, help="bootstrap draws (default 1000)")
    cmd.add_argument("--out", type=Path, required=True, help="output folder (summary.json and report.md; rows "
                                                             "already there are kept)")
    cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    cmd.set_defaults(func=cmd_estimate_bound, parser=cmd)
