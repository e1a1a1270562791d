"""Workloads: YAML validation names the field, generation is seeded and statistically sane."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calculet.config import SCHEMA_ID as SCHEDULER_SCHEMA, parse_config
from calculet.errors import ConfigError
from calculet.loadsim.arrivals import on_off_arrivals, poisson_arrivals
from calculet.loadsim.distributions import LogNormalDist
from calculet.loadsim.workload import (SimRequest, WorkloadError, generate_requests, load_preset, load_workload,
                                       offered_load, parse_workload, preset_names, prompt_class)


def base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": "calculet-loadsim/v1",
        "name": "t",
        "seed": 7,
        "duration_s": 100,
        "arrivals": {"kind": "poisson", "rate_per_s": 5},
        "prompt_tokens": {"kind": "lognormal", "median": 200, "sigma": 0.8, "min": 8, "max": 8000},
        "max_new_tokens": 32,
        "tenants": [{"name": "a", "weight": 1, "share": 1}, {"name": "b", "weight": 2, "share": 3}],
    }
    data.update(overrides)
    return data


def errors_of(data: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    with pytest.raises(WorkloadError) as info:
        parse_workload(data, source="w.yaml")
    return str(info.value), info.value.context.get("errors", [])  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def test_minimal_workload_parses_with_defaults() -> None:
    w = parse_workload(base())
    assert w.context_limit_tokens == 40960
    assert w.prompt_classes.short_max_tokens == 512 and w.prompt_classes.medium_max_tokens == 4096
    assert w.max_new_tokens.kind == "fixed" and w.max_new_tokens.value == 32  # scalar shorthand
    assert w.shares() == {"a": 0.25, "b": 0.75}
    assert isinstance(WorkloadError("x"), ConfigError)


@pytest.mark.parametrize("mutate,path,fragment", [
    (lambda d: d["arrivals"].update(rate=1), "arrivals.rate", "unknown key"),
    (lambda d: d.update(extra_key=1), "extra_key", "unknown key"),
    (lambda d: d["prompt_tokens"].update(sigma=-1), "prompt_tokens.sigma", "greater than or equal"),
    (lambda d: d["prompt_tokens"].update(min=9000), "prompt_tokens.min", "min 9000"),
    (lambda d: d["prompt_tokens"].update(median=5), "prompt_tokens.median", "outside"),
    (lambda d: d["tenants"][1].update(weight=0), "tenants[1].weight", "greater than 0"),
    (lambda d: d["tenants"][1].update(name="a"), "tenants[1].name", "duplicate tenant name"),
    (lambda d: d["tenants"][0].update(name="bad name!"), "tenants[0].name", "pattern"),
    (lambda d: d.update(max_new_tokens=2.5), "max_new_tokens", "whole number"),
    (lambda d: d.update(max_new_tokens={"kind": "empirical", "values": [1, 2], "weights": [1]}),
     "max_new_tokens.weights", "1 weights for 2 values"),
    (lambda d: d.update(max_new_tokens={"kind": "gamma", "value": 3}), "max_new_tokens", "unknown kind"),
    (lambda d: d.update(max_new_tokens={"value": 3}), "max_new_tokens", "needs 'kind'"),
    (lambda d: d["arrivals"].update(rate_per_s="3"), "arrivals.rate_per_s", "valid number"),
    (lambda d: d.update(storms=[{"start_s": 1, "count": 2, "prompt_tokens": 100, "tenant": "zz"}]),
     "storms[0].tenant", "unknown tenant 'zz'"),
    (lambda d: d.update(storms=[{"start_s": 1, "count": 2, "prompt_tokens": 50000}]),
     "storms[0].prompt_tokens", "context_limit_tokens 40960"),
    (lambda d: d["tenants"][0].update(prompt_tokens=40960), "tenants[0].prompt_tokens", "do not fit"),
    (lambda d: d.update(cancellation={"probability": 1.5, "delay_s": 1}), "cancellation.probability", "less than"),
    (lambda d: d.update(prompt_classes={"short_max_tokens": 600, "medium_max_tokens": 600}),
     "prompt_classes.medium_max_tokens", "must not overlap"),
    (lambda d: d.pop("arrivals"), "arrivals", "required field is missing"),
    (lambda d: d.update(tenants=[]), "tenants", "at least 1"),
])
def test_invalid_settings_name_the_field(mutate: Any, path: str, fragment: str) -> None:
    data = copy.deepcopy(base())
    mutate(data)
    message, problems = errors_of(data)
    assert message.startswith("w.yaml: ")
    matching = [msg for p, msg in problems if p == path]
    assert matching, f"no error at {path!r}: {problems}"
    assert any(fragment in msg for msg in matching), matching


def test_every_problem_is_reported_at_once() -> None:
    data = base()
    data["arrivals"]["rate_per_s"] = -1
    data["tenants"][0]["share"] = 0
    message, problems = errors_of(data)
    assert "2 invalid settings" in message
    assert {p for p, _ in problems} == {"arrivals.rate_per_s", "tenants[0].share"}


@pytest.mark.parametrize("data,fragment", [
    ({"name": "x"}, "a workload starts with 'schema: calculet-loadsim/v1'"),
    ({"schema": "calculet-loadsim/v0"}, "unknown schema 'calculet-loadsim/v0'"),
    ([1, 2], "top level must be a mapping"),
])
def test_schema_and_shape_are_checked_first(data: Any, fragment: str) -> None:
    with pytest.raises(WorkloadError, match=fragment):
        parse_workload(data)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="workload file not found"):
        load_workload(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: [unclosed\n")
    with pytest.raises(WorkloadError, match=r"bad\.yaml: invalid YAML"):
        load_workload(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text("schema: calculet-loadsim/v1\nname: a\nname: b\n")
    with pytest.raises(WorkloadError, match="duplicate key 'name'"):
        load_workload(dup)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("schema: calculet-loadsim/v1\nname: a\narrivals: {kind: poisson, rate_per_s: 0}\n"
                     "prompt_tokens: 10\nmax_new_tokens: 10\n")
    with pytest.raises(WorkloadError, match=r"wrong\.yaml: 1 invalid setting:\n  arrivals\.rate_per_s"):
        load_workload(wrong)


def test_generate_rejects_bad_arguments() -> None:
    w = parse_workload(base())
    for kwargs in ({"duration_s": 0}, {"load_scale": 0}, {"load_scale": math.inf}, {"seed": -1}):
        with pytest.raises(WorkloadError):
            generate_requests(w, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# determinism and structure
# --------------------------------------------------------------------------------------------


def test_same_seed_same_requests_and_different_seed_differs() -> None:
    w = parse_workload(base(cancellation={"probability": 0.3, "delay_s": 2}, deadline_ms=5000))
    first = generate_requests(w, 50, 1.0)
    assert first == generate_requests(parse_workload(base(cancellation={"probability": 0.3, "delay_s": 2},
                                                          deadline_ms=5000)), 50, 1.0)
    assert first != generate_requests(w, 50, 1.0, seed=8)
    assert generate_requests(w, 50, 1.0, seed=7) == first  # the workload's own seed


def test_requests_are_sorted_frozen_and_inside_the_window() -> None:
    reqs = generate_requests(parse_workload(base()), 40, 2.0)
    times = [r.arrival_s for r in reqs]
    assert times == sorted(times) and all(0 <= t < 40 for t in times)
    assert all(isinstance(r, SimRequest) for r in reqs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        reqs[0].tenant = "x"  # type: ignore[misc]


def test_prefix_stability_and_scale_consistency() -> None:
    """A longer run only appends; twice the load replays the same requests twice as fast."""
    w = parse_workload(base())
    short, long_ = generate_requests(w, 30), generate_requests(w, 60)
    assert long_[:len(short)] == short
    double = generate_requests(w, 30, 2.0)
    assert len(double) > len(short) * 1.5
    prefix = double[:len(short)]
    assert [(r.tenant, r.prompt_tokens, r.max_new_tokens) for r in prefix] == \
           [(r.tenant, r.prompt_tokens, r.max_new_tokens) for r in short]
    assert np.allclose([r.arrival_s * 2 for r in prefix], [r.arrival_s for r in short])


def test_prompt_class_thresholds() -> None:
    assert [prompt_class(n) for n in (1, 512, 513, 4096, 4097, 40000)] == \
           ["short", "short", "medium", "medium", "long", "long"]
    assert prompt_class(100, short_max_tokens=64, medium_max_tokens=128) == "medium"
    w = parse_workload(base(prompt_classes={"short_max_tokens": 100, "medium_max_tokens": 1000}))
    for r in generate_requests(w, 50):
        assert r.klass == prompt_class(r.prompt_tokens, 100, 1000)


def test_prompts_and_outputs_fit_the_context_limit() -> None:
    w = parse_workload(base(context_limit_tokens=1000, max_new_tokens=500,
                            prompt_tokens={"kind": "lognormal", "median": 600, "sigma": 1, "min": 100, "max": 999}))
    reqs = generate_requests(w, 50)
    assert max(r.prompt_tokens for r in reqs) == 999
    assert all(r.prompt_tokens < 1000 and r.prompt_tokens + r.max_new_tokens <= 1000 for r in reqs)
    assert all(r.max_new_tokens >= 1 for r in reqs)
    assert any(r.max_new_tokens < 500 for r in reqs) and any(r.max_new_tokens == 500 for r in reqs)


# --------------------------------------------------------------------------------------------
# distribution sanity
# --------------------------------------------------------------------------------------------


def test_poisson_count_and_gaps() -> None:
    times = poisson_arrivals(np.random.default_rng(1), 20.0, 500.0)
    assert abs(times.size - 10_000) < 4 * math.sqrt(10_000)
    gaps = np.diff(times)
    assert abs(gaps.mean() - 0.05) < 0.002 and abs(gaps.std() - 0.05) < 0.003  # exponential: std = mean


def test_on_off_rates_by_phase() -> None:
    times = on_off_arrivals(np.random.default_rng(2), 10.0, 1.0, 20.0, 40.0, 6000.0)
    phase = np.mod(times, 60.0)
    on, off = np.sum(phase < 20.0), np.sum(phase >= 20.0)
    assert abs(on / (100 * 20) - 10.0) < 0.3      # 100 cycles of 20 s at 10/s
    assert abs(off / (100 * 40) - 1.0) < 0.08     # 100 cycles of 40 s at 1/s
    silent = on_off_arrivals(np.random.default_rng(3), 5.0, 0.0, 1.0, 4.0, 500.0)
    assert np.all(np.mod(silent, 5.0) < 1.0)


def test_lognormal_median_mean_and_clip() -> None:
    dist = LogNormalDist(kind="lognormal", median=300, sigma=0.7, min=1, max=1e9)
    x = dist.sample(np.random.default_rng(4), 200_000)
    assert abs(np.median(x) / 300 - 1) < 0.01
    assert abs(x.mean() / (300 * math.exp(0.7 ** 2 / 2)) - 1) < 0.01
    clipped = LogNormalDist(kind="lognormal", median=300, sigma=1.0, min=100, max=1000)
    y = clipped.sample(np.random.default_rng(5), 200_000)
    assert y.min() == 100 and y.max() == 1000
    assert abs(y.mean() / clipped.mean() - 1) < 0.01  # the exact clipped mean


def test_generated_lengths_tenants_cancels_and_deadlines() -> None:
    w = parse_workload(base(
        duration_s=400,
        max_new_tokens={"kind": "empirical", "values": [10, 20, 40], "weights": [1, 2, 1]},
        deadline_ms={"kind": "lognormal", "median": 2000, "sigma": 0.5, "min": 500, "max": 10000},
        cancellation={"probability": 0.2, "delay_s": {"kind": "lognormal", "median": 3, "sigma": 0.3, "min": 1, "max": 9}},
        tenants=[{"name": "a", "share": 1}, {"name": "b", "share": 3, "deadline_ms": None,
                                             "cancellation": {"probability": 0.5, "delay_s": 4}}],
    ))
    reqs = generate_requests(w)
    n = len(reqs)
    assert abs(n - 2000) < 4 * math.sqrt(2000)
    by_tenant = Counter(r.tenant for r in reqs)
    assert abs(by_tenant["b"] / n - 0.75) < 0.04
    outputs = Counter(r.max_new_tokens for r in reqs)
    assert set(outputs) == {10, 20, 40} and abs(outputs[20] / n - 0.5) < 0.04
    a = [r for r in reqs if r.tenant == "a"]
    b = [r for r in reqs if r.tenant == "b"]
    assert all(r.deadline_ms is not None and 500 <= r.deadline_ms <= 10000 for r in a)
    assert abs(np.median([r.deadline_ms for r in a]) / 2000 - 1) < 0.1
    assert all(r.deadline_ms is None for r in b)                    # explicit null overrides the default
    assert abs(sum(r.cancel_after_s is not None for r in a) / len(a) - 0.2) < 0.05
    assert abs(sum(r.cancel_after_s is not None for r in b) / len(b) - 0.5) < 0.05
    assert {r.cancel_after_s for r in b if r.cancel_after_s is not None} == {4.0}
    assert all(1 <= r.cancel_after_s <= 9 for r in a if r.cancel_after_s is not None)
    load = offered_load(w)
    assert abs(load.requests_per_s - 5.0) < 1e-12
    assert abs(load.output_tokens_per_s - 5.0 * 22.5) < 1e-9
    assert abs(sum(r.max_new_tokens for r in reqs) / 400 / load.output_tokens_per_s - 1) < 0.06


def test_storms_are_scripted_and_not_scaled() -> None:
    w = parse_workload(base(storms=[
        {"start_s": 10, "count": 4, "spread_s": 2, "prompt_tokens": 40000, "max_new_tokens": 16, "tenant": "a"},
        {"start_s": 95, "count": 10, "spread_s": 10, "prompt_tokens": 30000},
    ]))
    for scale in (1.0, 3.0):
        reqs = generate_requests(w, 100, scale)
        storm1 = [r for r in reqs if r.prompt_tokens == 40000]
        assert [r.arrival_s for r in storm1] == [10.0, 10.5, 11.0, 11.5]
        assert all(r.tenant == "a" and r.klass == "long" and r.max_new_tokens == 16 for r in storm1)
        storm2 = [r for r in reqs if r.prompt_tokens == 30000]
        assert len(storm2) == 5                                    # arrivals at 100 s and later are cut
    assert offered_load(w, 100).requests_per_s == pytest.approx(5 + 9 / 100)


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------


def test_presets_load_and_generate() -> None:
    assert preset_names() == ("bursty", "long-prefill-storm", "noisy-neighbour", "overload", "steady")
    for name in preset_names():
        w = load_preset(name)
        assert w.name == name
        reqs = generate_requests(w)
        assert reqs and all(r.prompt_tokens < w.context_limit_tokens for r in reqs)
        assert generate_requests(w) == reqs
        # the tenants are valid scheduler tenants (weights and limits from the workload, R5.3.7)
        cfg = parse_config({"schema": SCHEDULER_SCHEMA,
                            "tenants": [t.model_dump(exclude_none=True) for t in w.tenant_configs()]})
        assert [t.name for t in cfg.tenants] == [t.name for t in w.tenants]
    with pytest.raises(WorkloadError, match="unknown preset 'nope'; presets: bursty"):
        load_preset("nope")


def test_preset_shapes() -> None:
    assert load_preset("bursty").arrivals.kind == "on_off"
    storm = load_preset("long-prefill-storm")
    reqs = generate_requests(storm)
    big = [r for r in reqs if r.prompt_tokens >= 40000]
    assert len(big) == 8 and {round(r.arrival_s) // 60 for r in big} == {1, 3}
    noisy = load_preset("noisy-neighbour")
    total_weight = sum(t.weight for t in noisy.tenants)
    weighted_share = noisy.tenant("noisy").weight / total_weight
    assert noisy.shares()["noisy"] == pytest.approx(10 * weighted_share)
    others = [t for t in noisy.tenants if t.name != "noisy"]
    assert all(noisy.shares()[t.name] < t.weight / total_weight for t in others)


def test_preset_requests_are_pinned() -> None:
    """A silent change to generation (stream naming, sampling order) must show up here, not in a bench."""
    reqs = generate_requests(load_preset("steady"))
    assert len(reqs) == 140
    first = reqs[0]
    assert (first.tenant, first.prompt_tokens, first.max_new_tokens, first.deadline_ms, first.klass) == \
           ("team-a", 39, 242, 120000, "short")
    assert first.arrival_s == pytest.approx(3.5720482707235788, rel=1e-12)
    assert [len(generate_requests(load_preset(n))) for n in ("bursty", "long-prefill-storm", "noisy-neighbour")] == \
           [169, 129, 211]
