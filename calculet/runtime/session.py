"""RuntimeSession (§3, §11 steps 7–9, §12): one model generation brought up on the device.

A session owns what a generation needs on the device — the calbin, its configuration, the
CalRT KvManager, the job buffers — and what the scheduler needs to know about it — the
:class:`~calculet.runtime.profiles.ProfileSet` and capability facts, all read from the
verified manifest and the capability contract, never from configuration alone (DESIGN
principle 8). It is deliberately small: :meth:`RuntimeSession.create` and
:meth:`RuntimeSession.destroy`, plus the contract reset the recovery path uses. Package trust
(§11 steps 1–3), alias publication and rollback belong to the model manager that drives it.

create (§11):
  7. CreateCalbin → cross-validate the configuration against the manifest and contract
     (R15.19, fail fast) → configure → KvManager → job buffers;
  8. inspect the exact profile contract: every requested profile is compiled, usable B>1
     profiles have a mask contract (R7.3.3), the KvManager can hold the configured lanes;
  9. golden: every golden vector of the manifest must reproduce (greedy tokens and the
     logits checksum) before the session is usable.
A failure at any step destroys what was created, so the device is back to its baseline.

destroy (§12): free live sequences, buffers, the KvManager, ResetConfiguration only where
the contract says it is verified (R12.7), destroy the calbin, then verify the device memory
is back at the baseline measured before create (R12.8) — a leak raises ``DeviceFault``.

Buffers (§14): one InputBuf/OutputBuf pair per (engine, job kind, compiled batch). A job runs
wholly on one engine and an engine runs one job at a time, so two in-flight jobs never share a
buffer; the buffers of a job stuck on the device stay bound until a reset or restart.

Decisions: prefill is a B1 graph, so B1 is configured whenever prefill must run (a fixed
B16-only instance needs multi-profile residency to prefill); the KV lanes the scheduler may
use are ``admission.max_sequences``, checked against the KvManager's ``canAllocate`` hint; the
KV token capacity is the manifest's KV bytes over the profile's bytes per token (§13.1).
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from calculet.adapters.calrt import (
    BatchProfile,
    Calbin,
    ContextOpSupport,
    DeviceCapabilities,
    DeviceFault,
    Engine,
    JobBuffers,
    JobKind,
    KvManager,
    KvSeqId,
    MaskContract,
    ReturnCode,
    VirtualDevice,
    rc_of,
)
from calculet.adapters.sim.driver import GoldenOutcome, HostDriver
from calculet.config import SchedulerConfig, cross_validate
from calculet.errors import CalculetError, DefinitionError
from calculet.runtime.kv import KvCapabilities
from calculet.runtime.profiles import InactiveLanePolicy, ProfileSet, ProfileSpec
from calculet.runtime.scheduler import SchedulingCapabilities

log = logging.getLogger("calculet.runtime.session")


class SessionState(str, enum.Enum):
    NEW = "new"
    READY = "ready"
    DESTROYED = "destroyed"
    ABANDONED = "abandoned"
    """The device was closed under the session (a restart): its handles are gone with it."""


class GoldenFailed(DeviceFault):
    """§11 step 9: a golden vector did not reproduce; the session is not usable."""

    code = "golden_failed"


@dataclass(frozen=True)
class SessionStatistics:
    generation: int
    state: str
    calbin: str
    package_sha256: str
    configured_profiles: tuple[int, ...]
    lanes: int
    max_seq: int
    kv_token_capacity: int
    buffer_pairs: int
    live_sequences: int
    sequences_allocated: int
    sequences_freed: int
    resets: int
    golden_checks: int
    baseline_memory_bytes: int


def profile_spec(profile: BatchProfile) -> ProfileSpec:
    """The scheduler's view of a manifest profile (§2, §7.3)."""
    policy = profile.inactive_policy
    return ProfileSpec(profile.compiled_batch, profile.max_seq, InactiveLanePolicy(policy.fill_token),
                       policy.mask is not MaskContract.NONE, profile.exact_submodel)


class RuntimeSession:
    """The device side of one model generation: calbin, configuration, KvManager, buffers."""

    def __init__(self, device: VirtualDevice, package_dir: str | os.PathLike[str], config: SchedulerConfig, *,
                 generation: int, verify_golden: bool = True) -> None:
        if generation < 1:
            raise DefinitionError(f"generation must be >= 1, got {generation}")
        self.device = device
        self.package_dir = Path(package_dir)
        self.config = config
        self.generation = generation
        self.verify_golden = verify_golden
        self.state = SessionState.NEW
        self._calbin: Calbin | None = None
        self._kv: KvManager | None = None
        self._profiles: ProfileSet | None = None
        self._configured: tuple[int, ...] = ()
        self._buffers: dict[tuple[Engine, JobKind, int], JobBuffers] = {}
        self._live: set[int] = set()
        self._allocated = 0
        self._freed = 0
        self._resets = 0
        self._golden = 0
        self._baseline = 0
        self.golden_outcomes: tuple[GoldenOutcome, ...] = ()

    # ------------------------------------------------------------------ facts

    @property
    def calbin(self) -> Calbin:
        if self._calbin is None:
            raise DefinitionError("the session has no calbin (not created, or destroyed)")
        return self._calbin

    @property
    def kv(self) -> KvManager:
        if self._kv is None:
            raise DefinitionError("the session has no KvManager (not created, reset in progress, or destroyed)")
        return self._kv

    @property
    def capabilities(self) -> DeviceCapabilities:
        return self.calbin.capabilities

    @property
    def profiles(self) -> ProfileSet:
        if self._profiles is None:
            raise DefinitionError("the session has no profiles (not created)")
        return self._profiles

    @property
    def max_seq(self) -> int:
        return self.profiles.max_seq

    @property
    def lanes(self) -> int:
        return self.config.admission.max_sequences

    @property
    def kv_token_capacity(self) -> int:
        """§13.1: the KV the capacity plan reserves, in tokens of the smallest profile's layout."""
        calbin = self.calbin
        per_token = calbin.profile(min(self._configured)).kv_layout.bytes_per_token
        return calbin.memory.kv_bytes // per_token

    @property
    def engines(self) -> tuple[Engine, ...]:
        return (Engine.PING, Engine.PONG) if self.config.executor.max_inflight == 2 else (Engine.PING,)

    def scheduling_capabilities(self) -> SchedulingCapabilities:
        caps = self.capabilities
        return SchedulingCapabilities(incremental_prefill=caps.incremental_prefill.value,
                                      lane_failure_isolation=caps.lane_failure_isolation.value,
                                      vocab_size=self.calbin.vocab_size)

    def kv_capabilities(self) -> KvCapabilities:
        ops = self.capabilities.context_ops
        return KvCapabilities(remove_tail=ops.remove_tail.value is ContextOpSupport.SUPPORTED,
                              shift=ops.shift.value is ContextOpSupport.SUPPORTED)

    def buffers(self, engine: Engine, kind: JobKind, compiled_batch: int) -> JobBuffers:
        """The buffer pair of ``engine`` for a ``kind`` job of ``compiled_batch`` lanes (§14)."""
        try:
            return self._buffers[(engine, kind, compiled_batch)]
        except KeyError:
            raise DefinitionError(f"no {kind.value} B{compiled_batch} buffers for engine {engine.value}") from None

    # ------------------------------------------------------------------ sequences

    def allocate_sequence(self) -> KvSeqId:
        seq = self.kv.allocate_sequence()
        self._live.add(int(seq))
        self._allocated += 1
        return seq

    def free_sequence(self, seq: KvSeqId) -> None:
        """Free a sequence; one the device no longer knows (NOT_FOUND) is forgotten, then re-raised."""
        try:
            self.kv.free_sequence(seq)
        except CalculetError as exc:
            if rc_of(exc) is ReturnCode.NOT_FOUND:
                self._live.discard(int(seq))
            raise
        self._live.discard(int(seq))
        self._freed += 1

    def live_sequences(self) -> tuple[KvSeqId, ...]:
        """The CalRT sequences this session allocated and has not freed (leak checks, tests)."""
        return tuple(KvSeqId(s) for s in sorted(self._live))

    def forget_sequences(self) -> None:
        """The device dropped every sequence (reset/restart): nothing is left to free."""
        self._live.clear()

    # ------------------------------------------------------------------ lifecycle

    def create(self) -> RuntimeSession:
        """§11 steps 7–9; on any failure everything created is destroyed and the error re-raised."""
        if self.state is not SessionState.NEW:
            raise DefinitionError(f"create() on a {self.state.value} session")
        self._baseline = self._memory_used()
        device = self.device
        try:
            self._calbin = calbin = device.create_calbin(self.package_dir)
            self._check_contract(calbin)
            self._configure()
            self.state = SessionState.READY
        except BaseException:
            self._teardown(verify=False)
            self.state = SessionState.DESTROYED
            raise
        log.info("session ready", extra={"generation": self.generation, "calbin": calbin.name,
                                         "profiles": self._configured})
        return self

    def reset(self) -> None:
        """ResetConfiguration per the contract, then configure, KvManager, buffers and golden again.

        Every job, buffer, sequence and the KvManager die with the configuration (the device's
        reset domain); the calbin stays. Only allowed where the contract says the reset is
        verified (R12.7); otherwise recovery restarts the device instead.
        """
        if self.state is not SessionState.READY:
            raise DefinitionError(f"reset() on a {self.state.value} session")
        if not self.capabilities.reset_configuration_verified.value:
            raise DefinitionError("ResetConfiguration is not a verified contract here (R12.7); restart instead")
        self.device.reset_configuration()
        self._resets += 1
        self._kv = None
        self._buffers.clear()
        self._live.clear()
        self._configure()

    def destroy(self) -> None:
        """§12: free sequences, buffers, KvManager; ResetConfiguration if verified; destroy the calbin;
        verify the device memory is back at its baseline (R12.8)."""
        if self.state is SessionState.ABANDONED:
            self.state = SessionState.DESTROYED
            return
        if self.state is not SessionState.READY:
            raise DefinitionError(f"destroy() on a {self.state.value} session")
        busy = [t for t in self.device.inflight() if t.calbin_id == self.calbin.calbin_id]
        if busy:
            raise DefinitionError(f"{len(busy)} job(s) still on the device; drain or recover before destroy (§12: "
                                  "a forced delete is not a cancellation)")
        self._teardown(verify=True)
        self.state = SessionState.DESTROYED

    def abandon(self) -> None:
        """The device was closed (a restart): every handle died with it; nothing is freed here."""
        self._calbin = None
        self._kv = None
        self._buffers.clear()
        self._live.clear()
        self.state = SessionState.ABANDONED

    def statistics(self) -> SessionStatistics:
        calbin = self._calbin
        capacity = self.kv_token_capacity if calbin is not None and self._configured else 0
        return SessionStatistics(
            generation=self.generation, state=self.state.value, calbin=calbin.name if calbin else "",
            package_sha256=calbin.package_sha256 if calbin else "", configured_profiles=self._configured,
            lanes=self.lanes, max_seq=self._profiles.max_seq if self._profiles else 0, kv_token_capacity=capacity,
            buffer_pairs=len(self._buffers), live_sequences=len(self._live), sequences_allocated=self._allocated,
            sequences_freed=self._freed, resets=self._resets, golden_checks=self._golden,
            baseline_memory_bytes=self._baseline)

    # ------------------------------------------------------------------ internals

    def _check_contract(self, calbin: Calbin) -> None:
        """Fail fast on a configuration the manifest or the contract cannot serve (R15.19, §11 step 8)."""
        caps = calbin.capabilities
        config = self.config
        manifest = {p.compiled_batch for p in calbin.profiles}
        cross_validate(config, manifest_profiles=manifest, manifest_label=f"calbin {calbin.name!r}",
                       max_inflight_supported=caps.max_inflight_jobs.value, ping_pong=caps.ping_pong.value,
                       physical_devices_supported=caps.physical_devices_per_process.value,
                       multi_profile_residency=caps.multi_profile_residency.value)
        requested = set(config.batch.profiles)
        configure = sorted(requested | {1})
        if len(configure) > 1 and not caps.multi_profile_residency.value:
            raise DefinitionError(f"profiles {sorted(requested)} need the B1 prefill graph resident beside them, "
                                  "which needs multi-profile residency (§8); this calbin does not offer it")
        self._configured = tuple(configure)
        self._profiles = ProfileSet([profile_spec(p) for p in calbin.profiles], requested=sorted(requested),
                                    thresholds=config.batch.select_thresholds,
                                    multi_profile_residency=caps.multi_profile_residency.value,
                                    manifest_label=f"calbin {calbin.name!r}")

    def _configure(self) -> None:
        device, calbin = self.device, self.calbin
        device.configure(calbin, self._configured)
        self._kv = kv = device.create_kv_manager(calbin)
        if not kv.can_allocate(self.lanes):
            raise DefinitionError(f"the KvManager cannot hold admission.max_sequences={self.lanes} sequences")
        if self.verify_golden:
            self._check_golden()
        for engine in self.engines:
            self._buffers[(engine, JobKind.PREFILL, 1)] = device.allocate_job_buffers(calbin, JobKind.PREFILL, 1)
            for size in self.profiles.sizes:
                self._buffers[(engine, JobKind.DECODE, size)] = device.allocate_job_buffers(
                    calbin, JobKind.DECODE, size)

    def _check_golden(self) -> None:
        driver = HostDriver(self.device, self.calbin, self.kv, generation=self.generation)
        try:
            outcomes = tuple(driver.check_golden(vector) for vector in self.calbin.golden)
        finally:
            driver.close()
        self._golden += 1
        self.golden_outcomes = outcomes
        bad = [o for o in outcomes if not o.ok]
        if bad:
            raise GoldenFailed("golden check failed: " + "; ".join(f"{o.name}: {o.detail}" for o in bad),
                               rc=ReturnCode.INTERNAL)

    def _teardown(self, *, verify: bool) -> None:
        """Destroy whatever exists, in §12 order; with ``verify`` a leftover is an error."""
        device = self.device
        problems: list[str] = []
        kv = self._kv
        for seq in sorted(self._live):
            try:
                if kv is not None:
                    kv.free_sequence(KvSeqId(seq))
                    self._freed += 1
            except CalculetError as exc:
                problems.append(f"free sequence {seq}: {rc_of(exc).name}")
        self._live.clear()
        for key, buffers in list(self._buffers.items()):
            try:
                device.free_job_buffers(buffers)
            except CalculetError as exc:
                problems.append(f"free {key[1].value} buffers of {key[0].value}: {rc_of(exc).name}")
            del self._buffers[key]
        if kv is not None:
            try:
                device.destroy_kv_manager(kv)
            except CalculetError as exc:
                problems.append(f"destroy KvManager: {rc_of(exc).name}")
            self._kv = None
        calbin = self._calbin
        if calbin is not None:
            if calbin.capabilities.reset_configuration_verified.value and self._configured:
                try:
                    device.reset_configuration()
                except CalculetError as exc:
                    problems.append(f"ResetConfiguration: {rc_of(exc).name}")
            try:
                device.destroy_calbin(calbin)
            except CalculetError as exc:
                problems.append(f"destroy calbin: {rc_of(exc).name}")
            self._calbin = None
        if not verify:
            return
        used = self._memory_used()
        if used != self._baseline:
            problems.append(f"device memory {used} bytes after unload, baseline {self._baseline}")
        if problems:
            raise DeviceFault("unload left the device unclean (§12): " + "; ".join(problems), rc=ReturnCode.INTERNAL)

    def _memory_used(self) -> int:
        total = 0
        for chip in range(8):
            try:
                total += self.device.read_mem(chip).used_bytes
            except CalculetError:
                break
        return total
