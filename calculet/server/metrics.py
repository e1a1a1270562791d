"""Prometheus metrics (§16): a custom Collector reading ``Engine.statistics()`` at scrape time.

The latencies, HTTP counts and starvation events only the service layer can see are recorded
as requests pass, in :mod:`calculet.server.request_metrics`; both share the app's registry.

Naming: ``calculet_<component>_<what>_<unit>`` in base units (seconds, tokens, lanes, bytes);
counters end in ``_total``. Labels come only from bounded sets (§16, R16.9): tenant names
from the configuration, model aliases, queue names, machine states, admission decisions, fault
reasons, CalRT return-code names, route templates, status codes. Every bounded label value is
exported from the start (a zero is a fact too), so the set of series never depends on how many
requests were served. Request and job ids appear only in logs (R16.10).

The §16 rows and where each comes from:

==========  ==================================================================================
admission   ``AdmissionStatistics``: waiting requests/tokens, decisions (admit/queue/reject by
            reason), timeouts, blocked-by-limit, tenant quota use next to the configured limits
queues      ``PrefillStatistics`` / ``DecodeStatistics``: depth and oldest wait per queue, WRR
            service opportunities
batch       ``DecodeStatistics``: compiled B, active lanes, fill ratio, batch wait, lane waste
KV          ``KvLaneStatistics``: sequences by state, tokens used/reserved, lane wait, Unknown, free
            latency
executor    ``ExecutorStatistics`` / ``JobStatistics`` / mailbox: in flight (ping/pong),
            submit/Wait return codes, device status, job and queue counters
model       the ModelAdmin's ``status()``: generation and state per alias; the ModelManager's
            ``statistics()``: last load/configure/warmup/drain/unload duration, generations by state
fairness    ``TenantStatistics``: service tokens, virtual lag; starvation events are counted
            here (:class:`~calculet.server.request_metrics.StarvationWatch`), where arrival and first token are both seen
recovery    ``RecoveryStatistics`` + executor/KV: faults by reason, quarantined jobs/buffers/KV,
            resets/restarts, recovery time
latency     TTFT, inter-token and end-to-end histograms, per tenant (:class:`~calculet.server.request_metrics.ServiceMetrics`)
goodput     ``GoodputStatistics`` (issue #13, the engine's request desk): on-time and late completions per
            tenant, device tokens by phase, wasted tokens by (phase, reason), device and wasted seconds
invariants  ``calculet_invariant_violations_total{machine,invariant}`` from the run-time monitor
==========  ==================================================================================

Decode "oldest wait": ``DecodeStatistics`` does not carry it yet, so the decode sample of
``calculet_queue_oldest_wait_seconds`` is exported only once the runtime provides an
``oldest_wait_s`` field (the prefill queues always have theirs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calculet.adapters.calrt import Anomaly, ReturnCode, profile_tier
from calculet.config import SchedulerConfig
from calculet.machines.monitor import MONITOR
from calculet.machines import ALL_MACHINES
from calculet.machines.job import DeviceJobMachine
from calculet.machines.kv_sequence import KvSequenceMachine
from calculet.machines.model import ModelMachine
from calculet.machines.request import FinishReason, RequestMachine
from calculet.runtime.scheduling.admission import Decision
from calculet.runtime.engine.goodput import PHASES, WASTE_REASONS
from calculet.runtime.engine.types import EngineStatistics
from calculet.runtime.execution.degrade import DegradeReason
from calculet.runtime.execution.recovery import FaultReason

log = logging.getLogger("calculet.server.metrics")

QUEUES = ("decode", "short", "medium", "long")
PREFILL_QUEUES = ("short", "medium", "long")
RC_NAMES = tuple(rc.name for rc in ReturnCode)
FAULT_REASONS = tuple(r.value for r in FaultReason)
DECISIONS = tuple(d.value for d in Decision)
FINISH_REASONS = tuple(r.name.lower() for r in FinishReason if r is not FinishReason.NONE)
MODEL_STATES = tuple(ModelMachine.definition.states)
MODEL_PHASES = ("load", "configure", "warmup", "drain", "unload")
"""The ModelManager's measured phases (``ModelManagerStatistics`` fields)."""
KV_STATES = tuple(KvSequenceMachine.definition.states)
REQUEST_STATES = tuple(RequestMachine.definition.states)
JOB_STATES = tuple(DeviceJobMachine.definition.states)
JOB_ENDINGS = tuple(sorted({t.name for t in DeviceJobMachine.definition.transitions
                            if t.target in DeviceJobMachine.definition.terminal}))
ENGINE_STATES = ("running", "stopping", "stopped")
RECOVERY_STATES = ("healthy", "recovering", "failed")
DEVICE_STATUSES = ("ok", "poisoned", "closed")
ADMISSION_LIMITS = ("kv_lane", "max_sequences", "max_kv_tokens")
ENGINES = ("ping", "pong")
TENANT_LIMITS = {
    "max_active_sequences": ("calculet_admission_tenant_max_active_sequences", "Active sequences a tenant may hold"),
    "max_waiting_tokens": ("calculet_admission_tenant_max_waiting_tokens", "Prompt tokens a tenant may have waiting"),
    "qps": ("calculet_admission_tenant_qps_limit_requests_per_second", "Requests per second admitted for a tenant"),
}
BUDGET = {
    "max_sequences": ("calculet_admission_budget_sequences", "Active sequences admitted at most"),
    "max_kv_tokens": ("calculet_admission_budget_kv_tokens", "KV tokens admitted requests may reserve"),
    "max_waiting_requests": ("calculet_admission_budget_waiting_requests", "Requests allowed to wait"),
    "max_waiting_prompt_tokens": ("calculet_admission_budget_waiting_prompt_tokens",
                                  "Prompt tokens allowed to wait"),
    "max_inflight_jobs": ("calculet_admission_budget_inflight_jobs", "Device jobs in flight at most"),
}


# ---------------------------------------------------------------------------------------------
# the engine collector
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModelFacts:
    """What the collector needs of the served package, read once at bring-up (not the runtime's
    :class:`~calculet.runtime.execution.model_facts.ModelFacts`, what a calbin states about itself)."""

    profiles: tuple[int, ...]
    kv_token_capacity: int


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def _family(kind: type[_Family], name: str, doc: str, value: float | None, labels: Sequence[str]) -> _Family:
    """A labelled family (samples added by the caller) or a single sample (``value``, 0 if None)."""
    if labels:
        return kind(name, doc, labels=list(labels))
    return kind(name, doc, value=value if value is not None else 0.0)


def _gauge(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return _family(GaugeMetricFamily, name, doc, value, labels)


def _counter(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return _family(CounterMetricFamily, name, doc, value, labels)


def _by(family: GaugeMetricFamily | CounterMetricFamily, values: Mapping[str, float], keys: Iterable[str],
        *prefix: str) -> GaugeMetricFamily | CounterMetricFamily:
    """One sample per bounded key (missing keys are 0; extra keys the runtime reports are kept)."""
    seen = list(keys)
    seen.extend(k for k in values if k not in seen)
    for key in seen:
        family.add_metric([*prefix, key], float(values.get(key, 0)))
    return family


def _one_hot(family: GaugeMetricFamily, current: str, keys: Iterable[str], *prefix: str) -> GaugeMetricFamily:
    seen = list(keys)
    if current not in seen:
        seen.append(current)
    for key in seen:
        family.add_metric([*prefix, key], 1.0 if key == current else 0.0)
    return family


def _on_time(s: EngineStatistics) -> list[Metric]:
    """Issue #13: what the ``on_time`` deadline order decided (all zero under another order)."""
    o = s.scheduler.on_time
    refused = {"cannot_finish": o.unfit, "ttft_target": o.ttft_refused} if o is not None else {}
    shed = {"waiting": o.shed_waiting, "admitted": o.shed_admitted} if o is not None else {}
    return [
        _by(_counter("calculet_scheduler_on_time_refused", "Requests refused (429) at admission because the "
                     "shared-device estimate says they cannot finish by their deadline or start within their "
                     "TTFT target (§5.2).", labels=["reason"]), refused, ("cannot_finish", "ttft_target")),
        _by(_counter("calculet_scheduler_on_time_shed", "Accepted requests the overload selection ended early, "
                     "before device time was spent on them: still waiting (429) or admitted (deadline) (§7.2).",
                     labels=["stage"]), shed, ("waiting", "admitted")),
        _counter("calculet_scheduler_on_time_replans", "Times the on-time selection was recomputed (admission, "
                 "an end, a reset, a step-time drift).", o.replans if o is not None else 0),
        _gauge("calculet_scheduler_at_risk_sequences", "Sequences ordered earliest-deadline-first because their "
               "shared-device finish estimate is past their deadline (§7.2 item 2).", o.at_risk if o else 0),
        _gauge("calculet_scheduler_decode_cap_streams", "Streams allowed to decode at once under the ITL target "
               "(0: no cap).", (o.decode_cap or 0) if o is not None else 0),
    ]


def _goodput(s: EngineStatistics, tenants: Sequence[str]) -> list[Metric]:
    """Issue #13: requests finished within their deadline and device work thrown away."""
    g = s.goodput
    on_time, late = (g.on_time, g.late) if g is not None else ({}, {})
    computed = g.computed_tokens if g is not None else {}
    wasted = g.wasted_tokens if g is not None else {}
    wasted_s = g.wasted_device_seconds if g is not None else {}
    tokens = _counter("calculet_request_wasted_tokens", "Tokens computed on the device for requests that then "
                      "ended deadline or error, by phase and reason.", labels=["phase", "reason"])
    for phase in PHASES:
        for reason in WASTE_REASONS:
            tokens.add_metric([phase, reason], float(wasted.get((phase, reason), 0)))
    return [
        _by(_counter("calculet_request_goodput", "Requests completed (stop/length) at or before their deadline.",
                     labels=["tenant"]), on_time, tenants),
        _by(_counter("calculet_request_late", "Requests completed after their deadline.", labels=["tenant"]),
            late, tenants),
        _by(_counter("calculet_device_computed_tokens", "Tokens the device computed for requests, by phase.",
                     labels=["phase"]), computed, PHASES),
        tokens,
        _counter("calculet_device_busy_seconds", "Device busy seconds attributed to requests' jobs.",
                 g.device_seconds if g is not None else 0.0),
        _by(_counter("calculet_request_wasted_device_seconds", "Device seconds spent on requests that then ended "
                     "deadline or error, by reason.", labels=["reason"]), wasted_s, WASTE_REASONS),
    ]


def _mailbox_and_memory(s: EngineStatistics) -> list[Metric]:
    """The actor mailbox's stages and the device's DRAM accounting (§16 executor row)."""
    mailbox = s.mailbox
    posted = run = failed = pending = 0
    if mailbox is not None:
        posted, run, failed, pending = mailbox.posted, mailbox.run, mailbox.failed, mailbox.pending
    memory = getattr(s.device, "memory", None)
    mem = _gauge("calculet_device_memory_bytes", "Device DRAM accounting.", labels=["kind"])
    if memory is not None:
        for kind, attr in (("total", "total_bytes"), ("used", "used_bytes"), ("peak", "peak_used_bytes")):
            mem.add_metric([kind], float(getattr(memory, attr, 0)))
    return [
        _by(_counter("calculet_executor_mailbox_messages", "Actor mailbox messages by stage.", labels=["stage"]),
            {"posted": posted, "run": run, "failed": failed}, ("posted", "run", "failed")),
        _gauge("calculet_executor_mailbox_pending_messages", "Messages waiting for the actor.", pending),
        mem,
    ]


class EngineCollector(Collector):
    """Reads every component's statistics at scrape time and turns them into §16 families."""

    def __init__(self, *, statistics: Callable[[], EngineStatistics], models: Callable[[], list[dict[str, Any]]],
                 config: SchedulerConfig, facts: ServedModelFacts) -> None:
        self._statistics = statistics
        self._models = models
        self._config = config
        self._facts = facts
        self._tenants = tuple(t.name for t in config.tenants)

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        try:
            stats = self._statistics()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the engine is busy or gone
            log.exception("engine statistics unavailable for this scrape")
            stats = None
        families: list[Metric] = []
        if stats is not None:
            for part in (self._engine, self._admission, self._queues, self._batch, self._kv, self._executor,
                         self._fairness, self._recovery):
                families.extend(part(stats))
            families.extend(_goodput(stats, self._tenants or ("default",)))
            families.extend(_on_time(stats))
        families.extend(self._model(stats))
        families.extend(self._invariants())
        families.append(_gauge("calculet_metrics_scrape_duration_seconds",
                               "Time spent reading the engine's statistics for this scrape (s).",
                               time.perf_counter() - started))
        families.append(_gauge("calculet_metrics_engine_up", "1 when the engine's statistics could be read.",
                               1.0 if stats is not None else 0.0))
        return families

    # ------------------------------------------------------------------ engine / requests

    def _engine(self, s: EngineStatistics) -> list[Metric]:
        reg = s.scheduler.registry
        finished = {k.lower(): v for k, v in s.finished.items()}
        rejected = dict(s.rejected_before_admission)
        return [
            _one_hot(_gauge("calculet_engine_state", "The engine's lifecycle (one-hot).", labels=["state"]),
                     s.state, ENGINE_STATES),
            _counter("calculet_engine_ticks", "Actor loop turns.", s.ticks),
            _gauge("calculet_engine_tick_host_avg_seconds", "Average host time per tick (s).", s.host_time_per_tick_s),
            _gauge("calculet_engine_tick_host_max_seconds", "Longest host time of one tick (s).", s.host_time_max_s),
            _counter("calculet_engine_accepted_requests", "Requests accepted (admitted or queued).", s.accepted),
            _by(_counter("calculet_engine_finished_requests", "Requests ended, by finish reason.",
                         labels=["reason"]), finished, FINISH_REASONS),
            _by(_counter("calculet_engine_rejected_requests",
                         "Requests refused before admission (engine stopping, invalid prompt, model unloaded).",
                         labels=["reason"]),
                rejected, ("stopping", "invalid", "unloaded")),
            _gauge("calculet_engine_live_requests", "Requests not yet terminal.", s.live_requests),
            _gauge("calculet_engine_pending_frees", "KV frees the device refused so far (retried).", s.pending_frees),
            _by(_gauge("calculet_request_live_requests", "Live requests by §2 RequestState.", labels=["state"]),
                reg.by_state, [st for st in REQUEST_STATES if st not in ("completed", "cancelled", "failed")]),
            _by(_counter("calculet_request_terminal_requests", "Terminal requests by finish reason (registry).",
                         labels=["reason"]), {k.lower(): v for k, v in reg.terminal_by_reason.items()},
                FINISH_REASONS),
            _counter("calculet_request_stale_callbacks", "Callbacks dropped as stale (§4).", reg.stale_callbacks),
            _by(_counter("calculet_sampler_tokens", "Tokens sampled, by mode.", labels=["mode"]),
                {"greedy": s.sampler.greedy, "stochastic": s.sampler.stochastic, "no_logits": s.sampler.no_logits},
                ("greedy", "stochastic", "no_logits")),
            _by(_counter("calculet_sampler_stops", "Requests stopped by EOS or a stop sequence.", labels=["kind"]),
                {"eos": s.sampler.stops_eos, "sequence": s.sampler.stops_sequence}, ("eos", "sequence")),
        ]

    # ------------------------------------------------------------------ §16 admission

    def _admission(self, s: EngineStatistics) -> list[Metric]:
        a = s.scheduler.admission
        budget = self._config.capacity_budget(self._facts.kv_token_capacity)
        rejected = {"invalid": a.outcomes.get("reject_invalid", 0) + s.rejected_before_admission.get("invalid", 0),
                    "capacity": a.outcomes.get("reject_capacity", 0),
                    "unavailable": a.outcomes.get("reject_unavailable", 0)
                    + s.rejected_before_admission.get("stopping", 0) + s.rejected_before_admission.get("unloaded", 0)}
        waiting_tokens = _gauge("calculet_admission_tenant_waiting_tokens", "Waiting prompt tokens per tenant.",
                                labels=["tenant"])
        active = _gauge("calculet_admission_tenant_active_sequences", "Active sequences per tenant.",
                        labels=["tenant"])
        qps = _counter("calculet_admission_tenant_qps_rejected", "Requests refused by the tenant's QPS limit.",
                       labels=["tenant"])
        for tenant in self._tenants:
            ts = a.tenants.get(tenant)
            waiting_tokens.add_metric([tenant], float(ts.waiting_tokens if ts else 0))
            active.add_metric([tenant], float(ts.active_sequences if ts else 0))
            qps.add_metric([tenant], float(ts.rejected_qps if ts else 0))
        limits: list[Metric] = []
        for limit, (name, doc) in TENANT_LIMITS.items():
            family = _gauge(name, f"{doc} (§5.3, configuration only; absent = only the global budget).",
                            labels=["tenant"])
            for tenant in self._config.tenants:
                value = getattr(tenant, limit)
                if value is not None:
                    family.add_metric([tenant.name], float(value))
            limits.append(family)
        budgets = [_gauge(name, f"{doc} (§5.1 CapacityBudget in force).", float(getattr(budget, field)))
                   for field, (name, doc) in BUDGET.items()]
        return [
            _gauge("calculet_admission_waiting_requests", "Requests waiting for admission.", a.waiting_requests),
            _gauge("calculet_admission_waiting_prompt_tokens", "Prompt tokens waiting for admission.",
                   a.waiting_prompt_tokens),
            _gauge("calculet_admission_active_sequences", "Admitted sequences holding KV budget.", a.active_sequences),
            _gauge("calculet_admission_active_kv_tokens", "KV tokens reserved by admitted requests.",
                   a.active_kv_tokens),
            _by(_gauge("calculet_admission_long_prefills", "Long prefills admitted / waiting (§6 quota).",
                       labels=["state"]), {"admitted": a.long_admitted, "waiting": a.long_waiting},
                ("admitted", "waiting")),
            _by(_counter("calculet_admission_decisions", "§5.2 admission outcomes.", labels=["decision"]),
                a.outcomes, DECISIONS),
            _by(_counter("calculet_admission_rejected_requests", "Rejected requests by reason (400/429/503).",
                         labels=["reason"]), rejected, ("invalid", "capacity", "unavailable")),
            _counter("calculet_admission_timeouts", "Queued requests whose deadline passed before admission.",
                     a.timeouts),
            _counter("calculet_admission_no_prospect", "Requests refused (429) with no prospect of service "
                     "before their deadline (§5.2).", a.no_prospect),
            _by(_counter("calculet_admission_blocked", "Admission attempts blocked, by the limit that blocked.",
                         labels=["limit"]), a.blocked, ADMISSION_LIMITS),
            _gauge("calculet_admission_parked_flows", "Waiting flows parked by a tenant or long-task limit.",
                   a.parked_flows),
            waiting_tokens, active, qps, *limits, *budgets,
        ]

    # ------------------------------------------------------------------ §16 queues

    def _queues(self, s: EngineStatistics) -> list[Metric]:
        p, d = s.scheduler.prefill, s.scheduler.decode
        depth = _gauge("calculet_queue_depth_requests", "Requests waiting in each §6 queue.", labels=["queue"])
        depth.add_metric(["decode"], float(d.ready))
        for q in PREFILL_QUEUES:
            depth.add_metric([q], float(p.depth.get(q, 0)))
        oldest = _gauge("calculet_queue_oldest_wait_seconds", "Age of the oldest entry of each queue (s).",
                        labels=["queue"])
        decode_oldest = getattr(d, "oldest_wait_s", None)
        if decode_oldest is not None:
            oldest.add_metric(["decode"], float(decode_oldest))
        for q in PREFILL_QUEUES:
            oldest.add_metric([q], float(p.oldest_wait_s.get(q, 0.0)))
        return [
            depth, oldest,
            _by(_counter("calculet_queue_service_opportunities", "WRR service opportunities taken per queue (§6).",
                         labels=["queue"]), s.scheduler.wrr_picks, QUEUES),
            _by(_counter("calculet_queue_prefill_taken", "Prefill jobs taken from each class queue.",
                         labels=["queue"]), p.taken, PREFILL_QUEUES),
            _counter("calculet_queue_prefill_chunked_jobs", "Prefill jobs that were one chunk of a prompt.",
                     p.chunked_jobs),
            _counter("calculet_prefill_deadline_first", "Prefills taken ahead of their class by deadline (§7.2, "
                     "on_time order).", p.deadline_first),
        ]

    # ------------------------------------------------------------------ §16 batch

    def _batch(self, s: EngineStatistics) -> list[Metric]:
        d = s.scheduler.decode
        compiled_b = d.last_compiled_batch if d.batches else min(self._facts.profiles, default=1)
        profiles = _gauge("calculet_batch_profile_info",
                          "Compiled batch profiles in use with the spec's tier (B1 C0; B>1 C3).",
                          labels=["compiled_batch", "tier"])
        for b in self._facts.profiles:
            profiles.add_metric([str(b), profile_tier(b).value], 1.0)
        return [
            _gauge("calculet_batch_compiled_size_lanes", "Compiled B of the last decode batch (device batch).",
                   compiled_b),
            profiles,
            _gauge("calculet_batch_active_lanes", "Active (valid) lanes of the last decode batch.",
                   d.last_active_lanes),
            _gauge("calculet_batch_fill_ratio", "Active lanes / compiled lanes over all decode batches.", d.fill_ratio),
            _gauge("calculet_batch_wait_avg_seconds", "Average wait of a decode batch's oldest lane (s).",
                   d.batch_wait_avg_s),
            _gauge("calculet_batch_wait_max_seconds", "Longest decode batch wait (s).", d.batch_wait_max_s),
            _gauge("calculet_decode_step_estimate_seconds", "Measured decode step time, submission to completion "
                   "(smoothed); drives the §7.2 deadline order and the §5.2 prospect check.",
                   s.scheduler.step_times.decode_step_s),
            _gauge("calculet_decode_token_seconds", "Measured wall seconds per token of a decoding sequence "
                   "(0: not measured); the B>1 lane step of the finish estimate.", s.scheduler.step_times.token_s),
            _counter("calculet_batch_lane_waste_lanes", "Compiled lanes that carried no sequence.", d.lane_waste),
            _counter("calculet_batch_batches", "Decode batches dispatched.", d.batches),
            _by(_counter("calculet_batch_lanes", "Decode lanes dispatched, active vs compiled.", labels=["kind"]),
                {"active": d.active_lanes, "compiled": d.compiled_lanes}, ("active", "compiled")),
            _counter("calculet_batch_window_waits", "Ticks that waited for the batching window.", d.window_waits),
            _by(_counter("calculet_batch_skipped_sequences", "Ready sequences skipped at selection (§7.2).",
                         labels=["reason"]), {"expired": d.skipped_expired, "invalid": d.skipped_invalid},
                ("expired", "invalid")),
            _counter("calculet_batch_tenant_cap_hits", "Selections limited by the tenant lane share (§7.2).",
                     d.tenant_cap_hits),
            _counter("calculet_batch_kv_refusals", "Batches refused by the KV reservation.", d.kv_refusals),
        ]

    # ------------------------------------------------------------------ §16 KV

    def _kv(self, s: EngineStatistics) -> list[Metric]:
        kv = s.scheduler.kv
        return [
            _by(_gauge("calculet_kv_sequences", "KV sequences (lanes) by §9.1 state.", labels=["state"]),
                kv.by_state, KV_STATES),
            _gauge("calculet_kv_lanes", "KV lanes in the pool.", kv.lanes),
            _gauge("calculet_kv_free_lanes", "KV lanes free to reserve.", kv.free_lanes),
            _gauge("calculet_kv_used_tokens", "Committed KV tokens.", kv.tokens_used),
            _gauge("calculet_kv_reserved_tokens", "Reserved KV tokens.", kv.tokens_reserved),
            _gauge("calculet_kv_capacity_tokens", "KV tokens the capacity plan reserves.",
                   self._facts.kv_token_capacity),
            _gauge("calculet_kv_unknown_sequences", "KV sequences in Unknown (quarantined, §9.2).", kv.unknown),
            _counter("calculet_kv_lane_wait_refusals", "Reservations refused for want of a free lane.",
                     kv.lane_wait_refusals),
            _gauge("calculet_kv_free_latency_avg_seconds", "Average release → confirmed-free latency (s).",
                   kv.free_latency_avg_s),
            _gauge("calculet_kv_free_latency_max_seconds", "Longest release → confirmed-free latency (s).",
                   kv.free_latency_max_s),
            _counter("calculet_kv_reservations", "KV reservations made.", kv.reservations),
            _counter("calculet_kv_releases", "KV releases started.", kv.releases),
            _counter("calculet_kv_confirmed_releases", "KV releases the runtime confirmed.", kv.confirmed_releases),
            _counter("calculet_kv_refused_double_releases", "Second releases refused.", kv.refused_double_releases),
            _counter("calculet_kv_faults", "KV sequences faulted into Unknown.", kv.faults),
        ]

    # ------------------------------------------------------------------ §16 executor

    def _executor(self, s: EngineStatistics) -> list[Metric]:
        e, jobs, c = s.executor, s.scheduler.jobs, s.completion
        dev = s.device
        if dev is None or getattr(dev, "closed", False):
            status = "closed"
        elif getattr(dev, "poisoned", None) is not None:
            status = "poisoned"
        else:
            status = "ok"
        families: list[Metric] = [
            _gauge("calculet_executor_inflight_jobs", "Device jobs in flight.", e.inflight),
            _by(_gauge("calculet_executor_engine_inflight_jobs", "Jobs in flight per engine (ping/pong, §14).",
                       labels=["engine"]), e.inflight_by_engine, ENGINES),
            _by(_gauge("calculet_executor_inflight_limit_jobs",
                       "In-flight depth configured vs in effect (§14 degrade).",
                       labels=["kind"]), {"configured": e.degrade.configured_inflight,
                                          "effective": e.degrade.effective_inflight}, ("configured", "effective")),
            _gauge("calculet_executor_pingpong_degraded", "1 while ping/pong is degraded to one job (§14).",
                   1.0 if e.degrade.degraded else 0.0),
            _by(_counter("calculet_executor_degrade_triggers", "§14 degrade triggers.", labels=["reason"]),
                e.degrade.triggers, tuple(r.value for r in DegradeReason)),
            _counter("calculet_executor_submitted_jobs", "Jobs the device accepted.", e.submitted),
            _by(_counter("calculet_executor_submit_rc", "CalRT return codes at submit.", labels=["rc"]),
                e.submit_rc, RC_NAMES),
            _by(_counter("calculet_executor_wait_rc", "CalRT return codes of completed jobs (Wait).", labels=["rc"]),
                e.completion_rc, RC_NAMES),
            _counter("calculet_executor_wait_timeouts", "Jobs whose Wait deadline passed.", e.wait_timeouts),
            _counter("calculet_executor_stale_results", "Results for jobs no longer tracked.", e.stale_results),
            _by(_counter("calculet_executor_anomalies", "Result anomalies (§7.4, §14).", labels=["kind"]),
                e.anomalies, tuple(a.value for a in Anomaly)),
            _one_hot(_gauge("calculet_executor_device_status", "Device status (one-hot).", labels=["status"]),
                     status, DEVICE_STATUSES),
            _gauge("calculet_executor_sequences_bound", "Device KV sequences bound to requests.", e.sequences_bound),
            _counter("calculet_executor_free_refusals", "Sequence frees the device refused.", e.free_refusals),
            _by(_gauge("calculet_executor_jobs", "Tracked jobs by §14 job state.", labels=["state"]),
                jobs.by_state, [st for st in JOB_STATES if st not in ("completed", "failed")]),
            _counter("calculet_executor_jobs_planned", "Jobs planned by the scheduler.", jobs.planned),
            _by(_counter("calculet_executor_jobs_ended", "Jobs ended, by the transition that ended them.",
                         labels=["transition"]), jobs.ended, JOB_ENDINGS),
            _by(_counter("calculet_executor_completions", "Results processed by the completion dispatcher.",
                         labels=["result"]), {"ok": c.results - c.failed_results - c.rejected_results,
                                              "failed": c.failed_results, "rejected": c.rejected_results},
                ("ok", "failed", "rejected")),
            _by(_counter("calculet_executor_completion_lanes", "Lanes of processed results.", labels=["result"]),
                {"sampled": c.lanes_sampled, "failed": c.lanes_failed, "unmatched": c.lanes_unmatched},
                ("sampled", "failed", "unmatched")),
        ]
        return families + _mailbox_and_memory(s)

    # ------------------------------------------------------------------ §16 fairness

    def _fairness(self, s: EngineStatistics) -> list[Metric]:
        a = s.scheduler.admission
        service = _counter("calculet_fairness_service_tokens", "WFQ service (tokens) granted per tenant (§5.3).",
                           labels=["tenant"])
        lag = _gauge("calculet_fairness_virtual_lag_tokens",
                     "Tenant virtual time ahead of global virtual time, in weighted tokens (§5.3).",
                     labels=["tenant"])
        weight = _gauge("calculet_fairness_weight", "Configured WFQ weight (control plane only).", labels=["tenant"])
        for tenant in self._config.tenants:
            ts = a.tenants.get(tenant.name)
            service.add_metric([tenant.name], float(ts.service_tokens if ts else 0))
            lag.add_metric([tenant.name], float(ts.virtual_lag if ts else 0.0))
            weight.add_metric([tenant.name], float(tenant.weight))
        return [service, lag, weight]

    # ------------------------------------------------------------------ §16 recovery

    def _recovery(self, s: EngineStatistics) -> list[Metric]:
        r = s.recovery
        return [
            _by(_counter("calculet_recovery_faults", "Device faults by reason.", labels=["reason"]),
                r.faults, FAULT_REASONS),
            _gauge("calculet_recovery_quarantined_jobs", "Timed-out jobs whose buffers stay fenced.",
                   s.executor.quarantined_jobs),
            _gauge("calculet_recovery_quarantined_buffer_pairs", "Buffer pairs held by quarantined jobs.",
                   s.executor.quarantined_jobs),
            _gauge("calculet_recovery_quarantined_kv_sequences", "KV sequences in Unknown, never reused (§9.2).",
                   s.scheduler.kv.unknown),
            _counter("calculet_recovery_resets", "Device resets (ResetConfiguration).", r.resets),
            _counter("calculet_recovery_restarts", "Runtime session restarts.", r.restarts),
            _counter("calculet_recovery_failed_recoveries", "Reset/restart attempts that failed.",
                     r.failed_recoveries),
            _counter("calculet_recovery_budget_refusals", "Recoveries refused by max_resets_per_10min.",
                     r.budget_refusals),
            _gauge("calculet_recovery_resets_in_window", "Resets in the sliding 10-minute window.", r.resets_in_window),
            _gauge("calculet_recovery_reset_budget", "Configured max_resets_per_10min.", r.max_resets_per_10min),
            _gauge("calculet_recovery_time_avg_seconds", "Average recovery time (s).", r.recovery_time_avg_s),
            _gauge("calculet_recovery_time_max_seconds", "Longest recovery time (s).", r.recovery_time_max_s),
            _one_hot(_gauge("calculet_recovery_state", "Health recovery state (one-hot).", labels=["state"]),
                     r.state, RECOVERY_STATES),
        ]

    # ------------------------------------------------------------------ §16 model

    def _model(self, s: EngineStatistics | None) -> list[Metric]:
        """Generation and state per alias from the ModelAdmin's ``status()``; phase durations and
        generations per state from the ModelManager's ``statistics()`` (in the engine's)."""
        generation = _gauge("calculet_model_generation", "Generation id the alias points at (0: none).",
                            labels=["alias"])
        state = _gauge("calculet_model_state", "§10 ModelState of the alias's generation (one-hot): the published "
                       "one, else the newest still on its way in or out, else unloaded.", labels=["alias", "state"])
        durations = _gauge("calculet_model_phase_duration_seconds",
                           "Duration of the last load/configure/warmup/drain/unload of the alias (s); a phase "
                           "appears once measured.", labels=["alias", "phase"])
        counts = _gauge("calculet_model_generations", "Generations the model manager holds, by §10 state "
                        "(ended ones are kept, bounded).", labels=["alias", "state"])
        try:
            entries = self._models()
        except Exception:  # noqa: BLE001
            log.exception("model status unavailable for this scrape")
            entries = []
        by_alias: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            by_alias.setdefault(str(entry["alias"]), []).append(entry)
        for alias, gens in by_alias.items():
            current = next((e for e in gens if e.get("active")), None)
            moving = [e for e in gens if e.get("state") != "unloaded"]
            shown = current or max(moving, key=lambda e: int(e.get("generation", 0)), default=None)
            generation.add_metric([alias], float(current["generation"]) if current else 0.0)
            _one_hot(state, str(shown["state"]) if shown else "unloaded", MODEL_STATES, alias)
        stats = s.models if s is not None else None
        if stats is not None:
            for phase in MODEL_PHASES:
                measured = getattr(stats, phase)
                if measured.count:
                    durations.add_metric([stats.alias, phase], measured.last_s)
            _by(counts, stats.generations_by_state, MODEL_STATES, stats.alias)
        return [generation, state, durations, counts]

    # ------------------------------------------------------------------ invariants

    def _invariants(self) -> list[Metric]:
        mon = MONITOR.statistics()
        violations = _counter("calculet_invariant_violations",
                              "Run-time invariant violations by machine and invariant (declared once, proved by z3).",
                              labels=["machine", "invariant"])
        seen: set[tuple[str, str]] = set()
        for machine in ALL_MACHINES:
            d = machine.definition
            for name in [i.name for i in d.invariants] + [p.name for p in d.step_properties]:
                key = (d.name, name)
                seen.add(key)
                violations.add_metric(list(key), float(mon.violations.get(key, 0)))
        for key, count in mon.violations.items():
            if key not in seen:
                violations.add_metric(list(key), float(count))
        return [violations, _counter("calculet_invariant_checks", "Invariant checks run.", mon.checks)]


__all__ = ["EngineCollector", "ServedModelFacts"]
