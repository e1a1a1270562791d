"""Figures of a load-simulation run, computed from per-request and per-batch records.

Why records and not live counters: every policy — the baselines here and the real scheduler
driven by the engine — emits the same two record types, and one pure function turns them into
the same :class:`RunSummary`. A figure therefore means the same thing for every policy, and a
test can pin it down on hand-built records.

Definitions (times in seconds of virtual time):

* **throughput** — generated tokens / measurement window (default: first arrival → last event);
* **TTFT** — first token − arrival; **inter-token latency (ITL)** — gaps between consecutive
  tokens of one request, pooled over requests; **queue wait** — service start (first prefill
  submitted) − arrival, for requests that started;
* **fill ratio** — Σ active lanes / Σ compiled lanes over decode batches; **lane waste** = 1 −
  fill ratio (§16: a compiled B16 graph computes all 16 lanes whether valid or not);
* **Jain's fairness index**, with Jain, Chiu and Hawe's (1984) normalisation ``x_t = served_t /
  fair_t``: per window (a stretch over which the set of tenants with waiting work does not
  change, :func:`fairness_index`), ``fair_t`` is the *weighted max-min fair* split (water-filling by weight)
  of the tokens actually delivered in the window, given each tenant's demand — a tenant with
  waiting work (arrived, not yet started) in the window is unsatisfied (unbounded demand); one
  without demanded exactly what it got. Then ``(Σx)² / (n·Σx²)`` over the tenants with demand;
  1.0 exactly when every tenant got its max-min fair share, so a tenant that asks for less than
  its weight does not lower the index (§5.3). Per-window indices are averaged weighted by the
  tokens served in each window;
* **starvation event** (§5.3: "long requests must not be starved forever") — a request that
  waited more than ``threshold`` seconds for service while a *later arrival of its own prompt
  class* started service (after the threshold), or a request that expired (``deadline``) without
  ever starting while a later arrival of its class started. Comparing within a class keeps the
  §6 long-task quota, which serialises long prompts in arrival order, from counting as
  starvation; the longest wait per class is reported separately (``queue_wait_by_class_s``);
* **workload limit** — output tokens/s of the offered requests if the device were never idle,
  every decode step ran the largest profile full, the host cost nothing and each prefill were
  paid once (:func:`workload_limit`); the decode-only *device-bound limit* leaves prefill out.

Percentiles use numpy's ``linear`` method (the default, named explicitly so the figures never
change under a numpy upgrade that changes the default).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence

import numpy as np

from calculet.errors import DefinitionError
from calculet.machines.request import FinishReason
from calculet.loadsim.workload import PromptClass, SimRequest

__all__ = [
    "PROMPT_CLASSES", "FINISH_REASONS", "SimRequestRecord", "SimBatchRecord", "LatencyStats",
    "StarvationEvent", "RunSummary", "ServiceTimeline", "latency_stats", "jain_index",
    "weighted_max_min_fair", "fairness_index", "starvation_events", "service_timeline", "summarize",
    "workload_limit",
]

PROMPT_CLASSES: tuple[PromptClass, ...] = ("short", "medium", "long")
FINISH_REASONS: frozenset[str] = frozenset(r.name.lower() for r in FinishReason if r is not FinishReason.NONE)
"""The request machine's finish reasons, lower-case: stop, length, cancelled, error, deadline, rejected."""
_COMPLETED = frozenset({"stop", "length"})


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimRequestRecord:
    """What happened to one request. ``None`` times: the event did not happen.

    ``service_start_s`` is when the request left the waiting queue (its prefill was submitted);
    ``token_times_s`` holds the time each generated token became available (the first one is
    produced by the prefill, so ``token_times_s[0] == first_token_s``). A rejected request has
    ``admitted=False``, a ``rejection_reason`` (e.g. ``reject_capacity``) and no tokens.
    """

    request_id: int
    tenant: str
    klass: PromptClass
    prompt_tokens: int
    arrival_s: float
    admitted: bool
    rejection_reason: str | None = None
    service_start_s: float | None = None
    first_token_s: float | None = None
    token_times_s: tuple[float, ...] = ()
    finish_s: float | None = None
    finish_reason: str | None = None
    deadline_s: float | None = None
    """Absolute deadline (arrival + the request's ``deadline_ms``); None: none (issue #13 goodput)."""
    estimated_finish_s: float | None = None
    """The scheduler's finish estimate at admission (``RequestRecord.estimated_finish``), if any."""

    def __post_init__(self) -> None:
        where = f"request {self.request_id}"
        if self.klass not in PROMPT_CLASSES:
            raise DefinitionError(f"{where}: klass {self.klass!r} not in {PROMPT_CLASSES}")
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise DefinitionError(f"{where}: finish_reason {self.finish_reason!r} not in {sorted(FINISH_REASONS)}")
        if not self.admitted:
            if self.rejection_reason is None:
                raise DefinitionError(f"{where}: a request that was not admitted needs a rejection_reason")
            if self.token_times_s or self.service_start_s is not None:
                raise DefinitionError(f"{where}: a rejected request cannot have been served")
        elif self.rejection_reason is not None:
            raise DefinitionError(f"{where}: an admitted request has no rejection_reason")
        if self.token_times_s:
            if self.first_token_s != self.token_times_s[0]:
                raise DefinitionError(f"{where}: first_token_s {self.first_token_s} != token_times_s[0] "
                                      f"{self.token_times_s[0]}")
            if any(b < a for a, b in zip(self.token_times_s, self.token_times_s[1:])):
                raise DefinitionError(f"{where}: token_times_s must be non-decreasing")
            if self.token_times_s[0] < self.arrival_s:
                raise DefinitionError(f"{where}: a token before the request arrived")
        elif self.first_token_s is not None:
            raise DefinitionError(f"{where}: first_token_s set but no token_times_s")
        for name in ("service_start_s", "finish_s"):
            value = getattr(self, name)
            if value is not None and value < self.arrival_s:
                raise DefinitionError(f"{where}: {name} {value} before arrival {self.arrival_s}")

    @property
    def generated_tokens(self) -> int:
        """Tokens delivered to the client (derived, so it cannot disagree with the times)."""
        return len(self.token_times_s)

    @classmethod
    def for_request(cls, request_id: int, request: SimRequest, **outcome: object) -> SimRequestRecord:
        """A record carrying the request's identity fields and deadline; ``outcome`` gives the rest."""
        deadline = None if request.deadline_ms is None else request.arrival_s + request.deadline_ms / 1000.0
        return cls(request_id=request_id, tenant=request.tenant, klass=request.klass,  # type: ignore[arg-type]
                   prompt_tokens=request.prompt_tokens, arrival_s=request.arrival_s, deadline_s=deadline, **outcome)

    @property
    def on_time(self) -> bool:
        """Completed (stop/length) at or before its deadline (always, without one): issue #13 goodput."""
        if self.finish_reason not in _COMPLETED or self.finish_s is None:
            return False
        return self.deadline_s is None or self.finish_s <= self.deadline_s + 1e-9


@dataclass(frozen=True, slots=True)
class SimBatchRecord:
    """One decode job: its compiled batch B, how many lanes carried a sequence, and its wait.

    ``wait_s`` is how long the longest-waiting ready lane waited between becoming ready (its
    previous token, or prefill completion) and this step starting — batching window, round
    robin turns and device contention all show up here.
    """

    start_s: float
    compiled_batch: int
    active_lanes: int
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.compiled_batch < 1 or not 0 <= self.active_lanes <= self.compiled_batch:
            raise DefinitionError(f"batch at {self.start_s}: active_lanes {self.active_lanes} not in "
                                  f"[0, compiled_batch {self.compiled_batch}]")
        if self.wait_s < 0:
            raise DefinitionError(f"batch at {self.start_s}: wait_s {self.wait_s} < 0")


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Count and P50/P99/mean/max of a latency sample (``None`` when the sample is empty)."""

    count: int
    p50: float | None
    p99: float | None
    mean: float | None
    max: float | None


def latency_stats(values: Iterable[float]) -> LatencyStats:
    """P50/P99 with numpy's ``linear`` method — deterministic for a given sample."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return LatencyStats(0, None, None, None, None)
    p50, p99 = np.percentile(arr, [50, 99], method="linear")
    return LatencyStats(int(arr.size), float(p50), float(p99), float(arr.mean()), float(arr.max()))


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``; 1.0 for an empty or all-zero sample (nothing to share)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return 1.0
    if np.any(arr < 0):
        raise DefinitionError("Jain's index needs non-negative values")
    sq = float(np.dot(arr, arr))
    return 1.0 if sq == 0 else float(arr.sum() ** 2 / (arr.size * sq))


StarvationKind = Literal["overtaken", "expired"]


@dataclass(frozen=True, slots=True)
class StarvationEvent:
    """A request passed over by later arrivals of its own prompt class (module docstring).

    ``kind`` is ``"overtaken"`` (it waited past the threshold while they started) or
    ``"expired"`` (its deadline ended it before it ever started, while they started).
    """

    request_id: int
    tenant: str
    klass: PromptClass
    waited_s: float
    """Arrival → service start (or → the end of its wait if it never started)."""
    overtaken_by: int
    """Later arrivals of the same class that started service in the counted part of its wait."""
    first_overtake_s: float
    kind: StarvationKind = "overtaken"


def starvation_events(records: Sequence[SimRequestRecord], threshold_s: float,
                      end_s: float | None = None) -> tuple[StarvationEvent, ...]:
    """Requests passed over by later arrivals of their own prompt class (one event per request).

    Why within a class: the §6 queues and the long-task quota deliberately serve short prompts
    while a long one waits, and serve long prompts one at a time in arrival order; a 40K prompt
    waiting for the quota is queued, not starved. Starvation is the scheduler preferring a
    *later* request of the same kind.

    * A request whose wait — arrival → service start, or → its finish if it ended unserved
      (cancelled, failed), or → ``end_s`` if still waiting — exceeds ``threshold_s`` starves
      when a later arrival of its class starts service after the threshold and before its wait
      ends (overtakes inside the threshold are ordinary WFQ reordering).
    * A request that expired (``deadline``) without ever starting starves when a later arrival
      of its class started service before it expired, whatever the wait.

    Rejected requests never waited in a queue and are not counted. Ordered by request id.
    """
    if threshold_s < 0:
        raise DefinitionError("starvation threshold must be >= 0")
    if not records:
        return ()
    horizon = end_s if end_s is not None else _last_event(records)
    starts: dict[str, np.ndarray] = {}
    arrivals: dict[str, np.ndarray] = {}
    for klass in PROMPT_CLASSES:
        started = sorted((r.service_start_s, r.arrival_s) for r in records
                         if r.klass == klass and r.service_start_s is not None)
        starts[klass] = np.asarray([s for s, _ in started], dtype=np.float64)
        arrivals[klass] = np.asarray([a for _, a in started], dtype=np.float64)
    events: list[StarvationEvent] = []
    for r in records:
        if not r.admitted:
            continue
        expired = r.service_start_s is None and r.finish_s is not None and r.finish_reason == "deadline"
        wait_end = (r.service_start_s if r.service_start_s is not None
                    else r.finish_s if r.finish_s is not None else horizon)
        if expired:
            from_s = r.arrival_s
        elif wait_end - r.arrival_s > threshold_s:
            from_s = r.arrival_s + threshold_s
        else:
            continue
        class_starts = starts[r.klass]
        lo = int(np.searchsorted(class_starts, from_s, side="left" if expired else "right"))
        hi = int(np.searchsorted(class_starts, wait_end, side="left"))
        if hi <= lo:
            continue
        later = np.flatnonzero(arrivals[r.klass][lo:hi] > r.arrival_s)  # excludes r itself
        if later.size:
            events.append(StarvationEvent(r.request_id, r.tenant, r.klass, float(wait_end - r.arrival_s),
                                          int(later.size), float(class_starts[lo + int(later[0])]),
                                          "expired" if expired else "overtaken"))
    return tuple(sorted(events, key=lambda e: e.request_id))


def weighted_max_min_fair(capacity: float, demands: Mapping[str, float],
                          weights: Mapping[str, float]) -> dict[str, float]:
    """Water-filling: the weighted max-min fair split of ``capacity`` among ``demands``.

    ``math.inf`` is an unsatisfied demand. Tenants whose demand per weight is below the water
    level get their demand; the rest share what is left in proportion to weight. The result sums
    to ``capacity`` whenever some demand is unbounded or the demands exceed it.
    """
    if capacity < 0:
        raise DefinitionError(f"capacity must be >= 0, got {capacity}")
    if any(weights[t] <= 0 for t in demands):
        raise DefinitionError("max-min fairness needs weights > 0")
    fair: dict[str, float] = {}
    remaining = float(capacity)
    weight_left = sum(weights[t] for t in demands)
    for tenant in sorted(demands, key=lambda t: demands[t] / weights[t]):
        demand = demands[tenant]
        if demand / weights[tenant] > remaining / weight_left:
            break
        fair[tenant] = demand
        remaining -= demand
        weight_left -= weights[tenant]
    level = remaining / weight_left if weight_left > 0 else 0.0
    for tenant in demands:
        fair.setdefault(tenant, weights[tenant] * level)
    return fair


def fairness_index(records: Sequence[SimRequestRecord], weights: Mapping[str, float] | None = None,
                   start_s: float | None = None, end_s: float | None = None) -> tuple[float | None, int]:
    """Token-weighted mean of per-window Jain indices of served / max-min fair share, and the window count.

    The windows are the stretches of ``[start_s, end_s]`` between consecutive changes of the set
    of *waiting* tenants — a tenant waits while one of its admitted requests waits for service
    (arrival → service start, or → finish / ``end_s`` if it never started) — so "had waiting work
    in the window" means "waited throughout it". Why not fixed windows: in a fixed 15 s window
    nearly every tenant has *some* request that waited a few hundred milliseconds for its
    prefill, and counting it unsatisfied for the whole window charges it a large fair share it
    never asked for (on noisy-neighbour, 20 fixed windows gave 0.45 where the well-behaved
    tenants got everything they asked for; these windows give 0.98).

    Per window ``[a, b)``: ``served`` = the tenant's tokens with a time in it (the last window
    includes ``end_s``); tenants with tokens or waiting work have demand; the fair shares are
    :func:`weighted_max_min_fair` of the window's tokens, waiting tenants unbounded and the
    others at what they got. Windows with fewer than two tenants with demand, or with no
    service, say nothing about fairness and are skipped; ``(None, 0)`` when none is left.
    """
    if not records:
        return None, 0
    t0 = min(r.arrival_s for r in records) if start_s is None else start_s
    t1 = _last_event(records) if end_s is None else end_s
    if t1 <= t0:
        return None, 0
    w = defaultdict(lambda: 1.0, weights or {})
    waits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if not r.admitted:
            continue
        wait_end = (r.service_start_s if r.service_start_s is not None
                    else r.finish_s if r.finish_s is not None else t1)
        if wait_end > r.arrival_s:
            waits[r.tenant].append((r.arrival_s, wait_end))
        tokens[r.tenant].extend(r.token_times_s)
    spans = {t: np.asarray(_merge(iv), dtype=np.float64).reshape(-1, 2) for t, iv in waits.items()}
    token_arrays = {t: np.sort(np.asarray(v, dtype=np.float64)) for t, v in tokens.items()}
    tenants = sorted(set(spans) | set(token_arrays))
    cuts = {t0, t1} | {float(x) for arr in spans.values() for x in arr.ravel() if t0 < x < t1}
    bounds = sorted(cuts)
    bounds[-1] = float(np.nextafter(t1, math.inf))  # a token at end_s counts
    total_weight = 0.0
    acc = 0.0
    used = 0
    for a, b in zip(bounds, bounds[1:]):
        mid = (a + b) / 2
        served = {t: _count_in(token_arrays.get(t), a, b) for t in tenants}
        waiting = {t for t, arr in spans.items() if _inside(arr, mid)}
        demand = {t: (math.inf if t in waiting else float(served[t])) for t in tenants
                  if t in waiting or served[t] > 0}
        mass = sum(served.values())
        if len(demand) < 2 or mass == 0:
            continue
        fair = weighted_max_min_fair(mass, demand, w)
        acc += mass * jain_index([served[t] / fair[t] for t in demand])
        total_weight += mass
        used += 1
    return (acc / total_weight if used else None), used


class CostLike(Protocol):
    """What :func:`workload_limit` needs of a cost model (``calculet.adapters.sim.cost.CostModel``)."""

    def prefill_s(self, tokens: int) -> float: ...

    def decode_s(self, compiled_batch: int) -> float: ...


def workload_limit(requests: Iterable[SimRequest], cost: CostLike, max_profile: int) -> float | None:
    """Output tokens/s of ``requests`` on a never-idle device with every decode step full.

    ``Σ out / (Σ prefill_s(prompt) + Σ (out − 1) · decode_s(B) / B)`` with ``B = max_profile``:
    each offered request's prefill paid exactly once (it yields the first token), every further
    token a ``1/B`` share of a full B-lane decode step, no host cost, no ping/pong overlap. ``out``
    is ``max_new_tokens``: the simulated model has no stop token, so the engine generates exactly
    that many for a request that completes. Unlike the decode-only device-bound limit
    (``B / decode_s(B)``) it charges the prefill work the workload cannot avoid, so it is a
    ceiling a policy can approach. ``None`` for an empty list.
    """
    if isinstance(max_profile, bool) or not isinstance(max_profile, int) or max_profile < 1:
        raise DefinitionError(f"max_profile must be an integer >= 1, got {max_profile!r}")
    per_token = cost.decode_s(max_profile) / max_profile
    out = 0
    work = 0.0
    for r in requests:
        if r.max_new_tokens < 1:
            raise DefinitionError(f"a request with max_new_tokens {r.max_new_tokens} < 1")
        out += r.max_new_tokens
        work += cost.prefill_s(r.prompt_tokens) + (r.max_new_tokens - 1) * per_token
    return out / work if work > 0 else None


@dataclass(frozen=True)
class ServiceTimeline:
    """Tokens served per tenant per time bin (the per-tenant service-over-time plot)."""

    start_s: float
    bin_s: float
    tenants: tuple[str, ...]
    tokens: Mapping[str, tuple[int, ...]]
    weights: Mapping[str, float]

    def cumulative_normalized(self, tenant: str) -> np.ndarray:
        """Cumulative tokens / weight — the quantity WFQ equalises among backlogged tenants."""
        return np.cumsum(np.asarray(self.tokens[tenant], dtype=np.float64)) / self.weights.get(tenant, 1.0)

    def bin_ends(self) -> np.ndarray:
        n = len(next(iter(self.tokens.values()), ()))
        return self.start_s + self.bin_s * np.arange(1, n + 1)


def service_timeline(records: Sequence[SimRequestRecord], bin_s: float | None = None,
                     weights: Mapping[str, float] | None = None, start_s: float = 0.0,
                     end_s: float | None = None) -> ServiceTimeline:
    """Histogram of token times per tenant; ``bin_s`` defaults to a hundredth of the span."""
    tenants = tuple(sorted({r.tenant for r in records}))
    end = _last_event(records) if end_s is None else end_s
    span = max(end - start_s, 1e-9)
    width = span / 100 if bin_s is None else bin_s
    if width <= 0:
        raise DefinitionError("timeline bin must be > 0")
    n_bins = max(1, int(math.ceil(span / width - 1e-9)))
    edges = start_s + width * np.arange(n_bins + 1)
    edges[-1] = max(edges[-1], end) + 1e-12  # the last token lands in the last bin
    per: dict[str, list[float]] = {t: [] for t in tenants}
    for r in records:
        per[r.tenant].extend(r.token_times_s)
    tokens = {t: tuple(int(c) for c in np.histogram(np.asarray(v, dtype=np.float64), bins=edges)[0])
              for t, v in per.items()}
    w = {t: float((weights or {}).get(t, 1.0)) for t in tenants}
    return ServiceTimeline(start_s=start_s, bin_s=width, tenants=tenants, tokens=tokens, weights=w)


@dataclass(frozen=True)
class RunSummary:
    """Every figure of one run of one policy at one offered load (times in seconds)."""

    window_s: float
    requests: int
    admitted: int
    rejected: int
    completed: int
    output_tokens: int
    output_tokens_per_s: float
    ttft_s: LatencyStats
    ttft_by_class_s: Mapping[str, LatencyStats]
    itl_s: LatencyStats
    itl_by_class_s: Mapping[str, LatencyStats]
    queue_wait_s: LatencyStats
    queue_wait_by_class_s: Mapping[str, LatencyStats]
    batches: int
    fill_ratio: float | None
    lane_waste: float | None
    wasted_lane_steps: int
    batch_wait_s: LatencyStats
    compiled_batches: Mapping[int, int]
    rejections_by_reason: Mapping[str, int]
    finish_reasons: Mapping[str, int]
    tenant_output_tokens: Mapping[str, int]
    jain_fairness: float | None
    fairness_windows: int
    starvation: tuple[StarvationEvent, ...] = field(default=())

    @property
    def starvation_events(self) -> int:
        return len(self.starvation)


def summarize(requests: Sequence[SimRequestRecord], batches: Sequence[SimBatchRecord] = (), *,
              window_s: float | None = None, weights: Mapping[str, float] | None = None,
              starvation_threshold_s: float = 30.0) -> RunSummary:
    """All figures of a run. ``window_s`` (throughput denominator) defaults to first arrival → last event."""
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise DefinitionError("duplicate request_id in records")
    t0 = min((r.arrival_s for r in requests), default=0.0)
    t_end = _last_event(requests, batches) if requests or batches else t0
    window = (t_end - t0) if window_s is None else window_s
    if window < 0:
        raise DefinitionError(f"window_s must be >= 0, got {window}")
    out_tokens = sum(r.generated_tokens for r in requests)
    compiled = sum(b.compiled_batch for b in batches)
    active = sum(b.active_lanes for b in batches)
    fill = (active / compiled) if compiled else None
    jain, n_windows = fairness_index(requests, weights, t0, t_end)
    tenant_tokens: Counter[str] = Counter()
    for r in requests:
        tenant_tokens[r.tenant] += r.generated_tokens
    return RunSummary(
        window_s=window,
        requests=len(requests),
        admitted=sum(1 for r in requests if r.admitted),
        rejected=sum(1 for r in requests if not r.admitted),
        completed=sum(1 for r in requests if r.finish_reason in _COMPLETED),
        output_tokens=out_tokens,
        output_tokens_per_s=(out_tokens / window) if window > 0 else 0.0,
        **_request_latencies(requests),
        batches=len(batches),
        fill_ratio=fill,
        lane_waste=None if fill is None else 1.0 - fill,
        wasted_lane_steps=compiled - active,
        batch_wait_s=latency_stats(b.wait_s for b in batches),
        compiled_batches=dict(sorted(Counter(b.compiled_batch for b in batches).items())),
        rejections_by_reason=dict(sorted(Counter(r.rejection_reason for r in requests
                                                 if r.rejection_reason is not None).items())),
        finish_reasons=dict(sorted(Counter(r.finish_reason for r in requests
                                           if r.finish_reason is not None).items())),
        tenant_output_tokens=dict(sorted(tenant_tokens.items())),
        jain_fairness=jain,
        fairness_windows=n_windows,
        starvation=starvation_events(requests, starvation_threshold_s, t_end),
    )


def _request_latencies(requests: Sequence[SimRequestRecord]) -> dict[str, Any]:
    """TTFT, inter-token latency and queue wait, pooled and by §6 prompt class (``RunSummary`` fields)."""
    ttft: dict[str, list[float]] = defaultdict(list)
    itl: dict[str, list[float]] = defaultdict(list)
    wait: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        if r.first_token_s is not None:
            ttft[r.klass].append(r.first_token_s - r.arrival_s)
        if len(r.token_times_s) > 1:
            itl[r.klass].extend(np.diff(np.asarray(r.token_times_s, dtype=np.float64)).tolist())
        if r.service_start_s is not None:
            wait[r.klass].append(r.service_start_s - r.arrival_s)

    def by_class(values: Mapping[str, list[float]]) -> dict[str, LatencyStats]:
        return {k: latency_stats(values.get(k, [])) for k in PROMPT_CLASSES}

    def pooled(values: Mapping[str, list[float]]) -> list[float]:
        return [v for k in PROMPT_CLASSES for v in values.get(k, [])]

    return {"ttft_s": latency_stats(pooled(ttft)), "ttft_by_class_s": by_class(ttft),
            "itl_s": latency_stats(pooled(itl)), "itl_by_class_s": by_class(itl),
            "queue_wait_s": latency_stats(pooled(wait)), "queue_wait_by_class_s": by_class(wait)}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _last_event(records: Sequence[SimRequestRecord], batches: Sequence[SimBatchRecord] = ()) -> float:
    last = 0.0
    for r in records:
        last = max(last, r.arrival_s)
        for t in (r.service_start_s, r.finish_s, r.token_times_s[-1] if r.token_times_s else None):
            if t is not None:
                last = max(last, t)
    for b in batches:
        last = max(last, b.start_s)
    return last


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of closed intervals; touching intervals merge (back-to-back requests = continuous backlog)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _inside(spans: np.ndarray, t: float) -> bool:
    """Whether ``t`` lies in one of the sorted, disjoint ``[start, end)`` rows of ``spans``."""
    i = int(np.searchsorted(spans[:, 0], t, side="right")) - 1
    return i >= 0 and t < spans[i, 1]


def _count_in(times: np.ndarray | None, a: float, b: float) -> int:
    """Tokens with time in ``[a, b)``."""
    if times is None or times.size == 0:
        return 0
    return int(np.searchsorted(times, b, side="left") - np.searchsorted(times, a, side="left"))
