"""A calbin created on the simulated NPU: its manifest contract and, numerics on, the model.

CreateCalbin (§11 step 6) turns a verified package directory into a :class:`SimCalbin`: the
profiles, capability contract, golden vectors and memory footprint the manifest declares, and the
tiny transformer rebuilt from the package's weights (:func:`load_model`), checked against the
manifest's sizes and tensor index so a tampered or truncated package is refused with a CalRT code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from calculet.adapters.calrt import (
    BatchProfile,
    DeviceCapabilities,
    GoldenVector,
    KvManagerMode,
    MemoryFootprint,
    ReturnCode,
    VendorError,
    vendor_boundary,
)
from calculet.adapters.sim.model import TinyConfig, TinyTransformer, unpack_weights
from calculet.errors import DefinitionError
from calculet.packages.manifest import CalbinManifest


@dataclass(frozen=True)
class CalbinStatistics:
    calbin_id: int
    name: str
    configured_profiles: tuple[int, ...]
    prefill_calls: int
    prefill_tokens: int
    decode_calls: int
    decode_lanes: int


class SimCalbin:
    """A created calbin: manifest contract + (numerics on) the model ready to compute."""

    def __init__(self, calbin_id: int, package_dir: Path, manifest: CalbinManifest, manifest_bytes: bytes,
                 model: TinyTransformer | None) -> None:
        self.calbin_id: Final[int] = calbin_id
        """Plain attributes, not properties, for the facts every Submit reads (issue #20); never rebound."""
        self.package_dir = package_dir
        self.manifest = manifest
        self._sha = hashlib.sha256(manifest_bytes).hexdigest()
        self._profiles = manifest.batch_profiles()
        self._by_batch = {p.compiled_batch: p for p in self._profiles}
        self.capabilities: Final[DeviceCapabilities] = manifest.device_capabilities()
        self.vocab_size: Final[int] = manifest.architecture.vocab_size
        """The model's vocabulary: a decode Submit's token check reads it once per job (issue #20)."""
        self._golden = manifest.golden_vectors()
        self._memory = manifest.memory_footprint()
        self.model = model
        self.configured_profiles: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def exact_submodel(self) -> str:
        return self.manifest.exact_submodel

    @property
    def package_sha256(self) -> str:
        """sha256 of manifest.json, which lists every file's sha256: the package's identity."""
        return self._sha

    @property
    def profiles(self) -> tuple[BatchProfile, ...]:
        return self._profiles

    @property
    def golden(self) -> tuple[GoldenVector, ...]:
        return self._golden

    @property
    def memory(self) -> MemoryFootprint:
        return self._memory

    @property
    def eos_token(self) -> int:
        return self.manifest.architecture.special_tokens.eos

    @property
    def bos_token(self) -> int:
        return self.manifest.architecture.special_tokens.bos

    @property
    def max_sequences(self) -> int:
        return self.manifest.memory.max_sequences

    @vendor_boundary("Calbin.profile")
    def profile(self, compiled_batch: int) -> BatchProfile:
        return self.profile_of(compiled_batch)

    def profile_of(self, compiled_batch: int) -> BatchProfile:
        """:meth:`profile` inside the device, already within its vendor boundary (a Submit checks a job's
        profile per token at B1; the boundary's second frame translated nothing, issue #20): raises
        :class:`VendorError` ``NOT_FOUND`` for a batch size the calbin does not have."""
        profile = self._by_batch.get(compiled_batch)
        if profile is None:
            raise VendorError(ReturnCode.NOT_FOUND, f"calbin {self.name!r} has no B{compiled_batch} profile; "
                                                    f"it has {[p.compiled_batch for p in self._profiles]}")
        return profile

    def statistics(self) -> CalbinStatistics:
        m = self.model.statistics() if self.model is not None else None
        return CalbinStatistics(
            calbin_id=self.calbin_id, name=self.name, configured_profiles=self.configured_profiles,
            prefill_calls=m.prefill_calls if m else 0, prefill_tokens=m.prefill_tokens if m else 0,
            decode_calls=m.decode_calls if m else 0, decode_lanes=m.decode_lanes if m else 0)


def load_model(path: Path, manifest: CalbinManifest) -> TinyTransformer:
    """The package's model, rebuilt from its weights file; refused if it does not match the manifest."""
    arch = manifest.architecture
    weights_path = path / arch.weights_file
    try:
        blob = weights_path.read_bytes()
    except OSError as exc:
        raise VendorError(ReturnCode.NOT_FOUND, f"cannot read weights {weights_path}: {exc}") from exc
    expected = manifest.files[arch.weights_file].size
    if len(blob) != expected:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"weights file is {len(blob)} bytes, manifest says {expected}")
    cfg = TinyConfig(vocab_size=arch.vocab_size, d_model=arch.d_model, n_layers=arch.n_layers,
                     n_heads=arch.n_heads, d_ff=arch.d_ff, max_seq=arch.max_seq, norm_eps=arch.norm_eps,
                     seed=arch.seed, bos=arch.special_tokens.bos, eos=arch.special_tokens.eos,
                     pad=arch.special_tokens.pad, unk=arch.special_tokens.unk)
    index = tuple((t.name, tuple(t.shape), t.offset) for t in arch.tensors)
    if tuple((n, s) for n, s, _ in index) != cfg.tensor_shapes():
        raise VendorError(ReturnCode.INVALID_ARGUMENT, "weight tensor index does not match the architecture")
    try:
        return TinyTransformer(cfg, unpack_weights(blob, index))
    except DefinitionError as exc:
        raise VendorError(ReturnCode.INVALID_ARGUMENT, str(exc)) from exc


def check_simulable(calbin: SimCalbin) -> None:
    """The simulated NPU implements per-sequence KV whose inactive lanes write nothing (§7.3)."""
    for p in calbin.profiles:
        pol = p.inactive_policy
        if pol.inactive_writes_kv or pol.kv_manager_mode is not KvManagerMode.PER_SEQUENCE:
            raise VendorError(ReturnCode.NOT_SUPPORTED,
                              f"profile B{p.compiled_batch}: the simulated NPU implements only "
                              "per-sequence KV with inactive lanes that write no KV")


def check_coresident(calbin: SimCalbin, others: Sequence[SimCalbin]) -> None:
    """A second resident calbin needs co-residency on both sides, which 0.7.6 lacks (§13.2)."""
    if others and not (calbin.capabilities.model_coresidency.value
                       and all(o.capabilities.model_coresidency.value for o in others)):
        names = ", ".join(repr(o.name) for o in others)
        raise VendorError(ReturnCode.NOT_SUPPORTED,
                          f"calbin {calbin.name!r} cannot be co-resident with {names}: multi-model "
                          "residency is not a CalRT 0.7.6 capability (§13.2, C3); drain and destroy the "
                          "resident calbin first (time-switching, §13.1)")


def profiles_to_configure(cb: SimCalbin, profiles: Sequence[int] | None, others: Sequence[SimCalbin]
                          ) -> tuple[int, ...]:
    """The profiles a configure call asks for, if the device can configure them (§8, §11, §13.1).

    Configure is device-global on 0.7.6 (§11, R11.14): another configured calbin must be
    destroyed or the configuration reset first. Several profiles at once need the multi-profile
    residency capability (§8, R8.4).
    """
    available = [p.compiled_batch for p in cb.profiles]
    chosen = tuple(sorted(set(available if profiles is None else profiles)))
    missing = [b for b in chosen if b not in available]
    if missing or not chosen:
        raise VendorError(ReturnCode.INVALID_ARGUMENT,
                          f"calbin {cb.name!r} has profiles {available}; cannot configure {list(chosen)}")
    if len(chosen) > 1 and not cb.capabilities.multi_profile_residency.value:
        raise VendorError(ReturnCode.NOT_SUPPORTED,
                          f"configuring profiles {list(chosen)} together needs multi-profile residency, "
                          "which this calbin does not offer (§8: one fixed profile per instance)")
    for other in others:
        if other is not cb and other.configured_profiles:
            global_cfg = cb.capabilities.configure_device_global.value or \
                other.capabilities.configure_device_global.value
            if global_cfg or not cb.capabilities.model_coresidency.value:
                raise VendorError(ReturnCode.INVALID_STATE,
                                  f"calbin {other.name!r} is configured and configure is device-global on "
                                  "CalRT 0.7.6; drain it and reset the configuration or destroy it first "
                                  "(§11, §13.1)")
    return chosen
