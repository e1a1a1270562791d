"""The goodput comparison judged over several seeds (issue #13): aggregation on summaries written by
hand — met on k of n seeds and the pooled verdicts are arithmetic on the figures, never hard-coded.
Each test names the mutant of ``calculet/bench/comparison_seeds.py`` (or the CLI) it catches."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from calculet.bench.cli import build_parser, main, parse_seeds
from calculet.bench.comparison_checks import PointFigures, point_checks
from calculet.bench.comparison_seeds import pool_figures, resolve_seeds, seed_points, seeds_json, tally
from calculet.bench.comparison_seeds_report import write_seeds_report

DEV = "calculet-b16"
LABELS = {DEV: "B16"}
BEST, BOUND, LATE, WASTED = range(4)


def _fig(policy: str, on_time: int, *, admitted: int = 100, expired: int = 0, wasted: float = 0.0,
         bound: int | None = 110, device_s: float | None = 100.0) -> PointFigures:
    return PointFigures(policy, 150, on_time, on_time / 150, admitted, expired, wasted, bound, "lp", device_s)


def _summary(points: dict[float, list[PointFigures]], deadline: str = "tight") -> dict[str, Any]:
    return {"workload": "overload", "command": "x", "arms": [
        {"device": DEV, "deadline": deadline, "points": [{"multiple": m, "figures": [f.as_json() for f in figs]}
                                                         for m, figs in points.items()]}]}


def test_a_check_met_on_some_seeds_is_counted_k_of_n_with_the_seeds_that_missed() -> None:
    """Mutants: met_on counting the judged seeds (3/3) or the seeds not missed; missed_seeds listing the met ones."""
    seeds = [(11, _summary({2.0: [_fig("at_risk", 90), _fig(DEV, 95)]})),
             (12, _summary({2.0: [_fig("at_risk", 99), _fig(DEV, 95)]})),
             (13, _summary({2.0: [_fig("at_risk", 80), _fig(DEV, 95)]}))]
    [point] = seed_points(seeds, LABELS)
    assert point.label == "B16 tight" and point.met_on(BEST) == (2, 3) and point.missed_seeds(BEST) == (12,)
    assert point.met_on(BOUND) == (3, 3)  # 95/110 on every seed
    assert [c.met for c in point.per_seed[1][1]] == [c.met for c in point_checks(
        [_fig("at_risk", 99), _fig(DEV, 95)], DEV, 2.0)]


def test_pooled_best_compares_on_time_totals_not_the_majority_of_seeds() -> None:
    """Mutant: the pooled 'best' check as 'met on most seeds' (2 of 3 here) or on the best seed's margin."""
    seeds = [(11, _summary({1.0: [_fig("at_risk", 100), _fig(DEV, 101)]})),
             (12, _summary({1.0: [_fig("at_risk", 100), _fig(DEV, 101)]})),
             (13, _summary({1.0: [_fig("at_risk", 110), _fig(DEV, 100)]}))]
    [point] = seed_points(seeds, LABELS)
    assert point.met_on(BEST) == (2, 3)
    assert point.pooled[BEST].met is False and point.pooled[BEST].value == "302 vs 310 (at_risk)"
    assert point.pooled[BOUND].met is None and point.met_on(BOUND) == (0, 0)  # bound judged at 2x only


def test_pooled_late_share_is_late_over_admitted_of_all_seeds() -> None:
    """Mutant: the pooled late share as the mean of the seeds' shares (5.0 %, missed) instead of 1/200 = 0.5 %."""
    seeds = [(11, _summary({4.0: [_fig("at_risk", 5), _fig(DEV, 9, admitted=10, expired=1)]})),
             (12, _summary({4.0: [_fig("at_risk", 5), _fig(DEV, 190, admitted=190, expired=0)]}))]
    [point] = seed_points(seeds, LABELS)
    assert point.met_on(LATE) == (1, 2)
    assert point.pooled[LATE].value == "1/200 = 0.5%" and point.pooled[LATE].met is True


def test_pooled_wasted_share_weighs_each_seed_by_its_device_time() -> None:
    """Mutants: the mean of the seeds' shares (5 %, not ≤ 5 % fails at 6 %); ignoring the device-time weights.
    Without a recorded device time the pooled share is the worst seed's, never better than a seed."""
    [pooled] = pool_figures([[_fig(DEV, 10, wasted=0.12, device_s=10.0)], [_fig(DEV, 10, wasted=0.0, device_s=190.0)]])
    assert pooled.wasted_share == pytest.approx(0.006) and pooled.device_s == pytest.approx(200.0)
    [old] = pool_figures([[_fig(DEV, 10, wasted=0.12, device_s=None)], [_fig(DEV, 10, wasted=0.0)]])
    assert old.wasted_share == pytest.approx(0.12) and old.device_s is None


def test_pooled_figures_sum_every_policy_and_the_bounds() -> None:
    """Mutants: pooling policies by position (the seeds list them in other orders); a bound summed over a
    seed without one (it must be None: no bound, not a smaller one)."""
    a = [_fig("fcfs", 10, bound=50), _fig(DEV, 40, bound=50)]
    b = [_fig(DEV, 45, bound=60, admitted=50, expired=2), _fig("fcfs", 12, bound=60)]
    fcfs, mine = pool_figures([a, b])
    assert (fcfs.policy, fcfs.on_time, fcfs.offered, fcfs.bound) == ("fcfs", 22, 300, 110)
    assert (mine.on_time, mine.admitted, mine.expired, mine.bound, mine.bound_method) == (85, 150, 2, 110, "lp")
    assert mine.goodput_per_s == pytest.approx((40 + 45) / 150 / 2)
    [none] = pool_figures([[_fig(DEV, 1, bound=None)], [_fig(DEV, 1)]])
    assert none.bound is None
    with pytest.raises(ValueError, match="different policies"):
        pool_figures([a, [_fig(DEV, 1)]])


def test_seeds_of_other_comparisons_are_not_pooled() -> None:
    """Mutant: pooling only the points the first seed has (a seed run with other multiples joins silently)."""
    with pytest.raises(ValueError, match="seed 12 holds other points"):
        seed_points([(11, _summary({2.0: [_fig(DEV, 1)]})), (12, _summary({4.0: [_fig(DEV, 1)]}))], LABELS)


def test_tally_counts_judged_checks_per_seed_pooled_and_on_every_seed() -> None:
    """Mutants: counting unjudged checks (the bound at 1x) as judged; 'met on every seed' counting a check met
    on one seed only."""
    seeds = [(11, _summary({1.0: [_fig("at_risk", 90), _fig(DEV, 95)], 2.0: [_fig("at_risk", 90), _fig(DEV, 99)]})),
             (12, _summary({1.0: [_fig("at_risk", 99), _fig(DEV, 95)], 2.0: [_fig("at_risk", 90), _fig(DEV, 99)]}))]
    t = tally(seed_points(seeds, LABELS))
    assert t.per_seed == {11: (7, 7), 12: (6, 7)}  # 1x: best, late, wasted; 2x: all four
    assert t.pooled == (7, 7)  # 1x pooled: 190 vs 189 on time, met
    assert t.every_seed == 6


def test_the_report_and_summary_carry_every_check_per_seed_and_pooled(tmp_path: Path) -> None:
    """Mutant: the report or summary.json leaving out a seed's checks or the pooled verdict."""
    seeds = [(11, _summary({2.0: [_fig("at_risk", 90), _fig(DEV, 95)]})),
             (12, _summary({2.0: [_fig("at_risk", 99), _fig(DEV, 95)]}))]
    report = write_seeds_report(seeds, tmp_path, 1.0, "python -m calculet.bench goodput --seeds 11,12 --out X")
    text = report.read_text(encoding="utf-8")
    assert "seed 11 4 of 4; seed 12 3 of 4; pooled 4 of 4; met on every seed 3 of 4" in text
    assert "1/2 seeds (missed on 12); pooled 190 vs 189 (at_risk) met" in text
    assert "95 vs 99 (at_risk) **missed**" in text and "| 90 / 99 |" in text
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["seeds"] == [11, 12] and data["tally"]["per_seed"]["12"] == {"met": 3, "judged": 4}
    [point] = data["points"]
    assert [c["met"] for c in point["per_seed"]["12"]] == [False, True, True, True]
    assert point["met_on"][0] == {"met": 1, "judged": 2} and point["pooled_checks"][0]["met"] is True
    assert data["per_seed_summaries"]["11"]["arms"][0]["device"] == DEV
    assert seeds_json(seed_points(seeds, LABELS), seeds, "c")["tally"] == data["tally"]


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected comma-separated seeds"), ("11,,12", "expected comma-separated seeds"),
    ("11,x", "seed 'x' is not an integer"), ("11,-1", "seed '-1' must be >= 0"),
    ("11,12,11", "seed '11' is listed twice"), ("1", "a count of seeds must be 2..10, got 1"),
    ("13", "one seed: --seed 13"),
])
def test_a_bad_seed_list_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    """Mutants: a bare 13 run as 13 seeds (half an hour) or as a one-seed list; duplicates or negatives accepted."""
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_seeds(text)


def test_a_list_is_taken_as_given_and_a_count_starts_at_the_preset_seed() -> None:
    """Mutant: a count resolved as range(N) (seeds 0..N-1, not the preset's trace and the ones after it)."""
    assert parse_seeds("12, 11") == (12, 11) and resolve_seeds((12, 11), 13) == (12, 11)
    assert parse_seeds("3") == 3 and resolve_seeds(3, 13) == (13, 14, 15)


def test_seed_and_seeds_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant: --seeds silently overriding --seed (or the reverse)."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["goodput", "--seed", "11", "--seeds", "11,12", "--out", "X"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_goodput_seeds_runs_each_seed_into_its_folder_and_judges_over_them(tmp_path: Path) -> None:
    """Issue #13: ``goodput --seeds 2`` (tiny: one multiple, 6 virtual seconds). Mutants: every seed run on the
    preset's trace (the seed not passed on); a seed's report quoting a command that does not re-run it."""
    out = tmp_path / "seeds"
    assert main(["goodput", "--seeds", "2", "--multiples", "2", "--duration", "6", "--quiet", "--out", str(out)]) == 0
    data = json.loads((out / "summary.json").read_text())
    assert data["seeds"] == [13, 14] and "--seeds 2" in data["command"]
    for seed in (13, 14):
        head = (out / f"seed-{seed}" / "report.md").read_text(encoding="utf-8").splitlines()[3]
        assert head.endswith(f"--seed {seed} --quiet") and f"--out {out / f'seed-{seed}'}" in head
        assert (out / f"seed-{seed}" / "b16-tight" / "report.md").exists()
    offered = {s: [f["offered"] for a in data["per_seed_summaries"][s]["arms"] for p in a["points"]
                   for f in p["figures"]] for s in ("13", "14")}
    assert offered["13"] != offered["14"]  # two traces
    assert len(data["points"]) == 4 and "## Checks per seed" in (out / "report.md").read_text(encoding="utf-8")


def test_all_keeps_the_committed_seed_comparisons_in_its_index(tmp_path: Path) -> None:
    """``all`` rewrites OUT/README.md; a ``goodput --seeds`` folder in OUT (not re-run: minutes per seed) keeps its
    entry with its tally. Mutants: the helper listing nothing (the folder dropped from the index); a folder without
    a readable summary listed or failing the whole index."""
    from calculet.bench.commands import _committed_seed_comparisons

    seeds = [(11, _summary({2.0: [_fig("at_risk", 90), _fig(DEV, 95)]})),
             (12, _summary({2.0: [_fig("at_risk", 99), _fig(DEV, 95)]}))]
    write_seeds_report(seeds, tmp_path / "goodput-seeds", 1.0, "python -m calculet.bench goodput --seeds 11,12")
    (tmp_path / "goodput-seeds-broken").mkdir()
    lines = _committed_seed_comparisons(tmp_path)
    assert lines[0] == "### [goodput-seeds](goodput-seeds/report.md)" and len(lines) == 6
    assert lines[2] == "Not re-run by this command; made by `python -m calculet.bench goodput --seeds 11,12`."
    assert lines[4] == "Judged checks met: seed 11 4 of 4; seed 12 3 of 4; pooled 4 of 4; met on every seed 3."
