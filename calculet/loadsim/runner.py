"""Drive a load-simulation workload through the real engine in virtual time.

Why the real engine and not a model of it: a policy figure is only worth something if it was
produced by the code that will serve traffic. So the runner hands each
:class:`~calculet.loadsim.workload.SimRequest` to :class:`~calculet.runtime.engine.core.EngineDriver`
— admission, WFQ, WRR prefill queues, profile selection, batch building, the executor with
ping/pong, completion, sampling, recovery — on the simulated NPU in cost-model mode (numerics
off, virtual time), and turns what the engine delivers into the same
:class:`~calculet.loadsim.analysis.SimRequestRecord` / :class:`SimBatchRecord` the baselines
emit, so one :func:`~calculet.loadsim.analysis.summarize` judges every policy alike.

Everything is observed through the engine's public surface, by composition:

* per-request facts come from the request's sink (token times, the one outcome) and from the
  ``observer`` transition hook (service start = the transition into ``prefill_running``,
  decode-ready instants for batch waits);
* per-batch facts come from a recording wrapper around the CalRT runtime and its devices: each
  accepted :class:`~calculet.adapters.calrt.DecodeJob` gives the compiled batch and its valid
  lanes. The scheduler fires the batch's ``submit_decode`` transitions right after the device
  accepted the job, so the observer attaches the batch wait to the job the device logged last.
  Wrapping the runtime (not one device) keeps the log across a device restart in recovery.

The simulated package is the ``future`` variant (B1/B4/B8/B16, ping/pong, multi-profile
residency) built with a context of ``max_seq`` tokens (the workloads' 40K prompts do not fit
the 256-token default) and the reference model's memory figures on the reference board, so
the KV budget is the §13.1 one, not the tiny model's. Numerics are off, so the model size does
not cost wall time; delivered tokens are the simulator's deterministic pseudo-tokens. With a
``prefill_chunk_tokens`` the package's B1 profile also declares that incremental-prefill chunk
(a simulated capability, like the rest of ``future``; CalRT 0.7.6 has none, §6), and the engine
then prefills long prompts in chunks of that size.
"""

from __future__ import annotations

import atexit
import heapq
import math
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from calculet.adapters.calrt import DecodeJob, JobResult, JobSpec, JobTicket
from calculet.adapters.sim import BoardPreset, CostModel, FaultKind, SimCalRT, SimConfig, SimVirtualDevice, TimeMode
from calculet.adapters.sim.model import TinyConfig
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, DefinitionError
from calculet.loadsim.analysis import RunSummary, SimBatchRecord, SimRequestRecord, summarize
from calculet.loadsim.workload import SimRequest
from calculet.machines.request import FinishReason
from calculet.clock import FakeClock
from calculet.runtime.engine.core import EngineDriver, EngineOptions, EngineStatistics, GenerateRequest
from calculet.runtime.scheduling.registry import RequestRecord
from calculet.runtime.request import RequestOutcome

__all__ = [
    "DEFAULT_MAX_SEQ", "BatchLog", "DeviceObserver", "LiveOutcome", "PolicyRun", "RecordingRuntime",
    "RequestTracker", "build_driver", "decode_work_s", "default_options", "generate_request",
    "loadsim_package_dir", "prompt_for", "rejection_reason", "run_engine", "run_live",
]

DEFAULT_MAX_SEQ = 40960
"""Context of the simulated package: the presets' ``context_limit_tokens`` (a 40K prompt + output)."""

_PROMPT_PERIOD = 251
_PROMPT_POOL: tuple[int, ...] = ()
_POOL_LOCK = threading.Lock()


def prompt_for(index: int, tokens: int) -> tuple[int, ...]:
    """Deterministic byte-token prompt ``index`` of ``tokens`` tokens.

    A slice of one cached pseudo-random byte string, offset by the index, so prompts differ
    (their pseudo-token chains differ) without building 40K-element tuples token by token.
    """
    global _PROMPT_POOL
    if tokens < 1:
        raise DefinitionError(f"a prompt needs >= 1 token, got {tokens}")
    need = tokens + _PROMPT_PERIOD
    if len(_PROMPT_POOL) < need:
        with _POOL_LOCK:
            if len(_PROMPT_POOL) < need:
                size = max(need, 2 * len(_PROMPT_POOL), DEFAULT_MAX_SEQ + _PROMPT_PERIOD)
                _PROMPT_POOL = tuple((j * 197 + (j >> 3) * 31 + 11) % 256 for j in range(size))
    offset = index % _PROMPT_PERIOD
    return _PROMPT_POOL[offset: offset + tokens]


# --------------------------------------------------------------------------------------------
# the simulated package
# --------------------------------------------------------------------------------------------

_PACKAGES: dict[tuple[int, int | None], Path] = {}
_PACKAGE_LOCK = threading.Lock()
_PACKAGE_ROOT: Path | None = None


def loadsim_package_dir(max_seq: int = DEFAULT_MAX_SEQ, prefill_chunk_tokens: int | None = None) -> Path:
    """The ``future`` sim package with a ``max_seq`` context and reference memory (built once per
    process and argument pair).

    ``prefill_chunk_tokens`` declares the B1 profile's incremental-prefill chunk (§6, simulated);
    each chunk size gets its own directory, so an unchunked run never sees a chunked package.
    Built with the adapter's own :func:`~calculet.adapters.sim.build.build_package` into a
    temporary directory removed at exit — nothing binary is committed.
    """
    global _PACKAGE_ROOT
    if max_seq < 16:
        raise DefinitionError(f"max_seq must be >= 16, got {max_seq}")
    if prefill_chunk_tokens is not None and not 1 <= prefill_chunk_tokens <= max_seq:
        raise DefinitionError(f"prefill_chunk_tokens must be in [1, max_seq={max_seq}], got {prefill_chunk_tokens}")
    from calculet.adapters.sim.build import build_package  # deferred, as presets.package_dir does

    key = (max_seq, prefill_chunk_tokens)
    with _PACKAGE_LOCK:
        path = _PACKAGES.get(key)
        if path is None:
            if _PACKAGE_ROOT is None:
                _PACKAGE_ROOT = Path(tempfile.mkdtemp(prefix="calculet-loadsim-pkg-"))
                atexit.register(shutil.rmtree, _PACKAGE_ROOT, True)
            suffix = "" if prefill_chunk_tokens is None else f"-chunk{prefill_chunk_tokens}"
            path = _PACKAGE_ROOT / f"future-{max_seq}{suffix}"
            build_package(path, variant="future", memory="reference", config=TinyConfig(max_seq=max_seq),
                          name=f"loadsim-sim-future{suffix}", prefill_chunk_tokens=prefill_chunk_tokens)
            _PACKAGES[key] = path
        return path


# --------------------------------------------------------------------------------------------
# device observation by composition (runtime, device and KvManager wrappers)
# --------------------------------------------------------------------------------------------


class DeviceObserver:
    """Hooks a :class:`RecordingRuntime` calls around the CalRT calls of its devices (no-ops here).

    Called on the engine's actor thread, in CalRT call order; an observer must not call the
    device itself.
    """

    def device_created(self, device: SimVirtualDevice, index: int) -> None:
        """A device was created (``index`` 0 at bring-up, then one per restart)."""

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        """The device accepted ``job`` (a refused submit raises before this)."""

    def completed(self, result: JobResult) -> None:
        """A result was handed to the runtime (poll, wait or wait_any)."""

    def sequence_allocated(self, seq: int) -> None:
        """A KV sequence was allocated on the device."""

    def sequence_freed(self, seq: int) -> None:
        """A KV sequence was freed on the device."""

    def device_reset(self) -> None:
        """ResetConfiguration or close: every job and KV sequence of the device is gone."""


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


class _RecordingKv:
    """A device KvManager whose allocations and frees are reported; everything else is delegated."""

    def __init__(self, inner: Any, observers: Sequence[DeviceObserver]) -> None:
        self.inner = inner
        self._observers = observers

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def allocate_sequence(self) -> Any:
        seq = self.inner.allocate_sequence()
        for o in self._observers:
            o.sequence_allocated(int(seq))
        return seq

    def free_sequence(self, seq: Any) -> None:
        self.inner.free_sequence(seq)
        for o in self._observers:
            o.sequence_freed(int(seq))


class _RecordingDevice:
    """A sim device that reports jobs, results, sequences and resets; every call is delegated."""

    def __init__(self, inner: SimVirtualDevice, observers: Sequence[DeviceObserver]) -> None:
        self._inner = inner
        self._observers = observers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(self, job: JobSpec) -> JobTicket:
        ticket = self._inner.submit(job)  # a refusal raises before anything is reported
        for o in self._observers:
            o.submitted(job, ticket)
        return ticket

    def _seen(self, results: list[JobResult]) -> list[JobResult]:
        for result in results:
            for o in self._observers:
                o.completed(result)
        return results

    def poll(self) -> list[JobResult]:
        return self._seen(self._inner.poll())

    def wait(self, job_id: Any, timeout_s: float) -> JobResult:
        return self._seen([self._inner.wait(job_id, timeout_s)])[0]

    def wait_any(self, timeout_s: float) -> list[JobResult]:
        return self._seen(self._inner.wait_any(timeout_s))

    def create_kv_manager(self, calbin: Any) -> Any:
        return _RecordingKv(self._inner.create_kv_manager(calbin), self._observers)

    def destroy_kv_manager(self, kv: Any) -> None:
        self._inner.destroy_kv_manager(kv.inner if isinstance(kv, _RecordingKv) else kv)

    def reset_configuration(self) -> None:
        self._inner.reset_configuration()
        for o in self._observers:
            o.device_reset()

    def close(self) -> None:
        self._inner.close()
        for o in self._observers:
            o.device_reset()


class RecordingRuntime:
    """A :class:`SimCalRT` whose devices (the first and any a restart creates) report to observers."""

    def __init__(self, inner: SimCalRT, observers: Sequence[DeviceObserver] = ()) -> None:
        self._inner = inner
        self.observers: list[DeviceObserver] = list(observers)
        self.devices: list[SimVirtualDevice] = []

    @property
    def version(self) -> str:
        return self._inner.version

    @property
    def config(self) -> SimConfig:
        return self._inner.config

    def create_virtual_device(self, physical_index: int = 0) -> Any:
        device = self._inner.create_virtual_device(physical_index)
        self.devices.append(device)
        for o in self.observers:
            o.device_created(device, len(self.devices) - 1)
        return _RecordingDevice(device, self.observers)

    def statistics(self) -> Any:
        return self._inner.statistics()


def build_driver(config: SchedulerConfig, *, cost: CostModel, max_seq: int = DEFAULT_MAX_SEQ,
                 fault_seed: int | None = None, fault_rates: Mapping[InjectedFault, float] | None = None,
                 options: EngineOptions | None = None,
                 observer: Callable[[RequestRecord, str, str], None] | None = None,
                 device_observers: Sequence[DeviceObserver] = (),
                 prefill_chunk_tokens: int | None = None) -> tuple[EngineDriver, RecordingRuntime]:
    """An :class:`EngineDriver` on a virtual-time, numerics-off sim NPU, with a recording runtime.

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
    runtime = RecordingRuntime(sim, observers)
    driver = EngineDriver(config, runtime, loadsim_package_dir(max_seq, prefill_chunk_tokens), clock=clock,
                          options=options or default_options(), observer=observer)
    return driver, runtime


class _RandomFaults(DeviceObserver):
    """Arms every new device's fault injector (``set_random``) with its own seed."""

    def __init__(self, seed: int, rates: Mapping[InjectedFault, float]) -> None:
        self.seed = seed
        self.rates = rates

    def device_created(self, device: SimVirtualDevice, index: int) -> None:
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
# request tracking
# --------------------------------------------------------------------------------------------

_REASON_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"requests already waiting"), "queue_full"),
    (re.compile(r"^waiting prompt tokens"), "waiting_tokens"),
    (re.compile(r"tenant .* waiting tokens"), "tenant_waiting_tokens"),
    (re.compile(r"long-prefill waiting quota"), "long_quota"),
    (re.compile(r"no prospect of service"), "no_prospect"),
    (re.compile(r"over its QPS limit"), "tenant_qps"),
    (re.compile(r"unknown tenant"), "unknown_tenant"),
    (re.compile(r"exceeds the context|KV budget"), "too_long"),
    (re.compile(r"stopping|model is"), "unavailable"),
)
_STATUS_DECISION = {400: "reject_invalid", 429: "reject_capacity", 503: "reject_unavailable"}


def rejection_reason(outcome: RequestOutcome) -> str:
    """A bounded label for a rejection: the §5.2 decision and which limit refused it.

    ``reject_capacity:tenant_qps``, ``reject_capacity:queue_full``... — the free-text detail
    names tenants and numbers, which must not become label values (§16 bounded labels).
    """
    decision = _STATUS_DECISION.get(outcome.http_status, f"reject_{outcome.http_status}")
    for pattern, label in _REASON_PATTERNS:
        if pattern.search(outcome.detail):
            return f"{decision}:{label}"
    return decision


class _Sink:
    """One request's sink: token instants and the single outcome (a second close is counted)."""

    __slots__ = ("tracker", "index", "tokens", "token_ids", "outcome", "closes", "late_tokens")

    def __init__(self, tracker: RequestTracker, index: int) -> None:
        self.tracker = tracker
        self.index = index
        self.tokens: list[float] = []
        self.token_ids: list[int] = []
        self.outcome: RequestOutcome | None = None
        self.closes = 0
        self.late_tokens = 0

    def token(self, request_id: int, token: int) -> None:
        if self.outcome is not None:
            self.late_tokens += 1
        self.tokens.append(self.tracker.now())
        if self.tracker.keep_tokens:
            self.token_ids.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closes += 1
        if self.outcome is None:
            self.outcome = outcome
            self.tracker.closed_at[self.index] = self.tracker.now()


class RequestTracker:
    """Turns sink callbacks and request transitions into :class:`SimRequestRecord` s.

    ``now`` returns the virtual time (seconds since the run's origin). Use :meth:`observer` as the
    engine's transition observer; it also completes the batch log's wait figures.
    """

    def __init__(self, now: Callable[[], float], log: BatchLog | None = None, *, keep_tokens: bool = False) -> None:
        self.now = now
        self.log = log
        self.keep_tokens = keep_tokens
        self.sinks: list[_Sink] = []
        self.request_ids: list[int] = []
        self.closed_at: dict[int, float] = {}
        self._service_start: dict[int, float] = {}
        self._ready_since: dict[int, float] = {}

    def new_sink(self) -> _Sink:
        sink = _Sink(self, len(self.sinks))
        self.sinks.append(sink)
        self.request_ids.append(0)
        return sink

    def bind(self, index: int, request_id: int) -> None:
        """The engine's id for the request at input ``index`` (0: rejected before an id was made)."""
        self.request_ids[index] = request_id

    def observer(self, rec: RequestRecord, source: str, target: str) -> None:
        """The engine's transition hook: service start, decode-ready instants, batch waits."""
        if source == target:
            return
        rid = rec.request_id
        if target == "prefill_running":
            self._service_start.setdefault(rid, self.now())
        elif target == "decode_ready":
            self._ready_since[rid] = self.now()
        elif target == "decode_running":
            since = self._ready_since.pop(rid, None)
            log = self.log
            if since is not None and log is not None and log.batches:
                batch = log.batches[-1]
                wait = self.now() - since
                if wait > batch[3]:
                    batch[3] = wait
        if target in ("completed", "cancelled", "failed"):
            self._ready_since.pop(rid, None)

    def records(self, requests: Sequence[SimRequest]) -> tuple[SimRequestRecord, ...]:
        """One record per offered request, in input order (``request_id`` = input index)."""
        if len(requests) != len(self.sinks):
            raise DefinitionError(f"{len(requests)} requests but {len(self.sinks)} sinks")
        out: list[SimRequestRecord] = []
        for i, (req, sink) in enumerate(zip(requests, self.sinks)):
            outcome = sink.outcome
            if outcome is None:
                raise DefinitionError(f"request {i} has no outcome: the run did not finish")
            reason = outcome.finish_reason
            finish = self.closed_at.get(i)
            if reason is FinishReason.REJECTED and not sink.tokens:
                out.append(SimRequestRecord.for_request(i, req, admitted=False, rejection_reason=rejection_reason(outcome),
                                                        finish_s=finish, finish_reason="rejected"))
                continue
            rid = self.request_ids[i]
            times = tuple(sink.tokens)
            out.append(SimRequestRecord.for_request(
                i, req, admitted=True, service_start_s=self._service_start.get(rid),
                first_token_s=times[0] if times else None, token_times_s=times, finish_s=finish,
                finish_reason=reason.name.lower()))
        return tuple(out)


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


def generate_request(index: int, req: SimRequest) -> GenerateRequest:
    """The engine request for an offered one (deterministic prompt bytes)."""
    return GenerateRequest(prompt_for(index, req.prompt_tokens), req.max_new_tokens, tenant=req.tenant,
                           deadline_ms=req.deadline_ms)


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


# --------------------------------------------------------------------------------------------
# the same workload on the live, real-time engine
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveOutcome:
    """What one request got from the live engine: its tokens and its single outcome."""

    tokens: tuple[int, ...]
    finish_reason: str
    http_status: int
    closes: int


class _LiveSink:
    """Thread-safe sink for the real-time engine: the actor thread writes, the caller waits."""

    def __init__(self, done: threading.Semaphore) -> None:
        self.tokens: list[int] = []
        self.outcome: RequestOutcome | None = None
        self.closes = 0
        self._done = done

    def token(self, request_id: int, token: int) -> None:
        self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.closes += 1
        if self.outcome is None:
            self.outcome = outcome
            self._done.release()


def run_live(requests: Sequence[SimRequest], config: SchedulerConfig, *, cost: CostModel,
             max_seq: int = DEFAULT_MAX_SEQ, options: EngineOptions | None = None,
             timeout_s: float = 60.0, prefill_chunk_tokens: int | None = None) -> tuple[LiveOutcome, ...]:
    """Serve ``requests`` on the live :class:`~calculet.runtime.engine.core.Engine` (threads, real clock).

    The simulated NPU runs in ``TimeMode.REAL`` (its worker thread completes jobs at their
    cost-model instants on the monotonic clock). Requests are submitted back to back from this
    thread, not at their arrival instants: outcomes that do not depend on timing (no deadline
    short enough to expire, no cancel, no rate limit) must then equal the virtual-time run's —
    which is what the agreement test checks. Waits on the sinks, never sleeps.
    """
    from calculet.runtime.engine.core import Engine

    sim = SimCalRT(SimConfig(time_mode=TimeMode.REAL, numerics=False, cost=cost, board=BoardPreset.reference()))
    engine = Engine(config, sim, loadsim_package_dir(max_seq, prefill_chunk_tokens),
                    options=options or default_options())
    done = threading.Semaphore(0)
    sinks = [_LiveSink(done) for _ in requests]
    engine.start()
    try:
        for i, (req, sink) in enumerate(zip(requests, sinks)):
            engine.submit(generate_request(i, req), sink)
        deadline = time.monotonic() + timeout_s
        for _ in sinks:
            if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                open_ = [i for i, s in enumerate(sinks) if s.outcome is None]
                raise DefinitionError(f"the live engine left {len(open_)} request(s) open after {timeout_s} s "
                                      f"(e.g. {open_[:5]})")
    finally:
        engine.stop(drain_timeout_s=5.0)
    out: list[LiveOutcome] = []
    for sink in sinks:
        assert sink.outcome is not None
        out.append(LiveOutcome(tuple(sink.tokens), sink.outcome.finish_reason.name.lower(), sink.outcome.http_status,
                               sink.closes))
    return tuple(out)
