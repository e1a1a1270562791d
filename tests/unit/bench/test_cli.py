"""``python -m calculet.bench``: argument errors, a small report end to end, and the soak's checks.

The soak's checkers are tested on hand-made inputs (a token or close that does not fit, a
sequence reused after a failed job, memory that grows), so a passing soak means something; a
short soak with a high fault rate runs end to end through the CLI.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from calculet.adapters.calrt import (DecodeJob, JobKind, JobResult, JobTicket, LaneResult, ReturnCode,
                                     StatusCounters)
from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.model import pseudo_next_token
from calculet.bench import main, parse_loads
from calculet.bench.comparison_report import checks_from_json
from calculet.loadsim.analysis import workload_limit
from calculet.loadsim.soak import _close_problem, _Soak, _SoakSink
from calculet.loadsim.soak_checks import QuarantineGuard, Violations
from calculet.loadsim.soak_report import MemorySample, SoakOptions
from calculet.loadsim.workload import generate_requests, load_preset
from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.machines.job import JobEngine


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_parse_loads() -> None:
    assert parse_loads("0.5, 1,2") == (0.5, 1.0, 2.0)
    import argparse

    for bad, match in (("", "comma-separated"), ("1,,2", "comma-separated"), ("x", "not a number"),
                       ("0", "> 0"), ("-1", "> 0"), ("inf", "finite"), ("nan", "finite"), ("1,1", "twice")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            parse_loads(bad)


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--preset", "nope", "--out", "X"], "unknown preset 'nope'; presets: bursty, long-prefill-storm"),
    (["run", "--preset", "steady", "--loads", "1,abc", "--out", "X"], "argument --loads: load 'abc' is not a number"),
    (["run", "--preset", "steady", "--loads", "0", "--out", "X"], "must be a finite number > 0"),
    (["run", "--preset", "steady", "--policies", "calculet-b32", "--out", "X"], "unknown policy 'calculet-b32'"),
    (["run", "--preset", "steady"], "the following arguments are required: --out"),
    (["run", "--out", "X"], "one of the arguments --preset --workload is required"),
    (["run", "--workload", "missing.yaml", "--out", "X"], "workload file not found"),
    (["soak", "--hours", "0"], "argument --hours: '0' must be > 0"),
    (["soak", "--fault-rate", "0.5"], "fault rate '0.5' must be in [0, 0.05]"),
    (["soak", "--policy", "b1-serial-fcfs"], "a soak runs an engine policy"),
    (["soak", "--preset", "nope"], "unknown preset 'nope'"),
    ([], "the following arguments are required: {run,all,goodput,estimate-bound,soak,list}"),
    (["goodput", "--multiples", "2,2", "--out", "X"], "load '2' is listed twice"),
])
def test_bad_input_is_a_clear_error_with_exit_code_2(argv: list[str], message: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path / a) if a in ("X", "missing.yaml") else a for a in argv]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert message in err.replace("\n", " "), err
    assert not (tmp_path / "X").exists()       # nothing was written


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0 and "steady" in out and "calculet-b16-pingpong" in out


def test_run_writes_report_plots_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "steady out"
    argv = ["run", "--preset", "steady", "--loads", "1,2", "--duration", "40", "--quiet",
            "--policies", "b1-serial-fcfs,calculet-b16", "--out", str(out)]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0 and "report.md" in stdout
    report = (out / "report.md").read_text(encoding="utf-8")
    assert f"python -m calculet.bench run --preset steady --loads 1,2 --duration 40 --quiet --policies " \
           f"b1-serial-fcfs,calculet-b16 --out '{out}'" in report
    for section in ("## Acceptance figures", "## Headline figures", "## Per-tenant service", "## calculet-b16",
                    "## b1-serial-fcfs", "throughput_vs_load.png", "p99_ttft_vs_load.png",
                    "tenant_service_calculet-b16.png"):
        assert section in report
    for png in ("throughput_vs_load.png", "p99_ttft_vs_load.png", "tenant_service_calculet-b16.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "steady" and summary["loads"] == [1.0, 2.0]
    rows = {(r["policy"], r["load"]): r for r in summary["runs"]}
    assert set(rows) == {(p, x) for p in ("b1-serial-fcfs", "calculet-b16") for x in (1.0, 2.0)}
    assert rows[("calculet-b16", 2.0)]["output_tokens_per_s"] > rows[("b1-serial-fcfs", 2.0)]["output_tokens_per_s"]
    # both limits: the decode-only one and the workload limit of the requests offered at each load
    limit = workload_limit(generate_requests(load_preset("steady"), 40.0, 2.0), CostModel.reference(), 16)
    assert limit is not None and limit < summary["device_bound_tokens_per_s"] == 200.0
    b16 = rows[("calculet-b16", 2.0)]
    assert b16["workload_limit_tokens_per_s"] == pytest.approx(limit, abs=1e-4)
    assert b16["workload_limit_ratio"] == pytest.approx(b16["output_tokens_per_s"] / limit, abs=1e-3)
    assert "| × limit | × workload limit |" in report
    assert "calculet-b16 at load 2 (saturation): ≥ 0.9 × device-bound limit |" in report
    assert "calculet-b16 at load 2 (saturation): ≥ 0.9 × workload limit (not the issue's criterion" in report


def test_storm_workloads_get_a_no_storm_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run_cli(["run", "--preset", "long-prefill-storm", "--loads", "0.5", "--duration", "75", "--quiet",
                          "--policies", "calculet-b16", "--out", str(tmp_path)], capsys)
    assert code == 0
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Long-prefill storm vs no storm" in report and "| 0.5 | calculet-b16 |" in report
    assert len(json.loads((tmp_path / "summary.json").read_text())["reference_runs"]) == 1


def test_short_soak_passes_with_faults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(["soak", "--hours", "0.03", "--fault-rate", "0.01", "--load", "2", "--quiet",
                               "--out", str(tmp_path)], capsys)
    text = (tmp_path / "soak.md").read_text(encoding="utf-8")
    assert code == 0, text
    assert "soak PASS" in stdout and "**PASS**" in text and "python -m calculet.bench soak --hours 0.03" in text
    import re

    quarantined = re.search(r"device sequences quarantined after a failed job (\d+)", text)
    injected = re.search(r"injected ([^;]+);", text)
    assert quarantined and int(quarantined.group(1)) > 0, text     # the guard had something to guard
    assert injected and "none" not in injected.group(1), text
    figures = json.loads((tmp_path / "soak.json").read_text())
    assert figures["ok"] and figures["submitted"] > 0 and sum(figures["injected"].values()) > 0


# --------------------------------------------------------------------------------------------
# the soak's checkers
# --------------------------------------------------------------------------------------------


class _FakeSoak:
    def __init__(self) -> None:
        self.violations = Violations()
        self.tokens = 0
        self.closed = 0
        self.outcomes: Counter[str] = Counter()
        self.open: dict[int, object] = {}
        self.t = 0.0

    def now(self) -> float:
        return self.t


def outcome(reason: FinishReason, *, state: str = "failed", status: int = 500, detail: str = "",
            tokens: int = 0) -> RequestOutcome:
    return RequestOutcome(1, state, reason, tokens, status, detail)


def test_soak_sink_checks_tokens_and_single_close() -> None:
    soak = _FakeSoak()
    sink = _SoakSink(soak, prompt_last=10, prompt_len=5, max_new=2, deadline_at=None, arrival=0.0)  # type: ignore[arg-type]
    good = pseudo_next_token(10, 4)
    sink.token(1, good)
    sink.token(1, (pseudo_next_token(good, 5) + 1) % 256)  # wrong token for position 5
    sink.close(outcome(FinishReason.LENGTH, state="completed", status=200, tokens=2))
    sink.close(outcome(FinishReason.LENGTH, state="completed", status=200, tokens=2))
    sink.token(1, 0)
    kinds = soak.violations.by_kind
    assert kinds == Counter({"wrong_token": 1, "closed_twice": 1, "token_after_close": 1})
    assert soak.closed == 1 and soak.tokens == 2


@pytest.mark.parametrize(("reason", "kwargs", "sink_state", "ok"), [
    (FinishReason.LENGTH, {"state": "completed", "status": 200}, {"count": 3}, True),
    (FinishReason.LENGTH, {"state": "completed", "status": 200}, {"count": 2}, False),
    (FinishReason.CANCELLED, {"status": 499}, {"cancelled": True}, True),
    (FinishReason.CANCELLED, {"status": 499}, {}, False),
    (FinishReason.DEADLINE, {"status": 504}, {"deadline_at": 5.0}, True),
    (FinishReason.DEADLINE, {"status": 504}, {"deadline_at": 50.0}, False),
    (FinishReason.ERROR, {"detail": "CCU_FAULT: job fault"}, {}, True),
    (FinishReason.ERROR, {"detail": "it broke"}, {}, False),
    (FinishReason.REJECTED, {"status": 429}, {}, True),
    (FinishReason.REJECTED, {"status": 429}, {"count": 1}, False),
    (FinishReason.STOP, {"state": "completed", "status": 200}, {}, False),
])
def test_close_must_fit_what_happened(reason: FinishReason, kwargs: dict[str, object], sink_state: dict[str, object],
                                      ok: bool) -> None:
    sink = _SoakSink(_FakeSoak(), 1, 1, max_new=3, deadline_at=None, arrival=0.0)  # type: ignore[arg-type]
    for name, value in sink_state.items():
        setattr(sink, name, value)
    problem = _close_problem(sink, outcome(reason, **kwargs), now=10.0)  # type: ignore[arg-type]
    assert (problem == "") is ok, problem


def decode_job(seqs: tuple[int, ...]) -> DecodeJob:
    b = len(seqs)
    return DecodeJob(generation=1, calbin_id=1, compiled_batch=b, engine=JobEngine.PING, buffers=None,  # type: ignore[arg-type]
                     seq_ids=seqs, token_ids=np.ones(b, dtype=np.int32), positions=np.zeros(b, dtype=np.int32),
                     lane_valid=np.ones(b, dtype=np.uint8))


def result_for(job: DecodeJob, job_id: int, rc: ReturnCode) -> JobResult:
    lanes = tuple(LaneResult(i, s, True, rc, 0, 1 if rc is ReturnCode.OK else 0, None, 7)
                  for i, s in enumerate(job.seq_ids))
    ok = rc is ReturnCode.OK
    counters = StatusCounters(1, len(lanes), len(lanes), len(lanes) if ok else 0)
    return JobResult(job_id, 1, JobKind.DECODE, JobEngine.PING, 1, job.compiled_batch, rc, lanes, counters, 0.0, 0.0,
                     None)  # type: ignore[arg-type]


def ticket(job_id: int) -> JobTicket:
    return JobTicket(job_id=job_id, generation=1, kind=JobKind.DECODE, engine=JobEngine.PING, calbin_id=1,  # type: ignore[arg-type]
                     submitted_at=0.0)


def test_quarantine_guard_flags_a_failed_jobs_sequence_reused_before_free() -> None:
    v = Violations()
    guard = QuarantineGuard(v)
    ok_job, bad_job = decode_job((1, 2)), decode_job((3, 4))
    guard.submitted(ok_job, ticket(1))
    guard.submitted(bad_job, ticket(2))
    guard.completed(result_for(ok_job, 1, ReturnCode.OK))
    guard.completed(result_for(bad_job, 2, ReturnCode.CCU_FAULT))
    assert guard.quarantined.keys() == {3, 4}
    guard.submitted(decode_job((1, 2)), ticket(3))          # fine: their job succeeded
    assert not v.items
    guard.sequence_freed(3)
    guard.submitted(decode_job((3,)), ticket(4))            # freed, then reused: fine
    guard.submitted(decode_job((4,)), ticket(5))            # still quarantined: a violation
    assert v.by_kind == Counter({"quarantined_reuse": 1})
    guard.device_reset()
    guard.submitted(decode_job((4,)), ticket(6))            # a reset drops every sequence's state
    assert v.by_kind == Counter({"quarantined_reuse": 1})


def test_soak_memory_check_flags_growth_beyond_bounded_histories() -> None:
    soak = _Soak.__new__(_Soak)
    soak.options = SoakOptions(hours=1.0, object_growth_limit=100, bounded_histories={"RequestOutcome": 1000})
    soak.violations = Violations()
    soak.memory = [MemorySample(t, 0.0, 100 << 20, None, 0) for t in (0.0, 600.0, 1200.0, 2400.0, 3600.0)]
    soak.census_start = Counter({"dict": 500, "RequestOutcome": 10})
    soak.census_end = Counter({"dict": 550, "RequestOutcome": 900})
    assert soak._memory_growth()[2] == 940 and not soak.violations.items
    soak.census_end = Counter({"dict": 700, "RequestOutcome": 900})
    soak._memory_growth()
    assert any("200 more dict objects" in v for v in soak.violations.items)
    soak.violations = Violations()
    soak.census_end = Counter({"dict": 500, "RequestOutcome": 10})
    soak.memory[-1] = MemorySample(3600.0, 0.0, 300 << 20, None, 0)
    soak._memory_growth()
    assert any("RSS grew" in v for v in soak.violations.items)


def test_tenant_stalls_measure_the_longest_gap_while_outstanding() -> None:
    from calculet.bench.tenants import tenant_stalls
    from calculet.loadsim.analysis import SimRequestRecord

    def rec(i: int, tenant: str, arrival: float, tokens: tuple[float, ...], finish: float) -> SimRequestRecord:
        return SimRequestRecord(i, tenant, "short", 10, arrival, True, service_start_s=arrival,
                                first_token_s=tokens[0] if tokens else None, token_times_s=tokens, finish_s=finish,
                                finish_reason="length" if tokens else "deadline")

    records = [rec(0, "a", 0.0, (1.0, 2.0, 3.0), 3.0),
               rec(1, "a", 10.0, (11.0,), 11.0),                  # idle 3..10 is not a stall: nothing outstanding
               rec(2, "b", 0.0, (0.5, 40.0), 40.0),               # 39.5 s without a token while outstanding
               rec(3, "c", 5.0, (), 25.0)]                        # expired without a token: 20 s
    stalls = tenant_stalls(records)
    assert stalls["a"] == (1.0, 0.0)
    assert stalls["b"] == (39.5, 0.5)
    assert stalls["c"] == (20.0, 5.0)


def test_goodput_leads_the_report_with_the_offline_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #13: goodput, on-time fraction, bound (with its method) and wasted share, in report and JSON."""
    out = tmp_path / "overload"
    argv = ["run", "--preset", "overload", "--loads", "2", "--duration", "30", "--quiet", "--deadline-scale", "0.5",
            "--policies", "b1-serial-fcfs,calculet-b1@strict", "--out", str(out)]
    code, _, _ = run_cli(argv, capsys)
    assert code == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert report.index("## Goodput") < report.index("## Headline figures")
    assert "| load | policy | goodput /s | on-time fraction | on time | bound (method, ×) |" in report
    assert "Deadlines scaled by 0.5." in report and "goodput_vs_load.png" in report
    assert (out / "goodput_vs_load.png").read_bytes().startswith(b"\x89PNG")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["deadline_scale"] == 0.5
    for row in summary["runs"]:
        assert 0 <= row["on_time"] <= row["offline_bound"]["on_time"] <= row["offered"]
        assert row["offline_bound"]["method"] and 0.0 <= row["wasted_share"] <= 1.0
        assert row["goodput_per_s"] == pytest.approx(row["on_time"] / 30, rel=0.5)
    rows = {r["policy"]: r for r in summary["runs"]}
    assert rows["b1-serial-fcfs"]["device_figures_from"] == "records"
    assert rows["calculet-b1@strict"]["device_figures_from"] == "engine"


def test_goodput_comparison_in_one_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #13 item 7: B1 (shared) and B16, tight and loose, FCFS/strict/at_risk/on_time, checks per point."""
    out = tmp_path / "goodput"
    code, _, _ = run_cli(["goodput", "--multiples", "2", "--duration", "6", "--quiet", "--out", str(out)], capsys)
    assert code == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert report.index("## Acceptance") < report.index("## Figures")
    for arm in ("b1-tight", "b1-loose", "b16-tight", "b16-loose"):
        assert (out / arm / "report.md").exists() and f"({arm}/report.md)" in report
    summary = json.loads((out / "summary.json").read_text())
    assert [(a["device"], a["deadline"]) for a in summary["arms"]] == [
        ("calculet-b1-shared", "tight"), ("calculet-b1-shared", "loose"), ("calculet-b16", "tight"),
        ("calculet-b16", "loose")]
    for device, multiple, checks in checks_from_json(summary):
        [point] = [p for a in summary["arms"] if a["device"] == device for p in a["points"]][:1]
        assert multiple == 2.0 and len(checks) == 4 and all(c.met is not None for c in checks)
        assert [f["policy"] for f in point["figures"]][0] == "b1-serial-fcfs"
        verdict = " met |" if checks[0].met else " **missed** |"
        assert checks[0].value + verdict in report


def test_all_without_a_soak_keeps_the_committed_soaks_in_its_index(tmp_path: Path) -> None:
    from calculet.bench.commands import _committed_soaks

    (tmp_path / "soak-b1").mkdir()
    (tmp_path / "soak-b1" / "soak.json").write_text(json.dumps(
        {"ok": True, "virtual_s": 7200, "wall_s": 60, "speedup": 120, "submitted": 10, "injected": {"a": 2},
         "violations": []}))
    (tmp_path / "soak-broken").mkdir()  # no soak.json: not listed
    lines = _committed_soaks(tmp_path)
    assert lines[0] == "### [soak-b1](soak-b1/soak.md)" and "Not re-run" in lines[2]
    assert lines[4] == ("PASS: 2.0 h of virtual time in 1.0 min wall (120x real time); 10 requests; 2 faults "
                        "injected; 0 violations.") and len(lines) == 6


def test_all_names_the_policies_its_preset_sweeps_left_out() -> None:
    from calculet.bench.commands import _omitted_policies
    from calculet.loadsim.policies import POLICIES

    assert _omitted_policies("all") == []
    note = _omitted_policies("b1-serial-fcfs,calculet-b16")
    assert "`calculet-b1-shared`" in note[1] and "`calculet-b16`" not in note[1] and "`b1-serial-fcfs`" not in note[1]
    assert all(f"`{n}`" in note[1] for n in POLICIES if n not in ("b1-serial-fcfs", "calculet-b16"))
