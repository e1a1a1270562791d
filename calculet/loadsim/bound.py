"""An offline upper bound on on-time completions for a recorded trace (issue #13 item 6).

Why: "goodput ≥ 0.8 × the optimum" needs an optimum, and the true optimum of an online
scheduling problem with arrivals is not computable in general. This module computes a number
that *no* schedule of the same device can beat, so a policy's on-time count can be read
against it beside FCFS, strict EDF and ``at_risk`` in the bench reports.

The device is :class:`~calculet.runtime.scheduling.finish_estimate.DeviceModel`: a prefill is
device-exclusive (``prefill_s`` seconds), a decode step serves up to ``lanes`` sequences in
``decode_step_s``. For job ``i`` (arrival ``a_i``, deadline ``d_i``) two facts hold in every
schedule:

* its *chain* — ``c_i = prefill_s + steps · s_1`` — cannot be shortened (one token per step,
  and no step is shorter than ``s_1``, the step of the smallest compiled profile run alone:
  a device that compiles B1 too runs a lone sequence at the B1 step, not ``decode_step_s``, and
  a ping/pong job alone is not slowed by the other engine), so it is on time only if
  ``a_i + c_i ≤ d_i``;
* it consumes at least ``w_i = prefill_s + steps · decode_step_s / lanes`` device-seconds
  (a step serves at most ``lanes`` tokens), all inside ``[a_i, d_i]`` if it is on time.

Hence for every window ``[a, d]`` the on-time jobs with ``a ≤ a_i`` and ``d_i ≤ d`` satisfy
``Σ w_i ≤ d − a``. Maximising ``Σ x_i`` (``x_i ∈ {0, 1}``) under those window constraints is a
relaxation of the real problem (every real schedule's on-time set satisfies them), so its
optimum — or the optimum of any further relaxation — is an upper bound. Methods, strongest
first (the result names the weakest one used):

``moore-hodgson``  all arrivals equal on one lane: the windows are Hodgson's prefixes and
                   ``w_i = c_i``, so the bound is the exact optimum.
``moore-hodgson-relaxation``  all arrivals equal on several lanes: Moore–Hodgson on ``w_i`` is
                   the exact optimum of the pooled relaxation.
``ilp``            z3's Optimize on the window ILP (components of at most ``ilp_max_jobs``).
``lp``             the LP relaxation (``0 ≤ x_i ≤ 1``), floored; with more windows than
                   ``lp_max_windows`` only every k-th arrival opens windows (fewer
                   constraints: still a relaxation).
``windowed``       components above ``lp_max_jobs``: cut time at up to ``cuts`` instants; a
                   job inside a segment is bounded by that segment's release relaxation, a
                   job crossing its segment's end counts 1 (its constraints dropped); a
                   dynamic programme picks the cuts with the smallest sum, O(cuts² · n log n).
``release-relaxation``  every arrival moved back to the component's first one (a relaxation),
                   then Moore–Hodgson on ``w_i``: used when the solver gives up or when it is
                   the smaller bound.

The trace is first split into independent components at instants no job's window crosses
(the constraints never link two components, so their bounds add). Jobs without a deadline are
always on time once they finish and add one each. The release relaxation is also computed for
every component and the smaller of the two bounds is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import z3

from calculet.adapters.sim.cost import CostModel
from calculet.runtime.scheduling.finish_estimate import DeviceModel, moore_hodgson

_METHODS = ("moore-hodgson", "moore-hodgson-relaxation", "ilp", "lp", "windowed", "release-relaxation")
_EPS = 1e-9


@dataclass(frozen=True)
class TraceJob:
    """One recorded request: arrival and absolute deadline in seconds (None: no deadline)."""

    arrival_s: float
    prompt_tokens: int
    decode_steps: int
    deadline_s: float | None


@dataclass(frozen=True)
class OnTimeBound:
    bound: int
    jobs: int
    method: str
    """The weakest method used (see the module docstring)."""


def device_model_from_cost(cost: CostModel, compiled_batch: int = 1, *, pingpong: bool = False,
                           prefill_chunk_tokens: int | None = None) -> DeviceModel:
    """The simulated NPU's cost model as a device model for one profile, for the bound's *work*.

    With ping/pong a job (prefill or decode) started while the other engine is busy progresses at
    ``pingpong_overlap`` (r) until the other's job ends, then at full rate; the job that started
    first is never slowed (:meth:`CostModel.finish_time`). So whenever both engines are busy one
    job runs at rate 1 and the other at r: the device does at most ``1 + r`` seconds of job time
    per second (back-to-back alternation reaches it: one job per ``d / (1 + r)``). Each engine is
    modelled as taking ``2 d / (1 + r)`` per job, and prefills ``1 / (1 + r)`` of their time,
    so the pooled work is the least any schedule spends. (Before session 13 a job took
    ``d / max(r, 0.5)``: at r = 0.5 exactly serial, under the 1.5× the simulator reaches, and
    ``calculet-b1-pingpong`` finished more requests on time than that bound on four presets.)
    A request's own chain of steps is not this model's step: see :func:`chain_step_from_cost`.
    """
    step = cost.decode_s(compiled_batch)
    engines, speed = 1, 1.0
    if pingpong:
        speed = 1.0 + cost.pingpong_overlap
        engines, step = 2, 2.0 * step / speed
    return DeviceModel(decode_step_s=step, compiled_batch=compiled_batch, engines=engines,
                       prefill_fixed_s=cost.prefill_fixed_s / speed,
                       prefill_per_token_s=cost.prefill_per_token_s / speed,
                       prefill_chunk_tokens=prefill_chunk_tokens)


def chain_step_from_cost(cost: CostModel, profiles: Sequence[int]) -> float:
    """The shortest decode step one sequence can see on a device compiling ``profiles``: the
    fastest profile's step, without ping/pong slow-down (a lone job has no other engine busy)."""
    return min(cost.decode_s(b) for b in profiles)


def _components(jobs: list[tuple[float, float, float]]) -> list[list[tuple[float, float, float]]]:
    """Split (arrival, deadline, work) jobs at instants no window ``[a_i, d_i]`` crosses."""
    jobs = sorted(jobs)
    out: list[list[tuple[float, float, float]]] = []
    reach = -math.inf
    for job in jobs:
        if not out or job[0] >= reach:
            out.append([])
        out[-1].append(job)
        reach = max(reach, job[1])
    return out


def _release_relaxation(comp: Sequence[tuple[float, float, float]]) -> int:
    start = min(a for a, _, _ in comp)
    kept, _ = moore_hodgson([w for _, _, w in comp], [d for _, d, _ in comp], start=start)
    return len(kept)


def _windows(comp: Sequence[tuple[float, float, float]], max_windows: int) -> list[tuple[float, float]]:
    arrivals = sorted({a for a, _, _ in comp})
    deadlines = sorted({d for _, d, _ in comp})
    stride = max(1, math.ceil(len(arrivals) * len(deadlines) / max_windows))
    return [(a, d) for a in arrivals[::stride] for d in deadlines if d > a]


def _solve(comp: Sequence[tuple[float, float, float]], integral: bool, max_windows: int,
           timeout_ms: int) -> int | None:
    """The window ILP (or LP) optimum of one component, floored; None when z3 gives up."""
    opt = z3.Optimize()
    opt.set("timeout", timeout_ms)
    if integral:
        xs = [z3.If(z3.Bool(f"x{i}"), 1, 0) for i in range(len(comp))]
    else:
        reals = [z3.Real(f"x{i}") for i in range(len(comp))]
        for x in reals:
            opt.add(x >= 0, x <= 1)
        xs = reals  # type: ignore[assignment]
    for a, d in _windows(comp, max_windows):
        inside = [(Fraction(w), x) for (ai, di, w), x in zip(comp, xs) if ai >= a and di <= d]
        if inside and sum(w for w, _ in inside) > Fraction(d - a):
            opt.add(z3.Sum([z3.RealVal(w) * x for w, x in inside]) <= z3.RealVal(Fraction(d - a) + Fraction(_EPS)))
    total = z3.Sum(xs)
    opt.maximize(total)
    if opt.check() != z3.sat:
        return None
    value = opt.model().eval(total, model_completion=True)
    exact = value.as_fraction() if z3.is_rational_value(value) else Fraction(value.as_long())
    return math.floor(exact)  # the LP optimum is exact (rationals) and >= the ILP's


def _windowed(comp: Sequence[tuple[float, float, float]], cuts: int) -> int:
    """The segment relaxation (module docstring, ``windowed``) at the best of ``cuts`` cut points."""
    arrivals = sorted(a for a, _, _ in comp)
    grid = sorted({arrivals[min(len(arrivals) - 1, k * len(arrivals) // cuts)] for k in range(cuts)})
    grid.append(math.inf)
    best = [0] + [len(comp) + 1] * (len(grid) - 1)
    for k in range(1, len(grid)):
        for j in range(k):
            lo, hi = grid[j], grid[k]
            inside = [(d, w) for a, d, w in comp if lo <= a < hi and d <= hi]
            crossing = sum(1 for a, d, _ in comp if lo <= a < hi and d > hi)
            kept, _ = moore_hodgson([w for _, w in inside], [d for d, _ in inside], start=lo)
            best[k] = min(best[k], best[j] + len(kept) + crossing)
    return best[-1]


def on_time_upper_bound(trace: Sequence[TraceJob], model: DeviceModel, *, chain_step_s: float | None = None,
                        ilp_max_jobs: int = 40, lp_max_jobs: int = 120, lp_max_windows: int = 2000, cuts: int = 24,
                        timeout_ms: int = 10_000) -> OnTimeBound:
    """An upper bound on how many of ``trace``'s requests any schedule on ``model`` finishes on time.

    ``chain_step_s``: the shortest decode step one sequence can see (the module docstring's
    ``s_1``); default ``model.decode_step_s``, right only for a device with one compiled profile
    and one engine — :func:`chain_step_from_cost` gives it for a cost model's profiles.
    """
    step, lanes = model.decode_step_s, model.lanes
    chain = step if chain_step_s is None else chain_step_s
    free = 0
    jobs: list[tuple[float, float, float]] = []
    for job in trace:
        if job.deadline_s is None:
            free += 1
            continue
        prefill = model.prefill_s(job.prompt_tokens)
        if job.arrival_s + prefill + job.decode_steps * chain <= job.deadline_s + _EPS:
            jobs.append((job.arrival_s, job.deadline_s, prefill + job.decode_steps * step / lanes))
    common = len({a for a, _, _ in jobs}) <= 1
    used, total = 0, free
    for comp in _components(jobs):
        method, bound = (0 if lanes == 1 else 1), _release_relaxation(comp)
        if not common:
            method, bound = _bound_component(comp, bound, ilp_max_jobs, lp_max_jobs, lp_max_windows, cuts,
                                             timeout_ms)
        used, total = max(used, method), total + bound
    return OnTimeBound(bound=total, jobs=len(trace), method=_METHODS[used])


def _bound_component(comp: Sequence[tuple[float, float, float]], relaxed: int, ilp_max_jobs: int,
                     lp_max_jobs: int, lp_max_windows: int, cuts: int, timeout_ms: int) -> tuple[int, int]:
    """(method index, bound) of one component with spread arrivals: the best valid bound found."""
    if len(comp) > lp_max_jobs:
        windowed = _windowed(comp, cuts)
        return (4, windowed) if windowed < relaxed else (5, relaxed)
    integral = len(comp) <= ilp_max_jobs
    solved = _solve(comp, integral, lp_max_windows, timeout_ms)
    if solved is None or relaxed < solved:
        return 5, relaxed
    return (2 if integral else 3), solved
