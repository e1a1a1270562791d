"""The runner: a workload through the real engine in virtual time, observed by composition.

Checked: records line up with the offered requests and with what the engine says it did (its
own decode statistics against the batch log of the recording device); every outcome kind is
recorded with the right fields (completion, client cancel, deadline, rejection with a bounded
reason); the policy catalogue builds valid configurations; the soak's checkers flag what they
exist to flag. Monitors raise throughout (tests/conftest.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from calculet.adapters.calrt import DecodeJob
from calculet.adapters.sim import CostModel, InjectedFault
from calculet.adapters.sim.model import pseudo_continuation
from calculet.errors import DefinitionError
from calculet.loadsim.analysis import summarize
from calculet.loadsim.policies import POLICIES, PolicyError, parse_policies, run_policy
from calculet.loadsim.engine_inputs import loadsim_package_dir, prompt_for
from calculet.loadsim.runner import BatchLog, run_engine
from calculet.loadsim.tracking import rejection_reason
from calculet.loadsim.workload import SimRequest, generate_requests, parse_workload
from calculet.machines.job import JobEngine
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome

COST = CostModel.reference()


def workload(**overrides: object):  # noqa: ANN201 - a Workload
    data = {
        "schema": "calculet-loadsim/v1", "name": "unit", "seed": 7, "duration_s": 20,
        "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
        "prompt_tokens": {"kind": "empirical", "values": [24, 300, 900]},
        "max_new_tokens": {"kind": "lognormal", "median": 10, "sigma": 0.4, "min": 2, "max": 24},
        "tenants": [{"name": "a", "weight": 2}, {"name": "b"}],
    }
    data.update(overrides)
    return parse_workload(data)


def req(arrival: float, prompt: int = 40, out: int = 6, *, tenant: str = "a", deadline_ms: int | None = None,
        cancel_after_s: float | None = None) -> SimRequest:
    return SimRequest(arrival, tenant, prompt, out, deadline_ms, cancel_after_s, "short")


def test_prompts_are_deterministic_bytes_of_the_asked_length() -> None:
    p = prompt_for(3, 40000)
    assert len(p) == 40000 and all(0 <= t < 256 for t in p[:1000])
    assert prompt_for(3, 50) == p[:50] and prompt_for(4, 50) != p[:50]
    with pytest.raises(DefinitionError):
        prompt_for(0, 0)


def test_rejection_reasons_are_bounded_labels() -> None:
    def outcome(status: int, detail: str) -> RequestOutcome:
        return RequestOutcome(0, "failed", FinishReason.REJECTED, 0, status, detail)

    assert rejection_reason(outcome(429, "tenant noisy is over its QPS limit")) == "reject_capacity:tenant_qps"
    assert rejection_reason(outcome(429, "128 requests already waiting (max 128)")) == "reject_capacity:queue_full"
    assert rejection_reason(outcome(429, "tenant x waiting tokens would exceed 9")) == \
        "reject_capacity:tenant_waiting_tokens"
    assert rejection_reason(outcome(400, "unknown tenant 'z'")) == "reject_invalid:unknown_tenant"
    assert rejection_reason(outcome(503, "the engine is stopping")) == "reject_unavailable:unavailable"
    assert rejection_reason(outcome(429, "something new")) == "reject_capacity"


def test_engine_run_records_match_the_requests_and_the_engine_statistics() -> None:
    w = workload()
    requests = generate_requests(w)
    spec = POLICIES["calculet-b16"]
    run = run_engine(requests, spec.scheduler_config(w), cost=COST, options=spec.engine_options())
    assert [r.request_id for r in run.requests] == list(range(len(requests)))
    assert run.duplicate_closes == 0 and run.late_tokens == 0
    for rec, r in zip(run.requests, requests):
        assert (rec.tenant, rec.prompt_tokens, rec.arrival_s) == (r.tenant, r.prompt_tokens, r.arrival_s)
        assert rec.finish_reason == "length" and rec.generated_tokens == r.max_new_tokens
        assert rec.service_start_s is not None and rec.arrival_s <= rec.service_start_s < rec.first_token_s
        assert rec.finish_s == rec.token_times_s[-1]
    decode = run.statistics.scheduler.decode
    assert len(run.batches) == decode.batches > 0
    assert sum(b.active_lanes for b in run.batches) == decode.active_lanes
    assert sum(b.compiled_batch for b in run.batches) == decode.compiled_lanes
    assert {b.compiled_batch for b in run.batches} <= {1, 4, 8, 16}
    assert all(b.wait_s >= 0 for b in run.batches) and max(b.wait_s for b in run.batches) > 0
    # every token after the first comes from a decode lane
    assert sum(r.generated_tokens - 1 for r in run.requests) == decode.active_lanes
    assert run.prefill_jobs == len(requests)
    assert run.prefill_work_s == pytest.approx(sum(COST.prefill_s(r.prompt_tokens) for r in requests))
    assert run.end_s >= requests[-1].arrival_s  # (speedup = virtual / wall time is a figure, never asserted: #14)
    s = summarize(run.requests, run.batches, weights=w.weights())
    assert s.completed == len(requests) and s.fill_ratio is not None and 0 < s.fill_ratio <= 1


def test_cancel_deadline_and_rejection_outcomes_are_recorded() -> None:
    w = workload()
    requests = [req(0.0, out=200),                                   # completes
                req(0.1, out=400, cancel_after_s=2.0),               # the client cancels while decoding
                req(0.2, out=400, deadline_ms=3000),                 # cannot finish: shed by its deadline
                req(0.3, tenant="nobody"),                           # unknown tenant: rejected at once
                req(0.4, prompt=40000, out=2000)]                    # beyond the 40960 context: rejected
    spec = POLICIES["calculet-b4"]
    run = run_engine(requests, spec.scheduler_config(w), cost=COST, options=spec.engine_options(),
                     keep_tokens=True)
    done, cancelled, expired, unknown, too_long = run.requests
    assert done.finish_reason == "length" and done.generated_tokens == 200
    assert cancelled.finish_reason == "cancelled" and 0 < cancelled.generated_tokens < 400
    assert cancelled.finish_s == pytest.approx(2.1, abs=0.2)
    # the shipped deadline order (on_time, #13) refuses it at admission (429, no prospect) or sheds it
    # before device time is spent on it; at_risk and strict end it at its deadline after decoding part of it
    assert expired.finish_reason in ("rejected", "deadline") and expired.generated_tokens == 0
    assert expired.rejection_reason in (None, "reject_capacity:no_prospect")
    for rec, reason in ((unknown, "reject_invalid:unknown_tenant"), (too_long, "reject_invalid:too_long")):
        assert not rec.admitted and rec.rejection_reason == reason and rec.generated_tokens == 0
    summary = summarize(run.requests, run.batches)
    assert {k: v for k, v in summary.rejections_by_reason.items() if "no_prospect" not in k} == \
        {"reject_invalid:too_long": 1, "reject_invalid:unknown_tenant": 1}
    # delivered tokens are the simulator's pseudo-token chain of each prompt
    prompt = prompt_for(0, 40)
    assert list(run.token_ids[0]) == pseudo_continuation(prompt, 200)


def test_faults_end_every_request_exactly_once() -> None:
    w = workload(duration_s=30)
    requests = generate_requests(w, load_scale=2.0)
    spec = POLICIES["calculet-b16-pingpong"]
    config = spec.scheduler_config(w, recovery={"max_resets_per_10min": 1000})
    run = run_engine(requests, config, cost=COST, options=spec.engine_options(), fault_seed=5,
                     fault_rates={kind: 0.02 for kind in (InjectedFault.TIMEOUT, InjectedFault.CCU_FAULT,
                                                         InjectedFault.DEVICE_BUSY, InjectedFault.LANE_CROSSTALK)})
    assert run.duplicate_closes == 0 and run.late_tokens == 0
    reasons = Counter(r.finish_reason for r in run.requests)
    assert reasons["error"] > 0 and reasons["length"] > 0 and sum(reasons.values()) == len(requests)
    assert run.statistics.recovery.resets + run.statistics.recovery.restarts > 0


def test_requests_must_be_sorted() -> None:
    w = workload()
    with pytest.raises(DefinitionError, match="sorted"):
        run_engine([req(1.0), req(0.5)], POLICIES["calculet-b1"].scheduler_config(w), cost=COST)


def test_batch_log_records_decode_jobs_only() -> None:
    log = BatchLog(cost=COST)

    class Ticket:
        submitted_at = 1.5

    class Prefill:
        tokens = np.zeros(100)

    no_buffers: Any = None  # the log reads the batch's size and its active lanes only
    job = DecodeJob(generation=1, calbin_id=1, compiled_batch=4, engine=JobEngine.PING, buffers=no_buffers,
                    seq_ids=(1, 2, 0, 0), token_ids=np.array([5, 6, 7, 7], dtype=np.int32),
                    positions=np.array([3, 4, 0, 0], dtype=np.int32),
                    lane_valid=np.array([1, 1, 0, 0], dtype=np.uint8))
    log.submitted(job, Ticket())  # type: ignore[arg-type]
    log.submitted(Prefill(), Ticket())  # type: ignore[arg-type]
    (batch,) = log.records()
    assert (batch.start_s, batch.compiled_batch, batch.active_lanes) == (1.5, 4, 2)
    assert log.prefills == 1 and log.prefill_work_s == pytest.approx(COST.prefill_s(100))


def test_policy_catalogue() -> None:
    assert [p.name for p in parse_policies("calculet-b16, b1-serial-fcfs")] == ["calculet-b16", "b1-serial-fcfs"]
    assert len(parse_policies("all")) == len(POLICIES)
    for bad, match in (("nope", "unknown policy 'nope'"), ("", "no policy"),
                       ("calculet-b1,calculet-b1", "listed twice")):
        with pytest.raises(PolicyError, match=match):
            parse_policies(bad)
    w = workload()
    config = POLICIES["calculet-b16-pingpong"].scheduler_config(w)
    assert config.admission.max_sequences == 32 and config.executor.max_inflight == 2
    assert config.batch.profiles == (1, 4, 8, 16) and dict(config.batch.select_thresholds) == {16: 12, 8: 6, 4: 3}
    assert {t.name: t.weight for t in config.tenants} == {"a": 2.0, "b": 1.0}
    assert POLICIES["calculet-b1"].scheduler_config(w).admission.max_sequences == 1
    assert POLICIES["calculet-b16-pingpong"].engine_options().degrade_min_samples > 10 ** 9
    assert POLICIES["calculet-b16"].engine_options().degrade_min_samples == 64
    with pytest.raises(PolicyError):
        POLICIES["b1-serial-fcfs"].scheduler_config(w)


@pytest.mark.parametrize("name", ["b1-serial-fcfs", "multi-slot-rr", "calculet-b8"])
def test_run_policy_accounts_device_work(name: str) -> None:
    w = workload()
    requests = generate_requests(w)
    run = run_policy(POLICIES[name], requests, w, COST)
    assert len(run.requests) == len(requests) and run.policy_name == name
    served = [r for r in run.requests if r.service_start_s is not None]
    assert run.prefill_jobs == len(served)
    assert run.prefill_work_s == pytest.approx(sum(COST.prefill_s(r.prompt_tokens) for r in served))
    assert run.decode_work_s == pytest.approx(sum(COST.decode_s(b.compiled_batch) for b in run.batches))
    assert (run.statistics is None) == (POLICIES[name].kind == "baseline")


def test_package_has_the_workload_context() -> None:
    import json

    manifest = json.loads((loadsim_package_dir() / "manifest.json").read_text())
    assert manifest["architecture"]["max_seq"] == 40960
    assert sorted(p["compiled_batch"] for p in manifest["profiles"]) == [1, 4, 8, 16]
