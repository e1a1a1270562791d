"""GET /metrics (§16): parses, holds every row of §16 (histograms included), passes ``promtool check metrics``,
negotiates OpenMetrics, carries the process collectors, and no label carries a request or job id.

The values of each row after a scripted scenario are checked in ``test_metrics_values.py``.
"""

from __future__ import annotations

import platform
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from calculet.machines import ALL_MACHINES
from calculet.verify import POOLS, SYSTEMS
from tests.service.promtool import run_promtool
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer, families_value

# Family names as the parser reports them (counters without their `_total` suffix).
SECTION_16: dict[str, tuple[str, ...]] = {
    "admission": ("calculet_admission_waiting_requests", "calculet_admission_waiting_prompt_tokens",
                  "calculet_admission_decisions", "calculet_admission_rejected_requests",
                  "calculet_admission_timeouts", "calculet_admission_no_prospect",
                  "calculet_admission_tenant_waiting_tokens",
                  "calculet_admission_tenant_active_sequences", "calculet_admission_tenant_qps_rejected",
                  "calculet_admission_tenant_max_active_sequences", "calculet_admission_tenant_max_waiting_tokens",
                  "calculet_admission_tenant_qps_limit_requests_per_second", "calculet_admission_budget_sequences",
                  "calculet_admission_budget_waiting_requests", "calculet_admission_budget_waiting_prompt_tokens"),
    "queues": ("calculet_queue_depth_requests", "calculet_queue_oldest_wait_seconds",
               "calculet_queue_service_opportunities", "calculet_prefill_deadline_first",
               "calculet_request_waiting_requests", "calculet_request_running_requests"),
    "batch": ("calculet_batch_compiled_size_lanes", "calculet_batch_active_lanes", "calculet_batch_fill_ratio",
              "calculet_batch_wait_avg_seconds", "calculet_batch_wait_max_seconds", "calculet_batch_lane_waste_lanes",
              "calculet_batch_profile_info", "calculet_decode_step_estimate_seconds",
              "calculet_decode_token_seconds", "calculet_decode_slot_token_seconds", "calculet_batch_wait_seconds"),
    "kv": ("calculet_kv_sequences", "calculet_kv_used_tokens", "calculet_kv_reserved_tokens",
           "calculet_kv_lane_wait_refusals", "calculet_kv_unknown_sequences", "calculet_kv_free_latency_avg_seconds",
           "calculet_kv_free_latency_max_seconds", "calculet_kv_free_latency_seconds", "calculet_kv_usage_ratio"),
    "executor": ("calculet_executor_inflight_jobs", "calculet_executor_engine_inflight_jobs",
                 "calculet_executor_submit_rc", "calculet_executor_wait_rc", "calculet_executor_device_status",
                 "calculet_executor_jobs", "calculet_executor_mailbox_messages",
                 "calculet_executor_mailbox_pending_messages", "calculet_engine_tick_host_seconds"),
    "model": ("calculet_model_generation", "calculet_model_state", "calculet_model_phase_duration_seconds"),
    "fairness": ("calculet_fairness_service_tokens", "calculet_fairness_virtual_lag_tokens",
                 "calculet_fairness_starvation_events"),
    "recovery": ("calculet_recovery_faults", "calculet_recovery_quarantined_jobs",
                 "calculet_recovery_quarantined_buffer_pairs", "calculet_recovery_quarantined_kv_sequences",
                 "calculet_recovery_resets", "calculet_recovery_restarts", "calculet_recovery_time_avg_seconds",
                 "calculet_recovery_time_max_seconds", "calculet_recovery_time_seconds"),
    "latency": ("calculet_request_ttft_seconds", "calculet_request_inter_token_latency_seconds",
                "calculet_request_e2e_latency_seconds", "calculet_request_queue_time_seconds",
                "calculet_request_prefill_time_seconds", "calculet_request_decode_time_per_token_seconds",
                "calculet_request_prompt_tokens", "calculet_request_generated_tokens"),
    "process": ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds", "python_info",
                "python_gc_collections"),
    "invariants": ("calculet_invariant_violations",),
}

ALLOWED_LABELS = {"tenant", "queue", "state", "reason", "decision", "limit", "rc", "engine", "kind", "status",
                  "alias", "phase", "machine", "invariant", "compiled_batch", "tier", "route", "method", "stage",
                  "result", "mode", "transition", "le", "percentile",
                  # prometheus-client's platform and GC collectors: fixed by the interpreter, bounded
                  "implementation", "major", "minor", "patchlevel", "version", "generation"}
NAME = re.compile(r"^calculet_[a-z0-9]+(_[a-z0-9]+)+$")
DEFAULT_COLLECTORS = re.compile(r"^(process|python)_[a-z0-9_]+$")
"""prometheus-client's process and platform collectors keep their standard names (every dashboard reads them)."""


def _traffic(server: RunningServer, n: int) -> list[str]:
    """``n`` completions; returns every id the responses carried (HTTP, response, engine)."""
    ids = []
    client = server.client("alpha")
    for i in range(n):
        raw = client.completions.with_raw_response.create(model=ALIAS, prompt=f"metrics {i}", max_tokens=3)
        ids.append(raw.headers["x-request-id"])
        ids.append(raw.parse().id)
    return ids


def _violations(text: str) -> dict[tuple[str, str], float]:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "calculet_invariant_violations")
    return {(s.labels["machine"], s.labels.get("invariant", "")): s.value for s in family.samples
            if s.name.endswith("_total")}


@pytest.mark.req("R16.1", "R16.2", "R16.3", "R16.4", "R16.5", "R16.6", "R16.7", "R16.8")
def test_every_section_16_row_is_exported_and_parses(server: RunningServer) -> None:
    before = _violations(server.metrics_text())
    _traffic(server, 3)
    text = server.metrics_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    missing = {row: [n for n in names if n not in families] for row, names in SECTION_16.items()}
    assert not any(missing.values()), missing
    for name in families:
        assert NAME.match(name) or DEFAULT_COLLECTORS.match(name), \
            f"{name} does not follow calculet_<component>_<what>_<unit>"
    queues = {s.labels["queue"] for s in families["calculet_queue_depth_requests"].samples}
    assert queues == {"decode", "short", "medium", "long"}
    rcs = {s.labels["rc"] for s in families["calculet_executor_submit_rc"].samples}
    assert {"OK", "DEVICE_BUSY", "TIMEOUT", "CCU_FAULT", "DMA_UNKNOWN"} <= rcs
    states = {s.labels["state"] for s in families["calculet_kv_sequences"].samples}
    assert states == {"free", "reserved", "active", "updating", "unknown", "releasing"}
    model_states = {s.labels["state"]: s.value for s in families["calculet_model_state"].samples}
    assert model_states["ready"] == 1 and sum(model_states.values()) == 1 and len(model_states) == 9
    assert families_value(families_of(text), "calculet_model_phase_duration_seconds", alias=ALIAS, phase="load") > 0
    violations = families["calculet_invariant_violations"].samples
    monitored = {s.labels["machine"] for s in violations}  # the joint system's once an engine has ticked (#17)
    assert {"RequestMachine", "KvSequenceMachine", "ModelMachine", "DeviceJobMachine"} <= monitored
    declared = {m.definition.name for m in (*ALL_MACHINES, *SYSTEMS, *POOLS)}  # only what is declared and proved
    assert monitored <= declared, monitored - declared
    # the monitor's counts are per process: tests that break invariants on purpose reset them when they end
    # (tests/conftest.py), so none is inherited, and the traffic here must add none
    assert not any(before.values()), before
    grown = {k: v for k, v in _violations(text).items() if v != before.get(k, 0.0)}
    assert not grown, grown
    tenants = {s.labels["tenant"] for s in families["calculet_fairness_service_tokens"].samples}
    assert tenants == set(TENANT_KEYS)
    parsed = families_of(text)
    assert families_value(parsed, "calculet_admission_tenant_max_waiting_tokens", tenant="alpha") == 4096
    assert families_value(parsed, "calculet_admission_tenant_max_active_sequences", tenant="beta") == 8
    assert families_value(parsed, "calculet_admission_tenant_qps_limit_requests_per_second", tenant="gamma") == 1000
    assert families_value(parsed, "calculet_fairness_weight", tenant="beta") == 2.0
    assert families_value(parsed, "calculet_admission_budget_waiting_requests") == 128
    ttft = [s for s in families["calculet_request_ttft_seconds"].samples
            if s.name.endswith("_count") and s.labels["tenant"] == "alpha"]
    assert ttft[0].value >= 3


@pytest.mark.req("R1.1")
def test_batch_metrics_report_device_batch_one(server: RunningServer) -> None:
    families = server.metrics()
    assert families_value(families, "calculet_batch_compiled_size_lanes") == 1
    profiles = [(s.labels["compiled_batch"], s.labels["tier"]) for s in families["calculet_batch_profile_info"]]
    assert profiles == [("1", "C0")]


@pytest.mark.req("R16.9", "R16.10")
def test_labels_are_bounded_and_never_carry_request_ids(server: RunningServer) -> None:
    _traffic(server, 2)  # every route/status pair used below exists from here on
    server.metrics_text()  # and /metrics' own: a scrape is counted once answered, so only the next one shows it
    first = server.metrics_text()
    ids = _traffic(server, 12)
    second = server.metrics_text()

    def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {(s.name, tuple(sorted(s.labels.items()))) for f in text_string_to_metric_families(text)
                for s in f.samples}

    assert series(first) == series(second), "the set of series grew with the number of requests"
    for family in text_string_to_metric_families(second):
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (sample.name, sample.labels)
            for value in sample.labels.values():
                assert value not in ids and not value.startswith(("cmpl-", "chatcmpl-"))
                assert not re.fullmatch(r"[0-9a-f]{32}", value), f"an id-like label value on {sample.name}"


def families_of(text: str) -> dict[str, list]:  # type: ignore[type-arg]
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def test_goodput_and_wasted_work_are_exported_per_tenant_and_reason(server: RunningServer) -> None:
    """Issue #13: on-time completions per configured tenant, device work by phase, waste by (phase, reason)."""
    before = families_of(server.metrics_text())
    _traffic(server, 3)
    after = families_of(server.metrics_text())
    gained = (families_value(after, "calculet_request_goodput", tenant="alpha")
              - families_value(before, "calculet_request_goodput", tenant="alpha"))
    assert gained == 3  # a 3-token completion is far inside the default deadline
    assert {s.labels["tenant"] for s in after["calculet_request_goodput"]} == set(TENANT_KEYS)
    wasted = {(s.labels["phase"], s.labels["reason"]) for s in after["calculet_request_wasted_tokens"]}
    assert wasted == {(p, r) for p in ("prefill", "decode") for r in ("deadline", "error")}
    assert families_value(after, "calculet_device_computed_tokens", phase="prefill") > \
        families_value(before, "calculet_device_computed_tokens", phase="prefill")
    assert families_value(after, "calculet_device_computed_tokens", phase="decode") >= 6  # 2 decode steps each
    assert families_value(after, "calculet_device_busy_seconds") >= 0
    assert {s.labels["reason"] for s in after["calculet_request_wasted_device_seconds"]} == {"deadline", "error"}


def test_on_time_decisions_are_exported_with_bounded_labels(server: RunningServer) -> None:
    """Issue #13: what the default ``on_time`` order refused, shed and replanned is on /metrics."""
    _traffic(server, 2)
    after = families_of(server.metrics_text())
    assert {s.labels["reason"] for s in after["calculet_scheduler_on_time_refused"]} == {"cannot_finish",
                                                                                        "ttft_target"}
    assert {s.labels["stage"] for s in after["calculet_scheduler_on_time_shed"]} == {"waiting", "admitted"}
    assert families_value(after, "calculet_scheduler_on_time_replans") >= 1  # every admission replans
    assert families_value(after, "calculet_scheduler_decode_cap_streams") == 0  # no ITL target configured
    rollouts = {x.labels["result"]: x.value for x in after["calculet_scheduler_finish_rollouts"]}
    assert rollouts == {"rolled": 0, "skipped": 0}  # the service's B1: the plan's estimate reported, no rollout
    assert families_value(after, "calculet_scheduler_at_risk_sequences") >= 0


@pytest.mark.req("R16.9")
def test_a_scrape_after_load_passes_promtool_check_metrics_without_warning(server: RunningServer) -> None:
    """Issue #19: Prometheus' own linter finds nothing to say (names, units, _total, HELP) after traffic."""
    _traffic(server, 6)
    checked = run_promtool("check", "metrics", stdin=server.metrics_text())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (checked.stdout + checked.stderr).strip() == "", checked.stdout + checked.stderr


def test_openmetrics_is_negotiated_on_the_accept_header(server: RunningServer) -> None:
    """Issue #19: a scraper asking for OpenMetrics gets it (# EOF, parseable); anyone else gets text 0.0.4."""
    with server.http() as http:
        plain = http.get("/metrics")
        om = http.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"})
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(om.text)}
    assert "calculet_batch_wait_seconds" in families and families["calculet_batch_wait_seconds"].type == "histogram"
    assert families["calculet_admission_decisions"].type == "counter"
    assert "process_cpu_seconds" in families


def test_process_and_platform_collectors_report_this_process(server: RunningServer) -> None:
    """Issue #19: process_* and python_* from prometheus-client's default collectors, in the app's registry."""
    parsed = server.metrics()
    assert families_value(parsed, "process_resident_memory_bytes") > 1_000_000
    assert families_value(parsed, "process_open_fds") >= 3
    info = parsed["python_info"][0].labels
    assert info["version"] == platform.python_version()
    assert families_value(parsed, "process_start_time_seconds") > 0


def test_every_calculet_series_in_the_readme_vllm_table_is_exported(server: RunningServer) -> None:
    """Issue #19: the README's vLLM → calculet table names only series a running calculet exports."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("**From vLLM's metric names.**", 1)[1].split("\n###", 1)[0]
    named = {m.split("{")[0] for m in re.findall(r"`(calculet_[a-z0-9_]+(?:\{[^`]*\})?)`", table)}
    assert len(named) >= 12, named
    _traffic(server, 1)
    families = list(text_string_to_metric_families(server.metrics_text()))
    exported = {s.name for f in families for s in f.samples} | {f.name for f in families if f.type == "histogram"}
    assert named <= exported, sorted(named - exported)
