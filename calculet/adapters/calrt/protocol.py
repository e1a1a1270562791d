"""The CalRT 0.7.6 surface calculet relies on: protocol, return codes, capability contract, errors.

The runtime talks to the device only through the protocols in this module (DESIGN "Arrows point
down": runtime → adapters through ``adapters/calrt.py``). Two adapters implement them: the
simulated NPU in :mod:`calculet.adapters.sim` (the embedded default and the device every test runs
against) and, on a machine with the vendor SDK, a thin binding over the real CalRT.

What lives here, and why it is one file:

* :class:`ReturnCode` — the CalRT status codes. Every device outcome is one of them (§16
  "submit/Wait rc"; R19.2 "all error codes visible").
* The **capability contract** (§7.3, §9.3, §13.2, §14, §20) as frozen dataclasses:
  :class:`BatchProfile` (§2) with its exact tensors, its :class:`InactiveLanePolicy` (the four
  vendor items of §7.3) and :class:`KvLayoutDescriptor`; :class:`DeviceCapabilities` with one
  :class:`Capability` per question the spec asks the vendor. Each capability carries the
  evidence tier C0–C4 *as the spec rates it* (§1) and where its value came from
  (:class:`EvidenceSource`), so nobody mistakes a simulated capability for a proved one (§20,
  R20.7).
* Job and result dataclasses: every result carries (generation id, job id), per-lane
  (seq id, lane) tags and status counters, so the runtime can correlate completions (§4, R4.8)
  and detect crosstalk or counter anomalies (§14, R14.5–R14.6); :func:`verify_result` does that
  check once for every adapter.
* The error boundary: :class:`VendorError` is what a vendor binding raises; :func:`map_exceptions`
  turns it (and anything else escaping the vendor layer) into a :class:`CalculetError` carrying a
  :class:`ReturnCode` (DESIGN principle 6). No vendor exception crosses into the runtime.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, NewType, ParamSpec, Protocol, TypeVar, runtime_checkable

import numpy as np

from calculet.errors import (
    CalculetError,
    CapacityExhausted,
    DefinitionError,
    DeviceFault,
    NotSupported,
)

CALRT_VERSION = "0.7.6"

KvSeqId = NewType("KvSeqId", int)
"""A KvManager sequence id. 0 is never allocated: it means "no sequence" (an inactive lane)."""

JobId = NewType("JobId", int)
"""Device-assigned job id, unique for the life of a VirtualDevice (never reused)."""

NO_SEQUENCE: KvSeqId = KvSeqId(0)


# ---------------------------------------------------------------------------------------------
# Return codes and the error boundary
# ---------------------------------------------------------------------------------------------


class ReturnCode(enum.IntEnum):
    """CalRT status codes (§16 executor metrics: submit/Wait rc).

    ``OK`` is 0 so that ``bool(rc)`` is true exactly for a failure, as in the C API.
    """

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    DEVICE_BUSY = 3
    TIMEOUT = 4
    CCU_FAULT = 5
    DMA_UNKNOWN = 6
    NOT_SUPPORTED = 7
    NOT_FOUND = 8
    ALREADY_EXISTS = 9
    INVALID_STATE = 10
    BUFFER_IN_USE = 11
    INTERNAL = 12

    @property
    def is_device_fault(self) -> bool:
        """Faults after which the device state of the job's lanes is unknown (§9.2 last rule)."""
        return self in (ReturnCode.TIMEOUT, ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN)


class VendorError(Exception):
    """What a CalRT binding raises: a return code and the vendor's message.

    It must never reach the runtime: adapters wrap every vendor call in :func:`map_exceptions`.
    """

    def __init__(self, rc: ReturnCode, message: str) -> None:
        super().__init__(f"{rc.name}: {message}")
        self.rc = rc
        self.message = message


class _RcError:
    """Mixin: every device-boundary error carries its :class:`ReturnCode` as ``rc``."""

    rc: ReturnCode


class DeviceInvalidArgument(_RcError, DefinitionError):
    """The device refused a job or call as malformed (INVALID_ARGUMENT).

    Bad client input is intercepted before submit (§7.4, R7.4.4), so reaching the device with an
    invalid argument is a defect of the program, hence a :class:`DefinitionError`.
    """

    code = "device_invalid_argument"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.INVALID_ARGUMENT, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceNotFound(DeviceInvalidArgument):
    """A handle (sequence, buffer, calbin, job) the device does not know (NOT_FOUND)."""

    code = "device_not_found"


class DeviceAlreadyExists(_RcError, DefinitionError):
    """A second physical VirtualDevice in one process (§3, R3.4), or a duplicate handle."""

    code = "device_already_exists"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.ALREADY_EXISTS, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceOutOfMemory(_RcError, CapacityExhausted):
    """Device DRAM or KV slots are exhausted (§13.1: no room for a second large model)."""

    code = "device_out_of_memory"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.OUT_OF_MEMORY, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class OperationNotSupported(_RcError, NotSupported):
    """The contract does not offer this operation (§9.3 empty implementations, C3/C4 features)."""

    code = "device_not_supported"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.NOT_SUPPORTED, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceBusy(DeviceFault):
    """Submit refused because the engine or the in-flight limit is occupied (§14 degrade input)."""

    code = "device_busy"


class DeviceTimeout(DeviceFault):
    """Wait expired before the job completed; the job's lanes are Unknown (§9.2, §12)."""

    code = "device_timeout"


class CcuFault(DeviceFault):
    """The compute unit faulted; the job's KV is Unknown until recovery (§9.2)."""

    code = "device_ccu_fault"


class DmaUnknown(DeviceFault):
    """A DMA ended in an unknown state (§15 ``recovery.restart_on_unknown_dma``)."""

    code = "device_dma_unknown"


class DeviceInvalidState(DeviceFault):
    """The call is not valid in the device's current state (e.g. submit after a CCU fault)."""

    code = "device_invalid_state"


class BufferInUse(DeviceFault):
    """A buffer is still bound to a job that has not completed (§12, §14: never reuse early)."""

    code = "device_buffer_in_use"


_ERROR_FOR_RC: Mapping[ReturnCode, Callable[..., CalculetError]] = {
    ReturnCode.INVALID_ARGUMENT: DeviceInvalidArgument,
    ReturnCode.NOT_FOUND: lambda m, rc, **c: DeviceNotFound(m, rc=rc, **c),
    ReturnCode.ALREADY_EXISTS: DeviceAlreadyExists,
    ReturnCode.OUT_OF_MEMORY: DeviceOutOfMemory,
    ReturnCode.NOT_SUPPORTED: OperationNotSupported,
    ReturnCode.DEVICE_BUSY: DeviceBusy,
    ReturnCode.TIMEOUT: DeviceTimeout,
    ReturnCode.CCU_FAULT: CcuFault,
    ReturnCode.DMA_UNKNOWN: DmaUnknown,
    ReturnCode.INVALID_STATE: DeviceInvalidState,
    ReturnCode.BUFFER_IN_USE: BufferInUse,
    ReturnCode.INTERNAL: DeviceFault,
}


def error_for(rc: ReturnCode, message: str, **context: object) -> CalculetError:
    """The :class:`CalculetError` for a failed CalRT call; ``rc`` is kept on the error.

    This table is the only place that decides who is at fault for a device return code
    (DESIGN principle 5: the error tree is split by fault owner).
    """
    if rc is ReturnCode.OK:
        raise DefinitionError("error_for(OK): a successful call has no error", rc=rc)
    factory = _ERROR_FOR_RC[rc]
    return factory(message, rc=rc, **context)


def rc_of(error: BaseException) -> ReturnCode:
    """The return code an error carries (INTERNAL for an error that carries none)."""
    rc = getattr(error, "rc", None)
    return rc if isinstance(rc, ReturnCode) else ReturnCode.INTERNAL


@contextlib.contextmanager
def map_exceptions(operation: str, **context: object) -> Iterator[None]:
    """Translate vendor failures into :class:`CalculetError`s at the adapter boundary.

    ``VendorError`` becomes the error :func:`error_for` names; a :class:`CalculetError` passes
    through untouched; anything else that escapes the vendor layer is a device fault with
    ``rc=INTERNAL`` (its cause chained), because the runtime must never see a vendor type
    (DESIGN principle 6, httpcore's ``map_exceptions``).
    """
    try:
        yield
    except CalculetError:
        raise
    except VendorError as exc:
        raise error_for(exc.rc, f"{operation}: {exc.message}", operation=operation, **context) from exc
    except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
        raise DeviceFault(
            f"{operation}: unexpected {type(exc).__name__} from the device layer: {exc}",
            rc=ReturnCode.INTERNAL, operation=operation, **context) from exc


_P = ParamSpec("_P")
_R = TypeVar("_R")


def vendor_boundary(operation: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator form of :func:`map_exceptions` for adapter methods."""

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with map_exceptions(operation):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------
# Evidence tiers (§1)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Profiles (§2, §7.3)
# ---------------------------------------------------------------------------------------------


class PrimitiveType(str, enum.Enum):
    """Tensor element types (§2 ``PrimitiveType``)."""

    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP64 = "fp64"

    @property
    def itemsize(self) -> int:
        return {"int32": 4, "int64": 8, "uint8": 1, "bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}[self.value]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The host dtype (bf16 has none in numpy; it is carried as float32 on the host)."""
        return np.dtype({"int32": np.int32, "int64": np.int64, "uint8": np.uint8, "bf16": np.float32,
                         "fp16": np.float16, "fp32": np.float32, "fp64": np.float64}[self.value])


class MaskContract(str, enum.Enum):
    """How a profile tells the device which lanes are valid (§7.3 "valid mask tensor/CSR")."""

    TENSOR = "tensor"
    """A ``lane_valid`` input tensor."""
    CSR = "csr"
    """A control/status register written per job."""
    NONE = "none"
    """No mask: every lane is computed. Acceptable only for B1 (§7.3, R7.3.3)."""


class KvManagerMode(str, enum.Enum):
    """How lanes address KV (§7.3 "KV manager mode")."""

    PER_SEQUENCE = "per_sequence"
    """Each lane names a KvManager sequence (seq_id); KV follows the sequence, not the lane."""
    LANE_BOUND = "lane_bound"
    """Each hardware lane owns a fixed KV region."""


@dataclass(frozen=True)
class InactiveLanePolicy:
    """The four §7.3 vendor items, plus the explicit token an inactive lane carries.

    Every field is required: a profile missing any of the four is rejected (R7.3.2). There is no
    default anywhere, so no policy can silently mean "pad with token 0" (R7.3.1), and
    ``fill_token`` 0 is refused outright.
    """

    mask: MaskContract
    kv_manager_mode: KvManagerMode
    inactive_writes_kv: bool
    inactive_logits_returned: bool
    fill_token: int

    def __post_init__(self) -> None:
        if self.fill_token == 0:
            raise DefinitionError(
                "inactive-lane policy fill_token=0 is forbidden: filling inactive lanes with token 0 "
                "is exactly what §7.3 rules out (R7.3.1)")
        for name, kind in (("mask", MaskContract), ("kv_manager_mode", KvManagerMode)):
            if not isinstance(getattr(self, name), kind):
                raise DefinitionError(f"inactive-lane policy {name} must be a {kind.__name__}")
        for name in ("inactive_writes_kv", "inactive_logits_returned"):
            if not isinstance(getattr(self, name), bool):
                raise DefinitionError(f"inactive-lane policy {name} must be stated as true or false")


@dataclass(frozen=True)
class KvLayoutDescriptor:
    """The KV layout of a profile (§2 ``KvLayoutDescriptor``; §20 vendor KV layout)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: PrimitiveType
    block_tokens: int
    order: str
    """Axis order of one sequence's K (and V) store, e.g. ``"layer,token,head,dim"``."""

    @property
    def bytes_per_token(self) -> int:
        """K and V for one token across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize


class TensorRole(str, enum.Enum):
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True)
class TensorSpec:
    """One exact tensor of a compiled profile (§11 step 8: inspect exact tensors)."""

    name: str
    shape: tuple[int, ...]
    dtype: PrimitiveType
    role: TensorRole

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class BatchProfile:
    """A compiled batch profile (§2 ``BatchProfile``); compiled_batch comes only from the calbin.

    ``usable`` says whether the scheduler may put the profile in Ready: a B>1 profile without a
    mask contract may not (§7.3, R7.3.3).

    ``prefill_chunk_tokens`` is the chunk size of the compiled incremental-prefill graph (§6):
    when set, a prompt may be prefilled in jobs of this many tokens, each starting at a multiple
    of it. Prefill jobs are always B1-shaped (§6 "current B1 prefill"), so only the B1 profile
    may carry it; whether chunking is *allowed* is the capability contract's
    ``incremental_prefill`` (the manifest refuses a chunk size without it, and the scheduler
    chunks only when both are present).
    """

    exact_submodel: str
    compiled_batch: int
    max_seq: int
    token_dtype: PrimitiveType
    logit_dtype: PrimitiveType
    inactive_policy: InactiveLanePolicy
    kv_layout: KvLayoutDescriptor
    tensors: tuple[TensorSpec, ...]
    prefill_chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.compiled_batch < 1 or self.compiled_batch > 0xFFFF:
            raise DefinitionError(f"compiled_batch {self.compiled_batch} out of range (uint16, >= 1)")
        if self.max_seq < 1:
            raise DefinitionError(f"max_seq {self.max_seq} must be >= 1")
        chunk = self.prefill_chunk_tokens
        if chunk is not None:
            if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= self.max_seq:
                raise DefinitionError(f"profile B{self.compiled_batch} prefill_chunk_tokens {chunk!r} must be an "
                                      f"int in [1, max_seq={self.max_seq}] (§6)")
            if self.compiled_batch != 1:
                raise DefinitionError(f"profile B{self.compiled_batch} declares prefill_chunk_tokens; prefill jobs "
                                      "are B1-shaped, so only the B1 profile may declare a chunk size (§6)")
        if not isinstance(self.inactive_policy, InactiveLanePolicy):
            raise DefinitionError(
                f"profile B{self.compiled_batch} has no inactive-lane policy; the four §7.3 items are "
                "required (R7.3.2)")

    @property
    def tier(self) -> EvidenceTier:
        return profile_tier(self.compiled_batch)

    @property
    def unusable_reason(self) -> str | None:
        """Why the profile may not enter Ready, or None (R7.3.3)."""
        if self.compiled_batch > 1 and self.inactive_policy.mask is MaskContract.NONE:
            return (f"profile B{self.compiled_batch} has no mask contract (valid-mask tensor or CSR); "
                    "a B>1 profile without one never enters Ready (§7.3)")
        return None

    @property
    def usable(self) -> bool:
        return self.unusable_reason is None

    def tensor(self, name: str) -> TensorSpec:
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise DefinitionError(f"profile B{self.compiled_batch} has no tensor {name!r}")


# ---------------------------------------------------------------------------------------------
# Device capabilities (§7.3, §9.3, §13.2, §14, §20)
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Jobs and results
# ---------------------------------------------------------------------------------------------


class Engine(str, enum.Enum):
    """The two job engines/banks (§14). Batch is lanes within a job; engine is which bank runs it."""

    PING = "ping"
    PONG = "pong"


class JobKind(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class BufferKind(str, enum.Enum):
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True)
class BufferHandle:
    """A device buffer. Ids are never reused within a VirtualDevice (stale handles fail NOT_FOUND)."""

    buffer_id: int
    kind: BufferKind
    job_kind: JobKind
    compiled_batch: int
    nbytes: int


@dataclass(frozen=True)
class JobBuffers:
    """The InputBuf/OutputBuf pair of one job (§14: each in-flight job has its own)."""

    input: BufferHandle
    output: BufferHandle


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """One decode step over a compiled batch (§2 ``DecodeBatch`` as the device sees it).

    Arrays have length ``compiled_batch`` (R7.1.2). For a valid lane ``positions[lane]`` must equal
    the sequence's committed KV length (§9.2, R9.2.4). An inactive lane carries the profile's
    ``fill_token`` and ``lane_valid`` 0; its ``seq_ids`` entry may name a sequence (that sequence's
    KV must not change) or be :data:`NO_SEQUENCE`.
    """

    generation: int
    calbin_id: int
    compiled_batch: int
    engine: Engine
    buffers: JobBuffers
    seq_ids: tuple[int, ...]
    token_ids: np.ndarray
    positions: np.ndarray
    lane_valid: np.ndarray

    kind: JobKind = field(default=JobKind.DECODE, init=False)

    def __post_init__(self) -> None:
        for name in ("token_ids", "positions", "lane_valid"):
            object.__setattr__(self, name, np.array(getattr(self, name), copy=True))
        b = self.compiled_batch
        for name, arr in (("seq_ids", self.seq_ids), ("token_ids", self.token_ids),
                          ("positions", self.positions), ("lane_valid", self.lane_valid)):
            if len(arr) != b:
                raise DefinitionError(f"DecodeJob.{name} has {len(arr)} entries; compiled_batch is {b} (R7.1.2)")

    @property
    def active_lanes(self) -> tuple[int, ...]:
        return tuple(int(i) for i in np.flatnonzero(self.lane_valid))


@dataclass(frozen=True, eq=False)
class PrefillJob:
    """Prefill of one sequence (§6). ``start_position`` must equal the committed KV length; a
    non-zero start (a chunk) needs the incremental-prefill capability."""

    generation: int
    calbin_id: int
    engine: Engine
    buffers: JobBuffers
    seq_id: int
    tokens: np.ndarray
    start_position: int

    kind: JobKind = field(default=JobKind.PREFILL, init=False)
    compiled_batch: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", np.array(self.tokens, copy=True))
        if self.tokens.ndim != 1 or len(self.tokens) == 0:
            raise DefinitionError("PrefillJob.tokens must be a non-empty 1-D array")


JobSpec = DecodeJob | PrefillJob


@dataclass(frozen=True)
class JobTicket:
    """What submit returns: the device's job id and the tags the result will echo."""

    job_id: JobId
    generation: int
    kind: JobKind
    engine: Engine
    calbin_id: int
    submitted_at: float


@dataclass(frozen=True)
class StatusCounters:
    """Status counters the device reports with every job (§14: counter anomaly → degrade).

    ``engine_sequence`` counts completed jobs per engine and must grow by one per job;
    ``lanes_valid`` / ``tokens_processed`` / ``kv_tokens_written`` must match the job.
    """

    engine_sequence: int
    lanes_valid: int
    tokens_processed: int
    kv_tokens_written: int


@dataclass(frozen=True, eq=False)
class LaneResult:
    """One lane's output, tagged with the lane and sequence the device says it belongs to (§7.4).

    ``logits`` is None for an inactive lane whose profile does not return logits, for a failed
    lane, and in numerics-off simulation; ``greedy_token`` is the device's argmax (or the
    simulator's pseudo token) for hosts that do not sample themselves.
    """

    lane: int
    seq_id: int
    valid: bool
    rc: ReturnCode
    position: int
    kv_len: int
    logits: np.ndarray | None
    greedy_token: int | None


@dataclass(frozen=True, eq=False)
class JobResult:
    """A completed job: (generation id, job id) plus per-lane tags and status counters (§4, §7.4).

    ``rc`` is the job's status. With lane-level failure isolation (a capability, R7.4.6) a failed
    job may still carry OK lanes; without it, a failed job fails every lane (R7.4.5).
    """

    job_id: JobId
    generation: int
    kind: JobKind
    engine: Engine
    calbin_id: int
    compiled_batch: int
    rc: ReturnCode
    lanes: tuple[LaneResult, ...]
    counters: StatusCounters
    submitted_at: float
    completed_at: float
    output_buffer: BufferHandle
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.rc is ReturnCode.OK


class Anomaly(str, enum.Enum):
    """What :func:`verify_result` can find (§7.4 consistency, §14 degrade triggers)."""

    WRONG_JOB = "wrong_job"
    WRONG_GENERATION = "wrong_generation"
    CROSSTALK = "crosstalk"
    COUNTERS = "counters"


@dataclass(frozen=True)
class ResultCheck:
    """Outcome of checking a result against the job that was submitted."""

    anomalies: tuple[tuple[Anomaly, str], ...]

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def has(self, kind: Anomaly) -> bool:
        return any(a is kind for a, _ in self.anomalies)


def verify_result(job: JobSpec, ticket: JobTicket, result: JobResult,
                  previous_engine_sequence: int | None = None) -> ResultCheck:
    """Check that a result belongs to the job and that its tags and counters are consistent.

    §7.4: verify request/generation/seq/lane before using a lane; §14: any crosstalk or counter
    anomaly triggers degrade. ``previous_engine_sequence`` is the counter of the previous job
    completed on the same engine, when the caller tracks it.
    """
    found: list[tuple[Anomaly, str]] = []
    if result.job_id != ticket.job_id:
        found.append((Anomaly.WRONG_JOB, f"result job {result.job_id} for ticket {ticket.job_id}"))
    if result.generation != job.generation:
        found.append((Anomaly.WRONG_GENERATION, f"result generation {result.generation} != {job.generation}"))
    if isinstance(job, DecodeJob):
        expected_seqs = job.seq_ids
        valid = [bool(v) for v in job.lane_valid]
        expected_tokens = sum(valid)
    else:
        expected_seqs = (job.seq_id,)
        valid = [True]
        expected_tokens = len(job.tokens)
    if len(result.lanes) != len(expected_seqs):
        found.append((Anomaly.CROSSTALK, f"{len(result.lanes)} lane results for {len(expected_seqs)} lanes"))
    for i, lane in enumerate(result.lanes[: len(expected_seqs)]):
        if lane.lane != i or lane.seq_id != expected_seqs[i] or lane.valid != valid[i]:
            found.append((Anomaly.CROSSTALK,
                          f"slot {i} carries lane {lane.lane} seq {lane.seq_id} valid={lane.valid}; "
                          f"expected lane {i} seq {expected_seqs[i]} valid={valid[i]}"))
    c = result.counters
    if c.lanes_valid != sum(valid):
        found.append((Anomaly.COUNTERS, f"lanes_valid counter {c.lanes_valid} != {sum(valid)}"))
    if c.tokens_processed != expected_tokens:
        found.append((Anomaly.COUNTERS, f"tokens_processed counter {c.tokens_processed} != {expected_tokens}"))
    if result.ok:
        committed = sum(1 for lane in result.lanes if lane.rc is ReturnCode.OK and lane.valid)
        expected_kv = expected_tokens if isinstance(job, PrefillJob) else committed
        if c.kv_tokens_written != expected_kv:
            found.append((Anomaly.COUNTERS, f"kv_tokens_written counter {c.kv_tokens_written} != {expected_kv}"))
    if previous_engine_sequence is not None and c.engine_sequence != previous_engine_sequence + 1:
        found.append((Anomaly.COUNTERS,
                      f"engine_sequence {c.engine_sequence} does not follow {previous_engine_sequence}"))
    return ResultCheck(tuple(found))


# ---------------------------------------------------------------------------------------------
# Memory and statistics records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemInfo:
    """ReadMem(chip): DRAM figures of one chiplet. Not evidence of chip isolation (§13.3)."""

    chip: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class MemoryFootprint:
    """What a calbin reserves on the board (§13.1)."""

    parameter_bytes: int
    kv_bytes: int
    reserved_bytes: int
    kv_dtype: str
    chiplets: tuple[int, ...]

    @property
    def runtime_bytes(self) -> int:
        """Reservation beyond parameters and KV (activations, runtime; §13.1 leaves 7.462 GiB open)."""
        return self.reserved_bytes - self.parameter_bytes - self.kv_bytes


@dataclass(frozen=True)
class GoldenVector:
    """A golden check (§11 step 9): prompt → expected greedy tokens and a logits checksum."""

    name: str
    prompt: tuple[int, ...]
    expected_tokens: tuple[int, ...]
    logits_sum: float
    logits_l2: float
    atol: float


# ---------------------------------------------------------------------------------------------
# Protocols
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Calbin(Protocol):
    """A created calbin (CreateCalbin): the model's compiled artifact resident in device DRAM."""

    @property
    def calbin_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def exact_submodel(self) -> str: ...
    @property
    def package_sha256(self) -> str: ...
    @property
    def profiles(self) -> tuple[BatchProfile, ...]: ...
    @property
    def capabilities(self) -> DeviceCapabilities: ...
    @property
    def golden(self) -> tuple[GoldenVector, ...]: ...
    @property
    def memory(self) -> MemoryFootprint: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token(self) -> int: ...
    @property
    def bos_token(self) -> int: ...

    def profile(self, compiled_batch: int) -> BatchProfile: ...


@runtime_checkable
class KvManager(Protocol):
    """CalRT's KvManager for one configured calbin (§5.1, §9).

    Every method raises a :class:`CalculetError` carrying ``rc`` on failure; the four §9.3 empty
    operations always raise :class:`OperationNotSupported` (rc NOT_SUPPORTED), never succeed
    silently (R9.3.4–R9.3.7).
    """

    def can_allocate(self, seq_num: int) -> bool:
        """A *hint* about sequence slots only; it knows nothing of token lengths (§5.1, R5.1.3)."""
        ...

    def allocate_sequence(self) -> KvSeqId: ...
    def free_sequence(self, seq_id: KvSeqId) -> None: ...
    def committed_length(self, seq_id: KvSeqId) -> int: ...
    def remove_tokens_at_end(self, seq_id: KvSeqId, n_tokens: int) -> None: ...
    def do_shift(self, seq_id: KvSeqId, n_tokens: int) -> None: ...
    def copy_prefix(self, src: KvSeqId, dst: KvSeqId, n_tokens: int) -> None: ...
    def keep_one_sequence(self, seq_id: KvSeqId) -> None: ...
    def position_add(self, seq_id: KvSeqId, p0: int, p1: int, delta: int) -> None: ...
    def position_div(self, seq_id: KvSeqId, p0: int, p1: int, divisor: int) -> None: ...
    def save_session(self, seq_id: KvSeqId) -> bytes: ...
    def load_session(self, seq_id: KvSeqId, data: bytes) -> None: ...
    def statistics(self) -> Any: ...


@runtime_checkable
class VirtualDevice(Protocol):
    """One physical CalRT VirtualDevice (§3: one per process on 0.7.6).

    Lifecycle calls raise :class:`CalculetError`s with ``rc``. Job outcomes are values:
    :class:`JobResult.rc`. ``wait`` raises :class:`DeviceTimeout` when the job has not completed
    in time; the job stays in flight and its buffers stay bound until it completes or the
    device is reset (§12, R12.10).
    """

    @property
    def physical_index(self) -> int: ...

    def create_calbin(self, package_dir: str | os.PathLike[str]) -> Calbin: ...
    def destroy_calbin(self, calbin: Calbin) -> None: ...
    def configure(self, calbin: Calbin, profiles: Sequence[int] | None = None) -> None: ...
    def reset_configuration(self) -> None: ...
    def create_kv_manager(self, calbin: Calbin) -> KvManager: ...
    def destroy_kv_manager(self, kv: KvManager) -> None: ...
    def allocate_job_buffers(self, calbin: Calbin, kind: JobKind, compiled_batch: int = 1) -> JobBuffers: ...
    def free_job_buffers(self, buffers: JobBuffers) -> None: ...
    def read_buffer(self, handle: BufferHandle) -> np.ndarray: ...
    def submit(self, job: JobSpec) -> JobTicket: ...
    def poll(self) -> list[JobResult]: ...
    def wait(self, job_id: JobId, timeout_s: float) -> JobResult: ...
    def wait_any(self, timeout_s: float) -> list[JobResult]: ...
    def next_completion_time(self) -> float | None: ...
    def inflight(self) -> tuple[JobTicket, ...]: ...
    def read_mem(self, chip: int) -> MemInfo: ...
    def close(self) -> None: ...
    def statistics(self) -> Any: ...


MAX_CHIPLETS = 8
"""How far :func:`read_board_memory` asks: ReadMem takes a chip id and the board's chiplet count
is not part of the protocol, so the walk stops at the first refused id or here."""


def read_board_memory(device: VirtualDevice) -> tuple[MemInfo, ...]:
    """ReadMem for every chiplet of the board, in chip order (§13.1 capacity figures, §12 release
    check); a refused chip id ends the board. Not evidence of chip isolation (§13.3)."""
    board: list[MemInfo] = []
    for chip in range(MAX_CHIPLETS):
        try:
            board.append(device.read_mem(chip))
        except CalculetError:
            break
    return tuple(board)


@runtime_checkable
class CalRT(Protocol):
    """The CalRT library loaded in this process."""

    @property
    def version(self) -> str: ...

    def create_virtual_device(self, physical_index: int = 0) -> VirtualDevice:
        """The process's one physical VirtualDevice; a second live one is refused (§3, R3.4)."""
        ...

    def statistics(self) -> Any: ...


__all__ = [
    "CALRT_VERSION", "NO_SEQUENCE", "SPEC_RATINGS", "Anomaly", "BatchProfile", "BufferHandle",
    "BufferInUse", "BufferKind", "CalRT", "Calbin", "Capability", "CcuFault", "ContextOp",
    "ContextOpSupport", "ContextOps", "DecodeJob", "DeviceAlreadyExists", "DeviceBusy",
    "DeviceCapabilities", "DeviceInvalidArgument", "DeviceInvalidState", "DeviceNotFound",
    "DeviceOutOfMemory", "DeviceTimeout", "DmaUnknown", "Engine", "EvidenceSource", "EvidenceTier",
    "GoldenVector", "InactiveLanePolicy", "JobBuffers", "JobId", "JobKind", "JobResult", "JobSpec",
    "JobTicket", "KvLayoutDescriptor", "KvManager", "KvManagerMode", "KvSeqId", "LaneResult",
    "MAX_CHIPLETS", "MaskContract", "MemInfo", "MemoryFootprint", "OperationNotSupported", "PrefillJob",
    "PrimitiveType", "ResetDomain", "ResultCheck", "ReturnCode", "SpecRating", "StatusCounters",
    "TensorRole", "TensorSpec", "VendorError", "VirtualDevice", "error_for", "map_exceptions",
    "profile_tier", "rc_of", "read_board_memory", "vendor_boundary", "verify_result",
]
