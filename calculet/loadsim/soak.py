"""The §19 M0 analogue in virtual time: a day of traffic with faults, and nothing lost or leaked.

M0 asks for "24h, no abort/busy-wait/crosstalk/leak, all error codes visible" on hardware. In
simulation the same day runs in minutes: the real engine (:class:`EngineDriver`) serves a
preset's traffic for ``hours`` of virtual time on the simulated NPU (numerics off, cost model
on) while every device's fault injector (``set_random``) injects each fault kind — Wait
timeout, CCU fault, unknown DMA, DeviceBusy, lane crosstalk, bad counters — at a low rate.

Why streaming: a day at the steady preset's rate is ~40 000 requests and millions of tokens.
Keeping their records would itself grow memory, and "process memory flat" is one of the
properties checked. So requests are generated an hour at a time (each hour its own seed) and
each client sink is checked and dropped as soon as it closes; only counters survive.

Checked continuously:

* every token a client receives is the right one for its request and position (the
  simulator's pseudo-token chain), and none arrives after the close;
* no request is closed twice, and each close fits what happened (``length`` only with every
  token, ``cancelled`` only if the client cancelled, ``deadline`` only past the deadline,
  ``error`` only with a return code or result anomaly in its detail, ``rejected`` only with
  no token);
* no KV lane is held by two live requests (the transition observer tracks lane leases);
* no quarantined lane is reused: a device sequence whose job failed or whose result did not
  check out (rc ≠ OK, crosstalk, counters — :func:`~calculet.adapters.calrt.verify_result`)
  must not appear in a later job until it was freed or the device was reset;
* the declared machines' invariants (run-time monitors in counting mode);
* process memory: RSS (and, with ``tracemalloc``, Python allocations) sampled over the run;
  after a warm-up, growth beyond the limit is a violation.

Checked at the end: every submitted request closed exactly once (none lost); the engine is
idle with every lane free, no device sequence live, no waiting or active request; after the
orderly stop the device memory is back at its baseline.
"""

from __future__ import annotations

import gc
import heapq
import math
import os
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping

from calculet.adapters.calrt import DecodeJob, JobResult, JobSpec, JobTicket, ReturnCode, verify_result
from calculet.adapters.sim import CostModel, InjectedFault, SimVirtualDevice
from calculet.adapters.sim.model import pseudo_next_token
from calculet.errors import CalculetError, DefinitionError
from calculet.machines.monitor import MONITOR, MonitorStatistics
from calculet.loadsim.policies import POLICIES, PolicySpec
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ, generate_request
from calculet.loadsim.runner import DeviceObserver, build_driver
from calculet.loadsim.workload import SimRequest, Workload, generate_requests, load_preset
from calculet.machines.request import FinishReason
from calculet.runtime.engine.core import EngineStatistics
from calculet.runtime.scheduling.registry import RequestRecord
from calculet.runtime.request import RequestOutcome

__all__ = ["MemorySample", "SoakOptions", "SoakReport", "run_soak"]

MIB = 1 << 20
_RC_NAMES = tuple(rc.name for rc in ReturnCode if rc is not ReturnCode.OK)


@dataclass(frozen=True)
class SoakOptions:
    """What a soak runs. Defaults: 24 h of ``steady`` under ping/pong B16, ~1e-5 faults per kind per job."""

    hours: float = 24.0
    preset: str = "steady"
    workload: Workload | None = None
    """Overrides ``preset`` when given."""
    load_scale: float = 1.0
    policy: str = "calculet-b16-pingpong"
    """ping/pong + B16 + §8 selection: every executor path (two engines, degrade) is exercised."""
    fault_rate: float = 1e-5
    """Per fault kind, per submitted job (six kinds)."""
    seed: int = 1
    cost: CostModel = field(default_factory=CostModel.reference)
    chunk_s: float = 3600.0
    """Requests are generated this many virtual seconds at a time (each chunk its own seed)."""
    sample_every_s: float = 1800.0
    """Virtual seconds between memory samples and lane audits."""
    warmup_fraction: float = 0.1
    """Memory growth is measured after this share of the run (caches, pools and the allocator settle)."""
    rss_growth_limit_bytes: int = 64 * MIB
    traced_growth_limit_bytes: int = 8 * MIB
    object_growth_limit: int = 20_000
    """Growth of GC-tracked objects after warm-up, per type and in total, beyond the allowances."""
    bounded_histories: Mapping[str, int] = field(default_factory=lambda: {"RequestOutcome": 65_536})
    """Object types the runtime keeps in a deliberately bounded history, with the bound: they may
    grow by up to that many. ``RequestOutcome``: the registry keeps the last ``retain_terminal``
    (65 536) ended requests' outcomes so a late ``cancel``/status call still gets an answer
    (``runtime/scheduling/registry.py``); a day at the steady preset's rate ends ~43 000 requests, so that
    history is still filling when the soak ends and grows by one object per request."""
    trace_memory: bool = False
    """Also run ``tracemalloc`` (exact Python allocations; measured ~4.5x slower here, so off by
    default: RSS and the GC object count are sampled in every run)."""
    max_resets_per_10min: int = 50
    """Recovery budget (§15): high enough that injected faults never exhaust it."""
    monitors: bool = True
    """Run the declared machines' invariant monitors (counting mode) throughout."""

    def __post_init__(self) -> None:
        if not (self.hours > 0 and math.isfinite(self.hours)):
            raise DefinitionError(f"hours must be finite and > 0, got {self.hours}")
        if not (self.load_scale > 0 and math.isfinite(self.load_scale)):
            raise DefinitionError(f"load_scale must be finite and > 0, got {self.load_scale}")
        if not 0 <= self.fault_rate <= 0.05:
            raise DefinitionError(f"fault_rate must be in [0, 0.05] per kind per job, got {self.fault_rate}")
        if self.policy not in POLICIES or POLICIES[self.policy].kind != "engine":
            engines = [n for n, p in POLICIES.items() if p.kind == "engine"]
            raise DefinitionError(f"soak policy must be an engine policy ({', '.join(engines)}), got {self.policy!r}")
        if self.chunk_s <= 0 or self.sample_every_s <= 0:
            raise DefinitionError("chunk_s and sample_every_s must be > 0")


@dataclass(frozen=True)
class MemorySample:
    virtual_s: float
    wall_s: float
    rss_bytes: int
    traced_bytes: int | None
    objects: int
    """Objects tracked by the garbage collector: a leak of Python objects shows here exactly,
    at a fraction of tracemalloc's cost (one ``gc.get_objects()`` per sample)."""


@dataclass(frozen=True)
class SoakReport:
    """The soak's figures and every violation found (empty: the run passed)."""

    options: SoakOptions
    virtual_s: float
    wall_s: float
    submitted: int
    outcomes: Mapping[str, int]
    tokens: int
    injected: Mapping[str, int]
    resets: int
    restarts: int
    degrade: str
    lanes: int
    audits: int
    quarantines: int
    """Device sequences quarantined by the guard (their job failed or did not check out)."""
    monitor_checks: int
    memory: tuple[MemorySample, ...]
    rss_growth_bytes: int
    traced_growth_bytes: int | None
    object_growth: int
    type_growth: Mapping[str, int]
    """Largest per-type growth of GC-tracked objects from the end of the warm-up to the end."""
    bounded_growth: int
    """Growth of the object types in ``options.bounded_histories`` (each capped at its bound)."""
    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def speedup(self) -> float:
        return self.virtual_s / self.wall_s if self.wall_s > 0 else math.inf

    def to_json(self, command_line: str = "") -> dict[str, object]:
        """The headline figures, machine-readable (``soak.json``)."""
        o = self.options
        return {"command": command_line, "ok": self.ok, "hours": o.hours, "workload": o.workload.name if o.workload
                else o.preset, "load_scale": o.load_scale, "policy": o.policy, "fault_rate": o.fault_rate,
                "virtual_s": self.virtual_s, "wall_s": round(self.wall_s, 3), "speedup": round(self.speedup, 1),
                "submitted": self.submitted, "outcomes": dict(self.outcomes), "tokens": self.tokens,
                "injected": dict(self.injected), "resets": self.resets, "restarts": self.restarts,
                "quarantines": self.quarantines, "monitor_checks": self.monitor_checks,
                "rss_growth_bytes": self.rss_growth_bytes, "object_growth": self.object_growth,
                "bounded_growth": self.bounded_growth, "violations": list(self.violations)}

    def markdown(self, command_line: str = "") -> str:
        """A short Markdown report (what ``python -m calculet.bench soak --out`` writes)."""
        o = self.options
        lines = ["# Calculet soak (virtual time)", ""]
        if command_line:
            lines += ["Command line:", "", "```", command_line, "```", ""]
        lines += [f"- result: **{'PASS' if self.ok else 'FAIL'}**",
                  f"- virtual time {self.virtual_s / 3600:.2f} h in {self.wall_s / 60:.1f} min wall "
                  f"({self.speedup:.0f}x real time)",
                  f"- workload `{o.workload.name if o.workload else o.preset}` at load {o.load_scale:g}, policy "
                  f"`{o.policy}`, {self.lanes} KV lanes, cost model {_cost_text(o.cost)}",
                  f"- faults: rate {o.fault_rate:g} per kind per job; injected {_counts(self.injected) or 'none'}; "
                  f"device resets {self.resets}, restarts {self.restarts}; ping/pong degrade: {self.degrade or 'none'}",
                  f"- requests submitted {self.submitted}; outcomes {_counts(self.outcomes)}; tokens delivered "
                  f"{self.tokens}",
                  f"- lane audits {self.audits}; device sequences quarantined after a failed job "
                  f"{self.quarantines} (a use before a free or reset is a violation); invariant monitor checks "
                  f"{self.monitor_checks}",
                  f"- memory after warm-up ({o.warmup_fraction:.0%} of the run): RSS "
                  f"{self.rss_growth_bytes / MIB:+.1f} MiB (limit {o.rss_growth_limit_bytes / MIB:.0f} MiB); "
                  f"GC-tracked objects {self.object_growth:+d}, of which bounded histories "
                  f"{self.bounded_growth:+d} (allowed: {_counts(dict(o.bounded_histories))}), limit "
                  f"{o.object_growth_limit} beyond those; largest growth by type: "
                  f"{_counts(self.type_growth) or 'none'}"
                  + ("" if self.traced_growth_bytes is None else
                     f"; tracemalloc {self.traced_growth_bytes / MIB:+.2f} MiB "
                     f"(limit {o.traced_growth_limit_bytes / MIB:.0f} MiB)"), ""]
        if self.violations:
            lines += ["## Violations", ""] + [f"- {v}" for v in self.violations[:200]] + [""]
        lines += ["## Memory samples", "", "| virtual h | wall s | RSS MiB | GC objects | traced MiB |",
                  "|---|---|---|---|---|"]
        lines += [f"| {m.virtual_s / 3600:.2f} | {m.wall_s:.0f} | {m.rss_bytes / MIB:.1f} | {m.objects} | "
                  f"{'—' if m.traced_bytes is None else f'{m.traced_bytes / MIB:.2f}'} |" for m in self.memory]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------


class _Violations:
    """Collects violations; keeps the first ``limit`` texts and counts the rest by kind."""

    def __init__(self, limit: int = 500) -> None:
        self.items: list[str] = []
        self.by_kind: Counter[str] = Counter()
        self.limit = limit

    def add(self, kind: str, detail: str) -> None:
        self.by_kind[kind] += 1
        if len(self.items) < self.limit:
            self.items.append(f"{kind}: {detail}")

    def all(self) -> tuple[str, ...]:
        extra = [f"{kind}: {n - shown} more" for kind, n in self.by_kind.items()
                 if (shown := sum(1 for i in self.items if i.startswith(kind + ":"))) < n]
        return tuple(self.items + extra)


class _SoakSink:
    """A client: checks each token against the pseudo-token chain as it arrives, keeps no tokens."""

    __slots__ = ("soak", "request_id", "max_new", "prev", "pos", "count", "deadline_at", "cancelled", "closed",
                 "arrival")

    def __init__(self, soak: _Soak, prompt_last: int, prompt_len: int, max_new: int, deadline_at: float | None,
                 arrival: float) -> None:
        self.soak = soak
        self.request_id = 0
        self.max_new = max_new
        self.prev = prompt_last
        self.pos = prompt_len - 1
        self.count = 0
        self.deadline_at = deadline_at
        self.cancelled = False
        self.closed = False
        self.arrival = arrival

    def token(self, request_id: int, token: int) -> None:
        soak = self.soak
        if self.closed:
            soak.violations.add("token_after_close", f"request {request_id} got a token after its close")
            return
        expected = pseudo_next_token(self.prev, self.pos)
        if token != expected:
            soak.violations.add("wrong_token", f"request {request_id} token {self.count}: {token} != {expected}")
        self.prev = token
        self.pos += 1
        self.count += 1
        soak.tokens += 1

    def close(self, outcome: RequestOutcome) -> None:
        soak = self.soak
        rid = outcome.request_id or self.request_id
        if self.closed:
            soak.violations.add("closed_twice", f"request {rid} closed again with {outcome.finish_reason.name}")
            return
        self.closed = True
        soak.closed += 1
        reason = outcome.finish_reason
        soak.outcomes[reason.name.lower()] += 1
        problem = _close_problem(self, outcome, soak.now())
        if problem:
            soak.violations.add("wrong_outcome", f"request {rid}: {problem}")
        soak.open.pop(id(self), None)


def _close_problem(sink: _SoakSink, outcome: RequestOutcome, now: float) -> str:
    """Why this close does not fit what happened to the request ('' if it does)."""
    reason = outcome.finish_reason
    if reason is FinishReason.LENGTH:
        if outcome.state != "completed" or sink.count != sink.max_new:
            return f"length with {sink.count}/{sink.max_new} tokens, state {outcome.state}"
    elif reason is FinishReason.CANCELLED:
        if not sink.cancelled:
            return "cancelled although the client never cancelled"
    elif reason is FinishReason.DEADLINE:
        if sink.deadline_at is None or now < sink.deadline_at - 1e-9:
            return f"deadline at {now:.3f} before the deadline {sink.deadline_at}"
    elif reason is FinishReason.ERROR:
        if not any(name in outcome.detail for name in _RC_NAMES) and "result rejected" not in outcome.detail:
            return f"error without a return code or anomaly in its detail: {outcome.detail!r}"
    elif reason is FinishReason.REJECTED:
        if sink.count or outcome.http_status not in (400, 429, 503):
            return f"rejected with {sink.count} tokens, status {outcome.http_status}"
    else:
        return f"unexpected finish reason {reason.name} (numerics-off pseudo-tokens never stop)"
    return ""


class _QuarantineGuard(DeviceObserver):
    """Device-level check: a sequence whose job failed is not used again until freed or reset."""

    def __init__(self, violations: _Violations) -> None:
        self.violations = violations
        self.jobs: dict[int, tuple[JobSpec, JobTicket]] = {}
        self.quarantined: dict[int, str] = {}
        self.quarantines = 0

    @staticmethod
    def _seqs(job: JobSpec) -> tuple[int, ...]:
        if isinstance(job, DecodeJob):
            return tuple(int(job.seq_ids[i]) for i in job.active_lanes)
        return (int(job.seq_id),)

    def device_created(self, device: SimVirtualDevice, index: int) -> None:
        self.device_reset()

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        for seq in self._seqs(job):
            why = self.quarantined.get(seq)
            if why is not None:
                self.violations.add("quarantined_reuse", f"sequence {seq} used by job {int(ticket.job_id)} "
                                                         f"while quarantined ({why})")
        self.jobs[int(ticket.job_id)] = (job, ticket)

    def completed(self, result: JobResult) -> None:
        entry = self.jobs.pop(int(result.job_id), None)
        if entry is None:
            return
        job, ticket = entry
        check = verify_result(job, ticket, result)
        if result.rc is ReturnCode.OK and check.ok:
            return
        why = result.rc.name if result.rc is not ReturnCode.OK else check.anomalies[0][0].value
        for seq in self._seqs(job):
            self.quarantined[seq] = f"job {int(result.job_id)} {why}"
            self.quarantines += 1

    def sequence_allocated(self, seq: int) -> None:
        self.quarantined.pop(seq, None)

    def sequence_freed(self, seq: int) -> None:
        self.quarantined.pop(seq, None)

    def device_reset(self) -> None:
        self.jobs.clear()
        self.quarantined.clear()


class _Soak:
    """State of one soak run (the engine, the open clients, the lane ledger)."""

    def __init__(self, options: SoakOptions, progress: Callable[[float, float], None] | None) -> None:
        self.options = options
        self.progress = progress
        self.violations = _Violations()
        self.workload = options.workload or load_preset(options.preset)
        self.policy: PolicySpec = POLICIES[options.policy]
        self.outcomes: Counter[str] = Counter()
        self.tokens = 0
        self.closed = 0
        self.submitted = 0
        self.open: dict[int, _SoakSink] = {}
        self.held: dict[int, int] = {}
        self.lane_of: dict[int, int] = {}
        self.audits = 0
        self.memory: list[MemorySample] = []
        self.census_start: Counter[str] | None = None
        self.census_end: Counter[str] = Counter()
        self.guard = _QuarantineGuard(self.violations)
        config = self.policy.scheduler_config(self.workload,
                                              recovery={"max_resets_per_10min": options.max_resets_per_10min})
        rates = {kind: options.fault_rate for kind in InjectedFault} if options.fault_rate > 0 else None
        self.driver, self.runtime = build_driver(
            config, cost=options.cost, max_seq=DEFAULT_MAX_SEQ, fault_seed=options.seed * 7919, fault_rates=rates,
            options=self.policy.engine_options(), observer=self.observe, device_observers=(self.guard,),
            prefill_chunk_tokens=self.policy.prefill_chunk_tokens)
        self.clock = self.driver.clock

    def now(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------------ lane ledger (observer)

    def observe(self, rec: RequestRecord, source: str, target: str) -> None:
        if source == target:
            return
        rid = rec.request_id
        if target == "prefill_ready" and rid not in self.lane_of:  # admitted: the lease was just taken
            lease = rec.lease
            if lease is None:
                self.violations.add("lane_ledger", f"request {rid} admitted without a KV lease")
                return
            lane = int(lease.lane)
            holder = self.held.get(lane)
            if holder is not None and holder != rid:
                self.violations.add("lane_double_assigned", f"lane {lane} given to request {rid} while request "
                                                            f"{holder} holds it")
            self.held[lane] = rid
            self.lane_of[rid] = lane
        elif target in ("finishing", "completed", "cancelled", "failed"):
            lane = self.lane_of.pop(rid, None)
            if lane is not None and self.held.get(lane) == rid:
                del self.held[lane]

    # ------------------------------------------------------------------ the run

    def run(self) -> SoakReport:
        o = self.options
        driver = self.driver
        total = o.hours * 3600.0
        traced = o.trace_memory
        if traced and not tracemalloc.is_tracing():
            tracemalloc.start(1)
        monitor_before = MONITOR.statistics()
        MONITOR.reset()  # the counts read at the end are this run's
        if o.monitors:
            MONITOR.configure(enabled=True, mode="count")
        else:
            MONITOR.configure(enabled=False)
        start = time.perf_counter()
        cancels: list[tuple[float, int, _SoakSink]] = []
        next_sample = 0.0
        chunk = 0
        index = 0
        try:
            while chunk * o.chunk_s < total:
                base = chunk * o.chunk_s
                length = min(o.chunk_s, total - base)
                requests = generate_requests(self.workload, length, o.load_scale, seed=o.seed * 100_003 + chunk)
                for req in requests:
                    at = base + req.arrival_s
                    next_sample = self._advance(at, cancels, next_sample, start)
                    index += 1
                    self._submit(index, req, at, cancels)
                del requests
                chunk += 1
            while cancels:
                next_sample = self._advance(cancels[0][0], cancels, next_sample, start)
            driver.run_until_idle()
            self._sample(start)
            self._audit()
            wall = time.perf_counter() - start
            stats = driver.statistics()
        finally:
            try:
                driver.stop(drain_timeout_s=1.0)
            except CalculetError as exc:
                self.violations.add("stop", str(exc))
            monitor = MONITOR.statistics()
            MONITOR.configure(enabled=monitor_before.enabled, mode=monitor_before.mode)  # type: ignore[arg-type]
            if traced:
                tracemalloc.stop()
        self._final_checks(stats, monitor)
        rss_growth, traced_growth, object_growth, type_growth, bounded_growth = self._memory_growth()
        injected: Counter[str] = Counter()
        for device in self.runtime.devices:
            for kind, count in device.statistics().faults.injected.items():
                injected[kind.value] += count
        if self.progress is not None:
            self.progress(total, total)
        return SoakReport(
            options=o, virtual_s=self.clock.now(), wall_s=wall, submitted=self.submitted,
            outcomes=dict(sorted(self.outcomes.items())), tokens=self.tokens,
            injected={k: v for k, v in sorted(injected.items()) if v}, resets=stats.recovery.resets,
            restarts=stats.recovery.restarts, degrade=stats.executor.degrade.reason, lanes=self.policy.lanes,
            audits=self.audits, quarantines=self.guard.quarantines, monitor_checks=monitor.checks, memory=tuple(self.memory),
            rss_growth_bytes=rss_growth, traced_growth_bytes=traced_growth, object_growth=object_growth,
            type_growth=type_growth, bounded_growth=bounded_growth, violations=self.violations.all())

    def _submit(self, index: int, req: SimRequest, at: float, cancels: list[tuple[float, int, _SoakSink]]) -> None:
        request = generate_request(index, req)
        deadline_at = None if req.deadline_ms is None else self.now() + req.deadline_ms / 1000.0
        sink = _SoakSink(self, request.prompt[-1], len(request.prompt), req.max_new_tokens, deadline_at, at)
        self.open[id(sink)] = sink
        self.submitted += 1
        submission = self.driver.submit(request, sink)
        sink.request_id = submission.request_id
        if req.cancel_after_s is not None and submission.request_id and not sink.closed:
            heapq.heappush(cancels, (at + req.cancel_after_s, index, sink))

    def _advance(self, when: float, cancels: list[tuple[float, int, _SoakSink]], next_sample: float,
                 start: float) -> float:
        driver = self.driver
        while True:
            due = min(when, cancels[0][0] if cancels else math.inf, next_sample)
            if due > self.now():
                driver.run_until(due)
            if cancels and cancels[0][0] <= due:
                _, _, sink = heapq.heappop(cancels)
                if not sink.closed:
                    sink.cancelled = True
                    driver.cancel(sink.request_id)
                continue
            if next_sample <= due:
                self._sample(start)
                self._audit()
                next_sample += self.options.sample_every_s
                if self.progress is not None:
                    self.progress(self.now(), self.options.hours * 3600.0)
                continue
            return next_sample

    def _sample(self, start: float) -> None:
        """RSS, traced bytes and a census of GC-tracked objects by type (kept: warm-up end and latest)."""
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
        objects = gc.get_objects()
        census = Counter(type(obj).__name__ for obj in objects)
        del objects
        self.memory.append(MemorySample(self.now(), time.perf_counter() - start, _rss_bytes(), traced,
                                        sum(census.values())))
        o = self.options
        if self.census_start is None and self.now() >= o.warmup_fraction * o.hours * 3600.0:
            self.census_start = census
        self.census_end = census

    def _audit(self) -> None:
        """Cross-check the lane ledger with the engine's own counts."""
        self.audits += 1
        stats = self.driver.statistics()
        admission = stats.scheduler.admission
        if admission.active_sequences != len(self.held):
            self.violations.add("lane_ledger", f"t={self.now():.0f}: engine counts {admission.active_sequences} "
                                               f"active sequences, the observer saw {len(self.held)} lanes held")
        kv = stats.scheduler.kv
        if sum(kv.by_state.values()) != kv.lanes:
            self.violations.add("lane_ledger", f"t={self.now():.0f}: lane states {kv.by_state} do not sum to "
                                               f"{kv.lanes}")

    def _final_checks(self, stats: EngineStatistics, monitor: MonitorStatistics) -> None:
        v = self.violations
        if self.open:
            sample = ", ".join(str(s.request_id) for s in list(self.open.values())[:10])
            v.add("lost_request", f"{len(self.open)} request(s) never closed (e.g. {sample})")
        if self.closed != self.submitted:
            v.add("lost_request", f"{self.submitted} submitted, {self.closed} closed")
        kv = stats.scheduler.kv
        if kv.by_state.get("free", 0) != kv.lanes or kv.free_lanes != kv.lanes:
            v.add("lane_leak", f"after the run lanes are {kv.by_state} (free_lanes {kv.free_lanes} of {kv.lanes})")
        if self.held:
            v.add("lane_leak", f"the observer still sees lanes {sorted(self.held)} held")
        if stats.session.live_sequences:
            v.add("lane_leak", f"{stats.session.live_sequences} device sequence(s) still live after the run")
        if stats.pending_frees:
            v.add("lane_leak", f"{stats.pending_frees} FreeSequence command(s) still pending")
        admission = stats.scheduler.admission
        if admission.waiting_requests or admission.active_sequences or stats.live_requests:
            v.add("lost_request", f"engine not idle: waiting {admission.waiting_requests}, active "
                                  f"{admission.active_sequences}, live {stats.live_requests}")
        for (machine, invariant), count in sorted(monitor.violations.items()):
            v.add("invariant", f"{machine}.{invariant} violated {count} time(s)")
        if stats.recovery.state != "healthy":
            v.add("recovery", f"recovery ended {stats.recovery.state} (the model became unavailable)")
        device = self.runtime.devices[-1] if self.runtime.devices else None
        if device is not None:
            used = device.statistics().memory.used_bytes
            if used:
                v.add("device_memory_leak", f"{used} bytes of device memory still reserved after the stop")

    def _memory_growth(self) -> tuple[int, int | None, int, dict[str, int], int]:
        """Growth after warm-up: RSS and traced bytes from the first to the last quarter of the samples
        (peak vs peak); GC-tracked objects by type from the census at the warm-up's end to the last one."""
        o = self.options
        samples = [m for m in self.memory if m.virtual_s >= o.warmup_fraction * o.hours * 3600.0]
        if len(samples) < 2 or self.census_start is None:
            return 0, None, 0, {}, 0
        growth = self.census_end.copy()
        growth.subtract(self.census_start)
        by_type = {k: v for k, v in growth.most_common(5) if v > 0}
        allowed = 0
        for name, delta in growth.items():
            allowance = o.bounded_histories.get(name, 0)
            allowed += min(max(delta, 0), allowance)
            if delta - allowance > o.object_growth_limit:
                self.violations.add("memory_growth", f"{delta} more {name} objects after warm-up "
                                                     f"(limit {o.object_growth_limit + allowance})")
        objects = sum(growth.values())
        if objects - allowed > o.object_growth_limit:
            self.violations.add("memory_growth", f"GC-tracked objects grew by {objects} after warm-up, {allowed} "
                                                 f"of them bounded histories (limit {o.object_growth_limit} more)")
        quarter = max(1, len(samples) // 4)
        early, late = samples[:quarter], samples[-quarter:]
        rss = max(m.rss_bytes for m in late) - max(m.rss_bytes for m in early)
        if rss > o.rss_growth_limit_bytes:
            self.violations.add("memory_growth", f"RSS grew {rss / MIB:.1f} MiB after warm-up "
                                                 f"(limit {o.rss_growth_limit_bytes / MIB:.0f} MiB)")
        traced: int | None = None
        if all(m.traced_bytes is not None for m in early + late):
            traced = max(m.traced_bytes or 0 for m in late) - max(m.traced_bytes or 0 for m in early)
            if traced > o.traced_growth_limit_bytes:
                self.violations.add("memory_growth", f"traced Python memory grew {traced / MIB:.2f} MiB after "
                                                     f"warm-up (limit {o.traced_growth_limit_bytes / MIB:.0f} MiB)")
        return rss, traced, objects, by_type, allowed


def _rss_bytes() -> int:
    """Resident set size now (Linux ``/proc``); the peak from ``getrusage`` elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _counts(mapping: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in mapping.items())


def _cost_text(cost: CostModel) -> str:
    return (f"(prefill {cost.prefill_fixed_s * 1e3:g} ms + {cost.prefill_per_token_s * 1e3:g} ms/token, decode "
            f"{cost.decode_fixed_s * 1e3:g} ms + {cost.decode_per_lane_s * 1e3:g} ms/lane, ping/pong overlap "
            f"{cost.pingpong_overlap:g})")


def run_soak(options: SoakOptions = SoakOptions(),
             progress: Callable[[float, float], None] | None = None) -> SoakReport:
    """Run a soak; ``progress(virtual_s, total_s)`` is called at every sample. Never raises on a
    violation: the report lists them (``report.ok``)."""
    return _Soak(options, progress).run()
