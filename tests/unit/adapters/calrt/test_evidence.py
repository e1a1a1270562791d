"""What the service may offer from a conformance report (§1, §20, R20.7): above C3 only with a
passing report for this device and this package; a simulated device earns nothing."""

from __future__ import annotations

import dataclasses

import pytest

from calculet.adapters.calrt import Capability, DeviceCapabilities, EvidenceSource, EvidenceTier
from calculet.adapters.calrt.evidence import (
    CapabilityEvidence,
    CheckOutcome,
    DeviceEvidence,
    Finding,
    better,
    offered_capabilities,
)
from calculet.errors import ConfigError

SHA = "ab" * 32


def evidence(*caps: CapabilityEvidence, device: str = "board", simulated: bool = False, sha: str = SHA,
             findings: tuple[Finding, ...] = ()) -> DeviceEvidence:
    check = CheckOutcome("kv.reset_clean", "reset", "§12", "fail" if findings else "pass", ("seen",), findings)
    return DeviceEvidence(device, simulated, "pkg", sha, "0.7.6", (1, 4), (check,), caps)


RESET_C2 = CapabilityEvidence("reset_configuration_verified", EvidenceTier.C3, EvidenceTier.C2, True,
                              ("kv.reset_clean",), "correct under the kit")


def contract(**changes: Capability[object]) -> DeviceCapabilities:
    return dataclasses.replace(DeviceCapabilities.calrt_076_current(), **changes)


def enabled_reset(source: EvidenceSource = EvidenceSource.SIMULATED, tier: EvidenceTier = EvidenceTier.C3
                  ) -> Capability[bool]:
    return Capability("reset_configuration_verified", True, tier, source, "§12")


def test_tier_order_puts_c0_first() -> None:
    assert better(EvidenceTier.C0, EvidenceTier.C3) and better(EvidenceTier.C2, EvidenceTier.C3)
    assert not better(EvidenceTier.C4, EvidenceTier.C3)


def test_without_evidence_nothing_rises_above_the_spec_tier() -> None:
    """R20.7: no report, no tier above C3 for a capability the spec rates C3."""
    offered = offered_capabilities(contract(reset_configuration_verified=enabled_reset()), None,
                                   device="board", package_sha256=SHA)
    assert offered.evidence_problem == "no conformance report"
    assert offered.capabilities.reset_configuration_verified.tier is EvidenceTier.C3
    assert not offered.earned


def test_a_vendor_claim_above_c3_is_refused_without_evidence() -> None:
    """R20.7: a package claiming C2 from the vendor is offered at C3 with the refusal recorded."""
    claimed = contract(reset_configuration_verified=enabled_reset(EvidenceSource.VENDOR, EvidenceTier.C2))
    offered = offered_capabilities(claimed, None, device="board", package_sha256=SHA)
    cap = offered.capabilities.reset_configuration_verified
    assert cap.tier is EvidenceTier.C3
    assert "no passing conformance report" in offered.refused["reset_configuration_verified"]


def test_a_passing_report_for_this_device_and_package_earns_the_tier() -> None:
    offered = offered_capabilities(contract(reset_configuration_verified=enabled_reset()), evidence(RESET_C2),
                                   device="board", package_sha256=SHA)
    assert offered.evidence_problem is None
    cap = offered.capabilities.reset_configuration_verified
    assert (cap.tier, cap.source) == (EvidenceTier.C2, EvidenceSource.MEASURED)
    assert offered.earned == {"reset_configuration_verified": EvidenceTier.C2}
    vendor = contract(reset_configuration_verified=enabled_reset(EvidenceSource.VENDOR, EvidenceTier.C2))
    kept = offered_capabilities(vendor, evidence(RESET_C2), device="board", package_sha256=SHA)
    assert kept.capabilities.reset_configuration_verified.tier is EvidenceTier.C2 and not kept.refused


@pytest.mark.parametrize(("report", "problem"), [
    (evidence(RESET_C2, device="other"), "for device 'other'"),
    (evidence(RESET_C2, sha="cd" * 32), "for package"),
    (evidence(RESET_C2, findings=(Finding("stale_kv_after_reset", "kv.reset_clean", "x"),)), "did not pass"),
    (evidence(RESET_C2, simulated=True), "simulated device"),
])
def test_a_report_for_something_else_is_not_evidence(report: DeviceEvidence, problem: str) -> None:
    offered = offered_capabilities(contract(reset_configuration_verified=enabled_reset()), report,
                                   device="board", package_sha256=SHA)
    assert offered.evidence_problem is not None and problem in offered.evidence_problem
    assert offered.capabilities.reset_configuration_verified.tier is EvidenceTier.C3


def test_a_switched_off_capability_earns_nothing() -> None:
    offered = offered_capabilities(contract(), evidence(RESET_C2), device="board", package_sha256=SHA)
    assert offered.capabilities.reset_configuration_verified.tier is EvidenceTier.C3


def test_the_json_round_trips_and_a_foreign_file_is_refused(tmp_path: object) -> None:
    report = evidence(RESET_C2, findings=(Finding("lane_crosstalk", "kv.reset_clean", "swapped"),))
    assert DeviceEvidence.from_json(report.to_json()) == report
    with pytest.raises(ConfigError, match="format"):
        DeviceEvidence.from_json('{"format": "other/v9"}')
