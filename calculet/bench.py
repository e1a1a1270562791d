"""``python -m calculet.bench``: policies judged in virtual time against the baselines and the device bound.

Subcommands::

    python -m calculet.bench run --preset steady --loads 0.5,1,2,4 --out DIR [--policies all]
    python -m calculet.bench run --workload my.yaml --loads 1 --policies b1-serial-fcfs,calculet-b16 --out DIR
    python -m calculet.bench all --out bench/results [--soak-hours 24]   # four presets (+ soak), README.md
    python -m calculet.bench soak --hours 24 [--out DIR]      # §19 M0 analogue; exit 1 on any violation
    python -m calculet.bench list                             # presets and policies

``run`` generates the workload's requests at each load scale (the same requests, compressed in
time, see :mod:`calculet.loadsim.arrivals`), runs every policy on them — the §1 baselines by
simulation, calculet through the real engine, scheduler and executor on the simulated NPU in
cost-model mode (numerics off) with a FakeClock — and writes ``report.md`` with the PNG plots
(throughput and P99 TTFT vs offered load, per-tenant service over time) plus ``summary.json``.
Every figure is virtual time on an assumed cost model (``CostModel.reference()`` by default),
never a measurement of the NPU; the report header carries the exact command line.

Exit codes: 0 done (a benchmark reports figures, it does not pass or fail — DESIGN principle
10), 2 bad input (unknown preset or policy, bad loads), 1 a soak found a violation.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from calculet.adapters.sim.cost import CostModel
from calculet.config import DegradeConfig
from calculet.machines.monitor import MONITOR
from calculet.loadsim.analysis import RunSummary, SimRequestRecord, latency_stats, service_timeline, workload_limit
from calculet.loadsim.baselines import device_bound_limit
from calculet.loadsim.policies import POLICIES, PolicyError, PolicySpec, parse_policies, run_policy
from calculet.loadsim.runner import PolicyRun
from calculet.loadsim.report import PolicyResult, write_report
from calculet.loadsim.soak import SoakOptions, SoakReport, run_soak
from calculet.loadsim.workload import (SimRequest, Workload, WorkloadError, generate_requests, load_preset,
                                       load_workload, offered_load, preset_names)

__all__ = ["PRESET_LOADS", "SweepResult", "main", "parse_loads", "run_sweep"]

PROG = "python -m calculet.bench"

PRESET_LOADS: Mapping[str, tuple[float, ...]] = {
    "steady": (0.5, 1.0, 2.0, 4.0),
    "bursty": (0.5, 1.0, 2.0),
    "long-prefill-storm": (0.5, 1.0, 2.0),
    "noisy-neighbour": (0.5, 1.0, 2.0, 4.0),
}
"""Default sweep per preset: from light load past the B16 device's saturation (steady: the
offered output reaches ~1.5x the B16 device bound at 4x)."""
DEFAULT_LOADS = (0.5, 1.0, 2.0)

COSTS: Mapping[str, Callable[[], CostModel]] = {"reference": CostModel.reference, "tiny": CostModel.tiny}

TARGET_DEVICE_RATIO = 0.9
TARGET_SERIAL_RATIO = 3.0
TARGET_STORM_TTFT_RATIO = 2.0
TARGET_JAIN = 0.95
TARGET_SPEEDUP = 50.0
M2_P99_REGRESSION = DegradeConfig().p99_regression_ratio
"""The shipped §14/M2 P99 gate (+5%) the ping/pong policies run without; reported, not applied."""


# --------------------------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------------------------


def parse_loads(text: str) -> tuple[float, ...]:
    """``"0.5,1,2"`` → ``(0.5, 1.0, 2.0)``: finite, > 0, no duplicates, sorted as given."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated load scales such as 0.5,1,2; got {text!r}")
    loads: list[float] = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"load {part!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"load {part!r} must be a finite number > 0 (a multiple of the "
                                             "workload's arrival rate)")
        if value in loads:
            raise argparse.ArgumentTypeError(f"load {part!r} is listed twice")
        loads.append(value)
    return tuple(loads)


def _number(kind: Callable[[str], Any], ok: Callable[[Any], bool], rule: str,
            what: str = "") -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` that must satisfy ``ok``, else a message stating ``rule``."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (ok(value) and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{what}{text!r} {rule}")
        return value
    return parse


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    return _number(kind, lambda v: v > 0, "must be > 0")


_non_negative_int = _number(int, lambda v: v >= 0, "must be >= 0")
_non_negative_float = _number(float, lambda v: v >= 0, "must be a finite number >= 0")
_rate = _number(float, lambda v: 0 <= v <= 0.05, "must be in [0, 0.05] per fault kind per job", "fault rate ")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{run,all,soak,list}")
    sub.required = True

    run = sub.add_parser("run", help="run a workload under several policies at several loads; write a report")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help=f"a bundled workload: {', '.join(preset_names())}")
    source.add_argument("--workload", type=Path, help="a calculet-loadsim/v1 YAML file")
    _sweep_arguments(run)
    run.add_argument("--loads", type=parse_loads, default=None,
                     help="comma-separated load scales (multiples of the workload's arrival rate); default: "
                          "the preset's sweep (" + "; ".join(f"{k} {','.join(f'{v:g}' for v in vs)}"
                                                            for k, vs in PRESET_LOADS.items()) + ")")
    run.add_argument("--out", type=Path, required=True, help="output folder (created; report.md, PNGs, summary.json)")
    run.set_defaults(func=_cmd_run, parser=run)

    every = sub.add_parser("all", help="run the four presets with their default sweeps into OUT/<preset>/ and "
                                       "write OUT/README.md")
    _sweep_arguments(every)
    every.add_argument("--out", type=Path, required=True, help="results folder, e.g. bench/results")
    every.add_argument("--soak-hours", type=_non_negative_float, default=0.0,
                       help="also run a soak of this many virtual hours into OUT/soak/ (default 0: none)")
    every.set_defaults(func=_cmd_all, parser=every)

    soak = sub.add_parser("soak", help="24 h of traffic in virtual time with faults; exit 1 on any violation")
    soak.add_argument("--hours", type=_positive(float), default=24.0, help="virtual hours (default 24)")
    source = soak.add_mutually_exclusive_group()
    source.add_argument("--preset", default="steady", help="bundled workload (default steady)")
    source.add_argument("--workload", type=Path, help="a calculet-loadsim/v1 YAML file")
    soak.add_argument("--load", type=_positive(float), default=1.0, help="load scale (default 1)")
    soak.add_argument("--policy", default=SoakOptions.policy, help=f"engine policy (default {SoakOptions.policy})")
    soak.add_argument("--fault-rate", type=_rate, default=SoakOptions.fault_rate,
                      help=f"injected faults per kind per job (default {SoakOptions.fault_rate:g}; six kinds)")
    soak.add_argument("--seed", type=_non_negative_int, default=1)
    soak.add_argument("--cost", choices=sorted(COSTS), default="reference")
    soak.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (~4.5x slower)")
    soak.add_argument("--no-monitors", action="store_true", help="do not run the invariant monitors")
    soak.add_argument("--out", type=Path, help="also write soak.md into this folder")
    soak.add_argument("--quiet", action="store_true", help="no progress bar")
    soak.set_defaults(func=_cmd_soak, parser=soak)

    listing = sub.add_parser("list", help="list presets and policies")
    listing.set_defaults(func=_cmd_list, parser=listing)
    return parser


def _sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", default="all",
                        help=f"comma-separated policies or 'all' (default): {', '.join(POLICIES)}")
    parser.add_argument("--duration", type=_positive(float), default=None,
                        help="virtual seconds of arrivals (default: the workload's duration_s)")
    parser.add_argument("--seed", type=_non_negative_int, default=None, help="override the workload's seed")
    parser.add_argument("--cost", choices=sorted(COSTS), default="reference",
                        help="cost model of the simulated NPU (default reference; the presets are sized for it)")
    parser.add_argument("--starvation-threshold", type=_positive(float), default=30.0,
                        help="seconds a request may wait while later arrivals of its prompt class start before "
                             "it counts as starved (default 30)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference runs (the same requests without the workload's storms, or "
                             "without its noisy tenant)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


# --------------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One policy at one load: its run, its summary, and the workload limit of the requests it ran."""

    load: float
    policy: PolicySpec
    run: PolicyRun
    summary: RunSummary
    workload_limit: float | None
    """:func:`~calculet.loadsim.analysis.workload_limit` of the offered requests on the largest profile."""
    offered_output_tokens: int = 0
    """Output tokens the offered requests ask for (``max_new_tokens``)."""

    @property
    def min_device_s(self) -> float | None:
        """Device seconds the offered requests need at least: their output over the workload limit."""
        return self.offered_output_tokens / self.workload_limit if self.workload_limit else None


@dataclass(frozen=True)
class SweepResult:
    """Every run of a sweep, plus the reference runs: the same background requests without the
    workload's storms, or without its noisy tenant (see :func:`reference_kind`)."""

    workload: Workload
    policies: tuple[PolicySpec, ...]
    loads: tuple[float, ...]
    cost: CostModel
    cells: tuple[Cell, ...]
    reference: tuple[Cell, ...]
    reference_label: str
    starvation_threshold_s: float
    wall_s: float

    def cell(self, policy: str, load: float, *, reference: bool = False) -> Cell | None:
        for c in (self.reference if reference else self.cells):
            if c.policy.name == policy and c.load == load:
                return c
        return None

    @property
    def largest_profile(self) -> int:
        """The largest profile of the catalogue: both limits assume it (B16)."""
        return max(p.max_profile for p in POLICIES.values())

    @property
    def device_bound(self) -> float:
        """The issue's decode-only limit: ``B / decode_s(B)`` (no prefill)."""
        return device_bound_limit(self.cost, self.largest_profile)

    def workload_limits(self) -> dict[float, float]:
        """Per load, the workload limit of the requests offered at that load (prefill paid once)."""
        return {c.load: c.workload_limit for c in self.cells if c.workload_limit is not None}

    @property
    def noisy_tenant(self) -> str | None:
        return noisy_tenant(self.workload)


def noisy_tenant(workload: Workload) -> str | None:
    """The tenant offering the most traffic relative to its weighted share, if that is ≥ 2x."""
    if len(workload.tenants) < 2:
        return None
    shares, weights = workload.shares(), workload.weights()
    total = sum(weights.values())
    ratio = {name: shares[name] / (weights[name] / total) for name in shares}
    name = max(ratio, key=lambda n: ratio[n])
    return name if ratio[name] >= 2.0 else None


def reference_kind(workload: Workload) -> str:
    """What the reference runs remove: ``"no storm"``, ``"without <tenant>"``, or ``""`` (none).

    The storm-free requests are regenerated (storms draw from their own random streams, so the
    background is unchanged); a noisy tenant's requests are filtered out of the same list.
    """
    if workload.storms:
        return "no storm"
    tenant = noisy_tenant(workload)
    return f"without {tenant}" if tenant else ""


class _Bars:
    """A rich progress display: runs done, and virtual time of the current run."""

    def __init__(self, total_runs: int, console: Console, quiet: bool) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                                 TimeElapsedColumn(), console=console, transient=False,
                                 disable=quiet or not console.is_terminal)
        self.overall: TaskID = self.progress.add_task("runs", total=total_runs)
        self.current: TaskID = self.progress.add_task("", total=1.0, visible=False)

    def __enter__(self) -> _Bars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def start(self, label: str, horizon_s: float) -> Callable[[float], None]:
        self.progress.reset(self.current, total=horizon_s, description=label, visible=True)

        def update(virtual_s: float) -> None:
            self.progress.update(self.current, completed=min(virtual_s, horizon_s))
        return update

    def done(self) -> None:
        self.progress.advance(self.overall)


def run_sweep(workload: Workload, policies: Sequence[PolicySpec], loads: Sequence[float], *,
              cost: CostModel, duration_s: float | None = None, seed: int | None = None,
              starvation_threshold_s: float = 30.0, reference: bool = True,
              console: Console | None = None, quiet: bool = True) -> SweepResult:
    """Every policy at every load on the same requests (per load), and with ``reference`` the
    reference runs of :func:`reference_kind`."""
    console = console or Console(stderr=True)
    label = reference_kind(workload) if reference else ""
    noisy = noisy_tenant(workload) if label.startswith("without ") else None
    duration = workload.duration_s if duration_s is None else duration_s
    total = len(policies) * len(loads) * (2 if label else 1)
    cells: list[Cell] = []
    refs: list[Cell] = []
    start = time.perf_counter()
    monitor = MONITOR.statistics()
    MONITOR.configure(enabled=False)  # figures of the production path; the tests run the monitors
    try:
        with _Bars(total, console, quiet) as bars:
            for load in loads:
                requests = generate_requests(workload, duration, load, seed=seed)
                batches: list[tuple[tuple[SimRequest, ...], list[Cell], str]] = [(requests, cells, "")]
                if label == "no storm":
                    calm = workload.model_copy(update={"storms": ()})
                    batches.append((generate_requests(calm, duration, load, seed=seed), refs, f" ({label})"))
                elif noisy is not None:
                    batches.append((tuple(r for r in requests if r.tenant != noisy), refs, f" ({label})"))
                largest = max(p.max_profile for p in POLICIES.values())
                for reqs, sink, suffix in batches:
                    limit = workload_limit(reqs, cost, largest)
                    offered = sum(r.max_new_tokens for r in reqs)
                    for policy in policies:
                        update = bars.start(f"{policy.name} @ {load:g}{suffix}", duration)
                        run = run_policy(policy, reqs, workload, cost, progress=update)
                        summary = run.summary(weights=workload.weights(),
                                              starvation_threshold_s=starvation_threshold_s)
                        sink.append(Cell(load, policy, run, summary, limit, offered))
                        bars.done()
    finally:
        MONITOR.configure(enabled=monitor.enabled, mode=monitor.mode)  # type: ignore[arg-type]
    return SweepResult(workload, tuple(policies), tuple(loads), cost, tuple(cells), tuple(refs), label,
                       starvation_threshold_s, time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def write_sweep_report(result: SweepResult, out: Path, command_line: str) -> Path:
    """``report.md`` (the shared tables and plots, then this sweep's own sections) and ``summary.json``."""
    w = result.workload
    results = [PolicyResult(c.policy.name, c.load, c.summary,
                            service_timeline(c.run.requests, weights=w.weights(), start_s=0.0))
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


def _ratio_text(value: float | None, digits: int = 2) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.0f}"


def _nominal_loads(result: SweepResult) -> tuple[float, ...]:
    """The workload's own rate (load 1) when swept, else every load."""
    return (1.0,) if 1.0 in result.loads else result.loads


def _decode_efficiency(c: Cell, cost: CostModel) -> float | None:
    """Tokens from decode steps per second of decode work, over the policy's largest-profile bound."""
    run = c.run
    if run.decode_work_s <= 0:
        return None
    decode_tokens = c.summary.output_tokens - sum(1 for r in run.requests if r.token_times_s)
    return decode_tokens / run.decode_work_s / device_bound_limit(cost, c.policy.max_profile)


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


def _limits_text(result: SweepResult) -> str:
    """Both limits in one sentence (the headline and the acceptance notes use it)."""
    b = result.largest_profile
    limits = result.workload_limits()
    per_load = ", ".join(f"{load:g}: {v:.1f}" for load, v in sorted(limits.items())) or "—"
    return (f"Decode-only limit (the issue's device-bound limit): {result.device_bound:.1f} output tokens/s — B{b} "
            f"lanes always full, back to back, no host cost, no ping/pong overlap, no prefill. Workload limit: the "
            f"offered requests' output tokens / (Σ prefill time + Σ (output − 1) × decode_s(B{b}) / {b}) — the "
            "device never idle, every decode step full, each prefill paid once, no host cost — by load scale: "
            f"{per_load} output tokens/s.")


def _headline(result: SweepResult) -> list[str]:
    bound = result.device_bound
    lines = ["## Headline figures", "",
             _limits_text(result) + " `× limit` = throughput / the decode-only limit; `× workload limit` = "
             "throughput / the workload limit at that load; `× B1 serial` = throughput / the "
             "`b1-serial-fcfs` baseline's at the same load. Device work = what the cost model charges the jobs "
             "submitted (nominal; with ping/pong two jobs overlap, so work can exceed the run time). "
             "`decode eff.` = tokens produced by decode steps per second of decode work, over the limit of the "
             "policy's own largest profile (1.0 = every decode step ran full). Sim speed = virtual / wall time.", "",
             "| load | policy | out tok/s | × limit | × workload limit | × B1 serial | TTFT P50/P99 ms | completed | "
             "rejected | prefill share of work | decode eff. | fill | sim speed | ping/pong |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
            lines.append(
                f"| {load:g} | {policy.name} | {s.output_tokens_per_s:.1f} | {s.output_tokens_per_s / bound:.2f} | "
                f"{_ratio_text(s.output_tokens_per_s / c.workload_limit if c.workload_limit else None)} | "
                f"{_ratio_text(s.output_tokens_per_s / base if base else None)} | "
                f"{_ms(s.ttft_s.p50)}/{_ms(s.ttft_s.p99)} | {s.completed} | {s.rejected} | "
                f"{_ratio_text(run.prefill_work_s / work if work else None)} | "
                f"{_ratio_text(_decode_efficiency(c, result.cost))} | {_ratio_text(s.fill_ratio)} | {speed} | "
                f"{_degrade_text(c, M2_P99_REGRESSION)} |")
    return lines + [""]


def _tenant_section(result: SweepResult) -> list[str]:
    w = result.workload
    if len(w.tenants) < 2:
        return []
    noisy = result.noisy_tenant if result.reference_label.startswith("without ") else None
    lines = ["## Per-tenant service", "",
             "Tokens delivered, tokens / weight, P99 TTFT (s), longest stall (s: the longest stretch without a "
             "token while the tenant had a request outstanding) and rejections per tenant. Jain's index (also in "
             "the policy tables) compares each tenant's tokens with its weighted max-min fair share (notes above)."]
    if noisy:
        lines[-1] += (f" `alone` = the tenant's P99 TTFT in the reference run: the same requests with `{noisy}`'s "
                      "removed.")
    header = " | ".join(f"{t.name} (w={t.weight:g}): tok, tok/w, TTFT P99{', alone' if noisy and t.name != noisy else ''}"
                        f", stall, rejected" for t in w.tenants)
    lines += ["", f"| load | policy | {header} | Jain |", "|---|---|" + "---|" * (len(w.tenants) + 1)]
    stalls: list[tuple[float, str, float, str, float]] = []
    for load in result.loads:
        for policy in result.policies:
            c = result.cell(policy.name, load)
            if c is None:
                continue
            per = _per_tenant(c.run.requests)
            stall = tenant_stalls(c.run.requests)
            ref = result.cell(policy.name, load, reference=True) if noisy else None
            alone = _per_tenant(ref.run.requests) if ref is not None else {}
            cells = []
            for t in w.tenants:
                tokens, ttft_p99, rejected = per.get(t.name, (0, None, 0))
                extra = ""
                if noisy and t.name != noisy:
                    extra = f", {_ratio_text(alone.get(t.name, (0, None, 0))[1], 1)}"
                gap, at = stall.get(t.name, (0.0, 0.0))
                if gap >= result.starvation_threshold_s and policy.kind == "engine":
                    stalls.append((gap, policy.name, load, t.name, at))
                cells.append(f"{tokens}, {tokens / t.weight:.0f}, {_ratio_text(ttft_p99, 1)}{extra}, {gap:.1f}, "
                             f"{rejected}")
            lines.append(f"| {load:g} | {policy.name} | " + " | ".join(cells) +
                         f" | {_ratio_text(c.summary.jain_fairness, 3)} |")
    lines.append("")
    if stalls:
        worst = sorted(stalls, reverse=True)[:5]
        lines += [f"Engine runs where a tenant went ≥ {result.starvation_threshold_s:g} s without a token while it had "
                  "a request outstanding: " + "; ".join(f"`{p}` at load {x:g}: {t} {g:.0f} s from t={a:.0f} s"
                                                        for g, p, x, t, a in worst) + ".", ""]
    return lines


def tenant_stalls(records: Sequence[SimRequestRecord]) -> dict[str, tuple[float, float]]:
    """Per tenant, its longest stretch without a token while it had an admitted request outstanding.

    Returns ``{tenant: (gap_s, start_s)}``. Outstanding = from an admitted request's arrival to its
    finish (merged over the tenant's requests); within each such stretch the gaps between its
    start, the tenant's token instants and its end are measured. A long gap while other tenants
    are served is a per-tenant starvation the per-request starvation count does not show.
    """
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.admitted and r.finish_s is not None:
            spans[r.tenant].append((r.arrival_s, r.finish_s))
            tokens[r.tenant].extend(r.token_times_s)
    out: dict[str, tuple[float, float]] = {}
    for tenant, intervals in spans.items():
        times = sorted(tokens[tenant])
        best = (0.0, 0.0)
        merged: list[list[float]] = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        j = 0
        for a, b in merged:
            last = a
            while j < len(times) and times[j] <= b:
                if times[j] >= a:
                    if times[j] - last > best[0]:
                        best = (times[j] - last, last)
                    last = times[j]
                j += 1
            if b - last > best[0]:
                best = (b - last, last)
        out[tenant] = best
    return out


def _per_tenant(records: Sequence[SimRequestRecord]) -> dict[str, tuple[int, float | None, int]]:
    tokens: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    ttft: dict[str, list[float]] = defaultdict(list)
    for r in records:
        tokens[r.tenant] += r.generated_tokens
        if not r.admitted:
            rejected[r.tenant] += 1
        if r.first_token_s is not None:
            ttft[r.tenant].append(r.first_token_s - r.arrival_s)
    names = set(tokens) | set(rejected) | set(ttft)
    return {n: (tokens[n], latency_stats(ttft.get(n, [])).p99, rejected[n]) for n in names}


def _storm_figures(c: Cell, ref: Cell) -> tuple[float | None, float | None, int, int, float | None]:
    """Short P99 TTFT with and without the storm, long prompts completed/offered, longest long wait."""
    storm, calm = c.summary.ttft_by_class_s["short"].p99, ref.summary.ttft_by_class_s["short"].p99
    longs = [r for r in c.run.requests if r.klass == "long"]
    done = sum(1 for r in longs if r.finish_reason in ("length", "stop"))
    waits = [((r.service_start_s if r.service_start_s is not None else r.finish_s or r.arrival_s) - r.arrival_s)
             for r in longs]
    return storm, calm, done, len(longs), (max(waits) if waits else None)


def _storm_capacity_text(result: SweepResult) -> str:
    """Why the storm's two figures trade against each other: device time needed vs the deadline.

    A storm's prefill work is fixed by the cost model; finishing it before the deadline needs a
    share of the device over that window. The background traffic needs the share its no-storm
    reference run used. When the two exceed one engine, a policy chooses which figure to miss.
    """
    w, cost = result.workload, result.cost
    deadline_ms = w.deadline_ms.upper_bound() if w.deadline_ms is not None else None
    parts = []
    for storm in w.storms:
        tokens = int(storm.prompt_tokens.upper_bound())
        work = storm.count * cost.prefill_s(tokens)
        text = f"{storm.count} × {tokens} tokens = {work:.0f} s of prefill"
        if deadline_ms:
            text += f" ({work / (deadline_ms / 1000):.0%} of the device over its {deadline_ms / 1000:.0f} s deadline)"
        parts.append(text)
    need = []
    for load in _nominal_loads(result):
        refs = [c for c in result.reference if c.load == load and c.min_device_s is not None]
        arrivals = [r.arrival_s for c in refs[:1] for r in c.run.requests]
        if refs and arrivals and max(arrivals) > 0:
            need.append(f"{refs[0].min_device_s / max(arrivals):.0%} at load {load:g}")  # type: ignore[operator]
    text = "Capacity: each storm brings " + "; ".join(dict.fromkeys(parts)) + "."
    if need:
        text += (" The background traffic alone needs at least " + ", ".join(need) + " of the device (its "
                 "prefills once, every decode step full: the workload limit's accounting; real batches are not "
                 "full, so more). Where a storm's share and the background's add up to more than one engine, no "
                 "single-engine policy can both finish every long prompt before its deadline and keep short "
                 "prompts' latency: chunking protects the short prompts and lets long ones miss their deadline; "
                 "whole-prompt prefill finishes more long prompts and blocks the short ones behind them.")
    return text


def _storm_section(result: SweepResult) -> list[str]:
    if result.reference_label != "no storm":
        return []
    lines = ["## Long-prefill storm vs no storm", "",
             "The same policy on the same background requests without the storm prompts (reference runs). "
             "`short TTFT P99` is over the short-class (≤ 512 tokens) requests of the whole run; long prompts: "
             "completed / offered, and their longest wait for service (arrival → prefill start).", "",
             "| load | policy | short TTFT P99 s, storm | no storm | ratio | long completed | long max wait s | "
             "starvation events (by class) |", "|---|---|---|---|---|---|---|---|"]
    for load in result.loads:
        for policy in result.policies:
            c, ref = result.cell(policy.name, load), result.cell(policy.name, load, reference=True)
            if c is None or ref is None:
                continue
            storm, calm, done, offered, wait = _storm_figures(c, ref)
            by_class = Counter(e.klass for e in c.summary.starvation)
            lines.append(f"| {load:g} | {policy.name} | {_ratio_text(storm)} | {_ratio_text(calm)} | "
                         f"{_ratio_text(storm / calm if storm is not None and calm else None)} | {done}/{offered} | "
                         f"{_ratio_text(wait, 1)} | "
                         f"{', '.join(f'{k}: {v}' for k, v in sorted(by_class.items())) or '0'} |")
    return lines + [""]


def acceptance(result: SweepResult) -> tuple[list[tuple[str, str, bool]], list[str]]:
    """The issue's acceptance figures for the bundled presets — (figure, value, met) rows — and
    notes with the figures that explain a miss. Other workloads have none."""
    name = result.workload.name
    rows: list[tuple[str, str, bool]] = []
    notes: list[str] = []
    top = max(result.loads)
    if name == "steady":
        serial = result.cell("b1-serial-fcfs", top)
        for policy in ("calculet-b16", "calculet-b16-pingpong"):
            c = result.cell(policy, top)
            if c is None:
                continue
            tps = c.summary.output_tokens_per_s
            ratio = tps / result.device_bound
            rows.append((f"{policy} at load {top:g} (saturation): ≥ {TARGET_DEVICE_RATIO:g} × device-bound limit",
                         f"{tps:.1f} tok/s = {ratio:.2f} × {result.device_bound:.0f}", ratio >= TARGET_DEVICE_RATIO))
            if c.workload_limit:
                wl = tps / c.workload_limit
                rows.append((f"{policy} at load {top:g} (saturation): ≥ {TARGET_DEVICE_RATIO:g} × workload limit "
                             "(not the issue's criterion: decode-only limit + each prefill paid once)",
                             f"{tps:.1f} tok/s = {wl:.2f} × {c.workload_limit:.0f}", wl >= TARGET_DEVICE_RATIO))
            if serial is not None and serial.summary.output_tokens_per_s > 0:
                x = tps / serial.summary.output_tokens_per_s
                rows.append((f"{policy} at load {top:g}: ≥ {TARGET_SERIAL_RATIO:g} × B1 serial baseline",
                             f"{x:.1f} × ({serial.summary.output_tokens_per_s:.1f} tok/s)", x >= TARGET_SERIAL_RATIO))
            work = c.run.prefill_work_s + c.run.decode_work_s
            eff = _decode_efficiency(c, result.cost)
            notes.append(f"`{policy}` at load {top:g}: prefill is {c.run.prefill_work_s / work:.0%} of the device "
                         f"work it submitted; its decode steps deliver {_ratio_text(eff)} of the limit per second "
                         f"of decode work (fill {_ratio_text(c.summary.fill_ratio)}).")
        notes.append(_limits_text(result) + " The issue's row is judged against the decode-only limit. Every "
                     "request pays its prefill before its decode tokens, so with one job in flight no policy can "
                     "reach the decode-only limit on this workload; the workload limit charges each prefill once "
                     "and is the ceiling one engine can approach. Ping/pong can exceed either by running "
                     "prefills on the other engine at the cost model's assumed overlap (0.5) — an assumption the "
                     "hardware has not proved (§14).")
        speeds = [c.run.speedup for c in result.cells if c.policy.name == "calculet-b16"]
        if speeds:
            rows.append((f"simulation speed, calculet-b16 (slowest load): ≥ {TARGET_SPEEDUP:g}x real time",
                         f"{min(speeds):.0f}x", min(speeds) >= TARGET_SPEEDUP))
    elif name == "long-prefill-storm" and result.reference_label == "no storm":
        for load in _nominal_loads(result):
            for policy in result.policies:
                c, ref = result.cell(policy.name, load), result.cell(policy.name, load, reference=True)
                if c is None or ref is None or policy.kind != "engine":
                    continue
                storm, calm, done, offered, wait = _storm_figures(c, ref)
                if storm is None or not calm:
                    continue
                by_class = Counter(e.klass for e in c.summary.starvation)
                ok = storm / calm <= TARGET_STORM_TTFT_RATIO and done == offered and not by_class
                rows.append((f"{policy.name} at load {load:g}: short P99 TTFT ≤ {TARGET_STORM_TTFT_RATIO:g} × "
                             "no-storm; every long prompt completes; no starvation (within a prompt class)",
                             f"{storm:.2f} s / {calm:.2f} s = {storm / calm:.2f}×; long {done}/{offered} (longest "
                             f"wait {_ratio_text(wait, 0)} s); starvation "
                             f"{', '.join(f'{k} {v}' for k, v in sorted(by_class.items())) or '0'}", ok))
        chunked = {p.name: p.prefill_chunk_tokens for p in result.policies if p.prefill_chunk_tokens is not None}
        longest = int(max(storm.prompt_tokens.upper_bound() for storm in result.workload.storms))
        for policy_name, chunk in chunked.items():
            notes.append(f"`{policy_name}` runs on a package whose B1 profile declares a {chunk}-token "
                         f"incremental-prefill chunk, so the longest storm prompt ({longest} tokens) is prefilled as "
                         f"{math.ceil(longest / chunk)} jobs with other work between them. Incremental "
                         "prefill is a simulated capability CalRT 0.7.6 does not provide (§6): this shows what "
                         "chunking would buy, not what can ship.")
        notes.append(("Prompts are never chunked: the simulated package" if not chunked else
                      "Under every other policy prompts are never chunked: the simulated package they run on")
                     + " declares incremental prefill, but no profile declares a chunk size, and §6 allows "
                     "chunking only when five conditions are proven. So each long prompt holds one engine for its "
                     "whole prefill, and the long-prefill quota (1) serialises a storm's prompts in arrival order — "
                     "queued, not starved, since no later long prompt starts before them (the `long max wait` "
                     "column shows how long the last one waited). With one job in flight short requests queue "
                     "behind each long prefill; with ping/pong they run on the other engine at the cost model's "
                     "overlap rate.")
        notes.append(_storm_capacity_text(result))
    elif name == "noisy-neighbour":
        noisy = result.noisy_tenant
        for load in _nominal_loads(result):
            for policy in result.policies:
                c = result.cell(policy.name, load)
                if c is None or policy.kind != "engine":
                    continue
                jain = c.summary.jain_fairness
                value = f"{_ratio_text(jain, 3)} over {c.summary.fairness_windows} windows"
                ref = result.cell(policy.name, load, reference=True)
                if noisy and ref is not None:
                    with_noisy, alone = _per_tenant(c.run.requests), _per_tenant(ref.run.requests)
                    value += "; well-behaved P99 TTFT with / without the noisy tenant: " + ", ".join(
                        f"{t} {_ratio_text(with_noisy.get(t, (0, None, 0))[1], 1)}/"
                        f"{_ratio_text(alone.get(t, (0, None, 0))[1], 1)} s"
                        for t in sorted(alone) if t != noisy)
                rows.append((f"{policy.name} at load {load:g}: Jain (served / max-min fair share) ≥ {TARGET_JAIN:g}",
                             value,
                             jain is not None and jain >= TARGET_JAIN))
        notes.append("Jain's index uses Jain, Chiu and Hawe's normalisation: each tenant's tokens over its "
                     "weighted max-min fair share of the tokens delivered, where a tenant with a request waiting "
                     "for service wants more (unbounded) and one without wanted what it got; it is evaluated over "
                     "the stretches where the set of waiting tenants does not change and token-weighted "
                     "(loadsim.analysis). 1.0 = every tenant got its fair share, so well-behaved tenants asking "
                     "for less than their weight no longer pull it down; it drops when a tenant waits while "
                     "another gets more than its share. The per-tenant TTFT with and without the noisy tenant "
                     "shows the same from the latency side.")
    return rows, notes


def _targets(result: SweepResult) -> list[str]:
    rows, notes = acceptance(result)
    if not rows:
        return []
    lines = ["## Acceptance figures", "", "| figure | value | |", "|---|---|---|"]
    lines += [f"| {what} | {value} | {'met' if ok else '**missed**'} |" for what, value, ok in rows]
    return lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


def _extra_sections(result: SweepResult) -> str:
    lines = _targets(result) + _headline(result) + _storm_section(result) + _tenant_section(result)
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
                "virtual_s": round(c.run.end_s, 4), "wall_s": round(c.run.wall_s, 4)}

    return {"workload": result.workload.name, "command": command_line, "device_bound_tokens_per_s": result.device_bound,
            "loads": list(result.loads), "runs": [row(c) for c in result.cells],
            "reference": result.reference_label, "reference_runs": [row(c) for c in result.reference]}


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------


class _BadInput(Exception):
    """A command-line error found after parsing (unknown preset, policy...): exit code 2."""


def _workload(preset: str | None, path: Path | None) -> Workload:
    try:
        return load_workload(path) if path is not None else load_preset(str(preset))
    except WorkloadError as exc:
        raise _BadInput(str(exc)) from None


def _policies(text: str) -> tuple[PolicySpec, ...]:
    try:
        return parse_policies(text)
    except PolicyError as exc:
        raise _BadInput(str(exc)) from None


def _command_line(argv: Sequence[str]) -> str:
    return shlex.join([*PROG.split(), *argv])


def _sweep(args: argparse.Namespace, workload: Workload, loads: Sequence[float], out: Path, argv: Sequence[str],
           console: Console) -> tuple[SweepResult, Path]:
    policies = _policies(args.policies)
    result = run_sweep(workload, policies, loads, cost=COSTS[args.cost](), duration_s=args.duration, seed=args.seed,
                       starvation_threshold_s=args.starvation_threshold, reference=not args.no_reference,
                       console=console, quiet=args.quiet)
    report = write_sweep_report(result, out, _command_line(argv))
    return result, report


def _cmd_run(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    workload = _workload(args.preset, args.workload)
    _policies(args.policies)  # fail fast, before any run
    loads = args.loads or PRESET_LOADS.get(workload.name, DEFAULT_LOADS)
    _, report = _sweep(args, workload, loads, args.out, argv, console)
    console.print(f"report: {report}")
    return 0


def _cmd_all(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    _policies(args.policies)
    sections: list[str] = []
    for name in PRESET_LOADS:
        workload = _workload(name, None)
        loads = PRESET_LOADS[name]
        sub_argv = ["run", "--preset", name, "--loads", ",".join(f"{x:g}" for x in loads),
                    "--out", str(args.out / name)] + _passthrough(args)
        result, report = _sweep(args, workload, loads, args.out / name, sub_argv, console)
        rows, _ = acceptance(result)
        sections += [f"### [{name}]({name}/report.md)", "", f"`{_command_line(sub_argv)}` — "
                     f"{len(result.cells) + len(result.reference)} runs in {result.wall_s:.0f} s wall.", ""]
        if rows:
            sections += ["| figure | value | |", "|---|---|---|"]
            sections += [f"| {what} | {value} | {'met' if ok else '**missed**'} |" for what, value, ok in rows]
            sections.append("")
        console.print(f"report: {report}")
    soak_ok = True
    if args.soak_hours > 0:
        # a fresh process: the sweeps' records would otherwise mask (or fake) the soak's memory growth
        soak_argv = ["soak", "--hours", f"{args.soak_hours:g}", "--out", str(args.out / "soak")]
        if args.cost != "reference":
            soak_argv += ["--cost", args.cost]
        if args.quiet:
            soak_argv.append("--quiet")
        code = subprocess.run([sys.executable, "-m", "calculet.bench", *soak_argv], check=False).returncode
        soak_ok = code == 0
        try:
            figures = json.loads((args.out / "soak" / "soak.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            figures = None
        sections += ["### [soak](soak/soak.md)", "", f"`{_command_line(soak_argv)}` (its own process)", ""]
        if figures is None:
            sections += [f"The soak did not write its report (exit code {code}).", ""]
        else:
            sections += [f"{'PASS' if figures['ok'] else 'FAIL'}: {figures['virtual_s'] / 3600:.1f} h of virtual "
                         f"time in {figures['wall_s'] / 60:.1f} min wall ({figures['speedup']:.0f}x real time); "
                         f"{figures['submitted']} requests; {sum(figures['injected'].values())} faults injected; "
                         f"{len(figures['violations'])} violations.", ""]
    readme = args.out / "README.md"
    readme.write_text("\n".join([
        "# Load-simulation results", "",
        "Each folder holds `report.md` (acceptance figures, headline table, per-policy tables, plots), the PNG "
        "plots and `summary.json`, written by the command shown (also in each report's header). All figures "
        "are virtual time on the simulated NPU's cost model (`CostModel.reference()`) — assumptions, not NPU "
        "measurements; the engine, scheduler and executor are the real ones. Regenerate everything with:", "",
        "```", _command_line(argv), "```", "", "## Acceptance figures by preset", "", *sections]), encoding="utf-8")
    console.print(f"index: {readme}")
    return 0 if soak_ok else 1


def _passthrough(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.policies != "all":
        out += ["--policies", args.policies]
    if args.duration is not None:
        out += ["--duration", f"{args.duration:g}"]
    if args.seed is not None:
        out += ["--seed", str(args.seed)]
    if args.cost != "reference":
        out += ["--cost", args.cost]
    if args.starvation_threshold != 30.0:
        out += ["--starvation-threshold", f"{args.starvation_threshold:g}"]
    if args.no_reference:
        out.append("--no-reference")
    return out


def _cmd_soak(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    workload = _workload(args.preset, args.workload)
    if args.policy not in POLICIES or POLICIES[args.policy].kind != "engine":
        engines = [n for n, p in POLICIES.items() if p.kind == "engine"]
        raise _BadInput(f"--policy {args.policy!r}: a soak runs an engine policy: {', '.join(engines)}")
    options = SoakOptions(hours=args.hours, preset=workload.name, workload=workload, load_scale=args.load,
                          policy=args.policy, fault_rate=args.fault_rate, seed=args.seed, cost=COSTS[args.cost](),
                          trace_memory=args.tracemalloc, monitors=not args.no_monitors)
    report = _run_soak(options, args.quiet, console)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.md").write_text(report.markdown(_command_line(argv)), encoding="utf-8")
        (args.out / "soak.json").write_text(json.dumps(report.to_json(_command_line(argv)), indent=2) + "\n",
                                            encoding="utf-8")
    _print_soak(report, console)
    return 0 if report.ok else 1


def _run_soak(options: SoakOptions, quiet: bool, console: Console) -> SoakReport:
    """The soak with a progress bar over virtual hours."""
    total = options.hours * 3600.0
    with Progress(TextColumn("soak"), BarColumn(), TextColumn("{task.fields[label]}"), TimeElapsedColumn(),
                  console=console, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task("soak", total=total, label="")

        def update(virtual_s: float, horizon_s: float) -> None:
            bar.update(task, completed=min(virtual_s, horizon_s),
                       label=f"{virtual_s / 3600:.1f} / {horizon_s / 3600:g} h virtual")

        return run_soak(options, progress=update)


def _print_soak(report: SoakReport, console: Console) -> None:
    verdict = "[green]PASS[/green]" if report.ok else "[red]FAIL[/red]"
    console.print(f"soak {verdict}: {report.virtual_s / 3600:.2f} h virtual in {report.wall_s / 60:.1f} min wall "
                  f"({report.speedup:.0f}x); {report.submitted} requests, outcomes "
                  f"{', '.join(f'{k} {v}' for k, v in report.outcomes.items())}; faults injected "
                  f"{sum(report.injected.values())} ({', '.join(f'{k} {v}' for k, v in report.injected.items())}); "
                  f"resets {report.resets}, restarts {report.restarts}; RSS growth "
                  f"{report.rss_growth_bytes / (1 << 20):+.1f} MiB, objects {report.object_growth:+d}",
                  highlight=False)
    for v in report.violations[:50]:
        console.print(f"  violation: {v}", highlight=False, markup=False)


def _cmd_list(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    console.print("presets:", highlight=False)
    for name in preset_names():
        w = load_preset(name)
        loads = ",".join(f"{x:g}" for x in PRESET_LOADS.get(name, DEFAULT_LOADS))
        console.print(f"  {name:20s} {w.description} (default loads {loads})", highlight=False, markup=False)
    console.print("policies:", highlight=False)
    for p in POLICIES.values():
        console.print(f"  {p.name:22s} {p.description}", highlight=False, markup=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 1 for a failed soak)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    command: argparse.ArgumentParser = args.parser
    with _QuietEngineLogs():
        try:
            return int(args.func(args, args_list, console))
        except _BadInput as exc:
            command.print_usage(sys.stderr)
            print(f"{command.prog}: error: {exc}", file=sys.stderr)
            return 2


class _QuietEngineLogs:
    """The engine logs every injected fault, recovery and ping/pong degrade as it happens; the
    reports carry those as figures (faults by kind, resets, degrade reasons), so the terminal
    keeps only the progress bars and critical errors."""

    def __enter__(self) -> None:
        self.logger = logging.getLogger("calculet")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        self.logger.setLevel(self.level)


if __name__ == "__main__":
    sys.exit(main())
