"""The scheduling rows of §16 — admission, queues, batch, KV, fairness — read from ``SchedulerStatistics``.

Why apart from the device rows (:mod:`calculet.server.metrics_device`): these are what the
scheduler decided (who waits, who is admitted, how full a batch is, who holds KV), the other
module what the device and its recovery did; each reads one part of ``EngineStatistics``.

==========  ==================================================================================
admission   ``AdmissionStatistics``: waiting requests/tokens, decisions (admit/queue/reject by
            reason), timeouts, blocked-by-limit, tenant quota use next to the configured limits
queues      ``PrefillStatistics`` / ``DecodeStatistics``: depth and oldest wait per queue
            (decode included), WRR service opportunities
batch       ``DecodeStatistics``: compiled B, active lanes, fill ratio, batch wait, lane waste
KV          ``KvLaneStatistics``: sequences by state, tokens used/reserved, usage ratio, lane wait,
            Unknown, free latency
fairness    ``TenantStatistics``: service tokens, virtual lag (starvation events are counted by
            the service, :class:`~calculet.server.request_metrics.StarvationWatch`)
==========  ==================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import Metric

from calculet.adapters.calrt import profile_tier
from calculet.config import SchedulerConfig
from calculet.runtime.engine.types import EngineStatistics
from calculet.server.metrics_families import (ADMISSION_LIMITS, DECISIONS, KV_STATES, PREFILL_QUEUES, QUEUES, by,
                                              counter, gauge)

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


@dataclass(frozen=True)
class ServedModelFacts:
    """What the collector needs of the served package, read once at bring-up (not the runtime's
    :class:`~calculet.runtime.execution.model_facts.ModelFacts`, what a calbin states about itself)."""

    profiles: tuple[int, ...]
    kv_token_capacity: int


def admission(s: EngineStatistics, config: SchedulerConfig, facts: ServedModelFacts) -> list[Metric]:
    a = s.scheduler.admission
    budget = config.capacity_budget(facts.kv_token_capacity)
    tenants = tuple(t.name for t in config.tenants)
    rejected = {"invalid": a.outcomes.get("reject_invalid", 0) + s.rejected_before_admission.get("invalid", 0),
                "capacity": a.outcomes.get("reject_capacity", 0),
                "unavailable": a.outcomes.get("reject_unavailable", 0)
                + s.rejected_before_admission.get("stopping", 0) + s.rejected_before_admission.get("unloaded", 0)}
    waiting_tokens = gauge("calculet_admission_tenant_waiting_tokens", "Waiting prompt tokens per tenant.",
                            labels=["tenant"])
    active = gauge("calculet_admission_tenant_active_sequences", "Active sequences per tenant.",
                    labels=["tenant"])
    qps = counter("calculet_admission_tenant_qps_rejected", "Requests refused by the tenant's QPS limit.",
                   labels=["tenant"])
    for tenant in tenants:
        ts = a.tenants.get(tenant)
        waiting_tokens.add_metric([tenant], float(ts.waiting_tokens if ts else 0))
        active.add_metric([tenant], float(ts.active_sequences if ts else 0))
        qps.add_metric([tenant], float(ts.rejected_qps if ts else 0))
    limits: list[Metric] = []
    for limit, (name, doc) in TENANT_LIMITS.items():
        family = gauge(name, f"{doc} (§5.3, configuration only; absent = only the global budget).",
                        labels=["tenant"])
        for tenant in config.tenants:
            value = getattr(tenant, limit)
            if value is not None:
                family.add_metric([tenant.name], float(value))
        limits.append(family)
    budgets = [gauge(name, f"{doc} (§5.1 CapacityBudget in force).", float(getattr(budget, field)))
               for field, (name, doc) in BUDGET.items()]
    return [
        gauge("calculet_admission_waiting_requests", "Requests waiting for admission.", a.waiting_requests),
        gauge("calculet_admission_waiting_prompt_tokens", "Prompt tokens waiting for admission.",
               a.waiting_prompt_tokens),
        gauge("calculet_admission_active_sequences", "Admitted sequences holding KV budget.", a.active_sequences),
        gauge("calculet_admission_active_kv_tokens", "KV tokens reserved by admitted requests.",
               a.active_kv_tokens),
        by(gauge("calculet_admission_long_prefills", "Long prefills admitted / waiting (§6 quota).",
                   labels=["state"]), {"admitted": a.long_admitted, "waiting": a.long_waiting},
            ("admitted", "waiting")),
        by(counter("calculet_admission_decisions", "§5.2 admission outcomes.", labels=["decision"]),
            a.outcomes, DECISIONS),
        by(counter("calculet_admission_rejected_requests", "Rejected requests by reason (400/429/503).",
                     labels=["reason"]), rejected, ("invalid", "capacity", "unavailable")),
        counter("calculet_admission_timeouts", "Queued requests whose deadline passed before admission.",
                 a.timeouts),
        counter("calculet_admission_no_prospect", "Requests refused (429) with no prospect of service "
                 "before their deadline (§5.2).", a.no_prospect),
        by(counter("calculet_admission_blocked", "Admission attempts blocked, by the limit that blocked.",
                     labels=["limit"]), a.blocked, ADMISSION_LIMITS),
        gauge("calculet_admission_default_deadline_seconds", "admission.deadline_default_ms: the deadline of a "
              "request that names none (the queue-wait alert compares the oldest wait with it).",
              config.admission.deadline_default_ms / 1000),
        gauge("calculet_admission_parked_flows", "Waiting flows parked by a tenant or long-task limit.",
               a.parked_flows),
        waiting_tokens, active, qps, *limits, *budgets,
    ]


def queues(s: EngineStatistics) -> list[Metric]:
    p, d = s.scheduler.prefill, s.scheduler.decode
    depth = gauge("calculet_queue_depth_requests", "Requests waiting in each §6 queue.", labels=["queue"])
    depth.add_metric(["decode"], float(d.ready))
    for q in PREFILL_QUEUES:
        depth.add_metric([q], float(p.depth.get(q, 0)))
    oldest = gauge("calculet_queue_oldest_wait_seconds", "Age of the oldest entry of each queue (s).",
                    labels=["queue"])
    oldest.add_metric(["decode"], float(d.oldest_wait_s))
    for q in PREFILL_QUEUES:
        oldest.add_metric([q], float(p.oldest_wait_s.get(q, 0.0)))
    return [
        depth, oldest,
        by(counter("calculet_queue_service_opportunities", "WRR service opportunities taken per queue (§6).",
                     labels=["queue"]), s.scheduler.wrr_picks, QUEUES),
        by(counter("calculet_queue_prefill_taken", "Prefill jobs taken from each class queue.",
                     labels=["queue"]), p.taken, PREFILL_QUEUES),
        counter("calculet_queue_prefill_chunked_jobs", "Prefill jobs that were one chunk of a prompt.",
                 p.chunked_jobs),
        counter("calculet_prefill_deadline_first", "Prefills taken ahead of their class by deadline (§7.2, "
                 "on_time order).", p.deadline_first),
    ]


def batch(s: EngineStatistics, facts: ServedModelFacts) -> list[Metric]:
    d = s.scheduler.decode
    compiled_b = d.last_compiled_batch if d.batches else min(facts.profiles, default=1)
    profiles = gauge("calculet_batch_profile_info",
                      "Compiled batch profiles in use with the spec's tier (B1 C0; B>1 C3).",
                      labels=["compiled_batch", "tier"])
    for b in facts.profiles:
        profiles.add_metric([str(b), profile_tier(b).value], 1.0)
    return [
        gauge("calculet_batch_compiled_size_lanes", "Compiled B of the last decode batch (device batch).",
               compiled_b),
        profiles,
        gauge("calculet_batch_active_lanes", "Active (valid) lanes of the last decode batch.",
               d.last_active_lanes),
        gauge("calculet_batch_fill_ratio", "Active lanes / compiled lanes over all decode batches.", d.fill_ratio),
        gauge("calculet_batch_wait_avg_seconds", "Average wait of a decode batch's oldest lane (s).",
               d.batch_wait_avg_s),
        gauge("calculet_batch_wait_max_seconds", "Longest decode batch wait (s).", d.batch_wait_max_s),
        gauge("calculet_decode_step_estimate_seconds", "Measured decode step time, submission to completion "
               "(smoothed); drives the §7.2 deadline order and the §5.2 prospect check.",
               s.scheduler.step_times.decode_step_s),
        gauge("calculet_decode_token_seconds", "Measured wall seconds per token of a decoding sequence "
               "(0: not measured); the B>1 lane step of the finish estimate.", s.scheduler.step_times.token_s),
        gauge("calculet_decode_slot_token_seconds", "Measured wall seconds a KV slot is held per token it yields "
               "(0: not measured); on B>1 the lane step of a job that takes a freed lane in admission's plan "
               "(issue #13).", s.scheduler.step_times.slot_token_s),
        counter("calculet_batch_lane_waste_lanes", "Compiled lanes that carried no sequence.", d.lane_waste),
        counter("calculet_batch_batches", "Decode batches dispatched.", d.batches),
        by(counter("calculet_batch_lanes", "Decode lanes dispatched, active vs compiled.", labels=["kind"]),
            {"active": d.active_lanes, "compiled": d.compiled_lanes}, ("active", "compiled")),
        counter("calculet_batch_window_waits", "Ticks that waited for the batching window.", d.window_waits),
        by(counter("calculet_batch_skipped_sequences", "Ready sequences skipped at selection (§7.2).",
                     labels=["reason"]), {"expired": d.skipped_expired, "invalid": d.skipped_invalid},
            ("expired", "invalid")),
        counter("calculet_batch_tenant_cap_hits", "Selections limited by the tenant lane share (§7.2).",
                 d.tenant_cap_hits),
        counter("calculet_batch_kv_refusals", "Batches refused by the KV reservation.", d.kv_refusals),
    ]


def kv(s: EngineStatistics, facts: ServedModelFacts) -> list[Metric]:
    kv = s.scheduler.kv
    capacity = facts.kv_token_capacity
    return [
        by(gauge("calculet_kv_sequences", "KV sequences (lanes) by §9.1 state.", labels=["state"]),
            kv.by_state, KV_STATES),
        gauge("calculet_kv_lanes", "KV lanes in the pool.", kv.lanes),
        gauge("calculet_kv_free_lanes", "KV lanes free to reserve.", kv.free_lanes),
        gauge("calculet_kv_used_tokens", "Committed KV tokens.", kv.tokens_used),
        gauge("calculet_kv_reserved_tokens", "Reserved KV tokens.", kv.tokens_reserved),
        gauge("calculet_kv_capacity_tokens", "KV tokens the capacity plan reserves.",
              facts.kv_token_capacity),
        gauge("calculet_kv_usage_ratio", "Reserved KV tokens / the capacity plan's KV tokens (0-1; vLLM's "
              "kv_cache_usage_perc).", kv.tokens_reserved / capacity if capacity else 0.0),
        gauge("calculet_kv_unknown_sequences", "KV sequences in Unknown (quarantined, §9.2).", kv.unknown),
        counter("calculet_kv_lane_wait_refusals", "KV reservations the pool refused for want of a free lane "
                "(0 while admission holds a request until a lane is free: those lane waits are "
                "calculet_admission_blocked_total{limit=\"kv_lane\"}).", kv.lane_wait_refusals),
        gauge("calculet_kv_free_latency_avg_seconds", "Average release → confirmed-free latency (s).",
               kv.free_latency_avg_s),
        gauge("calculet_kv_free_latency_max_seconds", "Longest release → confirmed-free latency (s).",
               kv.free_latency_max_s),
        counter("calculet_kv_reservations", "KV reservations made.", kv.reservations),
        counter("calculet_kv_releases", "KV releases started.", kv.releases),
        counter("calculet_kv_confirmed_releases", "KV releases the runtime confirmed.", kv.confirmed_releases),
        counter("calculet_kv_refused_double_releases", "Second releases refused.", kv.refused_double_releases),
        counter("calculet_kv_faults", "KV sequences faulted into Unknown.", kv.faults),
    ]


def fairness(s: EngineStatistics, config: SchedulerConfig) -> list[Metric]:
    a = s.scheduler.admission
    service = counter("calculet_fairness_service_tokens", "WFQ service (tokens) granted per tenant (§5.3).",
                       labels=["tenant"])
    lag = gauge("calculet_fairness_virtual_lag_tokens",
                 "Tenant virtual time ahead of global virtual time, in weighted tokens (§5.3).",
                 labels=["tenant"])
    weight = gauge("calculet_fairness_weight", "Configured WFQ weight (control plane only).", labels=["tenant"])
    for tenant in config.tenants:
        ts = a.tenants.get(tenant.name)
        service.add_metric([tenant.name], float(ts.service_tokens if ts else 0))
        lag.add_metric([tenant.name], float(ts.virtual_lag if ts else 0.0))
        weight.add_metric([tenant.name], float(tenant.weight))
    return [service, lag, weight]


__all__ = ["BUDGET", "TENANT_LIMITS", "ServedModelFacts", "admission", "batch", "fairness", "kv", "queues"]
