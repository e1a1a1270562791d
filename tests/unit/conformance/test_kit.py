"""The conformance kit (#18): the simulator passes every check and earns no tier; each of the five
broken devices fails with exactly its finding; a board's passing report earns C2 (§1, §9.2, §12,
§14, §18, §20). R7.3.1 R7.4.3 R9.2.1 R9.2.2 R9.2.5 R9.2.6 R12.7 R14.5 R14.6 R20.7"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from calculet.adapters.calrt import EvidenceTier, VirtualDevice
from calculet.adapters.calrt.evidence import DeviceEvidence
from calculet.adapters.devices import FaultHooks
from calculet.conformance import CHECKS, run_conformance, simulator_package
from calculet.conformance.__main__ import main
from calculet.conformance.faulty import EXPECTED_FINDINGS, FAULTY_DEVICES, Breakage, FaultyDevicePlugin
from calculet.conformance.specs import simulator_evidence
from tests.unit.conformance.fake_board import PLUGIN as BOARD
from tests.unit.conformance.fake_board import FakeBoard

FAULT_CHECKS = {"kv.commit_atomic", "fault.timeout_reset"}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield simulator_package(tmp_path_factory.mktemp("conformance"))


def test_the_simulator_passes_every_check_and_earns_no_tier() -> None:
    """§20: the simulator's report passes, and every tier in it is the spec's own."""
    report = simulator_evidence()
    assert report.passed and report.simulated
    assert [c.id for c in report.checks] == [c[0] for c in CHECKS]
    assert {c.status for c in report.checks} == {"pass"}
    for cap in report.capabilities:
        assert cap.established in (None, cap.spec_tier), cap
    assert report.capability("profile.b16") is not None


@pytest.mark.parametrize("breakage", list(Breakage), ids=[b.value for b in Breakage])
def test_each_broken_device_fails_with_exactly_its_finding(breakage: Breakage, package: Path) -> None:
    """One test per broken device: the kit's findings are that one code, nothing else (R7.3.1 inactive
    lanes, R14.5 crosstalk, R14.6 counters, R9.2.5 atomic commit, R12.7 reset)."""
    plugin = FAULTY_DEVICES[f"faulty-{breakage.value}"]
    report = run_conformance(plugin, package)
    assert not report.passed
    assert report.finding_codes == {EXPECTED_FINDINGS[breakage]}, [(f.code, f.detail) for f in report.findings]
    failed = {c.id for c in report.checks if c.status == "fail"}
    assert failed and all(f.check in failed for f in report.findings)


def test_a_board_that_passes_earns_c2_for_what_its_package_switches_on(package: Path) -> None:
    """A non-simulated device: passing checks establish C2 for C3-rated capabilities, confirm C0/C4."""
    report = run_conformance(BOARD, package)
    assert report.passed and not report.simulated
    tiers = {c.name: c.established for c in report.capabilities}
    assert tiers["profile.b1"] is EvidenceTier.C0
    assert tiers["profile.b4"] is EvidenceTier.C2 and tiers["profile.b16"] is EvidenceTier.C2
    assert tiers["reset_configuration_verified"] is EvidenceTier.C2
    assert tiers["ctx.copy_prefix"] is EvidenceTier.C4
    assert tiers["ping_pong_overlap"] is None and tiers["lane_failure_isolation"] is None


@dataclass(frozen=True)
class HooklessBoard(FakeBoard):
    name: str = "hookless"

    def fault_hooks(self, device: VirtualDevice) -> FaultHooks | None:
        return None


def test_without_fault_hooks_the_fault_checks_do_not_run_and_earn_nothing(package: Path) -> None:
    report = run_conformance(HooklessBoard(), package)
    assert report.passed
    assert {c.id for c in report.checks if c.status == "not_run"} == FAULT_CHECKS
    reset = report.capability("reset_configuration_verified")
    assert reset is not None and reset.established is None and "not run" in reset.note


def test_the_cli_writes_markdown_and_json_and_exits_1_on_a_finding(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "faulty-counters", "--out", str(tmp_path)]) == 1
    data = json.loads((tmp_path / "conformance-faulty-counters.json").read_text())
    assert data["passed"] is False and data["device"] == "faulty-counters"
    report = DeviceEvidence.from_json((tmp_path / "conformance-faulty-counters.json").read_text())
    assert report.finding_codes == {"status_counters"}
    md = (tmp_path / "conformance-faulty-counters.md").read_text()
    assert "verdict: **FAIL**" in md and "`status_counters`" in md
    assert "status_counters" in capsys.readouterr().out
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "sim\tsimulated" in listed and "faulty-crosstalk" in listed
    assert main(["--device", "no-such-board"]) == 2


def test_every_broken_device_has_a_distinct_finding() -> None:
    assert len(set(EXPECTED_FINDINGS.values())) == len(Breakage) == len(FAULTY_DEVICES)
    assert all(isinstance(p, FaultyDevicePlugin) and p.simulated for p in FAULTY_DEVICES.values())
