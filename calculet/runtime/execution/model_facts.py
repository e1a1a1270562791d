"""What one calbin package states about itself (§2, §7.3, §11 step 3, §13.1, §20).

Read from the verified manifest before any device call (§11 step 3) and from the calbin the device
created, so that §11 step 8 can compare the two: a difference in profiles, tensors, inactive-lane
contract, KV layout, capabilities, memory or identity fails the load (R11.8).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from calculet.adapters.calrt import BatchProfile, Calbin, DeviceCapabilities, GoldenVector, MemoryFootprint
from calculet.packages.manifest import CalbinManifest


@dataclass(frozen=True)
class ModelFacts:
    """What one calbin package states about itself (§2, §7.3, §11 step 3, §13.1, §20).

    Built from the verified manifest before any device call (:meth:`from_manifest`), and from the
    calbin the device created (:meth:`from_calbin`) so that step 8 can compare the two.
    ``max_sequences`` (the KvManager's slot count) is a manifest figure the calbin protocol does
    not report; it is None when read from a calbin.
    """

    name: str
    exact_submodel: str
    package_sha256: str
    profiles: tuple[BatchProfile, ...]
    capabilities: DeviceCapabilities
    memory: MemoryFootprint
    golden: tuple[GoldenVector, ...]
    vocab_size: int
    bos_token: int
    eos_token: int
    max_sequences: int | None = None

    @classmethod
    def from_manifest(cls, manifest: CalbinManifest, sha256: str) -> ModelFacts:
        """The facts of a verified manifest; ``sha256`` is the hash of its signed bytes."""
        arch = manifest.architecture
        return cls(name=manifest.name, exact_submodel=manifest.exact_submodel, package_sha256=sha256,
                   profiles=manifest.batch_profiles(), capabilities=manifest.device_capabilities(),
                   memory=manifest.memory_footprint(), golden=manifest.golden_vectors(),
                   vocab_size=arch.vocab_size, bos_token=arch.special_tokens.bos, eos_token=arch.special_tokens.eos,
                   max_sequences=manifest.memory.max_sequences)

    @classmethod
    def from_calbin(cls, calbin: Calbin) -> ModelFacts:
        """The facts the device reports for a created calbin (§11 step 8 compares them)."""
        return cls(name=calbin.name, exact_submodel=calbin.exact_submodel, package_sha256=calbin.package_sha256,
                   profiles=tuple(sorted(calbin.profiles, key=lambda p: p.compiled_batch)),
                   capabilities=calbin.capabilities, memory=calbin.memory, golden=tuple(calbin.golden),
                   vocab_size=calbin.vocab_size, bos_token=calbin.bos_token, eos_token=calbin.eos_token)

    def differences(self, reported: ModelFacts) -> list[str]:
        """Where the device's report differs from these (manifest) facts; empty when exact (§11 step 8)."""
        out: list[str] = []
        for f in fields(self):
            if f.name == "max_sequences":
                continue
            mine, theirs = getattr(self, f.name), getattr(reported, f.name)
            if f.name == "profiles":
                out.extend(_profile_differences(mine, theirs))
            elif mine != theirs:
                out.append(f"{f.name}: manifest {_short(mine)}, device {_short(theirs)}")
        return out


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _profile_differences(manifest: tuple[BatchProfile, ...], device: tuple[BatchProfile, ...]) -> list[str]:
    want = {p.compiled_batch: p for p in manifest}
    have = {p.compiled_batch: p for p in device}
    out = []
    if set(want) != set(have):
        out.append(f"profiles: manifest B{sorted(want)}, device B{sorted(have)}")
    for batch in sorted(set(want) & set(have)):
        a, b = want[batch], have[batch]
        if a == b:
            continue
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x == y:
                continue
            if f.name == "tensors":
                mine = {t.name: t for t in x}
                theirs = {t.name: t for t in y}
                for name in sorted(set(mine) | set(theirs)):
                    t1, t2 = mine.get(name), theirs.get(name)
                    if t1 != t2:
                        show = (lambda t: "absent" if t is None
                                else f"{list(t.shape)} {t.dtype.value} {t.role.value}")
                        out.append(f"profile B{batch} tensor {name!r}: manifest {show(t1)}, device {show(t2)}")
            else:
                out.append(f"profile B{batch} {f.name}: manifest {_short(x)}, device {_short(y)}")
    return out
