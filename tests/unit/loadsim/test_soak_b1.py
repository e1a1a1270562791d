"""§19 M0 for the product that exists (issue #13): the soak of ``b1-shipped``, the shipped config.

``b1-shipped`` is ``default.yaml`` as shipped — B1 only, one job in flight (no ping/pong), 16 KV
sequences sharing the device, the spec's reset budget of 2 per 10 minutes — serving a B1-sized
``steady`` load with faults injected. A few virtual minutes here (the 24 h run is
``bench/results/soak-b1/``): the soak's checks pass and goodput is reported beside them; with a
fault rate the budget cannot absorb, the model gives up, the soak says so, and recovery never
spent more than the budget in any 10 minutes (R15.16). Virtual time only; no wall-clock asserts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.bench import main
from calculet.config import load_config
from calculet.config.loading import DEFAULT_CONFIG_PATH
from calculet.loadsim.soak import run_soak
from calculet.loadsim.soak_checks import ResetWindow
from calculet.loadsim.soak_products import PRODUCTS, soak_setup
from calculet.loadsim.soak_report import SoakOptions
from calculet.loadsim.workload import load_preset


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.req("R19.8", "R15.16")
def test_b1_shipped_runs_default_yaml_with_the_workloads_tenants_only() -> None:
    shipped = load_config(DEFAULT_CONFIG_PATH)
    setup = soak_setup("b1-shipped", "calculet-b16-pingpong", load_preset("steady"), None)
    config = setup.config
    assert config.batch.profiles == (1,) and config.executor.max_inflight == 1          # no ping/pong
    assert config.admission == shipped.admission and config.queues == shipped.queues
    assert config.batch == shipped.batch and config.recovery == shipped.recovery
    assert config.recovery.max_resets_per_10min == 2 == setup.reset_budget and setup.budget_note == "shipped"
    assert [t.name for t in config.tenants] == ["team-a", "team-b"]
    changed = soak_setup("b1-shipped", "calculet-b16-pingpong", load_preset("steady"), 5)
    assert changed.reset_budget == 5 and changed.budget_note == "changed from the shipped 2"   # never silent
    policy = soak_setup("policy", "calculet-b16-pingpong", load_preset("steady"), None)
    assert policy.reset_budget == 50 and policy.config.executor.max_inflight == 2           # today's soak kept
    options = SoakOptions.for_product("b1-shipped", hours=1.0)
    product = PRODUCTS["b1-shipped"]
    assert (options.preset, options.load_scale, options.fault_rate) == (product.preset, product.load_scale,
                                                                          product.fault_rate)


@pytest.mark.req("R19.1", "R19.2", "R19.8", "R15.16")
def test_short_b1_shipped_soak_passes_with_faults_and_reports_goodput(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(["soak", "--product", "b1-shipped", "--hours", "0.05", "--fault-rate", "3e-4", "--seed",
                         "4", "--quiet", "--out", str(tmp_path)], capsys)
    text = (tmp_path / "soak.md").read_text(encoding="utf-8")
    assert code == 0, text
    assert "soak PASS" in out and "goodput:" in out and "**PASS**" in text
    figures = json.loads((tmp_path / "soak.json").read_text())
    assert figures["product"] == "b1-shipped" and figures["lanes"] == 16
    assert figures["policy"] is None and figures["configuration"] == "b1-shipped (default.yaml)"
    assert figures["reset_budget_per_10min"] == 2 and figures["reset_budget_source"] == "shipped"
    assert figures["recovery_state"] == "healthy" and figures["peak_resets_in_10min"] <= 2
    assert sum(figures["injected"].values()) > 0 and figures["resets"] + figures["restarts"] > 0
    goodput = figures["goodput"]
    assert goodput["on_time"] > 0 and goodput["on_time"] <= figures["outcomes"]["length"]
    assert 0 < goodput["on_time_fraction"] <= 1 and goodput["device_seconds"] > 0
    assert 0 <= goodput["wasted_share"] < 1 and "goodput:" in text and "wasted device work" in text


@pytest.mark.req("R15.16", "R19.2")
def test_b1_shipped_gives_up_under_a_fault_rate_its_budget_cannot_absorb_and_says_so() -> None:
    report = run_soak(SoakOptions.for_product("b1-shipped", hours=0.02, fault_rate=3e-3, seed=2,
                                              sample_every_s=30.0))
    assert not report.ok and report.recovery_state == "failed" and report.budget_refusals >= 1
    assert report.peak_resets_in_window <= 2 == report.reset_budget                   # R15.16: never beyond
    kinds = {v.split(":", 1)[0] for v in report.violations}
    assert "recovery" in kinds and kinds <= {"recovery", "lane_leak"}, report.violations  # nothing lost or wrong
    assert report.submitted == sum(report.outcomes.values())
    assert "recovery ended failed" in report.markdown()


def test_reset_window_counts_the_most_recoveries_in_any_ten_minutes() -> None:
    window = ResetWindow()
    t = [0.0]
    window.now = lambda: t[0]
    t[0] = 5.0
    window.device_created(None, 0)  # type: ignore[arg-type]  # bring-up is not a recovery
    for at, call in ((10.0, "reset_configuration"), (20.0, "configure"), (400.0, "reset_configuration"),
                     (700.0, "reset_configuration")):
        t[0] = at
        window.calling(call)
    t[0] = 800.0
    window.device_created(None, 1)  # type: ignore[arg-type]  # a restart is one
    t[0] = 1500.0
    window.calling("reset_configuration")
    assert window.count == 5 and window.peak == 3 and window.peak_at == 800.0   # 400, 700 and 800
    window.stop()
    window.calling("reset_configuration")                        # the orderly stop's own reset
    assert window.count == 5


def test_policy_is_refused_with_the_b1_shipped_product(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(["soak", "--product", "b1-shipped", "--policy", "calculet-b1", "--hours", "0.01"], capsys)
    assert code == 2 and "--policy applies to --product policy" in out


def test_a_deadline_before_the_deadline_fits_only_when_the_on_time_order_shed_it() -> None:
    from calculet.loadsim.soak import _close_problem, _SoakSink
    from calculet.machines.request import FinishReason
    from calculet.runtime.request import RequestOutcome

    sink = _SoakSink(None, 1, 1, max_new=3, deadline_at=50.0, arrival=0.0)  # type: ignore[arg-type]
    shed = RequestOutcome(1, "failed", FinishReason.DEADLINE, 0, 504,
                          "shed under overload: it could no longer finish by its deadline")
    early = RequestOutcome(1, "failed", FinishReason.DEADLINE, 0, 504, "deadline exceeded")
    assert _close_problem(sink, shed, now=10.0) == ""
    assert "before the deadline" in _close_problem(sink, early, now=10.0)
    assert _close_problem(sink, early, now=50.0) == ""
