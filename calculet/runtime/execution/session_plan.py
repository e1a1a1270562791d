"""What one generation will configure and what the scheduler may use (§2, §8, §11 step 3, §13.1).

:func:`plan_session` cross-validates the configuration against a package's
:class:`~calculet.runtime.execution.model_facts.ModelFacts` and capability contract (R15.19,
R17.1.6): an impossible configuration fails here, before any device call. The
:class:`SessionPlan` it returns is what the session configures; :class:`EngineContract` is the
part a running engine is built on for its life, so a replacement package must offer the same.

Decisions: prefill is a B1 graph, so B1 is configured whenever prefill must run (a fixed
B16-only instance needs multi-profile residency to prefill); the KV lanes the scheduler may use
are ``admission.max_sequences``; the KV token capacity is the manifest's KV bytes over the
profile's bytes per token (§13.1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from calculet.adapters.calrt import BatchProfile, ContextOpSupport, DeviceCapabilities, MaskContract
from calculet.config import SchedulerConfig, cross_validate
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.scheduling.kv import KvCapabilities
from calculet.runtime.scheduling.profiles import LaneFill, ProfileSet, ProfileSpec
from calculet.runtime.scheduling.plan import SchedulingCapabilities


def job_engines(config: SchedulerConfig) -> tuple[JobEngine, ...]:
    """The engines jobs run on: PING and PONG with two jobs in flight, PING alone otherwise (§14)."""
    return (JobEngine.PING, JobEngine.PONG) if config.executor.max_inflight == 2 else (JobEngine.PING,)


@dataclass(frozen=True)
class EngineContract:
    """The facts an engine's tokenizer, KV lane pool, scheduler and recovery are built on.

    A running engine keeps them for its life, so a replacement package must offer the same ones
    (checked at §11 step 3, before any device call); a package that differs here needs a new
    engine (process), like any other change of the serving contract.
    """

    vocab_size: int
    bos_token: int
    eos_token: int
    max_seq: int
    kv_token_capacity: int
    incremental_prefill: bool
    lane_failure_isolation: bool
    reset_configuration_verified: bool
    kv_remove_tail: bool
    kv_shift: bool

    def differences(self, other: EngineContract) -> list[str]:
        return [f"{f.name}: serving {getattr(self, f.name)!r}, package {getattr(other, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@dataclass(frozen=True)
class SessionPlan:
    """What one generation configures and what the scheduler may use (§2, §8, §11 step 3).

    Derived from :class:`ModelFacts` and the configuration only, so it is known before the
    first device call: an impossible configuration fails here (R15.19, R17.1.6).
    """

    facts: ModelFacts
    configured: tuple[int, ...]
    profiles: ProfileSet
    max_seq: int
    kv_token_capacity: int
    lanes: int
    engines: tuple[JobEngine, ...]

    @property
    def capabilities(self) -> DeviceCapabilities:
        return self.facts.capabilities

    def scheduling_capabilities(self) -> SchedulingCapabilities:
        caps = self.facts.capabilities
        return SchedulingCapabilities(incremental_prefill=caps.incremental_prefill.value,
                                      lane_failure_isolation=caps.lane_failure_isolation.value,
                                      vocab_size=self.facts.vocab_size)

    def kv_capabilities(self) -> KvCapabilities:
        ops = self.facts.capabilities.context_ops
        return KvCapabilities(remove_tail=ops.remove_tail.value is ContextOpSupport.SUPPORTED,
                              shift=ops.shift.value is ContextOpSupport.SUPPORTED)

    def contract(self) -> EngineContract:
        caps = self.facts.capabilities
        kv = self.kv_capabilities()
        return EngineContract(vocab_size=self.facts.vocab_size, bos_token=self.facts.bos_token,
                              eos_token=self.facts.eos_token, max_seq=self.max_seq,
                              kv_token_capacity=self.kv_token_capacity,
                              incremental_prefill=caps.incremental_prefill.value,
                              lane_failure_isolation=caps.lane_failure_isolation.value,
                              reset_configuration_verified=caps.reset_configuration_verified.value,
                              kv_remove_tail=kv.remove_tail, kv_shift=kv.shift)

    def pool_bytes(self) -> int:
        """Device bytes :meth:`RuntimeSession.create_pools` will allocate (for the capacity plan)."""
        total = 0
        for batch in self.configured:
            profile = next(p for p in self.facts.profiles if p.compiled_batch == batch)
            inputs = sum(t.nbytes for t in profile.tensors if t.role.value == "input")
            outputs = batch * self.facts.vocab_size * profile.logit_dtype.itemsize
            total += inputs + outputs
        return total * len(self.engines) * 2


def plan_session(facts: ModelFacts, config: SchedulerConfig) -> SessionPlan:
    """Cross-validate the configuration against the package's facts and contract (R15.19, §8).

    Raises :class:`~calculet.errors.ConfigError` / :class:`DefinitionError` naming the field; no
    device call is made.
    """
    caps = facts.capabilities
    label = f"calbin {facts.name!r}"
    manifest = {p.compiled_batch for p in facts.profiles}
    cross_validate(config, manifest_profiles=manifest, manifest_label=label,
                   max_inflight_supported=caps.max_inflight_jobs.value, ping_pong=caps.ping_pong.value,
                   physical_devices_supported=caps.physical_devices_per_process.value,
                   multi_profile_residency=caps.multi_profile_residency.value)
    requested = set(config.batch.profiles)
    configure = sorted(requested | {1})
    if len(configure) > 1 and not caps.multi_profile_residency.value:
        raise DefinitionError(f"profiles {sorted(requested)} need the B1 prefill graph resident beside them, "
                              "which needs multi-profile residency (§8); this calbin does not offer it")
    lanes = config.admission.max_sequences
    if facts.max_sequences is not None and lanes > facts.max_sequences:
        raise DefinitionError(f"admission.max_sequences={lanes} exceeds the {facts.max_sequences} KV sequences "
                              f"{label} reserves (§5.1, §13.1)")
    profiles = ProfileSet([profile_spec(p) for p in facts.profiles], requested=sorted(requested),
                          thresholds=config.batch.select_thresholds,
                          multi_profile_residency=caps.multi_profile_residency.value, manifest_label=label)
    smallest = next(p for p in facts.profiles if p.compiled_batch == min(configure))
    engines = job_engines(config)
    return SessionPlan(facts=facts, configured=tuple(configure), profiles=profiles, max_seq=profiles.max_seq,
                       kv_token_capacity=facts.memory.kv_bytes // smallest.kv_layout.bytes_per_token,
                       lanes=lanes, engines=engines)


def profile_spec(profile: BatchProfile) -> ProfileSpec:
    """The scheduler's view of a manifest profile (§2, §7.3, §6).

    The chunk size is passed through as declared; the scheduler still chunks only when the
    capability contract also says ``incremental_prefill`` (§6), so this never enables chunking
    on its own.
    """
    policy = profile.inactive_policy
    return ProfileSpec(profile.compiled_batch, profile.max_seq, LaneFill(policy.fill_token),
                       policy.mask is not MaskContract.NONE, profile.exact_submodel,
                       prefill_chunk_tokens=profile.prefill_chunk_tokens)
