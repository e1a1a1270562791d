"""Conformance evidence: what the kit established for one device and package, and what the service
may therefore offer (§1 tiers, §18 matrix, §20 "until these are delivered ... still C3").

Why: a tier above C3 is a claim about hardware, and the spec accepts it only with evidence. The
conformance kit (``python -m calculet.conformance``) writes a :class:`DeviceEvidence` as JSON; the
service reads it and :func:`offered_capabilities` decides, capability by capability, what is
offered:

* a capability rated by the spec (source ``spec``) or offered by the simulator (``simulated``)
  keeps the spec's tier — the spec's statement about CalRT 0.7.6 — unless a *passing* report for
  *this device and this package* establishes a better tier for it, and it is switched on; then it is
  offered at that tier with source ``measured``;
* a capability a vendor package *claims* above C3 (source ``vendor``/``measured``) is offered at
  that tier only when the report establishes at least that tier; otherwise it is refused: offered at
  C3 with the refusal recorded (:attr:`OfferedContract.refused`);
* a simulated device never establishes a tier (``simulated`` reports keep every spec rating).

A report for another device, another package (manifest sha256) or one that did not pass is not
evidence (:attr:`OfferedContract.evidence_problem` says why).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from calculet.adapters.calrt.capabilities import (
    Capability,
    ContextOp,
    ContextOps,
    DeviceCapabilities,
    EvidenceSource,
    EvidenceTier,
    profile_tier,
)
from calculet.errors import ConfigError

EVIDENCE_FORMAT = "calculet-conformance/v1"

TIER_ORDER: tuple[EvidenceTier, ...] = (EvidenceTier.C0, EvidenceTier.C1, EvidenceTier.C1_C2, EvidenceTier.C2,
                                        EvidenceTier.C2_C3, EvidenceTier.C3, EvidenceTier.C4)
"""Best first. "Above C3" means earlier in this order (C0–C2/C3)."""


def better(a: EvidenceTier, b: EvidenceTier) -> bool:
    """True when tier ``a`` claims more than tier ``b`` (C0 is the best, C4 unsupported)."""
    return TIER_ORDER.index(a) < TIER_ORDER.index(b)


def above_c3(tier: EvidenceTier) -> bool:
    return better(tier, EvidenceTier.C3)


@dataclass(frozen=True)
class CapabilityEvidence:
    """One capability (or ``profile.bN``) as the kit established it."""

    name: str
    spec_tier: EvidenceTier
    established: EvidenceTier | None
    """The tier the kit's checks support on this device; None when its checks failed or could not run."""
    passed: bool
    checks: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Finding:
    """A conformance failure: a stable code (what is wrong), the check that saw it, and the detail."""

    code: str
    check: str
    detail: str


@dataclass(frozen=True)
class CheckOutcome:
    """One check of the kit: passed, failed (findings) or not run (why)."""

    id: str
    title: str
    ref: str
    status: str
    """``pass``, ``fail`` or ``not_run``."""
    evidence: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class DeviceEvidence:
    """A conformance report: for one device plug-in and one package (by manifest sha256)."""

    device: str
    simulated: bool
    package_name: str
    package_sha256: str
    calrt_version: str
    profiles: tuple[int, ...]
    checks: tuple[CheckOutcome, ...]
    capabilities: tuple[CapabilityEvidence, ...]
    format: str = EVIDENCE_FORMAT

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for c in self.checks for f in c.findings)

    @property
    def finding_codes(self) -> frozenset[str]:
        return frozenset(f.code for f in self.findings)

    @property
    def passed(self) -> bool:
        return not self.findings

    def capability(self, name: str) -> CapabilityEvidence | None:
        return next((c for c in self.capabilities if c.name == name), None)

    def to_json(self) -> str:
        data = asdict(self)
        data["passed"] = self.passed
        return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DeviceEvidence:
        data = json.loads(text)
        if data.get("format") != EVIDENCE_FORMAT:
            raise ConfigError(f"evidence: format {data.get('format')!r} is not {EVIDENCE_FORMAT!r}",
                              errors=[("device.evidence", "unknown evidence format")])
        checks = tuple(CheckOutcome(c["id"], c["title"], c["ref"], c["status"], tuple(c["evidence"]),
                                    tuple(Finding(**f) for f in c["findings"])) for c in data["checks"])
        caps = tuple(CapabilityEvidence(c["name"], EvidenceTier(c["spec_tier"]),
                                        None if c["established"] is None else EvidenceTier(c["established"]),
                                        c["passed"], tuple(c["checks"]), c.get("note", ""))
                     for c in data["capabilities"])
        return cls(data["device"], bool(data["simulated"]), data["package_name"], data["package_sha256"],
                   data["calrt_version"], tuple(data["profiles"]), checks, caps)

    @classmethod
    def load(cls, path: str | Path) -> DeviceEvidence:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"device.evidence: cannot read {path}: {exc.strerror or exc}",
                              errors=[("device.evidence", "unreadable")]) from exc
        try:
            return cls.from_json(text)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"device.evidence: {path} is not a conformance report: {exc}",
                              errors=[("device.evidence", "not a conformance report")]) from exc


@dataclass(frozen=True)
class OfferedContract:
    """The capability contract the service offers, and why anything was refused."""

    capabilities: DeviceCapabilities
    evidence_problem: str | None
    """None when a report was given and accepted; otherwise why there is no evidence."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Capability name → why its claimed tier above C3 was refused (offered at C3)."""
    earned: Mapping[str, EvidenceTier] = field(default_factory=dict)
    """Capability name → the tier a passing report established (offered as ``measured``)."""
    profiles: Mapping[int, EvidenceTier] = field(default_factory=dict)
    """Compiled batch → the tier its profile is offered at (the spec's, or a better one a passing
    report established as ``profile.bN``)."""


def evidence_problem(evidence: DeviceEvidence | None, *, device: str, package_sha256: str) -> str | None:
    """Why ``evidence`` is not evidence for this device and package (None: it is)."""
    if evidence is None:
        return "no conformance report"
    if evidence.device != device:
        return f"the report is for device {evidence.device!r}, not {device!r}"
    if evidence.package_sha256 != package_sha256:
        return f"the report is for package {evidence.package_sha256[:12]}…, not {package_sha256[:12]}…"
    if not evidence.passed:
        return f"the report did not pass ({', '.join(sorted(evidence.finding_codes))})"
    if evidence.simulated:
        return "the report is of a simulated device, which earns no tier (§20)"
    return None


def _enabled(value: object) -> bool:
    return value not in (False, 0) and getattr(value, "value", value) != "empty"


def _offer(cap: Capability[Any], evidence: DeviceEvidence | None, refused: dict[str, str],
           earned: dict[str, EvidenceTier]) -> Capability[Any]:
    found = evidence.capability(cap.name) if evidence is not None else None
    established = found.established if found is not None and found.passed else None
    if cap.source in (EvidenceSource.SPEC, EvidenceSource.SIMULATED):
        if established is not None and better(established, cap.tier) and _enabled(cap.value):
            earned[cap.name] = established
            return Capability(cap.name, cap.value, established, EvidenceSource.MEASURED,
                              f"{cap.ref}; conformance evidence")
        return cap
    if not above_c3(cap.tier):
        return cap
    if established is not None and not better(cap.tier, established):
        earned[cap.name] = cap.tier
        return Capability(cap.name, cap.value, cap.tier, EvidenceSource.MEASURED, f"{cap.ref}; conformance evidence")
    refused[cap.name] = (f"claimed {cap.tier.value} by the {cap.source.value}, but no passing conformance report "
                         f"establishes it; offered at C3")
    return Capability(cap.name, cap.value, EvidenceTier.C3, EvidenceSource.VENDOR, cap.ref)


def _profile_tier(batch: int, evidence: DeviceEvidence | None) -> EvidenceTier:
    spec = profile_tier(batch)
    found = evidence.capability(f"profile.b{batch}") if evidence is not None else None
    if found is not None and found.passed and found.established is not None and better(found.established, spec):
        return found.established
    return spec


def offered_capabilities(contract: DeviceCapabilities, evidence: DeviceEvidence | None, *, device: str,
                         package_sha256: str, batches: Sequence[int] = ()) -> OfferedContract:
    """The contract the service may offer for ``device`` serving the package ``package_sha256``
    (and the tier of each served profile in ``batches``)."""
    problem = evidence_problem(evidence, device=device, package_sha256=package_sha256)
    accepted = evidence if problem is None else None
    refused: dict[str, str] = {}
    earned: dict[str, EvidenceTier] = {}
    ops = contract.context_ops
    new_ops = ContextOps(**{op.value: _offer(ops.support(op), accepted, refused, earned) for op in ContextOp})
    kwargs: dict[str, Any] = {}
    for name in DeviceCapabilities.__dataclass_fields__:
        kwargs[name] = new_ops if name == "context_ops" else _offer(getattr(contract, name), accepted, refused, earned)
    return OfferedContract(replace(contract, **kwargs), problem, refused, earned,
                           {b: _profile_tier(b, accepted) for b in batches})


__all__ = ["EVIDENCE_FORMAT", "TIER_ORDER", "CapabilityEvidence", "CheckOutcome", "DeviceEvidence", "Finding",
           "OfferedContract", "above_c3", "better", "evidence_problem", "offered_capabilities"]
