"""The information bound on any admission-time finish estimate: the simulations (issue #13).

Why this exists: :mod:`calculet.bench.estimate_bound` needs, for a request r of a bench run, samples
of r's finish given only what is known at its submit. This module draws them: the run's requests
up to r's arrival (r included) are kept and the later ones are taken from a fresh seed's trace
(:func:`calculet.loadsim.splice.splice_future`: by Poisson's independent increments, the
conditional law of the future), and the same policy runs the spliced trace. The actual run is one
of the samples. The oracle keeps fixed what the real estimator does not know (the pending
cancellations of the requests already present), so its samples are narrower than the true law and
the bound stays a lower bound.

Each sample is checked: r's estimate (made at its submit) must equal the actual run's in every
splice, which shows that nothing after the cut reached the present. Arrivals after r has ended
cannot change it (the engine is causal), so a sample first runs with arrivals up to
``4 x r's actual latency`` (at least 20 s) and again up to 1.5 x r's deadline only when r had not
ended by the first cut.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from calculet.adapters.sim.cost import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.analysis import SimRequestRecord
from calculet.loadsim.policies import PolicySpec, run_policy
from calculet.loadsim.splice import splice_future
from calculet.loadsim.workload import PoissonArrivals, SimRequest, Workload, generate_requests
from calculet.machines.monitor import MONITOR

__all__ = ["FUTURE_LAWS", "LoadSamples", "RequestSamples", "RowSpec", "future_workload", "is_scored", "sample_load"]

FIRST_CUT_LATENCIES = 4.0
FIRST_CUT_MIN_S = 20.0
DEADLINE_CUT = 1.5
FUTURE_LAWS = ("workload", "stationary")
"""``workload``: futures from the workload's own arrival law (the bound). ``stationary``: a what-if, futures
from a homogeneous Poisson law at the workload's mean rate (what an estimate blind to the on/off phase
would assume); its samples are all fresh, the actual run (the true law) left out."""


def is_scored(record: SimRequestRecord) -> bool:
    """The requests :func:`calculet.loadsim.goodput.estimate_error` scores: completed, with an estimate."""
    return (record.estimated_finish_s is not None and record.finish_s is not None
            and record.finish_s > record.arrival_s and record.finish_reason in ("stop", "length"))


@dataclass(frozen=True)
class RowSpec:
    """What one row samples: a policy on a workload's trace (the bench's seed unless given)."""

    workload: Workload
    policy: PolicySpec
    cost: CostModel
    duration_s: float | None = None
    seed: int | None = None
    future_law: str = "workload"


def future_workload(workload: Workload, law: str) -> Workload:
    """The workload the futures are drawn from (:data:`FUTURE_LAWS`); the attributes' law is unchanged."""
    if law == "workload":
        return workload
    if law == "stationary":
        rate = PoissonArrivals(kind="poisson", rate_per_s=float(workload.arrivals.mean_rate()))
        return workload.model_copy(update={"arrivals": rate})
    raise DefinitionError(f"unknown future law {law!r}; one of {', '.join(FUTURE_LAWS)}")


@dataclass(frozen=True)
class RequestSamples:
    """One sampled request: its arrival, today's estimate, and its finish in each sample it completed."""

    index: int
    arrival_s: float
    estimate_s: float
    finishes: tuple[float, ...]
    """The actual run's finish first, then each fresh future's where r completed (stop or length)."""
    seeds: tuple[int, ...]
    """The trace seed of each finish (the actual run's own seed first), in the order drawn."""
    drawn: int
    """Samples drawn (the actual one included); the ones missing from ``finishes`` did not complete."""


@dataclass(frozen=True)
class LoadSamples:
    """One load of a row: the actual run's scored errors and the sampled requests."""

    load: float
    scored_errors: tuple[float, ...]
    """Signed relative error of every scored request of the actual run (the bench's figure)."""
    requests: tuple[RequestSamples, ...]
    runs: int
    cpu_s: float
    mismatches: int
    """Samples whose estimate for r differed from the actual run's (must be 0: the splice leaked)."""
    beyond_horizon: int
    """Samples where r ended after 1.5 x its deadline (must be 0: the cut may have mattered)."""


@dataclass(frozen=True)
class _Context:
    spec: RowSpec
    load: float
    requests: tuple[SimRequest, ...]
    records: tuple[SimRequestRecord, ...]


_CONTEXT: _Context | None = None
_FUTURES: dict[tuple[float, int], tuple[SimRequest, ...]] = {}


def _future(ctx: _Context, seed: int) -> tuple[SimRequest, ...]:
    key = (ctx.load, seed)
    if key not in _FUTURES:
        _FUTURES.clear()  # one load at a time: keep memory flat
        law = future_workload(ctx.spec.workload, ctx.spec.future_law)
        _FUTURES[key] = generate_requests(law, ctx.spec.duration_s, ctx.load, seed=seed)
    return _FUTURES[key]


def _cuts(request: SimRequest, actual: SimRequestRecord) -> list[float]:
    latency = (actual.finish_s or request.arrival_s) - request.arrival_s
    last = request.arrival_s + (DEADLINE_CUT * request.deadline_ms / 1000.0 if request.deadline_ms else math.inf)
    first = min(last, request.arrival_s + max(FIRST_CUT_LATENCIES * latency, FIRST_CUT_MIN_S))
    return [first] if first == last else [first, last]


def _sample(task: tuple[int, int]) -> tuple[int, int, float | None, bool, bool, int, float]:
    """One future for one request: ``(index, seed, finish or None, estimate equal, within horizon, runs, cpu)``."""
    index, seed = task
    ctx = _CONTEXT
    assert ctx is not None
    start = time.process_time()
    request, actual = ctx.requests[index], ctx.records[index]
    record, cuts = actual, _cuts(request, actual)
    for runs, cut in enumerate(cuts, 1):
        trace = splice_future(ctx.requests, _future(ctx, seed), request.arrival_s, cut)
        record = run_policy(ctx.spec.policy, trace, ctx.spec.workload, ctx.spec.cost).requests[index]
        if record.finish_s is not None and record.finish_s <= cut:
            break
    ended = record.finish_s is not None and record.finish_s <= cuts[-1]
    finish = record.finish_s if is_scored(record) else None
    return (index, seed, finish, record.estimated_finish_s == actual.estimated_finish_s, ended, runs,
            time.process_time() - start)


def _pick(records: Sequence[SimRequestRecord], count: int, seed: int) -> list[int]:
    scored = [i for i, r in enumerate(records) if is_scored(r)]
    if len(scored) <= count:
        return scored
    return sorted(int(i) for i in np.random.default_rng(seed).choice(scored, size=count, replace=False))


def _map(tasks: list[tuple[int, int]], processes: int) -> Iterable[tuple[int, int, float | None, bool, bool, int, float]]:
    if processes <= 1:
        yield from map(_sample, tasks)
        return
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        yield from pool.imap_unordered(_sample, tasks, chunksize=1)


def sample_load(spec: RowSpec, load: float, *, requests: int, futures: int, future_seed: int, pick_seed: int = 0,
                processes: int = 1, progress: Callable[[int, int], None] | None = None) -> LoadSamples:
    """The actual run at ``load``, ``requests`` of its scored requests picked at random, and
    ``futures - 1`` fresh futures for each (seeds ``future_seed + 1 ..``), in ``processes`` processes."""
    global _CONTEXT
    if futures < 1 or requests < 1:
        raise DefinitionError(f"need requests >= 1 and futures >= 1, got {requests} and {futures}")
    workload_seed = spec.workload.seed if spec.seed is None else spec.seed
    actual_kept = spec.future_law == "workload"
    seeds = [future_seed + k for k in range(1, futures + (not actual_kept))]
    if workload_seed in seeds:
        raise DefinitionError(f"future seeds {seeds[0]}..{seeds[-1]} include the trace's own seed {workload_seed}")
    start = time.process_time()
    monitor = MONITOR.statistics()
    MONITOR.configure(enabled=False)  # as the sweep runs the bench (calculet/bench/sweep.py)
    try:
        trace = generate_requests(spec.workload, spec.duration_s, load, seed=spec.seed)
        actual = run_policy(spec.policy, trace, spec.workload, spec.cost)
        cpu = time.process_time() - start
        picked = _pick(actual.requests, requests, pick_seed)
        _CONTEXT = _Context(spec, load, trace, actual.requests)
        tasks = [(i, s) for i in picked for s in seeds]
        found: dict[int, list[tuple[int, float]]] = {
            i: [(workload_seed, float(actual.requests[i].finish_s or 0))] if actual_kept else [] for i in picked}
        runs, mismatches, beyond = 1, 0, 0
        for done, (index, seed, finish, same, ended, n, used) in enumerate(_map(tasks, processes), 1):
            runs, cpu, mismatches, beyond = runs + n, cpu + used, mismatches + (not same), beyond + (not ended)
            if finish is not None:
                found[index].append((seed, finish))
            if progress is not None:
                progress(done, len(tasks))
    finally:
        _CONTEXT = None
        _FUTURES.clear()
        MONITOR.configure(enabled=monitor.enabled, mode=monitor.mode)  # type: ignore[arg-type]
    samples = tuple(_request_samples(actual.requests[i], sorted(found[i]), futures)
                    for i in picked if found[i])  # stationary: a request that never completed has no sample
    errors = tuple((r.estimated_finish_s - r.finish_s) / (r.finish_s - r.arrival_s)  # type: ignore[operator]
                   for r in actual.requests if is_scored(r))
    return LoadSamples(load, errors, samples, runs, cpu, mismatches, beyond)


def _request_samples(actual: SimRequestRecord, found: list[tuple[int, float]], drawn: int) -> RequestSamples:
    assert actual.estimated_finish_s is not None
    return RequestSamples(actual.request_id, actual.arrival_s, actual.estimated_finish_s,
                          tuple(f for _, f in found), tuple(s for s, _ in found), drawn)
