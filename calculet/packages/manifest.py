"""``manifest.json`` of a calbin package (format ``calbin-package/v1``), as a pydantic model.

The manifest is the vendor's statement about one compiled artifact: the exact submodel, the model
architecture, the compiled batch profiles with their exact tensors and inactive-lane contract
(§2, §7.3, §20), the capability contract with evidence per answer (§1, §9.3, §13.2, §14), golden
vectors (§11 step 9), memory figures (§13.1) and a ``files`` map ``{relative path: {sha256,
size}}``.

Trust is not this module's business: :mod:`calculet.packages.verify` verifies the Ed25519
signature over ``manifest.json`` (stored as ``manifest.sig``) and the sha256 of every file in
``files`` (§11 step 2). :meth:`CalbinManifest.from_path` only parses and validates the schema,
so it can be called before or after verification but never replaces it.

Every required contract field has no default: a profile missing any of the four §7.3 items is
rejected (R7.3.2), and no omission can turn into "pad with token 0" (R7.3.1).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from calculet.adapters.calrt import (
    CALRT_VERSION,
    SPEC_RATINGS,
    BatchProfile,
    Capability,
    ContextOp,
    ContextOps,
    ContextOpSupport,
    DeviceCapabilities,
    EvidenceSource,
    EvidenceTier,
    GoldenVector,
    InactiveLanePolicy,
    KvLayoutDescriptor,
    KvManagerMode,
    MaskContract,
    MemoryFootprint,
    PrimitiveType,
    ResetDomain,
    TensorRole,
    TensorSpec,
)
from calculet.errors import CalculetError, PackageError
from calculet.packages.checks import DEFAULT_FORMAT as MANIFEST_FORMAT
from calculet.packages.checks import MANIFEST_NAME as MANIFEST_FILE



class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Model):
    """One file of the package; :mod:`calculet.packages.verify` checks ``sha256`` and ``size`` (§11 step 2)."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class WeightTensor(_Model):
    """Where one weight tensor lives in the weights file (float32, little endian, C order)."""

    name: str
    shape: tuple[int, ...]
    offset: int = Field(ge=0)


class SpecialTokens(_Model):
    bos: int = Field(ge=0)
    eos: int = Field(ge=0)
    pad: int = Field(ge=0)
    unk: int = Field(ge=0)


class Architecture(_Model):
    """The model the calbin computes. The simulated NPU runs it for real (numpy)."""

    family: Literal["tiny-numpy-transformer"]
    vocab_size: int = Field(ge=2)
    d_model: int = Field(ge=1)
    n_layers: int = Field(ge=1)
    n_heads: int = Field(ge=1)
    d_ff: int = Field(ge=1)
    max_seq: int = Field(ge=1)
    norm_eps: float = Field(gt=0)
    tokenizer: Literal["byte-level", "hf-tokenizers"]
    """``byte-level``: bytes 0..255 then the special ids (no file). ``hf-tokenizers``: the package's
    ``tokenizer_file`` (a Hugging Face ``tokenizer.json``) and ``tokenizer_config_file`` (its
    ``tokenizer_config.json``, holding the Jinja2 ``chat_template``), both listed in ``files`` and so
    covered by the signature; loaded and checked against this section at model load (§11, #18)."""
    tokenizer_file: str | None = None
    tokenizer_config_file: str | None = None
    special_tokens: SpecialTokens
    position_semantics: Literal["committed-kv-length"]
    """§9.2: a token's position equals its lane's committed KV length (no special semantics)."""
    seed: int
    weights_file: str
    weights_dtype: Literal["float32"]
    tensors: tuple[WeightTensor, ...]

    @model_validator(mode="after")
    def _check(self) -> Architecture:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        for name, tok in self.special_tokens.model_dump().items():
            if tok >= self.vocab_size:
                raise ValueError(f"special token {name}={tok} outside vocab_size {self.vocab_size}")
        files = (self.tokenizer_file, self.tokenizer_config_file)
        if self.tokenizer == "hf-tokenizers" and None in files:
            raise ValueError("tokenizer 'hf-tokenizers' needs tokenizer_file and tokenizer_config_file")
        if self.tokenizer == "byte-level" and files != (None, None):
            raise ValueError("a byte-level tokenizer has no tokenizer_file or tokenizer_config_file")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @model_serializer(mode="wrap")
    def _omit_absent_tokenizer_files(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A byte-level package has no tokenizer files: leave the keys out, so it stays byte-identical."""
        data: dict[str, Any] = handler(self)
        for key in ("tokenizer_file", "tokenizer_config_file"):
            if data.get(key, 0) is None:
                del data[key]
        return data


class InactivePolicyModel(_Model):
    """§7.3's four vendor items plus the fill token; all required, no defaults (R7.3.2)."""

    mask: MaskContract
    kv_manager_mode: KvManagerMode
    inactive_writes_kv: bool
    inactive_logits_returned: bool
    fill_token: int

    @field_validator("fill_token")
    @classmethod
    def _not_zero(cls, v: int) -> int:
        if v == 0:
            raise ValueError("fill_token 0 is forbidden: inactive lanes are never padded with token 0 (§7.3)")
        return v


class KvLayoutModel(_Model):
    n_layers: int = Field(ge=1)
    n_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    dtype: PrimitiveType
    block_tokens: int = Field(ge=1)
    order: str


class TensorModel(_Model):
    name: str
    shape: tuple[int, ...]
    dtype: PrimitiveType
    role: TensorRole


class ProfileModel(_Model):
    """One compiled batch profile (§2 ``BatchProfile``).

    ``prefill_chunk_tokens`` (optional) is the chunk size of the compiled incremental-prefill
    graph (§6). Decision: only the B1 profile may declare it, because every prefill job is
    B1-shaped (§6 "current B1 prefill"); on a B>1 profile it would describe a graph that is never
    run, so it is refused rather than ignored. It must lie in ``[1, max_seq]``, and the package
    must declare ``capabilities.incremental_prefill`` true (checked by :class:`CalbinManifest`):
    a chunk size without the capability would be a lie about what the runtime can do. When the
    field is absent it is also absent from the canonical JSON, so packages without it keep their
    exact bytes (and signatures).
    """

    exact_submodel: str
    compiled_batch: int = Field(ge=1, le=0xFFFF)
    max_seq: int = Field(ge=1)
    token_dtype: PrimitiveType
    logit_dtype: PrimitiveType
    inactive_policy: InactivePolicyModel
    kv_layout: KvLayoutModel
    tensors: tuple[TensorModel, ...] = Field(min_length=1)
    prefill_chunk_tokens: int | None = Field(default=None, ge=1, strict=True)

    @model_validator(mode="after")
    def _chunk(self) -> ProfileModel:
        chunk = self.prefill_chunk_tokens
        if chunk is None:
            return self
        if self.compiled_batch != 1:
            raise ValueError(f"profile B{self.compiled_batch} declares prefill_chunk_tokens={chunk}; prefill jobs "
                             "are B1-shaped, so only the B1 profile may declare a chunk size (§6)")
        if chunk > self.max_seq:
            raise ValueError(f"prefill_chunk_tokens {chunk} exceeds the profile's max_seq {self.max_seq}: such a "
                             "chunk never splits a prompt (§6)")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_chunk(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave an absent chunk size out of the dump: existing packages stay byte-identical."""
        data: dict[str, Any] = handler(self)
        if data.get("prefill_chunk_tokens", 0) is None:
            del data["prefill_chunk_tokens"]
        return data

    def to_contract(self) -> BatchProfile:
        p = self.inactive_policy
        k = self.kv_layout
        return BatchProfile(
            exact_submodel=self.exact_submodel,
            compiled_batch=self.compiled_batch,
            max_seq=self.max_seq,
            token_dtype=self.token_dtype,
            logit_dtype=self.logit_dtype,
            inactive_policy=InactiveLanePolicy(
                mask=p.mask, kv_manager_mode=p.kv_manager_mode, inactive_writes_kv=p.inactive_writes_kv,
                inactive_logits_returned=p.inactive_logits_returned, fill_token=p.fill_token),
            kv_layout=KvLayoutDescriptor(
                n_layers=k.n_layers, n_kv_heads=k.n_kv_heads, head_dim=k.head_dim, dtype=k.dtype,
                block_tokens=k.block_tokens, order=k.order),
            tensors=tuple(TensorSpec(name=t.name, shape=tuple(t.shape), dtype=t.dtype, role=t.role)
                          for t in self.tensors),
            prefill_chunk_tokens=self.prefill_chunk_tokens,
        )


_V = TypeVar("_V")


class CapabilityEntry(_Model, Generic[_V]):
    """A capability value and its evidence source; the tier defaults to the spec's rating.

    A ``spec`` or ``simulated`` entry may not state a tier other than the spec's (§20); a
    ``vendor`` or ``measured`` entry must state its tier.
    """

    value: _V
    source: EvidenceSource
    tier: EvidenceTier | None = None

    def to_contract(self, name: str) -> Capability[_V]:
        rating = SPEC_RATINGS[name]
        if self.tier is None and self.source in (EvidenceSource.VENDOR, EvidenceSource.MEASURED):
            raise ValueError(f"capability {name}: a {self.source.value} entry must state its tier")
        return Capability(name=name, value=self.value, tier=self.tier or rating.tier, source=self.source,
                          ref=rating.ref)


class ContextOpsModel(_Model):
    """§9.3 table: every operation must be stated (no default means "supported")."""

    append_decode: CapabilityEntry[ContextOpSupport]
    remove_tail: CapabilityEntry[ContextOpSupport]
    copy_prefix: CapabilityEntry[ContextOpSupport]
    keep_one_seq: CapabilityEntry[ContextOpSupport]
    position_add_div: CapabilityEntry[ContextOpSupport]
    save_load_session: CapabilityEntry[ContextOpSupport]
    shift: CapabilityEntry[ContextOpSupport]

    def to_contract(self) -> ContextOps:
        return ContextOps(**{op.value: getattr(self, op.value).to_contract(f"ctx.{op.value}") for op in ContextOp})


class CapabilitiesModel(_Model):
    """The capability contract (§7.3, §9.3, §13.2, §14, §20); every answer is required."""

    incremental_prefill: CapabilityEntry[bool]
    lane_failure_isolation: CapabilityEntry[bool]
    max_inflight_jobs: CapabilityEntry[int]
    ping_pong: CapabilityEntry[bool]
    ping_pong_overlap: CapabilityEntry[bool]
    multi_profile_residency: CapabilityEntry[bool]
    model_coresidency: CapabilityEntry[bool]
    configure_device_global: CapabilityEntry[bool]
    reset_domain: CapabilityEntry[ResetDomain]
    reset_configuration_verified: CapabilityEntry[bool]
    chiplet_scoped_models: CapabilityEntry[bool]
    physical_devices_per_process: CapabilityEntry[int]
    context_ops: ContextOpsModel

    def to_contract(self) -> DeviceCapabilities:
        kwargs: dict[str, Any] = {}
        for name in type(self).model_fields:
            entry = getattr(self, name)
            kwargs[name] = entry.to_contract() if name == "context_ops" else entry.to_contract(name)
        return DeviceCapabilities(**kwargs)

    @classmethod
    def from_contract(cls, caps: DeviceCapabilities) -> CapabilitiesModel:
        def entry(c: Capability[Any]) -> dict[str, Any]:
            out: dict[str, Any] = {"value": c.value, "source": c.source}
            if c.source in (EvidenceSource.VENDOR, EvidenceSource.MEASURED):
                out["tier"] = c.tier
            return out

        data: dict[str, Any] = {}
        for name in cls.model_fields:
            if name == "context_ops":
                data[name] = {op.value: entry(caps.context_ops.support(op)) for op in ContextOp}
            else:
                data[name] = entry(getattr(caps, name))
        return cls.model_validate(data)


class GoldenModel(_Model):
    """Prompt tokens → expected greedy tokens (B1 decode) and a checksum of the prefill logits."""

    name: str
    prompt: tuple[int, ...] = Field(min_length=1)
    expected_tokens: tuple[int, ...] = Field(min_length=1)
    logits_sum: float
    logits_l2: float
    atol: float = Field(gt=0)

    def to_contract(self) -> GoldenVector:
        return GoldenVector(name=self.name, prompt=tuple(self.prompt), expected_tokens=tuple(self.expected_tokens),
                            logits_sum=self.logits_sum, logits_l2=self.logits_l2, atol=self.atol)


class MemoryModel(_Model):
    """Board memory the calbin reserves (§13.1), and its KV slot count."""

    parameter_bytes: int = Field(ge=0)
    kv_bytes: int = Field(ge=0)
    reserved_bytes: int = Field(ge=0)
    kv_dtype: str
    chiplets: tuple[int, ...] = Field(min_length=1)
    max_sequences: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> MemoryModel:
        if self.reserved_bytes < self.parameter_bytes + self.kv_bytes:
            raise ValueError(f"reserved_bytes {self.reserved_bytes} < parameters {self.parameter_bytes} + "
                             f"KV {self.kv_bytes}")
        if len(set(self.chiplets)) != len(self.chiplets):
            raise ValueError(f"duplicate chiplets {self.chiplets}")
        return self

    def to_contract(self) -> MemoryFootprint:
        return MemoryFootprint(parameter_bytes=self.parameter_bytes, kv_bytes=self.kv_bytes,
                               reserved_bytes=self.reserved_bytes, kv_dtype=self.kv_dtype,
                               chiplets=tuple(self.chiplets))


class CalbinManifest(_Model):
    """The whole ``manifest.json`` (format ``calbin-package/v1``)."""

    format: Literal["calbin-package/v1"]
    name: str = Field(min_length=1)
    exact_submodel: str = Field(min_length=1)
    calrt_version: str
    architecture: Architecture
    profiles: tuple[ProfileModel, ...] = Field(min_length=1)
    capabilities: CapabilitiesModel
    golden: tuple[GoldenModel, ...] = Field(min_length=1)
    memory: MemoryModel
    files: dict[str, FileEntry]

    @field_validator("files")
    @classmethod
    def _safe_paths(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """File paths are relative POSIX paths inside the package (no ``..``, no absolute path)."""
        for rel in files:
            p = PurePosixPath(rel)
            if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or rel == MANIFEST_FILE:
                raise ValueError(f"file path {rel!r} must be relative, inside the package and not the manifest")
        return files

    @model_validator(mode="after")
    def _consistent(self) -> CalbinManifest:
        if self.calrt_version != CALRT_VERSION:
            raise ValueError(f"calrt_version {self.calrt_version!r}: this build speaks CalRT {CALRT_VERSION}")
        batches = [p.compiled_batch for p in self.profiles]
        if len(set(batches)) != len(batches):
            raise ValueError(f"duplicate compiled_batch in profiles {batches}")
        if 1 not in batches:
            raise ValueError("a calbin-package/v1 must contain the B1 profile (§1: the stable baseline; §8 falls back to B1)")
        arch = self.architecture
        for p in self.profiles:
            if p.exact_submodel != self.exact_submodel:
                raise ValueError(f"profile B{p.compiled_batch} exact_submodel {p.exact_submodel!r} != "
                                 f"{self.exact_submodel!r}")
            if p.max_seq > arch.max_seq:
                raise ValueError(f"profile B{p.compiled_batch} max_seq {p.max_seq} > architecture max_seq {arch.max_seq}")
            if (p.kv_layout.n_layers, p.kv_layout.n_kv_heads, p.kv_layout.head_dim) != (
                    arch.n_layers, arch.n_heads, arch.head_dim):
                raise ValueError(f"profile B{p.compiled_batch} kv_layout does not match the architecture")
        chunked = [p.compiled_batch for p in self.profiles if p.prefill_chunk_tokens is not None]
        if chunked and not self.capabilities.incremental_prefill.value:
            raise ValueError(f"profile B{chunked[0]} declares prefill_chunk_tokens but capabilities."
                             "incremental_prefill is false: a chunk size without incremental prefill is a capability "
                             "the runtime does not have (§6)")
        for role, rel in (("weights", arch.weights_file), ("tokenizer", arch.tokenizer_file),
                          ("tokenizer config", arch.tokenizer_config_file)):
            if rel is not None and rel not in self.files:
                raise ValueError(f"{role} file {rel!r} is not listed in files")
        # Build the contract views once so that tier/contract violations fail at parse time.
        self.capabilities.to_contract()
        for p in self.profiles:
            p.to_contract()
        return self

    # --- loading ---------------------------------------------------------------------------

    @classmethod
    def parse(cls, data: bytes | str | dict[str, Any]) -> CalbinManifest:
        """Validate manifest content; every failure is a :class:`PackageError` naming the field."""
        try:
            if isinstance(data, dict):
                return cls.model_validate(data)
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            raise PackageError(f"invalid {MANIFEST_FILE}: {where}: {first['msg']} ({exc.error_count()} error(s))",
                               field=where) from exc
        except CalculetError as exc:
            raise PackageError(f"invalid {MANIFEST_FILE}: {exc}") from exc

    @classmethod
    def from_path(cls, package_dir: str | Path) -> CalbinManifest:
        """Read ``<package_dir>/manifest.json``. Does NOT verify the signature or file hashes."""
        path = Path(package_dir) / MANIFEST_FILE
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise PackageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return cls.parse(raw)

    def to_json_bytes(self) -> bytes:
        """Canonical serialisation (sorted keys, 2-space indent, trailing newline): what is signed."""
        return (json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n").encode()

    # --- contract views --------------------------------------------------------------------

    def batch_profiles(self) -> tuple[BatchProfile, ...]:
        """Profiles as contract dataclasses, ordered by compiled_batch. Raises PackageError."""
        try:
            return tuple(sorted((p.to_contract() for p in self.profiles), key=lambda p: p.compiled_batch))
        except CalculetError as exc:
            raise PackageError(f"invalid profile in {MANIFEST_FILE}: {exc}") from exc

    def device_capabilities(self) -> DeviceCapabilities:
        """The capability contract with evidence tiers. Raises PackageError."""
        try:
            return self.capabilities.to_contract()
        except (CalculetError, ValueError) as exc:
            raise PackageError(f"invalid capabilities in {MANIFEST_FILE}: {exc}") from exc

    def golden_vectors(self) -> tuple[GoldenVector, ...]:
        return tuple(g.to_contract() for g in self.golden)

    def memory_footprint(self) -> MemoryFootprint:
        return self.memory.to_contract()

    def profile_batches(self) -> tuple[int, ...]:
        return tuple(sorted(p.compiled_batch for p in self.profiles))


__all__ = ["MANIFEST_FILE", "MANIFEST_FORMAT", "Architecture", "CalbinManifest", "CapabilitiesModel",
           "CapabilityEntry", "ContextOpsModel", "FileEntry", "GoldenModel", "InactivePolicyModel",
           "KvLayoutModel", "MemoryModel", "ProfileModel", "SpecialTokens", "TensorModel", "WeightTensor"]
