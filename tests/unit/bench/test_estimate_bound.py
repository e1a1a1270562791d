"""The information bound on an admission-time estimate (issue #13, session 19): its arithmetic,
the trace splice it samples futures with, and a small bound end to end.

Each test names the mutant it catches (checked by applying the mutant: the test fails).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.bench import main
from calculet.bench.estimate_bound import (Steps, best_coverage, bootstrap_bound, coverage_steps, estimate_steps,
                                           pooled_bound, rollout_steps)
from calculet.bench.estimate_bound_runs import RowSpec, future_workload, is_scored, sample_load
from calculet.errors import DefinitionError
from calculet.loadsim.goodput import estimate_error
from calculet.loadsim.policies import POLICIES, run_policy
from calculet.loadsim.splice import splice_future
from calculet.loadsim.workload import generate_requests, load_preset, parse_workload

WORKLOAD = {
    "schema": "calculet-loadsim/v1", "name": "unit-bound", "seed": 7, "duration_s": 16,
    "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
    "prompt_tokens": {"kind": "empirical", "values": [24, 300, 900]},
    "max_new_tokens": {"kind": "lognormal", "median": 12, "sigma": 0.4, "min": 4, "max": 24},
    "deadline_ms": 30000,
    "tenants": [{"name": "a"}, {"name": "b"}],
}


def workload():  # noqa: ANN201 - a Workload
    return parse_workload(WORKLOAD)


# -------------------------------------------------------------------------------------------- the sweep


def test_one_sample_is_always_covered_by_itself() -> None:
    """Mutant: the interval's half-width taken relative to the finish instead of the latency (e 10.8)."""
    assert best_coverage([12.0], 10.0, 0.0) == (1.0, 12.0)
    assert best_coverage([12.0], 10.0, 0.1) == (1.0, pytest.approx(11.8))
    assert coverage_steps([12.0], 10.0).at(np.array([0.0, 0.3])).tolist() == [1.0, 1.0]


def test_two_samples_meet_exactly_at_their_breakpoint() -> None:
    """F 10 and 12 from t 0: one estimate covers both from tau = 2/22 on (closed intervals).
    Mutant: open intervals (an end counted before a start at one point, no touch tolerance)."""
    assert best_coverage([10.0, 12.0], 0.0, 0.0)[0] == 0.5
    assert best_coverage([10.0, 12.0], 0.0, 0.0899)[0] == 0.5
    c, e = best_coverage([10.0, 12.0], 0.0, 2 / 22)
    assert c == 1.0 and e == pytest.approx(120 / 11)
    steps = coverage_steps([10.0, 12.0], 0.0)
    assert steps.taus.tolist() == pytest.approx([0.0, 2 / 22]) and steps.values.tolist() == [0.5, 1.0]


def test_ties_count_once_each() -> None:
    """Equal finishes are covered together at tau 0. Mutant: duplicate breakpoints kept as separate steps
    (np.unique dropped) or a tie counted as one sample."""
    c, e = best_coverage([10.0, 10.0, 20.0], 0.0, 0.0)
    assert (c, e) == (pytest.approx(2 / 3), 10.0)
    steps = coverage_steps([10.0, 10.0, 20.0], 0.0)
    assert steps.taus[0] == 0.0 and steps.values[0] == pytest.approx(2 / 3)
    assert len(set(steps.taus.tolist())) == len(steps.taus)


def test_a_chain_of_pairs_is_not_a_triple() -> None:
    """F 10, 20, 30 from 0: pairs meet at tau 0.2 (20-30) and 1/3 (10-20), all three only at 0.5.
    Mutant: coverage counted as the largest number of intervals meeting *some* other (2 -> 3 at 1/3)."""
    steps = coverage_steps([10.0, 20.0, 30.0], 0.0)
    assert steps.taus.tolist() == pytest.approx([0.0, 0.2, 1 / 3, 0.5])
    assert steps.values.tolist() == pytest.approx([1 / 3, 2 / 3, 2 / 3, 1.0])


def test_the_step_function_equals_the_sweep_everywhere() -> None:
    """Property on random samples. Mutant: breakpoints from the latency difference (L_i - L_j)."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        t = float(rng.uniform(0, 50))
        f = t + rng.lognormal(1.5, 0.5, size=int(rng.integers(1, 9)))
        steps = coverage_steps(f, t)
        for tau in rng.uniform(0, 0.8, size=25):
            assert steps.at(tau) == pytest.approx(best_coverage(f, t, float(tau))[0])


def test_a_given_estimate_is_scored_on_the_same_samples() -> None:
    """Mutant: the count of samples within tau taken as the first index of the tau (one short)."""
    steps = estimate_steps([10.0, 12.0, 20.0], 0.0, 11.0)
    assert steps.at(np.array([0.0, 1 / 12, 0.1, 0.44, 0.45])).tolist() == pytest.approx([0, 1 / 3, 2 / 3, 2 / 3, 1])
    assert estimate_steps([10.0, 10.0], 0.0, 10.0).at(0.0) == 1.0


def test_a_rollout_scores_each_sample_against_the_median_of_the_others() -> None:
    """Mutants: the scored sample inside its own median (k=0 would read 12, error 0.2, not 0.3); the mean of
    the others instead of their median (k=1 of the second case); one sample accepted."""
    steps = rollout_steps([10.0, 12.0, 14.0], 0.0)  # medians of the others 13, 12, 11: errors 0.3, 0, 3/14
    assert steps.at(np.array([0.0, 0.2, 3 / 14, 0.29, 0.3])).tolist() == pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3, 1])
    skewed = rollout_steps([10.0, 10.0, 10.0, 40.0], 0.0)  # the 10s: median of (10, 10, 40) = 10, error 0
    assert skewed.at(0.0) == pytest.approx(0.75)
    with pytest.raises(DefinitionError):
        rollout_steps([10.0], 0.0)


def test_bad_samples_are_refused() -> None:
    with pytest.raises(DefinitionError):
        best_coverage([], 0.0, 0.1)
    with pytest.raises(DefinitionError):
        coverage_steps([5.0, 3.0], 4.0)


# -------------------------------------------------------------------------------------------- pooling


def test_the_bound_is_the_smallest_tau_reaching_the_target() -> None:
    """Mutant: a strict '>' (0.5 instead of 0.2) or the unweighted mean (0.2 instead of 0.5 with weights 1, 3)."""
    a = Steps(np.array([0.0]), np.array([1.0]))
    b = Steps(np.array([0.0, 0.2, 0.5]), np.array([0.5, 0.8, 1.0]))
    assert pooled_bound([a, b], [1, 1]) == 0.2
    assert pooled_bound([a, b], [1, 3]) == 0.5
    assert pooled_bound([a, b], [1, 1], target=0.75) == 0.0
    with pytest.raises(DefinitionError):
        pooled_bound([a, b], [1])


def test_the_bootstrap_interval_holds_the_bound_and_keeps_the_strata() -> None:
    """Mutant: resampling across loads (a stratum's weight lost): identical strata give the bound exactly."""
    a = Steps(np.array([0.0]), np.array([1.0]))
    b = Steps(np.array([0.0, 0.2, 0.5]), np.array([0.5, 0.8, 1.0]))
    assert bootstrap_bound([a, a, b, b], [1, 1, 3, 3], ["x", "x", "y", "y"], draws=50) == (0.5, 0.5)
    low, high = bootstrap_bound([a, b, a, b], [1, 1, 1, 1], ["x", "x", "y", "y"], draws=200)
    assert low <= pooled_bound([a, b, a, b], [1, 1, 1, 1]) <= high


# -------------------------------------------------------------------------------------------- the splice


def test_the_splice_keeps_the_past_and_r_and_takes_the_future() -> None:
    """Mutant: a prefix up to but excluding the cut (r dropped), or the future's own past kept."""
    w = workload()
    actual, future = generate_requests(w, seed=1), generate_requests(w, seed=2)
    i = len(actual) // 2
    cut = actual[i].arrival_s
    spliced = splice_future(actual, future, cut)
    assert spliced[:i + 1] == actual[:i + 1]
    assert spliced[i + 1:] == tuple(r for r in future if r.arrival_s > cut)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(spliced, spliced[1:]))
    horizon = cut + 3.0
    short = splice_future(actual, future, cut, horizon)
    assert short[:i + 1] == actual[:i + 1] and all(r.arrival_s < horizon for r in short)
    with pytest.raises(DefinitionError):
        splice_future(actual[::-1], future, cut)
    with pytest.raises(DefinitionError):
        splice_future(actual, future, cut, cut - 1)


def test_a_requests_attributes_do_not_depend_on_how_many_arrive() -> None:
    """What the splice's law rests on: attributes are drawn per request (a shorter trace is a prefix of a
    longer one). Guards a generator change that would draw them jointly with the count."""
    w = workload()
    short, long_ = generate_requests(w, 8.0, seed=5), generate_requests(w, 16.0, seed=5)
    assert len(short) < len(long_) and long_[:len(short)] == short


# -------------------------------------------------------------------------------------------- end to end


def test_a_small_bound_end_to_end() -> None:
    """Two requests, K=2, on calculet-b16: the actual finish is the first sample, every splice reproduces
    r's estimate, and the first cut gives the same finish as the untruncated splice.
    Mutant: the splice cut just before r (another request at r's index: estimate mismatches > 0)."""
    w = workload()
    spec = RowSpec(w, POLICIES["calculet-b16"], CostModel.reference())
    samples = sample_load(spec, 1.0, requests=2, futures=2, future_seed=100)
    assert samples.mismatches == 0 and samples.beyond_horizon == 0 and len(samples.requests) == 2
    actual = run_policy(spec.policy, generate_requests(w), w, spec.cost)
    assert len(samples.scored_errors) == estimate_error(actual.requests).count  # type: ignore[union-attr]
    for r in samples.requests:
        assert r.finishes[0] == actual.requests[r.index].finish_s and r.seeds[0] == w.seed
        assert is_scored(actual.requests[r.index]) and r.drawn == 2
        if len(r.finishes) == 2:
            full = splice_future(generate_requests(w), generate_requests(w, seed=101), r.arrival_s)
            assert run_policy(spec.policy, full, w, spec.cost).requests[r.index].finish_s == r.finishes[1]


def test_the_stationary_what_if_draws_only_fresh_poisson_futures() -> None:
    """Mutant: the actual run (the true law's draw) kept among the what-if's samples, or the on/off
    phase kept in the what-if's law."""
    bursty = load_preset("bursty")
    law = future_workload(bursty, "stationary")
    assert law.arrivals.kind == "poisson" and law.arrivals.mean_rate() == pytest.approx(bursty.arrivals.mean_rate())
    assert law.tenants == bursty.tenants and law.max_new_tokens == bursty.max_new_tokens
    assert future_workload(bursty, "workload") is bursty
    with pytest.raises(DefinitionError):
        future_workload(bursty, "nope")
    w = workload()
    spec = RowSpec(w, POLICIES["calculet-b16"], CostModel.reference(), future_law="stationary")
    samples = sample_load(spec, 1.0, requests=1, futures=2, future_seed=100)
    assert samples.mismatches == 0 and all(r.seeds and min(r.seeds) > 100 and r.drawn == 2 for r in samples.requests)


def test_the_command_writes_and_merges_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant: a second row overwriting the folder's first one."""
    path = tmp_path / "w.yaml"
    import yaml

    path.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    out = tmp_path / "out"
    base = ["estimate-bound", "--workload", str(path), "--loads", "1", "--requests", "1", "--futures", "2",
            "--bootstrap", "20", "--out", str(out), "--quiet"]
    assert main(base + ["--policies", "calculet-b16"]) == 0
    assert main(base + ["--policies", "calculet-b4"]) == 0
    import json

    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert set(rows) == {"unit-bound/calculet-b16", "unit-bound/calculet-b4"}
    row = rows["unit-bound/calculet-b4"]
    assert row["estimate_mismatches"] == 0 and 0 <= row["bound_p90"] <= row["today_p90_on_samples"] + 1e-12
    assert "calculet-b16" in (out / "report.md").read_text() and math.isfinite(row["bound_p90"])
    capsys.readouterr()


@pytest.mark.parametrize(("extra", "message"), [
    (["--policies", "b1-serial-fcfs"], "gives no finish estimate"),
    (["--policies", "calculet-b16", "--processes", "3"], "at most 2"),
    (["--policies", "calculet-b99"], "unknown policy"),
])
def test_bad_input_is_refused(extra: list[str], message: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate-bound", "--preset", "bursty", "--out", str(tmp_path / "x"), *extra])
    assert code == 2 and message in capsys.readouterr().err
