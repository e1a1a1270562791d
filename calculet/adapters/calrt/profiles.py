"""Compiled batch profiles as the device describes them (§2 ``BatchProfile``, §7.3 inactive lanes).

A profile's ``compiled_batch`` comes only from the calbin; its exact tensors (§11 step 8), its
KV layout and its :class:`InactiveLanePolicy` — the four §7.3 vendor items, none defaulted, so
nothing can silently mean "pad with token 0" (R7.3.1) — are what the scheduler may rely on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from calculet.adapters.calrt.capabilities import EvidenceTier, profile_tier
from calculet.errors import DefinitionError


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
