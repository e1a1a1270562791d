"""Run analysis on hand-built records: percentiles, fairness, starvation, batch figures."""

from __future__ import annotations

import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.analysis import (FINISH_REASONS, SimBatchRecord, SimRequestRecord, fairness_index,
                                       jain_index, latency_stats, service_timeline, starvation_events,
                                       summarize, weighted_max_min_fair, workload_limit)
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


def spread(n: int, start: float = 0.0, end: float = 100.0) -> list[float]:
    """``n`` token instants spread evenly over ``[start, end)``."""
    return [start + (end - start) * (k + 0.5) / n for k in range(n)]


def backlogged(rid: int, tenant: str, tokens: int) -> list[SimRequestRecord]:
    """A tenant served ``tokens`` over [0, 100] with another request waiting throughout."""
    return [served(rid, 0.0, 0.0, spread(tokens), tenant=tenant, finish=100.0),
            served(rid + 1, 0.0, 100.0, [], tenant=tenant)]


def satisfied(rid: int, tenant: str, tokens: int) -> list[SimRequestRecord]:
    """A tenant served ``tokens`` over [0, 100] that never had a request waiting."""
    return [served(rid, 0.0, 0.0, spread(tokens), tenant=tenant, finish=100.0)]


def jain_of(records: list[SimRequestRecord], weights: dict[str, float]) -> float | None:
    return fairness_index(records, weights, start_s=0.0, end_s=100.0)[0]


def test_weighted_max_min_fair_is_water_filling() -> None:
    inf = float("inf")
    assert weighted_max_min_fair(20, {"a": 2, "b": inf}, {"a": 1, "b": 1}) == {"a": 2, "b": 18}
    assert weighted_max_min_fair(20, {"a": 15, "b": inf}, {"a": 1, "b": 1}) == {"a": 10, "b": 10}
    assert weighted_max_min_fair(30, {"a": inf, "b": inf}, {"a": 2, "b": 1}) == {"a": 20, "b": 10}
    # c's demand (3) is under the level; a and b split the rest 2:1
    assert weighted_max_min_fair(33, {"a": inf, "b": inf, "c": 3}, {"a": 2, "b": 1, "c": 1}) == \
        {"a": 20, "b": 10, "c": 3}
    assert weighted_max_min_fair(7, {"a": 3, "b": 4}, {"a": 1, "b": 1}) == {"a": 3, "b": 4}
    with pytest.raises(DefinitionError):
        weighted_max_min_fair(1, {"a": 1}, {"a": 0})


def test_fairness_satisfied_tenant_with_little_demand_does_not_lower_the_index() -> None:
    # a asked for 2 tokens and got them; b was backlogged and got the other 18: both max-min fair
    records = satisfied(0, "a", 2) + backlogged(10, "b", 18)
    assert jain_of(records, {"a": 1, "b": 1}) == pytest.approx(1.0)


def test_fairness_backlogged_tenants_split_unequally() -> None:
    # both backlogged, equal weights, 3:1 split: x = 30/20, 10/20 → (2)² / (2·(2.25 + 0.25)) = 0.8
    records = backlogged(0, "a", 30) + backlogged(10, "b", 10)
    assert jain_of(records, {"a": 1, "b": 1}) == pytest.approx(0.8)
    # weights 2:1 and a 2:1 split is exactly fair
    records = backlogged(0, "a", 20) + backlogged(10, "b", 10)
    assert jain_of(records, {"a": 2, "b": 1}) == pytest.approx(1.0)


def test_fairness_satisfied_tenant_above_the_water_level_lowers_the_index() -> None:
    # a never waited but got 15 while b was backlogged with 5: the fair split is 10/10
    records = satisfied(0, "a", 15) + backlogged(10, "b", 5)
    assert jain_of(records, {"a": 1, "b": 1}) == pytest.approx(0.8)
    # nobody waiting: everybody got what it asked for, whatever the amounts
    assert jain_of(satisfied(0, "a", 15) + satisfied(10, "b", 5), {"a": 1, "b": 1}) == pytest.approx(1.0)


def test_fairness_windows_follow_the_waiting_tenants_and_are_token_weighted() -> None:
    # [0, 50): both wait, 3:1 split (Jain 0.8, 40 tokens); [50, 100]: a no longer waits and gets
    # what it asked for, b the rest (1.0, 40 tokens)
    records = [served(0, 0.0, 0.0, spread(30, 0, 50) + spread(20, 50, 100), tenant="a", finish=100.0),
               served(1, 0.0, 0.0, spread(10, 0, 50) + spread(20, 50, 100), tenant="b", finish=100.0),
               served(2, 0.0, 50.0, [], tenant="a"), served(3, 0.0, 100.0, [100.0], tenant="b")]
    jain, windows = fairness_index(records, {"a": 1, "b": 1}, start_s=0.0, end_s=100.0)
    assert windows == 2 and jain == pytest.approx((40 * 0.8 + 41 * 1.0) / 81)   # the token at 100 counts


def test_a_short_wait_counts_only_where_it_happened() -> None:
    # a backlogged throughout; b satisfied, except that one request of b waited in [50, 51), while
    # a got one token and b none: that window's Jain is 0.5, weighted by its one token of 100
    records = backlogged(0, "a", 80)[:1] + [served(5, 0.0, 100.0, [], tenant="a")] + satisfied(10, "b", 20)
    records.append(served(20, 50.0, 51.0, [], tenant="b"))
    jain, windows = fairness_index(records, {"a": 1, "b": 1}, start_s=0.0, end_s=100.0)
    assert windows == 3 and jain == pytest.approx((99 * 1.0 + 1 * 0.5) / 100)


def test_fairness_needs_two_tenants_with_demand() -> None:
    assert fairness_index(backlogged(0, "a", 10), None, start_s=0.0, end_s=100.0) == (None, 0)
    # a rejected request is not demand
    lone = satisfied(0, "a", 10) + [rejected(5, 1.0, "reject_capacity", tenant="b")]
    assert fairness_index(lone, None, start_s=0.0, end_s=100.0) == (None, 0)


def test_starvation_detected_only_when_overtaken_after_the_threshold() -> None:
    old = served(0, 0.0, 50.0, [51.0])
    newer_late = served(1, 1.0, 40.0, [41.0])       # starts at 40 s: old has waited 40 s > 30 s
    events = starvation_events([old, newer_late], threshold_s=30.0)
    assert len(events) == 1
    e = events[0]
    assert (e.request_id, e.waited_s, e.overtaken_by, e.first_overtake_s, e.kind) == (0, 50.0, 1, 40.0, "overtaken")
    newer_early = served(1, 1.0, 20.0, [21.0])      # overtook before the threshold: not starvation
    assert starvation_events([old, newer_early], threshold_s=30.0) == ()
    same_time = served(1, 0.0, 40.0, [41.0])        # the same arrival time is not "later"
    assert starvation_events([old, same_time], threshold_s=30.0) == ()
    assert starvation_events([old], threshold_s=30.0) == ()           # long wait, nobody overtook


def test_starvation_compares_a_request_with_later_arrivals_of_its_own_class() -> None:
    # a storm: long prompts served one at a time in arrival order while short ones start
    longs = [served(i, float(i), 24.0 * i + 0.5, [24.0 * (i + 1)], klass="long") for i in range(4)]
    shorts = [served(10 + i, 2.0 + 10 * i, 3.0 + 10 * i, [4.0 + 10 * i], klass="short") for i in range(9)]
    assert starvation_events(longs + shorts, threshold_s=30.0) == ()
    # a later long prompt served first is starvation of the earlier one
    jumped = served(20, 5.0, 40.0, [60.0], klass="long")
    events = starvation_events([*longs, *shorts, jumped], threshold_s=30.0)
    assert [(e.request_id, e.klass, e.overtaken_by) for e in events] == [(2, "long", 1), (3, "long", 1)]


def test_starvation_of_a_request_that_never_started() -> None:
    never = SimRequestRecord(request_id=0, tenant="a", klass="long", prompt_tokens=40000, arrival_s=0.0,
                             admitted=True, finish_s=None)
    later = [served(i, 1.0 + i, 35.0 + i, [36.0 + i], klass="long") for i in range(1, 4)]
    events = starvation_events([never, *later], threshold_s=30.0, end_s=100.0)
    assert [(e.request_id, e.klass, e.waited_s, e.overtaken_by) for e in events] == [(0, "long", 100.0, 3)]
    # a cancelled waiting request's wait ends at its finish
    gave_up = SimRequestRecord(request_id=0, tenant="a", klass="long", prompt_tokens=40000, arrival_s=0.0,
                               admitted=True, finish_s=20.0, finish_reason="cancelled")
    assert starvation_events([gave_up, *later], threshold_s=10.0) == ()
    # an expiry before service while a later arrival of its class started: starvation at any wait
    expired = SimRequestRecord(request_id=0, tenant="a", klass="long", prompt_tokens=40000, arrival_s=0.0,
                               admitted=True, finish_s=37.5, finish_reason="deadline")
    events = starvation_events([expired, *later], threshold_s=60.0)
    assert [(e.request_id, e.kind, e.waited_s, e.overtaken_by) for e in events] == [(0, "expired", 37.5, 2)]
    other_class = [served(i, 1.0 + i, 35.0 + i, [36.0 + i], klass="short") for i in range(1, 4)]
    assert starvation_events([expired, *other_class], threshold_s=60.0) == ()


def test_workload_limit_charges_each_prefill_once() -> None:
    cost = CostModel.reference()
    reqs = [SimRequest(0.0, "t", 300, 150, None, None, "short"), SimRequest(1.0, "t", 40000, 64, None, None, "long")]
    per_token = cost.decode_s(16) / 16
    expected = (150 + 64) / (cost.prefill_s(300) + cost.prefill_s(40000) + (149 + 63) * per_token)
    assert workload_limit(reqs, cost, 16) == pytest.approx(expected)
    # decode only (one-token prompts cost next to nothing): tends to the device-bound limit
    assert workload_limit([SimRequest(0.0, "t", 1, 10 ** 6, None, None, "short")], cost, 16) == \
        pytest.approx(cost.device_bound_tokens_per_s(16), rel=1e-4)
    assert workload_limit([], cost, 16) is None
    with pytest.raises(DefinitionError):
        workload_limit(reqs, cost, 0)


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
    records = satisfied(0, "a", 30) + satisfied(10, "b", 10)
    weights = {"a": 1.0, "b": 2.0}
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
