"""The sweep: every policy at every load on the same requests, plus the reference runs.

Why this exists: a benchmark judges policies against each other and against the baselines on
*the same* requests (DESIGN principle 10: figures and ratios against a baseline in the same run,
never a timed pass/fail). At each load scale the workload's requests are generated once and run
under every policy in virtual time; the reference runs remove the workload's storms or its noisy
tenant so the report can say what they cost.

Each cell also carries its goodput figures (issue #13: on-time completions, wasted device work,
the estimator's error; :mod:`calculet.loadsim.goodput`) and the offline bound on on-time
completions of the requests it ran on the policy's device, computed once per device and request
list. ``deadline_scale`` multiplies every offered deadline (tight vs loose on one preset).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.analysis import RunSummary, workload_limit
from calculet.loadsim.baselines import device_bound_limit
from calculet.loadsim.bound import OnTimeBound
from calculet.loadsim.goodput import GoodputFigures, goodput_figures, offline_bound
from calculet.loadsim.policies import POLICIES, PolicySpec, run_policy
from calculet.loadsim.runner import PolicyRun
from calculet.loadsim.workload import SimRequest, Workload, generate_requests
from calculet.machines.monitor import MONITOR

__all__ = [
    "COSTS",
    "DEFAULT_LOADS",
    "PRESET_LOADS",
    "Cell",
    "SweepResult",
    "noisy_tenant",
    "reference_kind",
    "run_sweep",
    "scale_deadlines",
]

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
    goodput: GoodputFigures | None = None
    """On-time completions, wasted device work and estimator error of the run (issue #13)."""
    bound: OnTimeBound | None = None
    """The offline upper bound on on-time completions of these requests on the policy's device."""

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
    deadline_scale: float = 1.0

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


def scale_deadlines(requests: Sequence[SimRequest], scale: float) -> tuple[SimRequest, ...]:
    """The same requests with every deadline multiplied by ``scale`` (1: unchanged)."""
    if scale == 1.0:
        return tuple(requests)
    return tuple(r if r.deadline_ms is None else dataclasses.replace(r, deadline_ms=max(1, round(r.deadline_ms * scale)))
                 for r in requests)


class _Bounds:
    """Offline bounds per (request list, device): the solver runs once per device and load."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._done: dict[tuple[int, tuple[int, ...], bool, int | None], tuple[Sequence[SimRequest], OnTimeBound]] = {}
        """Keyed by the request list's id; the value keeps the list alive so an id is never reused."""

    def of(self, requests: Sequence[SimRequest], policy: PolicySpec) -> OnTimeBound:
        key = (id(requests), policy.profiles, policy.max_inflight == 2, policy.prefill_chunk_tokens)
        if key not in self._done:
            self._done[key] = (requests, offline_bound(requests, self.cost, compiled_batch=policy.max_profile,
                                                       pingpong=policy.max_inflight == 2,
                                                       prefill_chunk_tokens=policy.prefill_chunk_tokens,
                                                       profiles=policy.profiles))
        return self._done[key][1]


def _cell(load: float, policy: PolicySpec, requests: Sequence[SimRequest], workload: Workload, cost: CostModel,
          bounds: _Bounds, threshold_s: float, update: Callable[[float], None]) -> Cell:
    """One policy on one request list, with its summary, goodput figures and offline bound."""
    largest = max(p.max_profile for p in POLICIES.values())
    run = run_policy(policy, requests, workload, cost, progress=update)
    summary = run.summary(weights=workload.weights(), starvation_threshold_s=threshold_s)
    return Cell(load, policy, run, summary, workload_limit(requests, cost, largest),
                sum(r.max_new_tokens for r in requests), goodput_figures(run, cost, summary.window_s),
                bounds.of(requests, policy))


def run_sweep(workload: Workload, policies: Sequence[PolicySpec], loads: Sequence[float], *,
              cost: CostModel, duration_s: float | None = None, seed: int | None = None,
              starvation_threshold_s: float = 30.0, reference: bool = True, deadline_scale: float = 1.0,
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
    bounds = _Bounds(cost)
    monitor = MONITOR.statistics()
    MONITOR.configure(enabled=False)  # the scheduling alone (production samples 1 event in 256, README "Monitors")
    try:
        with _Bars(total, console, quiet) as bars:
            for load in loads:
                requests = scale_deadlines(generate_requests(workload, duration, load, seed=seed), deadline_scale)
                batches: list[tuple[tuple[SimRequest, ...], list[Cell], str]] = [(requests, cells, "")]
                if label == "no storm":
                    calm = workload.model_copy(update={"storms": ()})
                    batches.append((scale_deadlines(generate_requests(calm, duration, load, seed=seed),
                                                    deadline_scale), refs, f" ({label})"))
                elif noisy is not None:
                    batches.append((tuple(r for r in requests if r.tenant != noisy), refs, f" ({label})"))
                for reqs, sink, suffix in batches:
                    for policy in policies:
                        update = bars.start(f"{policy.name} @ {load:g}{suffix}", duration)
                        sink.append(_cell(load, policy, reqs, workload, cost, bounds, starvation_threshold_s,
                                          update))
                        bars.done()
    finally:
        MONITOR.configure(enabled=monitor.enabled, mode=monitor.mode)  # type: ignore[arg-type]
    return SweepResult(workload, tuple(policies), tuple(loads), cost, tuple(cells), tuple(refs), label,
                       starvation_threshold_s, time.perf_counter() - start, deadline_scale)
