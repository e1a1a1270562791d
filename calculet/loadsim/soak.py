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
  no token; ``deadline`` before the deadline only when the on_time order shed it);
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

What a soak runs and reports is :mod:`calculet.loadsim.soak_report`; the violation ledger and
the device-level quarantine guard are :mod:`calculet.loadsim.soak_checks`. This module is the
run: the client sinks, the lane ledger, the sampling and the end-of-run checks.
"""

from __future__ import annotations

import gc
import heapq
import math
import os
import time
import tracemalloc
from collections import Counter
from typing import Callable

from calculet.adapters.calrt import ReturnCode
from calculet.adapters.sim import InjectedFault
from calculet.adapters.sim.model import pseudo_next_token
from calculet.errors import CalculetError
from calculet.machines.monitor import MONITOR, MonitorStatistics
from calculet.loadsim.engine_inputs import DEFAULT_MAX_SEQ, generate_request
from calculet.loadsim.runner import build_driver
from calculet.loadsim.soak_checks import QuarantineGuard, ResetWindow, Violations
from calculet.loadsim.soak_products import SoakSetup, soak_setup
from calculet.loadsim.soak_report import MIB, MemorySample, SoakOptions, SoakReport
from calculet.loadsim.workload import SimRequest, generate_requests, load_preset
from calculet.machines.request import FinishReason
from calculet.runtime.engine.types import EngineStatistics
from calculet.runtime.scheduling.registry import RequestRecord
from calculet.runtime.request import RequestOutcome

__all__ = ["run_soak"]

_RC_NAMES = tuple(rc.name for rc in ReturnCode if rc is not ReturnCode.OK)
_SHED = "shed under overload"
"""Detail of a request the on_time order ended DEADLINE before its deadline because it could no
longer finish by it (``runtime/scheduling/on_time.py``): legitimate early, never late."""


# --------------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------------


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
        shed = outcome.detail.startswith(_SHED)  # on_time (#13, §7.2): ended early, before more device time
        if sink.deadline_at is None or (now < sink.deadline_at - 1e-9 and not shed):
            return f"deadline at {now:.3f} before the deadline {sink.deadline_at}: {outcome.detail!r}"
    elif reason is FinishReason.ERROR:
        if not any(name in outcome.detail for name in _RC_NAMES) and "result rejected" not in outcome.detail:
            return f"error without a return code or anomaly in its detail: {outcome.detail!r}"
    elif reason is FinishReason.REJECTED:
        if sink.count or outcome.http_status not in (400, 429, 503):
            return f"rejected with {sink.count} tokens, status {outcome.http_status}"
    else:
        return f"unexpected finish reason {reason.name} (numerics-off pseudo-tokens never stop)"
    return ""


class _Soak:
    """State of one soak run (the engine, the open clients, the lane ledger)."""

    def __init__(self, options: SoakOptions, progress: Callable[[float, float], None] | None) -> None:
        self.options = options
        self.progress = progress
        self.violations = Violations()
        self.workload = options.workload or load_preset(options.preset)
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
        self.guard = QuarantineGuard(self.violations)
        self.window = ResetWindow()
        self.setup: SoakSetup = soak_setup(options.product, options.policy, self.workload,
                                           options.max_resets_per_10min)
        rates = {kind: options.fault_rate for kind in InjectedFault} if options.fault_rate > 0 else None
        self.driver, self.runtime = build_driver(
            self.setup.config, cost=options.cost, max_seq=DEFAULT_MAX_SEQ, fault_seed=options.seed * 7919,
            fault_rates=rates, options=self.setup.engine_options, observer=self.observe,
            device_observers=(self.guard, self.window), prefill_chunk_tokens=self.setup.prefill_chunk_tokens)
        self.clock = self.driver.clock
        self.window.now = self.clock.now

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
        try:
            self._serve(total, start)
            wall = time.perf_counter() - start
            stats = self.driver.statistics()
        finally:
            self.window.stop()
            try:
                self.driver.stop(drain_timeout_s=1.0)
            except CalculetError as exc:
                self.violations.add("stop", str(exc))
            monitor = MONITOR.statistics()
            MONITOR.configure(enabled=monitor_before.enabled, mode=monitor_before.mode)  # type: ignore[arg-type]
            if traced:
                tracemalloc.stop()
        self._final_checks(stats, monitor)
        growth = self._memory_growth()
        if self.progress is not None:
            self.progress(total, total)
        return self._report(stats, monitor, wall, growth)

    def _serve(self, total: float, start: float) -> None:
        """Offer the traffic an hour-sized chunk at a time (each its own seed), issue the client
        cancels as they fall due, run until idle, then take the last sample and audit."""
        o = self.options
        cancels: list[tuple[float, int, _SoakSink]] = []
        next_sample = 0.0
        chunk = 0
        index = 0
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
        self.driver.run_until_idle()
        self._sample(start)
        self._audit()

    def _report(self, stats: EngineStatistics, monitor: MonitorStatistics, wall: float,
                growth: tuple[int, int | None, int, dict[str, int], int]) -> SoakReport:
        rss_growth, traced_growth, object_growth, type_growth, bounded_growth = growth
        injected: Counter[str] = Counter()
        for device in self.runtime.devices:
            for kind, count in device.statistics().faults.injected.items():
                injected[kind.value] += count
        recovery = stats.recovery
        return SoakReport(
            options=self.options, virtual_s=self.clock.now(), wall_s=wall, submitted=self.submitted,
            outcomes=dict(sorted(self.outcomes.items())), tokens=self.tokens,
            injected={k: v for k, v in sorted(injected.items()) if v}, resets=recovery.resets,
            restarts=recovery.restarts, degrade=stats.executor.degrade.reason, lanes=stats.scheduler.kv.lanes,
            audits=self.audits, quarantines=self.guard.quarantines, monitor_checks=monitor.checks,
            memory=tuple(self.memory), rss_growth_bytes=rss_growth, traced_growth_bytes=traced_growth,
            object_growth=object_growth, type_growth=type_growth, bounded_growth=bounded_growth,
            violations=self.violations.all(), label=self.setup.label, reset_budget=self.setup.reset_budget,
            budget_note=self.setup.budget_note, peak_resets_in_window=self.window.peak,
            budget_refusals=recovery.budget_refusals, recovery_state=recovery.state, goodput=stats.goodput)

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
        self._forget_completed_jobs()
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

    def _forget_completed_jobs(self) -> None:
        """Drop completed jobs from the observed runtime's job list before each sample.

        :class:`~calculet.adapters.observed.ObservedCalRT` — the soak's instrument, not the
        product — records every job it sees (tests read the list back). On B1 a day is millions of
        one-lane jobs, so the list would be the soak's own leak and hide the product's; the checks
        need none of it (the quarantine guard keeps its own in-flight map)."""
        jobs = self.runtime.jobs
        jobs[:] = [j for j in jobs if j.completed_at is None]

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
        if self.window.count != stats.recovery.resets + stats.recovery.restarts:
            v.add("recovery", f"the device saw {self.window.count} resets + restarts, recovery counted "
                              f"{stats.recovery.resets} + {stats.recovery.restarts}")
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


def run_soak(options: SoakOptions = SoakOptions(),
             progress: Callable[[float, float], None] | None = None) -> SoakReport:
    """Run a soak; ``progress(virtual_s, total_s)`` is called at every sample. Never raises on a
    violation: the report lists them (``report.ok``)."""
    return _Soak(options, progress).run()
