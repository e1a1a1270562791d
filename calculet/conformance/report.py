"""The evidence report as Markdown (for people) beside its JSON (for the service, §20).

Why both: the JSON (:class:`~calculet.adapters.calrt.evidence.DeviceEvidence`) is what
``device.evidence`` names and the service checks; the Markdown states the same facts per
capability — the spec's tier, the tier established, the checks behind it and what a real board
still needs — so an operator can read why a capability is or is not offered.
"""

from __future__ import annotations

from calculet.adapters.calrt.evidence import DeviceEvidence
from calculet.conformance.capabilities import EARNINGS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _needs(name: str) -> str:
    key = "profile.b1" if name == "profile.b1" else "profile.bN" if name.startswith("profile.b") else name
    return EARNINGS[key].board_needs


def markdown(evidence: DeviceEvidence) -> str:
    """The report: verdict, findings, capabilities, then every check with its evidence."""
    verdict = "PASS" if evidence.passed else "FAIL"
    out = [
        f"# Conformance report: device `{evidence.device}`", "",
        f"- verdict: **{verdict}** ({sum(c.status == 'pass' for c in evidence.checks)} passed, "
        f"{sum(c.status == 'fail' for c in evidence.checks)} failed, "
        f"{sum(c.status == 'not_run' for c in evidence.checks)} not run of {len(evidence.checks)} checks)",
        f"- simulated device: {'yes — it earns no tier; every tier below stays the spec’s (§20)' if evidence.simulated else 'no'}",
        f"- package: `{evidence.package_name}`, manifest sha256 `{evidence.package_sha256}`",
        f"- CalRT {evidence.calrt_version}; profiles {', '.join(f'B{b}' for b in evidence.profiles)}",
        f"- format `{evidence.format}`; the service offers a capability above C3 only with a passing report "
        "for its device and package (`device.evidence`)", "",
    ]
    if evidence.findings:
        out += ["## Findings", "", "| finding | check | detail |", "|---|---|---|"]
        out += [f"| `{f.code}` | {f.check} | {_cell(f.detail)} |" for f in evidence.findings]
        out.append("")
    out += ["## Capabilities", "",
            "| capability | spec tier | established here | checks | note | what a real board needs |",
            "|---|---|---|---|---|---|"]
    for c in evidence.capabilities:
        est = c.established.value if c.established is not None else ("—" if c.passed else "FAILED")
        out.append(f"| {c.name} | {c.spec_tier.value} | {est} | {', '.join(c.checks) or '—'} | {_cell(c.note)} | "
                   f"{_cell(_needs(c.name))} |")
    out += ["", "## Checks", "", "| check | spec | status | evidence |", "|---|---|---|---|"]
    for check in evidence.checks:
        detail = "; ".join(check.evidence) + ("; " if check.evidence and check.findings else "") + \
            "; ".join(f"**{f.code}**: {f.detail}" for f in check.findings)
        out.append(f"| `{check.id}` — {_cell(check.title)} | {check.ref} | {check.status} | {_cell(detail)} |")
    return "\n".join(out) + "\n"
