"""The device rows of §16 — executor, recovery, model — and the engine's own counters.

Why apart from the scheduling rows (:mod:`calculet.server.metrics_scheduling`): these are what
the device, its recovery and the model manager did, read from ``ExecutorStatistics``,
``RecoveryStatistics``, the ModelManager's statistics and the ModelAdmin's status.

==========  ==================================================================================
executor    ``ExecutorStatistics`` / ``JobStatistics`` / mailbox: in flight (ping/pong),
            submit/Wait return codes, device status, job and queue counters
model       the ModelAdmin's ``status()``: generation and state per alias; the ModelManager's
            ``statistics()``: last load/configure/warmup/drain/unload duration, generations by state
recovery    ``RecoveryStatistics`` + executor/KV: faults by reason, quarantined jobs/buffers/KV,
            resets/restarts, recovery time
invariants  ``calculet_invariant_violations_total{machine,invariant}`` from the run-time monitor
==========  ==================================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client.core import Metric

from calculet.adapters.calrt import Anomaly
from calculet.machines import ALL_MACHINES
from calculet.machines.monitor import MONITOR
from calculet.runtime.engine.types import EngineStatistics
from calculet.runtime.execution.degrade import DegradeReason
from calculet.server.metrics_families import (DEVICE_STATUSES, ENGINE_STATES, ENGINES, FAULT_REASONS, FINISH_REASONS,
                                              JOB_ENDINGS, JOB_STATES, LIVE_REQUEST_STATES, MODEL_PHASES,
                                              MODEL_STATES, RC_NAMES, RECOVERY_STATES, RUNNING_REQUEST_STATES,
                                              WAITING_REQUEST_STATES, by, counter, gauge, one_hot)

log = logging.getLogger("calculet.server.metrics")


def mailbox_and_memory(s: EngineStatistics) -> list[Metric]:
    """The actor mailbox's stages and the device's DRAM accounting (§16 executor row)."""
    mailbox = s.mailbox
    posted = run = failed = pending = 0
    if mailbox is not None:
        posted, run, failed, pending = mailbox.posted, mailbox.run, mailbox.failed, mailbox.pending
    memory = getattr(s.device, "memory", None)
    mem = gauge("calculet_device_memory_bytes", "Device DRAM accounting.", labels=["kind"])
    if memory is not None:
        for kind, attr in (("total", "total_bytes"), ("used", "used_bytes"), ("peak", "peak_used_bytes")):
            mem.add_metric([kind], float(getattr(memory, attr, 0)))
    return [
        by(counter("calculet_executor_mailbox_messages", "Actor mailbox messages by stage.", labels=["stage"]),
            {"posted": posted, "run": run, "failed": failed}, ("posted", "run", "failed")),
        gauge("calculet_executor_mailbox_pending_messages", "Messages waiting for the actor.", pending),
        mem,
    ]


def engine(s: EngineStatistics) -> list[Metric]:
    reg = s.scheduler.registry
    finished = {k.lower(): v for k, v in s.finished.items()}
    rejected = dict(s.rejected_before_admission)
    return [
        one_hot(gauge("calculet_engine_state", "The engine's lifecycle (one-hot).", labels=["state"]),
                 s.state, ENGINE_STATES),
        counter("calculet_engine_ticks", "Actor loop turns.", s.ticks),
        gauge("calculet_engine_tick_host_avg_seconds", "Average host time per tick (s).", s.host_time_per_tick_s),
        gauge("calculet_engine_tick_host_max_seconds", "Longest host time of one tick (s).", s.host_time_max_s),
        counter("calculet_engine_accepted_requests", "Requests accepted (admitted or queued).", s.accepted),
        by(counter("calculet_engine_finished_requests", "Requests ended, by finish reason.",
                     labels=["reason"]), finished, FINISH_REASONS),
        by(counter("calculet_engine_rejected_requests",
                     "Requests refused before admission (engine stopping, invalid prompt, model unloaded).",
                     labels=["reason"]),
            rejected, ("stopping", "invalid", "unloaded")),
        gauge("calculet_engine_live_requests", "Requests not yet terminal.", s.live_requests),
        gauge("calculet_engine_pending_frees", "KV frees the device refused so far (retried).", s.pending_frees),
        by(gauge("calculet_request_live_requests", "Live requests by §2 RequestState.", labels=["state"]),
            reg.by_state, LIVE_REQUEST_STATES),
        gauge("calculet_request_waiting_requests", "Requests accepted with no device work started yet (queued for "
              "admission or prefill; vLLM's num_requests_waiting).",
              sum(reg.by_state.get(st, 0) for st in WAITING_REQUEST_STATES)),
        gauge("calculet_request_running_requests", "Requests in prefill or decode on a KV lane (vLLM's "
              "num_requests_running).", sum(reg.by_state.get(st, 0) for st in RUNNING_REQUEST_STATES)),
        by(counter("calculet_request_terminal_requests", "Terminal requests by finish reason (registry).",
                     labels=["reason"]), {k.lower(): v for k, v in reg.terminal_by_reason.items()},
            FINISH_REASONS),
        counter("calculet_request_stale_callbacks", "Callbacks dropped as stale (§4).", reg.stale_callbacks),
        by(counter("calculet_sampler_tokens", "Tokens sampled, by mode.", labels=["mode"]),
            {"greedy": s.sampler.greedy, "stochastic": s.sampler.stochastic, "no_logits": s.sampler.no_logits},
            ("greedy", "stochastic", "no_logits")),
        by(counter("calculet_sampler_stops", "Requests stopped by EOS or a stop sequence.", labels=["kind"]),
            {"eos": s.sampler.stops_eos, "sequence": s.sampler.stops_sequence}, ("eos", "sequence")),
    ]


def executor(s: EngineStatistics) -> list[Metric]:
    e, jobs, c = s.executor, s.scheduler.jobs, s.completion
    dev = s.device
    if dev is None or getattr(dev, "closed", False):
        status = "closed"
    elif getattr(dev, "poisoned", None) is not None:
        status = "poisoned"
    else:
        status = "ok"
    families: list[Metric] = [
        gauge("calculet_executor_inflight_jobs", "Device jobs in flight.", e.inflight),
        by(gauge("calculet_executor_engine_inflight_jobs", "Jobs in flight per engine (ping/pong, §14).",
                   labels=["engine"]), e.inflight_by_engine, ENGINES),
        by(gauge("calculet_executor_inflight_limit_jobs",
                   "In-flight depth configured vs in effect (§14 degrade).",
                   labels=["kind"]), {"configured": e.degrade.configured_inflight,
                                      "effective": e.degrade.effective_inflight}, ("configured", "effective")),
        gauge("calculet_executor_pingpong_degraded", "1 while ping/pong is degraded to one job (§14).",
               1.0 if e.degrade.degraded else 0.0),
        by(counter("calculet_executor_degrade_triggers", "§14 degrade triggers.", labels=["reason"]),
            e.degrade.triggers, tuple(r.value for r in DegradeReason)),
        counter("calculet_executor_submitted_jobs", "Jobs the device accepted.", e.submitted),
        by(counter("calculet_executor_submit_rc", "CalRT return codes at submit.", labels=["rc"]),
            e.submit_rc, RC_NAMES),
        by(counter("calculet_executor_wait_rc", "CalRT return codes of completed jobs (Wait).", labels=["rc"]),
            e.completion_rc, RC_NAMES),
        counter("calculet_executor_wait_timeouts", "Jobs whose Wait deadline passed.", e.wait_timeouts),
        counter("calculet_executor_stale_results", "Results for jobs no longer tracked.", e.stale_results),
        by(counter("calculet_executor_anomalies", "Result anomalies (§7.4, §14).", labels=["kind"]),
            e.anomalies, tuple(a.value for a in Anomaly)),
        one_hot(gauge("calculet_executor_device_status", "Device status (one-hot).", labels=["status"]),
                 status, DEVICE_STATUSES),
        gauge("calculet_executor_sequences_bound", "Device KV sequences bound to requests.", e.sequences_bound),
        counter("calculet_executor_free_refusals", "Sequence frees the device refused.", e.free_refusals),
        by(gauge("calculet_executor_jobs", "Tracked jobs by §14 job state.", labels=["state"]),
            jobs.by_state, [st for st in JOB_STATES if st not in ("completed", "failed")]),
        counter("calculet_executor_jobs_planned", "Jobs planned by the scheduler.", jobs.planned),
        by(counter("calculet_executor_jobs_ended", "Jobs ended, by the transition that ended them.",
                     labels=["transition"]), jobs.ended, JOB_ENDINGS),
        by(counter("calculet_executor_completions", "Results processed by the completion dispatcher.",
                     labels=["result"]), {"ok": c.results - c.failed_results - c.rejected_results,
                                          "failed": c.failed_results, "rejected": c.rejected_results},
            ("ok", "failed", "rejected")),
        by(counter("calculet_executor_completion_lanes", "Lanes of processed results.", labels=["result"]),
            {"sampled": c.lanes_sampled, "failed": c.lanes_failed, "unmatched": c.lanes_unmatched},
            ("sampled", "failed", "unmatched")),
    ]
    return families + mailbox_and_memory(s)


def recovery(s: EngineStatistics) -> list[Metric]:
    r = s.recovery
    return [
        by(counter("calculet_recovery_faults", "Device faults by reason.", labels=["reason"]),
            r.faults, FAULT_REASONS),
        gauge("calculet_recovery_quarantined_jobs", "Timed-out jobs whose buffers stay fenced.",
               s.executor.quarantined_jobs),
        gauge("calculet_recovery_quarantined_buffer_pairs", "Buffer pairs held by quarantined jobs.",
               s.executor.quarantined_jobs),
        gauge("calculet_recovery_quarantined_kv_sequences", "KV sequences in Unknown, never reused (§9.2).",
               s.scheduler.kv.unknown),
        counter("calculet_recovery_resets", "Device resets (ResetConfiguration).", r.resets),
        counter("calculet_recovery_restarts", "Runtime session restarts.", r.restarts),
        counter("calculet_recovery_failed_recoveries", "Reset/restart attempts that failed.",
                 r.failed_recoveries),
        counter("calculet_recovery_budget_refusals", "Recoveries refused by max_resets_per_10min.",
                 r.budget_refusals),
        gauge("calculet_recovery_resets_in_window", "Resets in the sliding 10-minute window.", r.resets_in_window),
        gauge("calculet_recovery_reset_budget", "Configured max_resets_per_10min.", r.max_resets_per_10min),
        gauge("calculet_recovery_time_avg_seconds", "Average recovery time (s).", r.recovery_time_avg_s),
        gauge("calculet_recovery_time_max_seconds", "Longest recovery time (s).", r.recovery_time_max_s),
        one_hot(gauge("calculet_recovery_state", "Health recovery state (one-hot).", labels=["state"]),
                 r.state, RECOVERY_STATES),
    ]


def model(s: EngineStatistics | None, models: Callable[[], list[dict[str, Any]]]) -> list[Metric]:
    """Generation and state per alias from the ModelAdmin's ``status()``; phase durations and
    generations per state from the ModelManager's ``statistics()`` (in the engine's)."""
    generation = gauge("calculet_model_generation", "Generation id the alias points at (0: none).",
                        labels=["alias"])
    state = gauge("calculet_model_state", "§10 ModelState of the alias's generation (one-hot): the published "
                   "one, else the newest still on its way in or out, else unloaded.", labels=["alias", "state"])
    durations = gauge("calculet_model_phase_duration_seconds",
                       "Duration of the last load/configure/warmup/drain/unload of the alias (s); a phase "
                       "appears once measured.", labels=["alias", "phase"])
    counts = gauge("calculet_model_generations", "Generations the model manager holds, by §10 state "
                    "(ended ones are kept, bounded).", labels=["alias", "state"])
    try:
        entries = models()
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
        one_hot(state, str(shown["state"]) if shown else "unloaded", MODEL_STATES, alias)
    stats = s.models if s is not None else None
    if stats is not None:
        for phase in MODEL_PHASES:
            measured = getattr(stats, phase)
            if measured.count:
                durations.add_metric([stats.alias, phase], measured.last_s)
        by(counts, stats.generations_by_state, MODEL_STATES, stats.alias)
    return [generation, state, durations, counts]


def invariants() -> list[Metric]:
    mon = MONITOR.statistics()
    violations = counter("calculet_invariant_violations",
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
    return [violations, counter("calculet_invariant_checks", "Invariant checks run.", mon.checks)]


__all__ = ["engine", "executor", "invariants", "mailbox_and_memory", "model", "recovery"]
