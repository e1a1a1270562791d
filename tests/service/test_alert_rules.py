"""deploy/prometheus/alerts.yaml (issue #19): checked and unit-tested by Prometheus' own promtool, and
every series an alert reads is one a running calculet exports.

The alerts: KV lanes in Unknown (§9.2), reset budget exhausted (§14, §15), ping/pong degraded (§14),
a queue's oldest wait beyond the default deadline (§6, §16), 5xx error rate, no Ready generation (§10).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.service.promtool import ROOT, metric_names, run_promtool, scraped_sample_names
from tests.service.support import ALIAS, RunningServer

RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
REQUIRED = {"CalculetKvLanesUnknown", "CalculetResetBudgetExhausted", "CalculetPingPongDegraded",
            "CalculetQueueWaitBeyondDeadline", "CalculetHighErrorRate", "CalculetNoReadyGeneration"}


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_check_rules_passes() -> None:
    checked = run_promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in checked.stdout


def test_promtool_test_rules_passes() -> None:
    tested = run_promtool("test", "rules", str(TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_required_alert_has_a_firing_and_a_silent_case() -> None:
    """Each alert is unit-tested both ways: at least one evaluation expects it firing, one expects nothing."""
    assert {rule["alert"] for rule in _rules()} == REQUIRED
    cases: dict[str, set[bool]] = {name: set() for name in REQUIRED}
    for test in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", ()):
            cases[case["alertname"]].add(bool(case.get("exp_alerts")))
    assert all(seen == {True, False} for seen in cases.values()), cases


def test_a_broken_rule_makes_promtool_test_rules_fail(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against rules whose Unknown-lane threshold is off by one."""
    broken = RULES.read_text().replace("(calculet_kv_unknown_sequences) > 0", "(calculet_kv_unknown_sequences) > 1")
    assert broken != RULES.read_text()
    (tmp_path / "alerts.yaml").write_text(broken)
    (tmp_path / "alerts_test.yaml").write_text(TESTS.read_text())
    tested = run_promtool("test", "rules", str(tmp_path / "alerts_test.yaml"))
    assert tested.returncode != 0 and "CalculetKvLanesUnknown" in tested.stdout + tested.stderr


def test_every_series_an_alert_reads_is_exported_by_a_running_service(server: RunningServer) -> None:
    """Names in the rule expressions, against a live scrape after traffic (no alert on a series that never exists)."""
    client = server.client("alpha")
    client.completions.create(model=ALIAS, prompt="alerts", max_tokens=2)
    exported = scraped_sample_names(server.metrics_text())
    used = {name for rule in _rules() for name in metric_names(rule["expr"])}
    assert used, "no metric names found in the rules"
    assert used <= exported, sorted(used - exported)


@pytest.mark.parametrize("rule", sorted(REQUIRED))
def test_each_alert_names_severity_summary_and_description(rule: str) -> None:
    found = next(r for r in _rules() if r["alert"] == rule)
    assert found["labels"]["severity"] in ("warning", "critical")
    assert found["annotations"]["summary"] and found["annotations"]["description"]
