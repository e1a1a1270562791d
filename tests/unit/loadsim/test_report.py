"""Report writing: Markdown with the exact command line, and non-empty, reproducible PNG plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.adapters.sim.cost import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.analysis import service_timeline, summarize
from calculet.loadsim.baselines import device_bound_limit, simulate_multi_slot, simulate_serial_fcfs
from calculet.loadsim.report import PolicyResult, render_markdown, write_report
from calculet.loadsim.workload import generate_requests, parse_workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COMMAND = ["python", "-m", "calculet.bench", "--preset", "steady", "--out", "dir with space"]


def sweep() -> list[PolicyResult]:
    w = parse_workload({
        "schema": "calculet-loadsim/v1", "name": "r", "seed": 5, "duration_s": 60,
        "arrivals": {"kind": "poisson", "rate_per_s": 0.3},
        "prompt_tokens": {"kind": "empirical", "values": [64, 1000, 6000], "weights": [6, 3, 1]},
        "max_new_tokens": 12,
        "tenants": [{"name": "a", "weight": 2}, {"name": "b"}],
    })
    cost = CostModel.reference()
    results = []
    for load in (0.5, 1.0, 2.0):
        reqs = generate_requests(w, load_scale=load)
        for run in (simulate_serial_fcfs(reqs, cost, max_waiting_requests=3), simulate_multi_slot(reqs, cost, 4)):
            results.append(PolicyResult(run.policy_name, load, run.summary(weights=w.weights()),
                                        service_timeline(run.requests, weights=w.weights())))
    return results


def test_report_files_exist_and_pngs_are_non_empty(tmp_path: Path) -> None:
    out = tmp_path / "report"
    files = write_report(sweep(), out, command_line=COMMAND,
                         device_bound_tokens_per_s=device_bound_limit(CostModel.reference(), 16),
                         workload_limits={0.5: 120.25, 1.0: 119.5, 2.0: 121.0},
                         notes=["cost model: CostModel.reference()"])
    assert files.markdown == out / "report.md" and files.markdown.is_file()
    names = sorted(p.name for p in files.plots)
    assert names == ["p99_ttft_vs_load.png", "tenant_service_b1-serial-fcfs.png",
                     "tenant_service_multi-slot-rr-4.png", "throughput_vs_load.png"]
    for plot in files.plots:
        data = plot.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    text = files.markdown.read_text(encoding="utf-8")
    assert "python -m calculet.bench --preset steady --out 'dir with space'" in text
    assert "## b1-serial-fcfs" in text and "## multi-slot-rr-4" in text
    assert "TTFT P99 by prompt class" in text and "Inter-token latency P99" in text
    assert "reject_capacity" in text                       # the bounded serial queue rejected some
    assert "Device-bound limit, decode only" in text and "200.0" in text
    assert "Workload limit" in text and "0.5: 120.2, 1: 119.5, 2: 121.0 output tokens/s" in text
    assert "Queue wait P99 / longest by prompt class" in text
    assert "- cost model: CostModel.reference()" in text
    for plot in files.plots:
        assert f"]({plot.name})" in text                   # every plot is linked


def test_reports_are_reproducible(tmp_path: Path) -> None:
    results = sweep()
    first = write_report(results, tmp_path / "one", command_line="cmd")
    second = write_report(results, tmp_path / "two", command_line="cmd")
    for a, b in zip(first.plots, second.plots):
        assert a.read_bytes() == b.read_bytes()
    assert first.markdown.read_text() == second.markdown.read_text()


def test_markdown_handles_missing_figures_and_rejects_empty_input(tmp_path: Path) -> None:
    empty = PolicyResult("idle", 0.0, summarize([], []))
    text = render_markdown([empty], command_line="run --idle")
    assert "run --idle" in text and "| 0 | 0.00 | — | — |" in text
    files = write_report([empty], tmp_path, command_line="run --idle")
    assert [p.name for p in files.plots] == ["throughput_vs_load.png", "p99_ttft_vs_load.png"]
    with pytest.raises(DefinitionError):
        write_report([], tmp_path, command_line="x")
