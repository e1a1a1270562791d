"""The capability contract: what the vendor has answered, at which evidence tier (§1, §7.3, §9.3,
§13.2, §14, §20).

Each :class:`Capability` carries the tier C0–C4 *as the spec rates it* (§1, :data:`SPEC_RATINGS`)
and where its value came from (:class:`EvidenceSource`), so nobody mistakes a simulated
capability for a proved one (§20, R20.7; DESIGN principle 8). :class:`DeviceCapabilities` asks
one question per field; :class:`ContextOps` is the §9.3 table as a contract.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

from calculet.errors import DefinitionError


class EvidenceTier(str, enum.Enum):
    """The spec's capability tiers (§1; definitions inferred in translator's note 1).

    C0 shipped/stable; C1/C2 SDK hint or experimental; C3 designed, awaiting vendor artifacts or
    evidence; C4 unsupported by the current runtime. The spec writes ranges ("C1/C2", "C2/C3");
    they are kept as values so a manifest can quote the spec exactly.
    """

    C0 = "C0"
    C1 = "C1"
    C1_C2 = "C1/C2"
    C2 = "C2"
    C2_C3 = "C2/C3"
    C3 = "C3"
    C4 = "C4"


class EvidenceSource(str, enum.Enum):
    """Where a capability's *value* comes from (independent of its tier)."""

    SPEC = "spec"
    """The spec's statement about CalRT 0.7.6 and the current calbin."""
    SIMULATED = "simulated"
    """Offered by the simulated NPU so the software path can be tested; proves nothing (§20)."""
    VENDOR = "vendor"
    """A delivered vendor contract (§20)."""
    MEASURED = "measured"
    """Measured on the NPU (§18, §19)."""


@dataclass(frozen=True)
class SpecRating:
    """How the spec rates one capability: its tier and the section that says so."""

    tier: EvidenceTier
    ref: str


SPEC_RATINGS: Mapping[str, SpecRating] = {
    "incremental_prefill": SpecRating(EvidenceTier.C3, "§6"),
    "lane_failure_isolation": SpecRating(EvidenceTier.C3, "§7.4, §20"),
    "max_inflight_jobs": SpecRating(EvidenceTier.C1_C2, "§1, §14, §20"),
    "ping_pong": SpecRating(EvidenceTier.C1_C2, "§1, §14"),
    "ping_pong_overlap": SpecRating(EvidenceTier.C1_C2, "§14 (a trace is needed to prove overlap)"),
    "multi_profile_residency": SpecRating(EvidenceTier.C3, "§8, §20"),
    "model_coresidency": SpecRating(EvidenceTier.C3, "§1, §13.1, §13.2"),
    "configure_device_global": SpecRating(EvidenceTier.C3, "§11, §13.2 (R11.15)"),
    "reset_domain": SpecRating(EvidenceTier.C3, "§13.2, §20"),
    "reset_configuration_verified": SpecRating(EvidenceTier.C3, "§12"),
    "chiplet_scoped_models": SpecRating(EvidenceTier.C3, "§1, §13.3"),
    "physical_devices_per_process": SpecRating(EvidenceTier.C4, "§1, §3"),
    "ctx.append_decode": SpecRating(EvidenceTier.C0, "§9.3"),
    "ctx.remove_tail": SpecRating(EvidenceTier.C1_C2, "§9.3 (RemoveTokensAtEnd boundary tests pending)"),
    "ctx.copy_prefix": SpecRating(EvidenceTier.C4, "§9.3 (empty implementation)"),
    "ctx.keep_one_seq": SpecRating(EvidenceTier.C4, "§9.3 (empty implementation)"),
    "ctx.position_add_div": SpecRating(EvidenceTier.C4, "§9.3 (empty implementation)"),
    "ctx.save_load_session": SpecRating(EvidenceTier.C4, "§9.3 (empty implementation)"),
    "ctx.shift": SpecRating(EvidenceTier.C1_C2, "§9.3 (DoShift: llama semantics not closed-loop)"),
}
"""The spec's tier for every capability in :class:`DeviceCapabilities` (§1 table, §9.3 table).

Profiles are rated separately (:func:`profile_tier`): B1 serial is C0, B4/B8/B16 are C3.
"""


def profile_tier(compiled_batch: int) -> EvidenceTier:
    """§1: single-graph B1 serial is C0 (current product); decode B4/B8/B16 needs a new calbin: C3."""
    return EvidenceTier.C0 if compiled_batch == 1 else EvidenceTier.C3


_T = TypeVar("_T")


@dataclass(frozen=True)
class Capability(Generic[_T]):
    """One answer of the capability contract, with the evidence behind it.

    ``tier`` is the spec's rating of the capability. A value from the spec or from the simulator
    must carry exactly that tier: only a vendor contract or a measurement can move a capability
    to another tier (§20: "until these are delivered ... the hardware capability is still C3").
    """

    name: str
    value: _T
    tier: EvidenceTier
    source: EvidenceSource
    ref: str

    def __post_init__(self) -> None:
        rating = SPEC_RATINGS.get(self.name)
        if rating is None:
            raise DefinitionError(f"unknown capability {self.name!r}; known: {sorted(SPEC_RATINGS)}")
        if self.source in (EvidenceSource.SPEC, EvidenceSource.SIMULATED) and self.tier is not rating.tier:
            raise DefinitionError(
                f"capability {self.name!r} claims tier {self.tier.value} from source "
                f"{self.source.value!r}, but the spec rates it {rating.tier.value} ({rating.ref}); "
                "only vendor or measured evidence can change a tier (§20)")

    @property
    def simulated(self) -> bool:
        """True when the value exists only because the simulated NPU offers it."""
        return self.source is EvidenceSource.SIMULATED

    @property
    def proved(self) -> bool:
        """True only for shipped (C0) capabilities whose value is not a simulation."""
        return self.tier is EvidenceTier.C0 and not self.simulated

    @classmethod
    def rated(cls, name: str, value: _T, source: EvidenceSource = EvidenceSource.SPEC) -> Capability[_T]:
        """A capability at the spec's own tier (the only tier a spec/simulated value may have)."""
        rating = SPEC_RATINGS.get(name)
        if rating is None:
            raise DefinitionError(f"unknown capability {name!r}; known: {sorted(SPEC_RATINGS)}")
        return cls(name=name, value=value, tier=rating.tier, source=source, ref=rating.ref)


class ResetDomain(str, enum.Enum):
    """What a reset clears (§13.2, §20 "reset domain")."""

    DEVICE = "device"
    CHIPLET = "chiplet"
    MODEL = "model"


class ContextOpSupport(str, enum.Enum):
    """State of one §9.3 context operation."""

    SUPPORTED = "supported"
    """Main path; usable."""
    GATED = "gated"
    """Implemented by the SDK but not enabled until its evidence exists (remove tail, shift)."""
    EMPTY = "empty"
    """Empty implementation in the SDK: the call returns NOT_SUPPORTED, never silent success."""


class ContextOp(str, enum.Enum):
    APPEND_DECODE = "append_decode"
    REMOVE_TAIL = "remove_tail"
    COPY_PREFIX = "copy_prefix"
    KEEP_ONE_SEQ = "keep_one_seq"
    POSITION_ADD_DIV = "position_add_div"
    SAVE_LOAD_SESSION = "save_load_session"
    SHIFT = "shift"


_EMPTY_OPS = (ContextOp.COPY_PREFIX, ContextOp.KEEP_ONE_SEQ, ContextOp.POSITION_ADD_DIV,
              ContextOp.SAVE_LOAD_SESSION)


@dataclass(frozen=True)
class ContextOps:
    """The §9.3 table as a contract: one capability per context operation."""

    append_decode: Capability[ContextOpSupport]
    remove_tail: Capability[ContextOpSupport]
    copy_prefix: Capability[ContextOpSupport]
    keep_one_seq: Capability[ContextOpSupport]
    position_add_div: Capability[ContextOpSupport]
    save_load_session: Capability[ContextOpSupport]
    shift: Capability[ContextOpSupport]

    def __post_init__(self) -> None:
        for op in _EMPTY_OPS:
            cap = self.support(op)
            if cap.value is not ContextOpSupport.EMPTY and cap.source in (EvidenceSource.SPEC, EvidenceSource.SIMULATED):
                raise DefinitionError(
                    f"context op {op.value} is an empty implementation in CalRT 0.7.6 (§9.3); only a vendor "
                    f"contract or a measurement may declare it {cap.value.value}")

    def support(self, op: ContextOp) -> Capability[ContextOpSupport]:
        cap: Capability[ContextOpSupport] = getattr(self, op.value)
        return cap

    @classmethod
    def calrt_076(cls) -> ContextOps:
        """The §9.3 table exactly as the spec states it for CalRT 0.7.6."""
        values = {
            ContextOp.APPEND_DECODE: ContextOpSupport.SUPPORTED,
            ContextOp.REMOVE_TAIL: ContextOpSupport.GATED,
            ContextOp.SHIFT: ContextOpSupport.GATED,
        }
        return cls(**{op.value: Capability.rated(f"ctx.{op.value}", values.get(op, ContextOpSupport.EMPTY))
                      for op in ContextOp})


@dataclass(frozen=True)
class DeviceCapabilities:
    """Everything §7.3/§9.3/§13.2/§14/§20 asks the vendor, with evidence per answer.

    The scheduler gates features on these values, never on a config flag alone (DESIGN
    principle 8); documents print :meth:`rows` so every answer shows its tier and source.
    """

    incremental_prefill: Capability[bool]
    lane_failure_isolation: Capability[bool]
    max_inflight_jobs: Capability[int]
    ping_pong: Capability[bool]
    ping_pong_overlap: Capability[bool]
    multi_profile_residency: Capability[bool]
    model_coresidency: Capability[bool]
    configure_device_global: Capability[bool]
    reset_domain: Capability[ResetDomain]
    reset_configuration_verified: Capability[bool]
    chiplet_scoped_models: Capability[bool]
    physical_devices_per_process: Capability[int]
    context_ops: ContextOps

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "context_ops" and (not isinstance(value, Capability) or value.name != f.name):
                raise DefinitionError(f"capability field {f.name} must be a Capability named {f.name!r}")
        inflight = self.max_inflight_jobs.value
        if inflight < 1:
            raise DefinitionError(f"max_inflight_jobs must be >= 1, got {inflight}")
        if not self.ping_pong.value and inflight != 1:
            raise DefinitionError(
                f"max_inflight_jobs={inflight} needs ping/pong: without a second engine only one job "
                "can be in flight (§14)")
        if inflight > 2:
            raise DefinitionError(f"max_inflight_jobs={inflight}: CalRT 0.7.6 has two engines, PING and PONG (§14)")
        if self.ping_pong_overlap.value and not self.ping_pong.value:
            raise DefinitionError("ping_pong_overlap without ping_pong is meaningless (§14)")
        if self.physical_devices_per_process.value != 1:
            raise DefinitionError("CalRT 0.7.6 drives exactly one physical device per process (§3, C4)")

    @classmethod
    def calrt_076_current(cls) -> DeviceCapabilities:
        """The current product as the spec describes it: B1 serial, nothing unproven enabled."""
        return cls(
            incremental_prefill=Capability.rated("incremental_prefill", False),
            lane_failure_isolation=Capability.rated("lane_failure_isolation", False),
            max_inflight_jobs=Capability.rated("max_inflight_jobs", 1),
            ping_pong=Capability.rated("ping_pong", False),
            ping_pong_overlap=Capability.rated("ping_pong_overlap", False),
            multi_profile_residency=Capability.rated("multi_profile_residency", False),
            model_coresidency=Capability.rated("model_coresidency", False),
            configure_device_global=Capability.rated("configure_device_global", True),
            reset_domain=Capability.rated("reset_domain", ResetDomain.DEVICE),
            reset_configuration_verified=Capability.rated("reset_configuration_verified", False),
            chiplet_scoped_models=Capability.rated("chiplet_scoped_models", False),
            physical_devices_per_process=Capability.rated("physical_devices_per_process", 1),
            context_ops=ContextOps.calrt_076(),
        )

    def all(self) -> tuple[Capability[Any], ...]:
        """Every capability, context operations included."""
        caps: list[Capability[Any]] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ContextOps):
                caps.extend(value.support(op) for op in ContextOp)
            else:
                caps.append(value)
        return tuple(caps)

    def rows(self) -> tuple[tuple[str, str, str, str, str], ...]:
        """(name, value, tier, source, spec ref) rows for documents and ``/capabilities``."""
        def show(v: object) -> str:
            return v.value if isinstance(v, enum.Enum) else str(v).lower() if isinstance(v, bool) else str(v)
        return tuple((c.name, show(c.value), c.tier.value, c.source.value, c.ref) for c in self.all())

    def simulated_enabled(self) -> tuple[str, ...]:
        """Names of capabilities that are switched on only by the simulator (never claim these)."""
        return tuple(c.name for c in self.all() if c.simulated and c.value not in (False, ContextOpSupport.EMPTY))
