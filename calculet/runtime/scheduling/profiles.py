"""Batch profiles (§2, §7.3, §8): which compiled batches exist, which may be used, which to pick.

The scheduler does not read the calbin manifest itself; the engine fills :class:`ProfileSpec`
from the validated manifest (``adapters.calrt.BatchProfile``) and the runtime's capability
contract. From those inputs :class:`ProfileSet`

* fails fast when the configuration asks for a profile the manifest does not compile
  (§15, R15.19, R17.1.6) — ``compiled_batch`` comes only from a validated calbin (§2);
* keeps a B>1 profile without a mask contract, or without an explicit inactive-lane policy,
  out of Ready: it is reported, never selected (§7.3, R7.3.1, R7.3.3);
* selects a profile with the configured thresholds (§8, R8.1–R8.2), or serves one fixed
  profile when the runtime cannot keep several resident (§8, R8.4).

Decision (ambiguity 13): ``select_profile`` takes ``oldest_wait`` as the spec's signature does,
and — like the spec's example policy — does not let it change the choice; waiting to fill a
batch is the decode scheduler's batching window (§7.2 items 4–5), not a profile decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

from calculet.errors import ConfigError, DefinitionError
from calculet.runtime.scheduling.asked_once import AskedOnce


_PAST_EVERY_THRESHOLD = 2**31
"""A Ready count no device holds, at or past every configured threshold (they are ints; one above it would name a
profile no Ready count ever selects, which :attr:`ProfileSet.largest` then leaves out, as selection does)."""


@dataclass(frozen=True, slots=True)
class LaneFill:
    """What an inactive lane of a partial batch carries: the token and position (§7.3).

    The scheduler's part of the vendor profile's inactive-lane policy
    (:class:`calculet.adapters.calrt.InactiveLanePolicy`: the four §7.3 items plus its
    ``fill_token``), which only the session reads; the scheduler needs no more than what to put
    in the lane. There is no default: a profile that declares no fill token has
    ``lane_fill=None`` and may only run full batches (B1). Token 0 is refused outright, because
    padding with token 0 is exactly what §7.3 forbids (R7.3.1); a negative token (an
    out-of-vocabulary sentinel, as the vendor manifest may declare) is allowed.
    """

    fill_token: int
    fill_position: int = 0

    def __post_init__(self) -> None:
        # A negative fill token is an out-of-vocabulary sentinel (the simulated manifest uses -1):
        # any accidental use of an inactive lane's input is then caught by the device (§7.3).
        if isinstance(self.fill_token, bool) or not isinstance(self.fill_token, int):
            raise DefinitionError(f"inactive-lane fill_token must be an int, got {self.fill_token!r}")
        if self.fill_token == 0:
            raise DefinitionError("inactive-lane fill_token 0 is forbidden: §7.3 rules out padding with token 0")


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One compiled batch profile, as much of §2 ``BatchProfile`` as scheduling needs."""

    compiled_batch: int
    max_seq: int
    lane_fill: LaneFill | None
    has_mask_contract: bool
    exact_submodel: str = ""
    prefill_chunk_tokens: int | None = None
    """Chunk boundary for incremental prefill (multiples of it), if the profile declares one (§6).

    Filled from the manifest's B1 profile (``adapters.manifest.ProfileModel``), the only one that
    may declare it because prefill jobs are B1-shaped; :attr:`ProfileSet.prefill_chunk_tokens`
    reads it from the smallest usable profile, which is B1 whenever B1 is requested."""

    def __post_init__(self) -> None:
        if not 1 <= self.compiled_batch <= 0xFFFF:
            raise DefinitionError(f"compiled_batch {self.compiled_batch} out of range (uint16, >= 1)")
        if self.max_seq < 1:
            raise DefinitionError(f"max_seq {self.max_seq} must be >= 1")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise DefinitionError(f"prefill_chunk_tokens {self.prefill_chunk_tokens} must be >= 1 (§6)")

    @property
    def unusable_reason(self) -> str | None:
        """Why this profile may not enter Ready (R7.3.3), or None."""
        if self.compiled_batch == 1:
            return None
        if not self.has_mask_contract:
            return (f"B{self.compiled_batch} has no mask contract (valid-mask tensor or CSR); a B>1 profile "
                    "without one never enters Ready (§7.3)")
        if self.lane_fill is None:
            return (f"B{self.compiled_batch} declares no inactive-lane policy; partial batches cannot be "
                    "built and token 0 is never a default (§7.3)")
        return None


class ProfileSet:
    """The profiles of one model generation that the scheduler may use."""

    def __init__(self, manifest: Iterable[ProfileSpec], *, requested: Collection[int],
                 thresholds: Mapping[int, int], multi_profile_residency: bool,
                 manifest_label: str = "the calbin manifest") -> None:
        compiled = {p.compiled_batch: p for p in manifest}
        missing = sorted(set(requested) - set(compiled))
        if missing:
            raise ConfigError(
                f"batch.profiles: profile(s) {['B%d' % b for b in missing]} are not compiled in {manifest_label} "
                f"(compiled: {sorted(compiled)}); compiled_batch comes only from a validated calbin (§2, §15)",
                errors=[("batch.profiles", f"missing {missing}")])
        if not requested:
            raise ConfigError("batch.profiles: no profile requested", errors=[("batch.profiles", "empty")])
        if len(set(requested)) > 1 and not multi_profile_residency:
            raise ConfigError(
                f"batch.profiles: {sorted(set(requested))} needs several profiles resident at once, which the "
                "runtime does not offer; serve one fixed profile per instance pool (§8, R8.4)",
                errors=[("batch.profiles", "multi-profile residency unsupported")])
        names = {}
        usable: dict[int, ProfileSpec] = {}
        for size in sorted(set(requested)):
            reason = compiled[size].unusable_reason
            if reason is None:
                usable[size] = compiled[size]
            else:
                names[size] = reason
        if not usable:
            raise ConfigError("batch.profiles: no requested profile may enter Ready: "
                              + "; ".join(names.values()), errors=[("batch.profiles", "none usable")])
        for size in usable:
            if size != min(usable) and size not in thresholds:
                raise ConfigError(f"batch.select_thresholds: no threshold for B{size} (§8)",
                                  errors=[("batch.select_thresholds", f"missing {size}")])
        self._usable = usable
        self._unusable = names
        self._thresholds = dict(thresholds)
        self.fixed = len(usable) == 1
        # Largest first: the first whose threshold the ready count reaches is chosen.
        self._order = sorted(usable, reverse=True)
        self._smallest = usable[min(usable)]
        self._max_seq = min(p.max_seq for p in usable.values())
        self.by_ready: AskedOnce[int, ProfileSpec] = AskedOnce(self.select_profile)
        """:meth:`select_profile` of each Ready count asked so far (the decode step's profile, issue #20): the set of
        one generation is fixed once built, so a count's profile is decided once, and a steady rotation, whose
        Ready count repeats step after step, reads it instead of asking again."""
        self._largest = self.select_profile(_PAST_EVERY_THRESHOLD)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._usable))

    @property
    def unusable(self) -> dict[int, str]:
        """Compiled and requested, but kept out of Ready, with the reason (R7.3.3)."""
        return dict(self._unusable)

    @property
    def max_seq(self) -> int:
        """The context every usable profile holds (fixed at construction; read once per ``submit``, issue #20)."""
        return self._max_seq

    @property
    def prefill_chunk_tokens(self) -> int | None:
        """The chunk boundary prefill jobs (always B1-shaped) may use, if any (§6)."""
        return self._smallest.prefill_chunk_tokens

    @property
    def largest(self) -> ProfileSpec:
        """The largest compiled batch a decode step may run: the profile §8 selection (R8.1) picks for a Ready count
        past every threshold. The batch the finish estimate's device model and the lanes of the on-time policy are
        sized by (:mod:`.on_time`); one name for what both read as ``select_profile(2**31)`` before session 24.
        Fixed at construction, like the set."""
        return self._largest

    def get(self, compiled_batch: int) -> ProfileSpec:
        """The usable profile of this size; ``ConfigError`` if there is none (fail fast)."""
        profile = self._usable.get(compiled_batch)
        if profile is None:
            why = self._unusable.get(compiled_batch, "not compiled or not requested")
            raise ConfigError(f"profile B{compiled_batch} is not available: {why}")
        return profile

    def select_profile(self, ready: int, oldest_wait: float = 0.0) -> ProfileSpec:
        """§8: the largest profile whose threshold ``ready`` reaches, else the smallest one."""
        if self.fixed:
            return self._smallest
        for size in self._order:
            threshold = self._thresholds.get(size)
            if threshold is not None and ready >= threshold:
                return self._usable[size]
        return self._smallest
