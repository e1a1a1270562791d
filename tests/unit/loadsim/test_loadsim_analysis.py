"""Run analysis on hand-built records: percentiles, fairness, starvation, batch figures."""

from __future__ import annotations

import pytest

from calculet.errors import DefinitionError
from calculet.loadsim.analysis import (FINISH_REASONS, SimBatchRecord, SimRequestRecord, fairness_index,
                                       jain_index, latency_stats, service_timeline, starvation_events,
                                       summarize)
from calculet.loadsim.workload import SimRequest


def served(rid: int, arrival: float, start: float, tokens: list[float], *, tenant: str = "a",
           klass: str = "short", finish_reason: str = "length", finish: float | None = None) -> SimRequestRecord:
    return SimRequestRecord(request_id=rid, tenant=tenant, klass=klass, prompt_tokens=100,  # type: ignore[arg-type]
                            arrival_s=arrival, admitted=True, service_start_s=start,
                            first_token_s=tokens[0] if tokens else None, token_times_s=tuple(tokens),
                            finish_s=finish if finish is not None else (tokens[-1] if tokens else start),
                            finish_reason=finish_reason)


def rejected(rid: int, arrival: float, reason: str, tenant: str = "a") -> SimRequestRecord:
    return SimRequestRecord(request_id=rid, tenant=tenant, klass="short", prompt_tokens=10, arrival_s=arrival,
                            admitted=False, rejection_reason=reason, finish_s=arrival, finish_reason="rejected")


def test_percentiles_are_numpy_linear() -> None:
    stats = latency_stats(float(v) for v in range(1, 101))
    assert (stats.count, stats.p50, stats.p99, stats.mean, stats.max) == (100, 50.5, pytest.approx(99.01), 50.5, 100.0)
    assert latency_stats([]).p50 is None and latency_stats([]).count == 0
    assert latency_stats([3.0]).p99 == 3.0


def test_jain_index() -> None:
    assert jain_index([5.0, 5.0, 5.0]) == 1.0
    assert jain_index([1.0, 0.0]) == 0.5
    assert jain_index([3.0, 1.0]) == pytest.approx(16 / 20)
    assert 0.25 < jain_index([10, 1, 1, 1]) < 1.0
    assert jain_index([]) == 1.0 and jain_index([0, 0]) == 1.0
    with pytest.raises(DefinitionError):
        jain_index([-1.0, 1.0])


def _two_tenants(tokens_a: int, tokens_b: int, weight_b: float = 1.0) -> tuple[list[SimRequestRecord], dict[str, float]]:
    # both tenants backlogged over [0, 100]: one long request each, tokens spread evenly
    ra = served(0, 0.0, 0.0, [100 * (k + 0.5) / tokens_a for k in range(tokens_a)], tenant="a", finish=100.0)
    rb = served(1, 0.0, 0.0, [100 * (k + 0.5) / tokens_b for k in range(tokens_b)], tenant="b", finish=100.0)
    return [ra, rb], {"a": 1.0, "b": weight_b}


def test_fairness_equal_weighted_service_is_one() -> None:
    records, weights = _two_tenants(200, 200)
    jain, windows = fairness_index(records, weights, window_s=10.0, start_s=0.0, end_s=100.0)
    assert jain == pytest.approx(1.0) and windows == 10
    records, weights = _two_tenants(100, 200, weight_b=2.0)       # twice the weight, twice the tokens
    assert fairness_index(records, weights, window_s=10.0, start_s=0.0, end_s=100.0)[0] == pytest.approx(1.0)


def test_fairness_unequal_service_is_below_one() -> None:
    records, weights = _two_tenants(300, 100)
    jain, _ = fairness_index(records, weights, window_s=10.0, start_s=0.0, end_s=100.0)
    assert jain == pytest.approx(0.8)                            # (3+1)² / (2·(9+1))


def test_fairness_ignores_tenants_that_are_not_backlogged() -> None:
    records, weights = _two_tenants(200, 200)
    # tenant c has one short request in [0, 1]: it is never backlogged through a 10 s window
    records.append(served(2, 0.0, 0.0, [0.5], tenant="c", finish=1.0))
    assert fairness_index(records, weights, window_s=10.0, start_s=0.0, end_s=100.0)[0] == pytest.approx(1.0)
    # one backlogged tenant alone says nothing about fairness
    assert fairness_index(records[:1], weights, window_s=10.0, start_s=0.0, end_s=100.0) == (None, 0)


def test_starvation_detected_only_when_overtaken_after_the_threshold() -> None:
    old = served(0, 0.0, 50.0, [51.0])
    newer_late = served(1, 1.0, 40.0, [41.0])       # starts at 40 s: old has waited 40 s > 30 s
    events = starvation_events([old, newer_late], threshold_s=30.0)
    assert len(events) == 1
    e = events[0]
    assert (e.request_id, e.waited_s, e.overtaken_by, e.first_overtake_s) == (0, 50.0, 1, 40.0)
    newer_early = served(1, 1.0, 20.0, [21.0])      # overtook before the threshold: not starvation
    assert starvation_events([old, newer_early], threshold_s=30.0) == ()
    same_time = served(1, 0.0, 40.0, [41.0])        # the same arrival time is not "later"
    assert starvation_events([old, same_time], threshold_s=30.0) == ()
    assert starvation_events([old], threshold_s=30.0) == ()           # long wait, nobody overtook


def test_starvation_of_a_request_that_never_started() -> None:
    never = SimRequestRecord(request_id=0, tenant="a", klass="long", prompt_tokens=40000, arrival_s=0.0,
                             admitted=True, finish_s=None)
    later = [served(i, 1.0 + i, 35.0 + i, [36.0 + i]) for i in range(1, 4)]
    events = starvation_events([never, *later], threshold_s=30.0, end_s=100.0)
    assert [(e.request_id, e.klass, e.waited_s, e.overtaken_by) for e in events] == [(0, "long", 100.0, 3)]
    # a cancelled waiting request's wait ends at its finish
    gave_up = SimRequestRecord(request_id=0, tenant="a", klass="long", prompt_tokens=40000, arrival_s=0.0,
                               admitted=True, finish_s=20.0, finish_reason="cancelled")
    assert starvation_events([gave_up, *later], threshold_s=10.0) == ()


def test_summary_figures_on_hand_built_records() -> None:
    requests = [
        served(0, 0.0, 0.0, [1.0, 1.5, 2.0, 2.5], klass="short", tenant="a"),
        served(1, 0.0, 2.5, [4.0, 5.0], klass="medium", tenant="b"),
        served(2, 1.0, 5.0, [6.0], klass="short", tenant="a", finish_reason="cancelled"),
        rejected(3, 2.0, "reject_capacity", tenant="b"),
        rejected(4, 3.0, "reject_capacity"),
        rejected(5, 4.0, "reject_invalid"),
    ]
    batches = [SimBatchRecord(1.0, 4, 2, 0.0), SimBatchRecord(1.5, 4, 1, 0.1), SimBatchRecord(4.0, 1, 1, 0.2)]
    s = summarize(requests, batches, window_s=10.0, weights={"a": 1, "b": 1})
    assert (s.requests, s.admitted, s.rejected, s.completed) == (6, 3, 3, 2)
    assert s.output_tokens == 7 and s.output_tokens_per_s == pytest.approx(0.7)
    assert s.ttft_by_class_s["short"].count == 2 and s.ttft_by_class_s["short"].p50 == pytest.approx(3.0)
    assert s.ttft_by_class_s["medium"].p50 == 4.0 and s.ttft_by_class_s["long"].count == 0
    assert s.ttft_s.count == 3 and s.ttft_s.max == 5.0
    assert s.itl_by_class_s["short"].p50 == 0.5 and s.itl_by_class_s["medium"].p50 == 1.0
    assert s.itl_s.count == 4
    assert s.queue_wait_s.p50 == 2.5 and s.queue_wait_s.max == 4.0
    assert s.fill_ratio == pytest.approx(4 / 9) and s.lane_waste == pytest.approx(5 / 9)
    assert s.wasted_lane_steps == 5 and s.batches == 3 and s.compiled_batches == {1: 1, 4: 2}
    assert s.batch_wait_s.max == 0.2
    assert s.rejections_by_reason == {"reject_capacity": 2, "reject_invalid": 1}
    assert s.finish_reasons == {"cancelled": 1, "length": 2, "rejected": 3}
    assert s.tenant_output_tokens == {"a": 5, "b": 2}
    assert s.starvation_events == 0
    default_window = summarize(requests, batches)
    assert default_window.window_s == 6.0                           # first arrival → last event


def test_empty_run_summarizes() -> None:
    s = summarize([], [])
    assert s.requests == 0 and s.output_tokens_per_s == 0.0 and s.fill_ratio is None and s.jain_fairness is None


def test_service_timeline_bins_every_token() -> None:
    records, weights = _two_tenants(30, 10, weight_b=2.0)
    tl = service_timeline(records, bin_s=10.0, weights=weights, end_s=100.0)
    assert tl.tenants == ("a", "b") and len(tl.tokens["a"]) == 10
    assert sum(tl.tokens["a"]) == 30 and sum(tl.tokens["b"]) == 10 and tl.tokens["a"][0] == 3
    assert tl.cumulative_normalized("b")[-1] == 5.0
    assert tl.bin_ends()[-1] == 100.0


def test_records_reject_inconsistent_fields() -> None:
    assert FINISH_REASONS == {"stop", "length", "cancelled", "error", "deadline", "rejected"}
    common = dict(request_id=9, tenant="a", prompt_tokens=1, arrival_s=1.0)
    with pytest.raises(DefinitionError, match="needs a rejection_reason"):
        SimRequestRecord(klass="short", admitted=False, **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="klass"):
        SimRequestRecord(klass="huge", admitted=True, **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="finish_reason"):
        SimRequestRecord(klass="short", admitted=True, finish_reason="eos", **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="first_token_s"):
        SimRequestRecord(klass="short", admitted=True, token_times_s=(2.0, 3.0), first_token_s=2.5, **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="non-decreasing"):
        SimRequestRecord(klass="short", admitted=True, token_times_s=(3.0, 2.0), first_token_s=3.0, **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="before arrival"):
        SimRequestRecord(klass="short", admitted=True, service_start_s=0.5, **common)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="active_lanes"):
        SimBatchRecord(0.0, compiled_batch=4, active_lanes=5)
    with pytest.raises(DefinitionError, match="duplicate request_id"):
        summarize([rejected(1, 0.0, "x"), rejected(1, 1.0, "x")])
    record = SimRequestRecord.for_request(3, SimRequest(2.0, "t", 600, 8, None, None, "medium"),
                                          admitted=True, service_start_s=2.0, first_token_s=3.0,
                                          token_times_s=(3.0, 3.1), finish_s=3.1, finish_reason="length")
    assert (record.tenant, record.klass, record.prompt_tokens, record.generated_tokens) == ("t", "medium", 600, 2)
