"""deploy/grafana/calculet.json (issue #19): every panel query parses as PromQL (promtool) and uses only
metric names a running calculet exports — checked against a live scrape after traffic."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.service.promtool import ROOT, check_promql, metric_names, scraped_sample_names
from tests.service.support import ALIAS, RunningServer

DASHBOARD = ROOT / "deploy" / "grafana" / "calculet.json"


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _expressions() -> dict[str, str]:
    """``panel id + refId`` → PromQL, every panel target and the templating queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {f"panel_{p['id']}_{t['refId']}": t["expr"] for p in _panels(dashboard["panels"])
             for t in p.get("targets", ())}
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict) and query["query"].startswith("label_values("):
            inner = query["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            exprs[f"var_{var['name']}"] = inner
    return exprs


def test_the_dashboard_is_grafana_json_with_panels_and_queries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "calculet" and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    assert len(_expressions()) >= 30


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    checked = check_promql(_expressions(), tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_metric_a_panel_reads_is_exported_by_a_live_service(server: RunningServer) -> None:
    """The issue's check: scrape a running service (after a few completions) and find every name."""
    client = server.client("alpha")
    for i in range(3):
        client.completions.create(model=ALIAS, prompt=f"dashboard {i}", max_tokens=3)
    exported = scraped_sample_names(server.metrics_text())
    used: dict[str, set[str]] = {}
    for key, expr in _expressions().items():
        names = metric_names(expr)
        assert names, f"{key}: no metric name found in {expr!r}"
        for name in names:
            used.setdefault(name, set()).add(key)
    missing = {name: sorted(keys) for name, keys in used.items() if name not in exported}
    assert not missing, missing
