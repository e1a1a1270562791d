"""Drive a load-simulation workload through the real engine in virtual time.

Why the real engine and not a model of it: a policy figure is only worth something if it was
produced by the code that will serve traffic. So the runner hands each
:class:`~calculet.loadsim.workload.SimRequest` to :class:`~calculet.runtime.engine.driver.EngineDriver`
— admission, WFQ, WRR prefill queues, profile selection, batch building, the executor with
ping/pong, completion, sampling, recovery — on the simulated NPU in cost-model mode (numerics
off, virtual time), and turns what the engine delivers into the same
:class:`~calculet.loadsim.analysis.SimRequestRecord` / :class:`SimBatchRecord` the baselines
emit, so one :func:`~calculet.loadsim.analysis.summarize` judges every policy alike.

Everything is observed through the engine's public surface, by composition:

* per-request facts come from the request's sink (token times, the one outcome) and from the
  ``observer`` transition hook (:class:`~calculet.loadsim.tracking.RequestTracker`);
* per-batch facts come from the observed CalRT runtime and its devices
  (:class:`~calculet.adapters.observed.ObservedCalRT`): each
  accepted :class:`~calculet.adapters.calrt.DecodeJob` gives the compiled batch and its valid
  lanes. The scheduler fires the batch's ``submit_decode`` transitions right after the device
  accepted the job, so the observer attaches the batch wait to the job the device logged last.
  Wrapping the runtime (not one device) keeps the log across a device restart in recovery.

The simulated package (:mod:`calculet.loadsim.engine_inputs`) runs on the reference board.
Numerics are off, so the model size does not cost wall time; delivered tokens are the
simulator's deterministic pseudo-tokens. With a ``prefill_chunk_tokens`` the engine prefills
long prompts in chunks of that size (§6, simulated). The same workload on the live, real-time
engine is :mod:`calculet.loadsim.live`.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from calculet.adapters.calrt import DecodeJob, JobSpec, JobTicket
from calculet.adapters.observed import DeviceObserver, ObservedCalRT
from calculet.adapters.sim import BoardPreset, CostModel, InjectedFault, SimCalRT, SimConfig, TimeMode
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, DefinitionError
from calculet.loadsim.analysis import RunSummary, SimBatchRecord, SimRequestRecord, summarize
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ, generate_request, loadsim_package_dir
from calculet.loadsim.tracking import RequestTracker
from calculet.loadsim.workload import SimRequest
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, EngineStatistics
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = [
    "BatchLog", "PolicyRun", "build_driver", "decode_work_s",
    "default_options", "run_engine",
]

# --------------------------------------------------------------------------------------------
# device observation (through calculet.adapters.observed)
# --------------------------------------------------------------------------------------------


@dataclass
class BatchLog(DeviceObserver):
    """Decode jobs the device accepted, in order, plus the prefill jobs' count and device work."""

    batches: list[list[float]] = field(default_factory=list)
    """``[start_s, compiled_batch, active_lanes, wait_s]`` per accepted decode job (mutable: the
    request observer fills in the wait right after the submit)."""
    prefills: int = 0
    prefill_work_s: float = 0.0
    """Device time the cost model charges the accepted prefill jobs (nominal, without overlap)."""
    cost: CostModel | None = None

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        if isinstance(job, DecodeJob):
            self.batches.append([ticket.submitted_at, job.compiled_batch, len(job.active_lanes), 0.0])
        else:
            self.prefills += 1
            if self.cost is not None:
                self.prefill_work_s += self.cost.prefill_s(len(job.tokens))

    def records(self) -> tuple[SimBatchRecord, ...]:
        return tuple(SimBatchRecord(start_s=b[0], compiled_batch=int(b[1]), active_lanes=int(b[2]), wait_s=b[3])
                     for b in self.batches)


def build_driver(config: SchedulerConfig, *, cost: CostModel, max_seq: int = DEFAULT_MAX_SEQ,
                 fault_seed: int | None = None, fault_rates: Mapping[InjectedFault, float] | None = None,
                 options: EngineOptions | None = None,
                 observer: Callable[[RequestRecord, str, str], None] | None = None,
                 device_observers: Sequence[DeviceObserver] = (),
                 prefill_chunk_tokens: int | None = None) -> tuple[EngineDriver, ObservedCalRT]:
    """An :class:`EngineDriver` on a virtual-time, numerics-off sim NPU, with an observed runtime.

    The board is the reference one (the package declares the reference model's memory).
    ``prefill_chunk_tokens`` selects the package whose B1 profile declares that chunk (§6).
    Random faults (``fault_rates`` per submit, per kind) are seeded per device: a restart's new
    device gets ``fault_seed + index`` through the injector's ``set_random``, so a soak does not
    replay the first device's fault sequence after every restart.
    """
    clock = FakeClock()
    sim = SimCalRT(SimConfig(time_mode=TimeMode.VIRTUAL, clock=clock, numerics=False, cost=cost,
                             board=BoardPreset.reference()))
    observers = list(device_observers)
    if fault_rates:
        observers.insert(0, _RandomFaults(0 if fault_seed is None else fault_seed, dict(fault_rates)))
    runtime = ObservedCalRT(sim, observers)
    driver = EngineDriver(config, runtime, loadsim_package_dir(max_seq, prefill_chunk_tokens), clock=clock,
                          options=options or default_options(), observer=observer)
    return driver, runtime


class _RandomFaults(DeviceObserver):
    """Arms every new device's fault injector (``set_random``) with its own seed."""

    def __init__(self, seed: int, rates: Mapping[InjectedFault, float]) -> None:
        self.seed = seed
        self.rates = rates

    def device_created(self, device: Any, index: int) -> None:
        device.faults.set_random(self.seed + index, self.rates)


def default_options(**overrides: Any) -> EngineOptions:
    """Engine options of a load simulation: golden off (numerics off), monitors left as configured.

    The Wait timeout scales with prefill length (2 ms per prompt token on top of 30 s, i.e. 110 s
    for 40K tokens) so a 40K-token prefill under the reference cost model (~24 s, up to twice
    that while overlapped with the other engine) is never mistaken for a hung job.
    """
    base: dict[str, Any] = {"verify_golden": False, "monitor_mode": None, "job_timeout_s": 30.0,
                            "prefill_timeout_per_token_s": 2e-3}
    base.update(overrides)
    return EngineOptions(**base)


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyRun:
    """One policy on one request list — a baseline simulation or an engine run — as records.

    The one result type of a load simulation (:func:`run_engine` and
    :func:`calculet.loadsim.policies.run_policy` both return it), so the report code reads a
    baseline and an engine run the same way; what only an engine run has is ``statistics``
    (``None`` for a baseline) and the sink-level checks.
    """

    policy_name: str
    requests: tuple[SimRequestRecord, ...]
    """One per offered request, in input order (``request_id`` = input index)."""
    batches: tuple[SimBatchRecord, ...]
    end_s: float
    """Virtual seconds from the run's origin (0) until the last job ended (the engine was idle)."""
    wall_s: float
    prefill_jobs: int
    """Prefill jobs submitted (one per served request, or one per chunk)."""
    prefill_work_s: float
    """Device time the cost model charges every prefill job submitted (nominal, no overlap)."""
    decode_work_s: float
    """Device time charged for every decode job (compiled lanes, nominal, no overlap)."""
    statistics: EngineStatistics | None = None
    """The engine's own statistics at the end of the run; ``None`` for a baseline simulation."""
    duplicate_closes: int = 0
    """Sinks closed more than once (must be 0: one outcome per request)."""
    late_tokens: int = 0
    """Tokens delivered after a request's outcome (must be 0)."""
    token_ids: tuple[tuple[int, ...], ...] = ()
    """Delivered token ids per request (only with ``keep_tokens``; for agreement checks)."""

    @property
    def speedup(self) -> float:
        """Virtual seconds simulated per wall second."""
        return self.end_s / self.wall_s if self.wall_s > 0 else math.inf

    def summary(self, **kwargs: Any) -> RunSummary:
        """:func:`~calculet.loadsim.analysis.summarize` of this run (keyword arguments passed on)."""
        return summarize(self.requests, self.batches, **kwargs)


def decode_work_s(batches: Sequence[SimBatchRecord], cost: CostModel) -> float:
    """Device time ``cost`` charges ``batches`` (every compiled lane computes, §16)."""
    return sum(cost.decode_s(b.compiled_batch) for b in batches)



def run_engine(requests: Sequence[SimRequest], config: SchedulerConfig, *, cost: CostModel,
               policy_name: str = "calculet", max_seq: int = DEFAULT_MAX_SEQ, options: EngineOptions | None = None,
               fault_seed: int | None = None, fault_rates: Mapping[InjectedFault, float] | None = None,
               progress: Callable[[float], None] | None = None, progress_every_s: float = 10.0,
               keep_tokens: bool = False, prefill_chunk_tokens: int | None = None) -> PolicyRun:
    """Run ``requests`` (sorted by arrival) through a fresh engine in virtual time and record them.

    Arrivals are submitted at their instants (the engine's fresh FakeClock starts at 0, the
    workload's origin); a request with ``cancel_after_s`` is cancelled then if it is still open.
    After the last arrival the engine runs until idle, so every request ends with exactly one
    outcome. ``progress`` is called with the virtual time reached, about every
    ``progress_every_s`` virtual seconds (a terminal progress bar). ``prefill_chunk_tokens``
    runs on the package that declares that incremental-prefill chunk (§6, simulated).
    """
    if any(b.arrival_s < a.arrival_s for a, b in zip(requests, requests[1:])):
        raise DefinitionError("requests must be sorted by arrival_s")
    log = BatchLog(cost=cost)
    clock_box: list[FakeClock] = []
    tracker = RequestTracker(lambda: clock_box[0].now(), log, keep_tokens=keep_tokens)
    driver, _runtime = build_driver(config, cost=cost, max_seq=max_seq, fault_seed=fault_seed,
                                    fault_rates=fault_rates, options=options, observer=tracker.observer,
                                    device_observers=(log,), prefill_chunk_tokens=prefill_chunk_tokens)
    clock = driver.clock
    clock_box.append(clock)
    if clock.now() != 0.0:
        raise DefinitionError(f"the engine's clock starts at {clock.now()}, not 0")
    start = time.perf_counter()
    cancels: list[tuple[float, int]] = []
    next_progress = progress_every_s
    try:
        for i, req in enumerate(requests):
            _advance_to(driver, req.arrival_s, cancels, tracker)
            sink = tracker.new_sink()
            submission = driver.submit(generate_request(i, req), sink)
            tracker.bind(i, submission.request_id)
            if req.cancel_after_s is not None and submission.request_id and sink.outcome is None:
                heapq.heappush(cancels, (req.arrival_s + req.cancel_after_s, i))
            if progress is not None and req.arrival_s >= next_progress:
                progress(req.arrival_s)
                next_progress = req.arrival_s + progress_every_s
        while cancels:
            _advance_to(driver, cancels[0][0], cancels, tracker)
        end = driver.run_until_idle()
        wall = time.perf_counter() - start
        if progress is not None:
            progress(end)
        stats = driver.statistics()
    finally:
        try:
            driver.stop(drain_timeout_s=1.0)
        except CalculetError:  # a teardown problem must not hide the run's own result or error
            pass
    records = tracker.records(requests)
    batches = log.records()
    return PolicyRun(policy_name, records, batches, end, wall, prefill_jobs=log.prefills,
                     prefill_work_s=log.prefill_work_s, decode_work_s=decode_work_s(batches, cost), statistics=stats,
                     duplicate_closes=sum(max(0, s.closes - 1) for s in tracker.sinks),
                     late_tokens=sum(s.late_tokens for s in tracker.sinks),
                     token_ids=tuple(tuple(s.token_ids) for s in tracker.sinks) if keep_tokens else ())


def _advance_to(driver: EngineDriver, when: float, cancels: list[tuple[float, int]],
                tracker: RequestTracker) -> None:
    """Run the engine up to ``when``, issuing the client cancels that fall due on the way."""
    while cancels and cancels[0][0] <= when:
        at, index = heapq.heappop(cancels)
        if at > driver.clock.now():
            driver.run_until(at)
        if tracker.sinks[index].outcome is None:
            driver.cancel(tracker.request_ids[index])
    if when > driver.clock.now():
        driver.run_until(when)
