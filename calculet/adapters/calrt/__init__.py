"""The CalRT 0.7.6 surface calculet relies on, as one unit: protocol, return codes, capability
contract, profiles, jobs and memory records.

The runtime imports the device surface from here (``from calculet.adapters.calrt import X``); the
parts live in one module per idea:

* :mod:`.codes` — :class:`ReturnCode`, the device-boundary errors and the vendor boundary
  (:func:`map_exceptions`, :func:`vendor_boundary`; DESIGN principle 6);
* :mod:`.capabilities` — evidence tiers C0–C4 and the capability contract (§1, §9.3, §20);
* :mod:`.profiles` — compiled batch profiles, their tensors and inactive-lane policy (§2, §7.3);
* :mod:`.jobs` — jobs, results, their tags and :func:`verify_result` (§4, §7.4, §14);
* :mod:`.memory` — ReadMem and calbin footprints (§13.1);
* :mod:`.protocol` — the CalRT, VirtualDevice, Calbin and KvManager protocols (§3, §9, §11).

The job engine (ping/pong, §14) is :class:`calculet.machines.job.JobEngine`, shared with the job
lifecycle machine.
"""

from calculet.adapters.calrt.capabilities import (
    SPEC_RATINGS,
    Capability,
    ContextOp,
    ContextOps,
    ContextOpSupport,
    DeviceCapabilities,
    EvidenceSource,
    EvidenceTier,
    ResetDomain,
    SpecRating,
    profile_tier,
)
from calculet.adapters.calrt.codes import (
    BufferInUse,
    CcuFault,
    DeviceAlreadyExists,
    DeviceBusy,
    DeviceInvalidArgument,
    DeviceInvalidState,
    DeviceNotFound,
    DeviceOutOfMemory,
    DeviceTimeout,
    DmaUnknown,
    OperationNotSupported,
    ReturnCode,
    VendorError,
    error_for,
    map_exceptions,
    rc_of,
    translated,
    vendor_boundary,
)
from calculet.adapters.calrt.jobs import (
    NO_SEQUENCE,
    Anomaly,
    BufferHandle,
    BufferKind,
    DecodeJob,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobSpec,
    JobTicket,
    KvSeqId,
    LaneResult,
    PrefillJob,
    ResultCheck,
    StatusCounters,
    records_follow_contract,
    verify_result,
)
from calculet.adapters.calrt.memory import MAX_CHIPLETS, MemInfo, MemoryFootprint, read_board_memory
from calculet.adapters.calrt.profiles import (
    BatchProfile,
    InactiveLanePolicy,
    KvLayoutDescriptor,
    KvManagerMode,
    MaskContract,
    PrimitiveType,
    TensorRole,
    TensorSpec,
)
from calculet.adapters.calrt.protocol import CALRT_VERSION, Calbin, CalRT, GoldenVector, KvManager, VirtualDevice

__all__ = [
    "CALRT_VERSION", "NO_SEQUENCE", "SPEC_RATINGS", "Anomaly", "BatchProfile", "BufferHandle",
    "BufferInUse", "BufferKind", "CalRT", "Calbin", "Capability", "CcuFault", "ContextOp",
    "ContextOpSupport", "ContextOps", "DecodeJob", "DeviceAlreadyExists", "DeviceBusy",
    "DeviceCapabilities", "DeviceInvalidArgument", "DeviceInvalidState", "DeviceNotFound",
    "DeviceOutOfMemory", "DeviceTimeout", "DmaUnknown", "EvidenceSource", "EvidenceTier",
    "GoldenVector", "InactiveLanePolicy", "JobBuffers", "JobId", "JobKind", "JobResult", "JobSpec",
    "JobTicket", "KvLayoutDescriptor", "KvManager", "KvManagerMode", "KvSeqId", "LaneResult",
    "MAX_CHIPLETS", "MaskContract", "MemInfo", "MemoryFootprint", "OperationNotSupported", "PrefillJob",
    "PrimitiveType", "ResetDomain", "ResultCheck", "ReturnCode", "SpecRating", "StatusCounters",
    "TensorRole", "TensorSpec", "VendorError", "VirtualDevice", "error_for", "map_exceptions",
    "profile_tier", "rc_of", "read_board_memory", "records_follow_contract", "translated", "vendor_boundary",
    "verify_result",
]
