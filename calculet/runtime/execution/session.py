"""RuntimeSession (§3, §11 steps 7–9, §12): one model generation brought up on the device.

A session owns what a generation needs on the device — the calbin, its configuration, the
CalRT KvManager, the job buffers — and what the scheduler needs to know about it — the
:class:`~calculet.runtime.scheduling.profiles.ProfileSet` and capability facts, all read from the
verified manifest and the capability contract, never from configuration alone (DESIGN
principle 8). Package trust (§11 steps 1–2), alias publication and rollback belong to the
model manager (:mod:`calculet.runtime.models.manager`) that drives it one step at a time; the
:meth:`RuntimeSession.create` / :meth:`RuntimeSession.destroy` pair runs every step in order
for callers that need no more.

What a package states about itself is a :class:`~calculet.runtime.execution.model_facts.ModelFacts`
(read from the verified manifest at §11 step 3, before any device call, or from a created calbin
to compare at step 8), and what a generation will configure is its
:class:`~calculet.runtime.execution.session_plan.SessionPlan` (``plan_session``: the requested
profiles cross-validated against the manifest and the contract, R15.19, fail fast).

create (§11), one method per step so the manager can interleave them with serving:
  7. :meth:`create_calbin` → :meth:`configure` → :meth:`create_kv_manager` → :meth:`create_pools`
     (in exactly this order, R11.7);
  8. :meth:`inspect`: the calbin the device created reports exactly the manifest's profiles,
     tensors, inactive-lane contract, KV layout, capabilities, memory and identity (a mismatch
     fails the load, R11.8), and the KvManager can hold the configured lanes;
  9. :meth:`check_golden` (every golden vector reproduces: greedy tokens and the logits
     checksum) and :meth:`warmup` (one prefill and one decode per configured profile), run by
     :mod:`calculet.runtime.execution.golden`.
A failure at any step is cleaned up by :meth:`teardown` (``verify=False``), so the device is
back to its baseline.

destroy (§12), again one method per step: :meth:`free_sequences` and :meth:`destroy_pools`,
:meth:`destroy_kv_manager` and :meth:`destroy_calbin`, :meth:`reset_configuration_after_unload`
only where the contract says the reset is verified *and* no other calbin shares the reset
domain (R12.7), then :meth:`verify_released`: the device memory this session took is back
(R12.8) — a leak is reported, never ignored. Memory is checked as a difference (what the
session reserved when it became ready must be what its teardown gives back), so it stays exact
when another generation is resident beside it (§13.2 co-residency, simulated).

Buffers (§14): one InputBuf/OutputBuf pair per (engine, job kind, compiled batch), kept by the session's
:class:`~calculet.runtime.execution.pools.JobPools` with the decode targets built on them.

Decision: the KV lanes the scheduler may use (``admission.max_sequences``) are checked against
the CalRT KvManager's ``canAllocate`` hint at step 8.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calculet.adapters.calrt import (
    Calbin,
    DeviceCapabilities,
    JobBuffers,
    JobKind,
    KvManager,
    KvSeqId,
    ReturnCode,
    VirtualDevice,
    rc_of,
    read_board_memory,
)
from calculet.adapters.host_driver import GoldenOutcome
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, DefinitionError, DeviceFault
from calculet.machines.job import JobEngine
from calculet.runtime.execution.golden import require_reproduced, run_golden_vectors, warm_up
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.execution.pools import JobPools
from calculet.runtime.execution.session_plan import SessionPlan, job_engines, plan_session
from calculet.runtime.scheduling.kv import KvCapabilities
from calculet.runtime.scheduling.profiles import ProfileSet
from calculet.runtime.scheduling.plan import SchedulingCapabilities

log = logging.getLogger("calculet.runtime.execution.session")

__all__ = ["InspectionFailed", "RuntimeSession", "SessionState", "SessionStatistics"]


class SessionState(str, enum.Enum):
    NEW = "new"
    READY = "ready"
    DESTROYED = "destroyed"
    ABANDONED = "abandoned"
    """The device was closed under the session (a restart): its handles are gone with it."""


class InspectionFailed(DeviceFault):
    """§11 step 8: the device reports tensors/profiles/contract other than the verified manifest's."""

    code = "inspection_failed"


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
    warmups: int
    baseline_memory_bytes: int
    acquired_memory_bytes: int


class SessionMemory:
    """The device memory one session took, for §12's release check (R12.8).

    Memory is checked as a difference: what the session reserved when it became ready must be
    what its teardown gives back, so the check stays exact when another generation is resident
    beside it (§13.2 co-residency, simulated).
    """

    def __init__(self, device: VirtualDevice) -> None:
        self._device = device
        self.baseline = 0
        """Device memory in use before the session's first step."""
        self.acquired = 0
        """What the session holds now: set when it became ready (or was reset), less what it gave back."""
        self._teardown_from: int | None = None

    def used(self) -> int:
        return sum(info.used_bytes for info in read_board_memory(self._device))

    def start(self) -> None:
        self.baseline = self.used()

    def settle(self) -> None:
        """The session is ready (again): everything above the baseline is its own."""
        self.acquired = self.used() - self.baseline

    def give_back(self, nbytes: int) -> None:
        """The device dropped ``nbytes`` of the session's memory by itself (a reset)."""
        self.acquired -= nbytes

    def begin_teardown(self) -> None:
        """Record the memory before the first §12 step (once)."""
        if self._teardown_from is None:
            self._teardown_from = self.used()

    def leak(self, *, ready: bool) -> str | None:
        """What is not back after the teardown, or None: a ready session must give back what it
        acquired; one that never became ready must leave the baseline."""
        used = self.used()
        if ready and self._teardown_from is not None:
            expected = self._teardown_from - self.acquired
        else:
            expected = self.baseline
        if used == expected:
            return None
        return (f"device memory {used} bytes after unload, expected {expected} "
                f"(this generation reserved {self.acquired})")


class RuntimeSession:
    """The device side of one model generation: calbin, configuration, KvManager, buffers."""

    def __init__(self, device: VirtualDevice, package_dir: str | os.PathLike[str], config: SchedulerConfig, *,
                 generation: int, verify_golden: bool = True, plan: SessionPlan | None = None,
                 warmup: bool = False) -> None:
        if generation < 1:
            raise DefinitionError(f"generation must be >= 1, got {generation}")
        self.device = device
        self.package_dir = Path(package_dir)
        self.config = config
        self.generation = generation
        self.verify_golden = verify_golden
        self.run_warmup = warmup
        self.plan: SessionPlan | None = plan
        self.state = SessionState.NEW
        self.detached = False
        self._calbin: Calbin | None = None
        self._kv: KvManager | None = None
        self._configured: tuple[int, ...] = ()
        self._pools = JobPools()
        self.decode_targets = self._pools.decode_targets
        """The calbin id and buffer pair of a decode step per (engine, batch) (:mod:`.pools`, issue #20); a missing
        one is explained by :meth:`no_decode_target`."""
        self._live: set[int] = set()
        self._allocated = 0
        self._freed = 0
        self._resets = 0
        self._golden = 0
        self._warmups = 0
        self._memory = SessionMemory(device)
        self.golden_outcomes: tuple[GoldenOutcome, ...] = ()

    @classmethod
    def detached(cls, device: VirtualDevice, config: SchedulerConfig) -> RuntimeSession:
        """A session with no model on it: what the executor is bound to while no generation serves
        (between an unload and the next load, or on a restarted device before a generation is up)."""
        session = cls(device, "", config, generation=1, verify_golden=False)
        session.detached = True
        return session

    # ------------------------------------------------------------------ facts

    @property
    def calbin(self) -> Calbin:
        if self._calbin is None:
            raise DefinitionError("the session has no calbin (not created, or destroyed)")
        return self._calbin

    @property
    def has_calbin(self) -> bool:
        return self._calbin is not None

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
        return self._planned("profiles").profiles

    @property
    def max_seq(self) -> int:
        return self.profiles.max_seq

    @property
    def lanes(self) -> int:
        return self.config.admission.max_sequences

    @property
    def kv_token_capacity(self) -> int:
        """§13.1: the KV the capacity plan reserves, in tokens of the smallest profile's layout."""
        return self._planned().kv_token_capacity

    @property
    def engines(self) -> tuple[JobEngine, ...]:
        return job_engines(self.config)

    def scheduling_capabilities(self) -> SchedulingCapabilities:
        return self._planned().scheduling_capabilities()

    def kv_capabilities(self) -> KvCapabilities:
        return self._planned().kv_capabilities()

    def _planned(self, what: str = "plan") -> SessionPlan:
        """The plan, which a caller-built session only has once its calbin is created; asking for
        ``what`` before that is a bug in the caller."""
        if self.plan is None:
            raise DefinitionError(f"the session has no {what} (not created)")
        return self.plan

    def buffers(self, engine: JobEngine, kind: JobKind, compiled_batch: int) -> JobBuffers:
        """The buffer pair of ``engine`` for a ``kind`` job of ``compiled_batch`` lanes (§14)."""
        return self._pools.pair(engine, kind, compiled_batch)

    def no_decode_target(self, engine: JobEngine, compiled_batch: int) -> CalculetError:
        """Why :attr:`decode_targets` has no entry for (``engine``, ``compiled_batch``): the error :attr:`calbin` or
        :meth:`buffers` raises (no calbin, or no such buffers)."""
        try:
            self.calbin  # noqa: B018 - raises when there is none
            self.buffers(engine, JobKind.DECODE, compiled_batch)  # raises when there are no such buffers
        except DefinitionError as exc:
            return exc
        return DefinitionError(f"no decode B{compiled_batch} target for engine {engine.name.lower()}")  # not reached

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

    # ------------------------------------------------------------------ §11 steps 7–9, one at a time

    def create_calbin(self) -> Calbin:
        """Step 7a, CreateCalbin. Without a plan (a caller-built session) the plan is derived from the
        calbin's own contract here, so a configuration it cannot serve fails before configure."""
        if self.state is not SessionState.NEW or self._calbin is not None or self.detached:
            raise DefinitionError(f"create_calbin() on a {self.state.value} session")
        self._memory.start()
        self._calbin = calbin = self.device.create_calbin(self.package_dir)
        if self.plan is None:
            self.plan = plan_session(ModelFacts.from_calbin(calbin), self.config)
        return calbin

    def configure(self) -> None:
        """Step 7b: configure the device for the plan's profiles (device-global on 0.7.6, §11)."""
        assert self.plan is not None
        self.device.configure(self.calbin, self.plan.configured)
        self._configured = self.plan.configured

    def create_kv_manager(self) -> KvManager:
        """Step 7c: the CalRT KvManager of the configured calbin."""
        self._kv = self.device.create_kv_manager(self.calbin)
        return self._kv

    def create_pools(self) -> None:
        """Step 7d: the job buffer pools, one InputBuf/OutputBuf pair per (engine, kind, batch) (§14)."""
        assert self.plan is not None
        self._pools.create(self.device, self.calbin, self.engines, self.plan.profiles.sizes)

    def inspect(self) -> None:
        """Step 8: the device reports exactly the verified manifest's profiles, exact tensors,
        inactive-lane contract, KV layout, capabilities, memory and identity (R11.8); the
        KvManager can hold the configured lanes."""
        assert self.plan is not None
        reported = ModelFacts.from_calbin(self.calbin)
        problems = self.plan.facts.differences(reported)
        if problems:
            raise InspectionFailed("the device's calbin does not match the verified manifest (§11 step 8): "
                                   + "; ".join(problems), rc=ReturnCode.INVALID_ARGUMENT)
        if not self.kv.can_allocate(self.lanes):
            raise DefinitionError(f"the KvManager cannot hold admission.max_sequences={self.lanes} sequences")

    def check_golden(self) -> None:
        """Step 9a: every golden vector of the manifest reproduces (greedy tokens, logits checksum)."""
        outcomes = run_golden_vectors(self.device, self.calbin, self.kv, generation=self.generation)
        self._golden += 1
        self.golden_outcomes = outcomes
        require_reproduced(outcomes)

    def warmup(self) -> None:
        """Step 9b: one prefill and one decode step on every configured profile (:func:`warm_up`)."""
        assert self.plan is not None
        warm_up(self.device, self.calbin, self.kv, generation=self.generation, sizes=self.plan.profiles.sizes)
        self._warmups += 1

    def mark_ready(self) -> None:
        """Steps 7–9 passed: the session may serve; what it reserved is recorded for §12's check."""
        self.state = SessionState.READY
        self._memory.settle()
        assert self.plan is not None
        log.info("session ready", extra={"generation": self.generation, "calbin": self.calbin.name,
                                         "profiles": self._configured})

    def create(self) -> RuntimeSession:
        """§11 steps 7–9 in order; on any failure everything created is destroyed and the error re-raised."""
        if self.state is not SessionState.NEW:
            raise DefinitionError(f"create() on a {self.state.value} session")
        try:
            self.create_calbin()
            self._configure_and_check()
            if self.run_warmup:
                self.warmup()
            self.mark_ready()
        except BaseException:
            self.teardown(verify=False)
            raise
        return self

    # ------------------------------------------------------------------ recovery

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
        self.drop_configuration()
        self._configure_and_check()
        self._memory.settle()

    def _configure_and_check(self) -> None:
        """Steps 7b–9a on the created calbin: configure, KvManager, pools, inspect, golden. The same
        sequence brings a new session up (:meth:`create`) and a reset one back (:meth:`reset`), so
        a reset session is checked exactly as a new one was (only :meth:`create` warms up)."""
        self.configure()
        self.create_kv_manager()
        self.create_pools()
        self.inspect()
        if self.verify_golden:
            self.check_golden()

    def drop_configuration(self) -> None:
        """A ResetConfiguration (this session's or another's: the reset domain is the device) dropped
        the configuration, the KvManager, the buffers and every sequence; the calbin remains."""
        self._memory.give_back(self._pools.nbytes())
        self._forget_configuration()

    def abandon(self) -> None:
        """The device was closed (a restart): every handle died with it; nothing is freed here."""
        self._calbin = None
        self._forget_configuration()
        self.state = SessionState.ABANDONED

    def _forget_configuration(self) -> None:
        """Drop the handles a configuration owns (KvManager, buffers, sequences) without freeing
        them: the device already did, by a reset or by closing."""
        self._kv = None
        self._pools.forget()
        self._live.clear()
        self._configured = ()

    # ------------------------------------------------------------------ §12, one step at a time

    def begin_teardown(self) -> None:
        """Record the device memory before the first §12 step (the release check compares to it)."""
        self._memory.begin_teardown()

    def free_sequences(self) -> list[str]:
        """§12: free every sequence still live on the KvManager. Returns the problems (empty: clean)."""
        self.begin_teardown()
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
        return problems

    def destroy_pools(self) -> list[str]:
        """§12: free the job buffer pools (refused by the device while a job holds a buffer)."""
        self.begin_teardown()
        return self._pools.destroy(self.device)

    def destroy_kv_manager(self) -> list[str]:
        return self._destroy("_kv", self.device.destroy_kv_manager, "KvManager")

    def destroy_calbin(self) -> list[str]:
        return self._destroy("_calbin", self.device.destroy_calbin, "calbin")

    def _destroy(self, attr: str, destroy: Callable[[object], None], label: str) -> list[str]:
        """§12: destroy the object held in ``attr`` once; the problems found (empty: clean)."""
        self.begin_teardown()
        held = getattr(self, attr)
        if held is None:
            return []
        setattr(self, attr, None)
        try:
            destroy(held)
        except CalculetError as exc:
            return [f"destroy {label}: {rc_of(exc).name}"]
        return []

    def reset_allowed(self, *, others_configured: bool) -> bool:
        """R12.7: ResetConfiguration after an unload only where the contract verifies it and no other
        calbin shares the reset domain (it would lose its configuration too)."""
        plan = self.plan
        return (plan is not None and plan.capabilities.reset_configuration_verified.value
                and bool(self._configured) and not others_configured)

    def reset_configuration_after_unload(self, *, others_configured: bool) -> tuple[bool, list[str]]:
        """§12 "ResetConfiguration only per verified contract": (called, problems)."""
        if self.detached or not self.reset_allowed(others_configured=others_configured):
            return False, []
        try:
            self.device.reset_configuration()
        except CalculetError as exc:
            return True, [f"ResetConfiguration: {rc_of(exc).name}"]
        self._resets += 1
        self._configured = ()
        return True, []

    def verify_released(self) -> list[str]:
        """§12 "verify device memory/health": the memory this session took is back (R12.8)."""
        if self.state is SessionState.ABANDONED:
            return []
        problems: list[str] = []
        leak = self._memory.leak(ready=self.state is SessionState.READY)
        if leak:
            problems.append(leak)
        try:
            busy = [t for t in self.device.inflight() if t.generation == self.generation]
        except CalculetError as exc:
            problems.append(f"device health: inflight() failed: {rc_of(exc).name}")
            busy = []
        if busy:
            problems.append(f"{len(busy)} job(s) of generation {self.generation} still on the device")
        return problems

    def finish_teardown(self) -> None:
        self.state = SessionState.DESTROYED if self.state is not SessionState.ABANDONED else self.state

    def teardown(self, *, verify: bool, others_configured: bool = False) -> list[str]:
        """Every §12 cleanup step in order; with ``verify`` a leftover raises ``DeviceFault``.

        Returns the problems found (``verify=False``: a failed create cleans up best-effort)."""
        if self.state is SessionState.ABANDONED:
            return []
        problems = self.free_sequences()
        problems += self.destroy_pools()
        problems += self.destroy_kv_manager()
        problems += self.destroy_calbin()
        _, reset_problems = self.reset_configuration_after_unload(others_configured=others_configured)
        problems += reset_problems
        if verify:
            problems += self.verify_released()
        self.finish_teardown()
        if verify and problems:
            raise DeviceFault("unload left the device unclean (§12): " + "; ".join(problems), rc=ReturnCode.INTERNAL)
        return problems

    def destroy(self, *, others_configured: bool = False) -> None:
        """§12: free sequences, buffers, KvManager and calbin; ResetConfiguration if verified; verify
        the device memory this session took is back (R12.8)."""
        if self.state is SessionState.ABANDONED:
            self.state = SessionState.DESTROYED
            return
        if self.state is not SessionState.READY:
            raise DefinitionError(f"destroy() on a {self.state.value} session")
        busy = [t for t in self.device.inflight() if t.calbin_id == self.calbin.calbin_id]
        if busy:
            raise DefinitionError(f"{len(busy)} job(s) still on the device; drain or recover before destroy (§12: "
                                  "a forced delete is not a cancellation)")
        self.teardown(verify=True, others_configured=others_configured)

    def statistics(self) -> SessionStatistics:
        calbin = self._calbin
        plan = self.plan
        capacity = plan.kv_token_capacity if plan is not None and calbin is not None else 0
        return SessionStatistics(
            generation=self.generation, state=self.state.value, calbin=calbin.name if calbin else "",
            package_sha256=calbin.package_sha256 if calbin else "", configured_profiles=self._configured,
            lanes=self.lanes, max_seq=plan.max_seq if plan is not None and not self.detached else 0,
            kv_token_capacity=capacity, buffer_pairs=len(self._pools), live_sequences=len(self._live),
            sequences_allocated=self._allocated, sequences_freed=self._freed, resets=self._resets,
            golden_checks=self._golden, warmups=self._warmups, baseline_memory_bytes=self._memory.baseline,
            acquired_memory_bytes=self._memory.acquired)
