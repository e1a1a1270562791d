"""Goodput figures of a load-simulation run (issue #13 items 1, 2 and 6).

A serving system is judged by the requests it finishes within their deadlines (DESIGN "Goodput
before throughput"), so every bench report leads with these figures, computed the same way for
every policy from its :class:`~calculet.loadsim.runner.PolicyRun`:

* **goodput** — on-time completions (completed at or before the deadline,
  :attr:`SimRequestRecord.on_time`) per second of the run's window, and the **on-time fraction**
  of the offered requests;
* **wasted device work** — device seconds spent on requests that then ended ``deadline`` or
  ``error``, as a share of the device seconds spent. For an engine run both come from the core's
  own count (:class:`~calculet.runtime.engine.goodput.GoodputStatistics`: each job's busy time
  shared among its lanes); a baseline simulation has no core, so its figure is charged from its
  records with the same cost model (a prefill per served request, a B1 step per further token);
* **the offline bound** — :func:`~calculet.loadsim.bound.on_time_upper_bound` of the offered
  trace on the policy's device (largest profile, ping/pong, prefill chunk), with the method it
  used: no schedule of that device finishes more of these requests on time;
* **estimator accuracy** — ``(estimated − actual) / (actual − arrival)`` over the completed
  requests that carried the scheduler's finish estimate at admission (median and P90 of its
  absolute value, and the median signed error); ``None`` when the scheduler gives none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.analysis import SimRequestRecord
from calculet.loadsim.bound import (OnTimeBound, TraceJob, chain_step_from_cost, device_model_from_cost,
                                   on_time_upper_bound)
from calculet.loadsim.runner import PolicyRun
from calculet.loadsim.workload import SimRequest

__all__ = ["EstimateError", "GoodputFigures", "estimate_error", "goodput_figures", "offline_bound", "trace_of"]

_WASTED = ("deadline", "error")


@dataclass(frozen=True)
class EstimateError:
    """Relative finish-time error of the scheduler's estimate at admission (issue #13 item 2)."""

    count: int
    median_abs: float
    p90_abs: float
    median_signed: float
    """Positive: the estimate was late (pessimistic); negative: early (optimistic)."""


@dataclass(frozen=True)
class GoodputFigures:
    """The headline figures of one run (see the module docstring)."""

    offered: int
    on_time: int
    late: int
    window_s: float
    device_s: float
    wasted_device_s: float
    wasted_tokens: int
    """Tokens delivered to requests that then ended deadline or error (prefill's first token included)."""
    source: str
    """Where the device figures come from: ``engine`` (the core's count) or ``records`` (cost model)."""
    estimate: EstimateError | None = None

    @property
    def goodput_per_s(self) -> float:
        return self.on_time / self.window_s if self.window_s > 0 else 0.0

    @property
    def on_time_fraction(self) -> float:
        return self.on_time / self.offered if self.offered else 0.0

    @property
    def wasted_share(self) -> float:
        return self.wasted_device_s / self.device_s if self.device_s > 0 else 0.0


def estimate_error(records: Sequence[SimRequestRecord]) -> EstimateError | None:
    """Median / P90 relative finish-time error over completed requests that carry an estimate."""
    errors = [(r.estimated_finish_s - r.finish_s) / (r.finish_s - r.arrival_s) for r in records
              if r.estimated_finish_s is not None and r.finish_s is not None and r.finish_s > r.arrival_s
              and r.finish_reason in ("stop", "length")]
    if not errors:
        return None
    arr = np.asarray(errors, dtype=np.float64)
    med_abs, p90_abs = np.percentile(np.abs(arr), [50, 90], method="linear")
    return EstimateError(int(arr.size), float(med_abs), float(p90_abs),
                         float(np.percentile(arr, 50, method="linear")))


def _records_waste(records: Sequence[SimRequestRecord], cost: CostModel) -> float:
    """Device seconds a baseline charged requests that ended deadline/error (B1 steps, module docstring)."""
    wasted = 0.0
    for r in records:
        if r.finish_reason in _WASTED and r.service_start_s is not None:
            wasted += cost.prefill_s(r.prompt_tokens) + max(0, r.generated_tokens - 1) * cost.decode_s(1)
    return wasted


def goodput_figures(run: PolicyRun, cost: CostModel, window_s: float) -> GoodputFigures:
    """The goodput figures of ``run`` over ``window_s`` (the summary's throughput window)."""
    records = run.requests
    on_time = sum(1 for r in records if r.on_time)
    late = sum(1 for r in records if r.finish_reason in ("stop", "length") and not r.on_time)
    wasted_tokens = sum(r.generated_tokens for r in records if r.finish_reason in _WASTED)
    core = run.statistics.goodput if run.statistics is not None else None
    if core is not None:
        device_s, wasted_s, source = core.device_seconds, sum(core.wasted_device_seconds.values()), "engine"
    else:
        device_s, wasted_s, source = run.prefill_work_s + run.decode_work_s, _records_waste(records, cost), "records"
    return GoodputFigures(len(records), on_time, late, window_s, device_s, wasted_s, wasted_tokens, source,
                          estimate_error(records))


def trace_of(requests: Sequence[SimRequest]) -> tuple[TraceJob, ...]:
    """The offered requests as bound jobs: the first token comes with the prefill, the rest are steps."""
    return tuple(TraceJob(r.arrival_s, r.prompt_tokens, max(0, r.max_new_tokens - 1),
                          None if r.deadline_ms is None else r.arrival_s + r.deadline_ms / 1000.0)
                 for r in requests)


def offline_bound(requests: Sequence[SimRequest], cost: CostModel, *, compiled_batch: int = 1,
                  pingpong: bool = False, prefill_chunk_tokens: int | None = None,
                  profiles: Sequence[int] | None = None, timeout_ms: int = 10_000) -> OnTimeBound:
    """:func:`on_time_upper_bound` of ``requests`` on the device a policy runs: the largest profile's
    step for the device's work, the fastest of ``profiles`` (default: the largest alone) for a
    request's own chain of steps."""
    model = device_model_from_cost(cost, compiled_batch, pingpong=pingpong, prefill_chunk_tokens=prefill_chunk_tokens)
    chain = chain_step_from_cost(cost, profiles or (compiled_batch,))
    return on_time_upper_bound(trace_of(requests), model, chain_step_s=chain, timeout_ms=timeout_ms)
