"""The goodput comparison (issue #13 item 7) and the issue's acceptance rows, computed from figures
written by hand: met and missed are arithmetic on the numbers, never hard-coded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.bench.acceptance import estimator_rows, shared_fairness_rows, storm_outcome_rows
from calculet.bench.comparison import arm_policies, capacity_load, device_seconds
from calculet.bench.comparison_checks import PointFigures, point_checks
from calculet.bench.comparison_report import checks_from_json
from calculet.loadsim.analysis import SimRequestRecord
from calculet.loadsim.workload import SimRequest, generate_requests, load_preset

COST = CostModel.reference()
ON_TIME = "calculet-b1-shared"


def _fig(policy: str, on_time: int, *, admitted: int = 100, expired: int = 0, wasted: float = 0.0,
         bound: int | None = 60) -> PointFigures:
    return PointFigures(policy, 120, on_time, on_time / 120, admitted, expired, wasted, bound, "lp")


def _by_criterion(checks: list) -> dict[str, object]:
    return {c.criterion.split(" (")[0]: c.met for c in checks}


def test_checks_met_when_the_default_leads_and_wastes_nothing() -> None:
    figs = [_fig("b1-serial-fcfs", 40), _fig(f"{ON_TIME}@strict", 41), _fig(ON_TIME, 55, admitted=60, expired=0)]
    met = _by_criterion(point_checks(figs, ON_TIME, 2.0))
    assert met == {"on time ≥ best of the others": True, "≥ 0.8 × offline bound": True,
                   "admitted then deadline_exceeded ≤ 1%": True, "wasted device time ≤ 5%": True}


def test_checks_missed_with_the_figures_that_miss() -> None:
    figs = [_fig("b1-serial-fcfs", 40), _fig(f"{ON_TIME}@at_risk", 50), _fig(ON_TIME, 45, admitted=50, expired=1,
                                                                              wasted=0.06)]
    checks = point_checks(figs, ON_TIME, 2.0)
    assert all(c.met is False for c in checks)  # 45 < 50; 45/60 = 0.75; 1/50 = 2 %; 6 %
    assert checks[0].value == f"45 vs 50 ({ON_TIME}@at_risk)"
    assert checks[1].value == "45/60 = 0.75×" and checks[2].value == "1/50 = 2.0%" and checks[3].value == "6.0%"


def test_the_bound_is_judged_at_two_times_capacity_only() -> None:
    figs = [_fig("b1-serial-fcfs", 10), _fig(ON_TIME, 10, bound=40)]
    assert point_checks(figs, ON_TIME, 1.0)[1].met is None
    assert point_checks(figs, ON_TIME, 2.0)[1].met is False
    assert point_checks([_fig(ON_TIME, 10, bound=None)], ON_TIME, 2.0)[0].value == "no bound"


def test_checks_recompute_from_summary_json() -> None:
    figs = [_fig("b1-serial-fcfs", 40), _fig(ON_TIME, 55)]
    data = {"arms": [{"device": ON_TIME, "points": [{"multiple": 2.0, "figures": [f.as_json() for f in figs]}]}]}
    [(device, multiple, checks)] = checks_from_json(data)
    assert (device, multiple) == (ON_TIME, 2.0) and checks == point_checks(figs, ON_TIME, 2.0)
    assert PointFigures.from_json(figs[1].as_json()).as_json() == figs[1].as_json()


def test_capacity_is_the_load_at_which_device_work_fills_the_arrival_span() -> None:
    reqs = [SimRequest(0.0, "t", 100, 11, None, None, "short")]
    assert device_seconds(reqs, COST, 1) == pytest.approx(COST.prefill_s(100) + 10 * COST.decode_s(1))
    assert device_seconds(reqs, COST, 16) == pytest.approx(COST.prefill_s(100) + 10 * COST.decode_s(16) / 16)
    w = load_preset("overload")
    work = device_seconds(generate_requests(w, w.duration_s, 1.0), COST, 1)
    assert capacity_load(w, COST, 1) == pytest.approx(w.duration_s / work)
    assert capacity_load(w, COST, 16) > 4 * capacity_load(w, COST, 1)  # B16 serves many times more


def test_an_arm_runs_fcfs_then_the_other_orders_then_the_default() -> None:
    names = [p.name for p in arm_policies(ON_TIME)]
    assert names[0] == "b1-serial-fcfs" and names[-1] == ON_TIME
    assert {f"{ON_TIME}@strict", f"{ON_TIME}@at_risk"} <= set(names)


def _rec(i: int, tenant: str, klass: str, *, admitted: bool = True, reason: str = "length",
         ttft: float | None = 1.0) -> SimRequestRecord:
    times = () if ttft is None or not admitted else (float(i) + ttft,)
    return SimRequestRecord(i, tenant, klass, 40_000 if klass == "long" else 100, float(i), admitted,  # type: ignore[arg-type]
                            None if admitted else "no_prospect", float(i) if times else None,
                            times[0] if times else None, times, float(i) + 5.0, reason if admitted else "rejected")


def _result(cells: dict[tuple[str, float, bool], object], loads: tuple[float, ...], noisy: str | None = None):
    return SimpleNamespace(loads=loads, noisy_tenant=noisy,
                           cell=lambda name, load, reference=False: cells.get((name, load, reference)))


def _cell(records: list[SimRequestRecord], jain: float | None = None) -> object:
    return SimpleNamespace(run=SimpleNamespace(requests=tuple(records)), summary=SimpleNamespace(jain_fairness=jain))


def test_storm_row_counts_long_prompts_admitted_and_then_expired() -> None:
    good = _cell([_rec(0, "d", "long"), _rec(1, "d", "long", admitted=False), _rec(2, "i", "short", reason="deadline")])
    bad = _cell([_rec(0, "d", "long"), _rec(1, "d", "long", reason="deadline")])
    rows = storm_outcome_rows(_result({(ON_TIME, 1.0, False): good, (ON_TIME, 2.0, False): bad}, (1.0, 2.0)))
    assert [r[2] for r in rows] == [True, False]
    assert rows[0][1] == "2 long: completed 1, refused 1 (refused after up to 5.0 s in the queue)"
    assert rows[1][1] == "2 long: admitted, then deadline 1, completed 1"


def test_shared_fairness_row_needs_jain_and_every_tenant_ttft_ratio() -> None:
    alone = _cell([_rec(0, "a", "short", ttft=1.0), _rec(1, "b", "short", ttft=2.0)])
    fair = _cell([_rec(0, "a", "short", ttft=1.5), _rec(1, "b", "short", ttft=3.9), _rec(2, "n", "short")], 0.93)
    slow = _cell([_rec(0, "a", "short", ttft=1.5), _rec(1, "b", "short", ttft=4.2), _rec(2, "n", "short")], 0.93)
    unfair = _cell(fair.run.requests, 0.85)  # type: ignore[attr-defined]
    for cell, met in ((fair, True), (slow, False), (unfair, False)):
        [row] = shared_fairness_rows(_result({(ON_TIME, 1.0, False): cell, (ON_TIME, 1.0, True): alone}, (1.0,), "n"))
        assert row[2] is met, row
    assert "b 3.90/2.00 s = 1.95× (429 0 vs 0)" in row[1] and "Jain 0.850" in row[1]


def test_estimator_rows_say_by_how_much_a_p90_misses() -> None:
    rows = estimator_rows({"calculet-b16": {"count": 10, "median_abs": 0.3, "p90_abs": 0.45, "median_signed": 0.2},
                           "calculet-b1-shared": {"count": 5, "median_abs": 0.1, "p90_abs": 0.2,
                                                  "median_signed": -0.05}})
    assert [r[2] for r in rows] == [False, True]
    assert rows[0][1].endswith("20 points over") and "P90 45%" in rows[0][1]
