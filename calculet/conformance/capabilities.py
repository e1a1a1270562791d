"""Which checks earn which capability, and what a real board needs for it (§1, §9.3, §18, §19, §20).

Why one table: the report, the README's capability table and the service's evidence gate must
agree on what a passing check proves. The rule is deliberately modest:

* a capability the spec rates C0 (B1 serial, append/decode) is *confirmed* at C0 when its checks pass;
* a capability the spec rates C4 (the §9.3 empty operations, a second physical device) is
  confirmed C4 when the device refuses it as the contract says;
* any other capability that the package switches on is established at **C2** when its checks pass
  on a real device — correct under the kit; §19's acceptance (24 h soak, throughput and P99
  against B1) is what would make it C0, and the kit does not run that;
* a capability whose checks could not run, or which the kit has no check for, is not established;
* a simulated device establishes nothing above the spec's tier: its report shows the checks pass,
  and every tier stays the spec's (§20).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calculet.adapters.calrt import SPEC_RATINGS, ContextOpSupport, DeviceCapabilities, EvidenceTier, profile_tier
from calculet.adapters.calrt.evidence import CapabilityEvidence, CheckOutcome


@dataclass(frozen=True)
class Earning:
    """How one capability is earned: the checks it rests on and what a board must deliver."""

    checks: tuple[str, ...]
    board_needs: str


EARNINGS: Mapping[str, Earning] = {
    "profile.b1": Earning(("matrix.single_sequence", "matrix.two_sequences", "status.counters",
                           "lifecycle.load_unload"),
                          "the current calbin and CalRT 0.7.6 (the shipped product)"),
    "profile.bN": Earning(("vendor.profiles", "lanes.fill_and_identity", "kv.inactive_lanes_silent",
                           "status.counters", "kv.commit_atomic"),
                          "a B4/B8/B16 calbin with its mask tensor/CSR, KV layout and inactive-lane contract (§7.3, §20)"),
    "ping_pong": Earning(("pingpong.two_jobs", "status.counters"),
                         "the vendor's PING/PONG timing and in-flight limit (§14, §20)"),
    "max_inflight_jobs": Earning(("pingpong.two_jobs",), "the vendor's maximum in-flight jobs (§20)"),
    "ping_pong_overlap": Earning((), "a device trace showing two jobs computing at once (§14); the kit has no trace"),
    "lane_failure_isolation": Earning((), "the vendor's statement of lane-level failure and KV contamination scope "
                                          "(§7.4, §20) and a lane-targeted fault hook; the kit has none"),
    "reset_configuration_verified": Earning(("kv.reset_clean", "fault.timeout_reset", "kv.commit_atomic"),
                                            "ResetConfiguration that discards jobs and KV (§12)"),
    "reset_domain": Earning(("kv.reset_clean",), "the vendor's reset domain (§13.2, §20)"),
    "multi_profile_residency": Earning(("lanes.fill_and_identity",),
                                       "an official API for several resident profiles (§8, §20)"),
    "incremental_prefill": Earning(("prefill.incremental",), "a chunked-prefill calbin and runtime support (§6)"),
    "model_coresidency": Earning((), "the §13.2 multi-model runtime contract; the kit has no check"),
    "configure_device_global": Earning((), "the §13.2 contract (configure scope); the kit has no check"),
    "chiplet_scoped_models": Earning((), "two single-chiplet calbins with chip-scoped configure/queue/reset (§13.3)"),
    "physical_devices_per_process": Earning(("vendor.runtime",), "a runtime after 0.7.6 with device selection (§20)"),
    "ctx.append_decode": Earning(("matrix.single_sequence", "lanes.fill_and_identity", "kv.commit_atomic"),
                                 "the shipped decode path with its KV transaction"),
    "ctx.remove_tail": Earning(("ctx.operations",), "RemoveTokensAtEnd boundary tests passing (§9.3)"),
    "ctx.shift": Earning((), "closed-loop llama shift semantics (§9.3); the kit has no check"),
    "ctx.copy_prefix": Earning(("ctx.operations",), "a non-empty CopyPrefix implementation (§9.3)"),
    "ctx.keep_one_seq": Earning(("ctx.operations",), "a non-empty KeepOneSeq implementation (§9.3)"),
    "ctx.position_add_div": Earning(("ctx.operations",), "non-empty PositionAdd/Div implementations (§9.3)"),
    "ctx.save_load_session": Earning(("ctx.operations",), "non-empty Save/LoadSession implementations (§9.3)"),
}


def _enabled(value: object) -> bool:
    return value not in (False, 0) and value is not ContextOpSupport.EMPTY


def establish(name: str, spec_tier: EvidenceTier, enabled: bool, outcomes: Mapping[str, CheckOutcome],
              simulated: bool) -> CapabilityEvidence:
    """What the checks establish for one capability (the rule of the module docstring)."""
    earning = EARNINGS[name]
    used = tuple(c for c in earning.checks if c in outcomes)
    failed = [c for c in used if outcomes[c].status == "fail"]
    not_run = [c for c in earning.checks if c not in outcomes or outcomes[c].status == "not_run"]
    if failed:
        return CapabilityEvidence(name, spec_tier, None, False, used, f"failed: {', '.join(failed)}")
    if not earning.checks or not_run:
        why = "no check in this kit" if not earning.checks else f"not run: {', '.join(not_run)}"
        return CapabilityEvidence(name, spec_tier, None, True, used, f"{why}; needs {earning.board_needs}")
    if simulated:
        return CapabilityEvidence(name, spec_tier, spec_tier, True, used,
                                  "checks pass on a simulated device, which earns no tier (§20)")
    if spec_tier in (EvidenceTier.C0, EvidenceTier.C4):
        return CapabilityEvidence(name, spec_tier, spec_tier, True, used, "confirmed as the spec rates it")
    if not enabled:
        return CapabilityEvidence(name, spec_tier, None, True, used, "switched off in this package; nothing to earn")
    return CapabilityEvidence(name, spec_tier, EvidenceTier.C2, True, used,
                              "correct under the kit; §19 acceptance (soak, throughput, P99) is needed for C0")


def capability_evidence(batches: Sequence[int], contract: DeviceCapabilities, outcomes: Sequence[CheckOutcome],
                        simulated: bool) -> tuple[CapabilityEvidence, ...]:
    """Every capability of the contract plus ``profile.b1`` / ``profile.bN`` (one row per B>1 profile)."""
    by_id = {o.id: o for o in outcomes}
    rows: list[CapabilityEvidence] = []
    for b in sorted(batches):
        row = establish("profile.b1" if b == 1 else "profile.bN", profile_tier(b), True, by_id, simulated)
        rows.append(CapabilityEvidence(f"profile.b{b}", row.spec_tier, row.established, row.passed, row.checks,
                                       row.note))
    for cap in contract.all():
        rows.append(establish(cap.name, SPEC_RATINGS[cap.name].tier, _enabled(cap.value), by_id, simulated))
    return tuple(rows)
