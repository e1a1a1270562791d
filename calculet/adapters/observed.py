"""An observed device: any CalRT runtime and its VirtualDevices, unchanged, plus a record of what
they did — the jobs they accepted and completed, the lifecycle calls they received, the KV
sequences they allocated and freed, their resets.

Tests and the load simulator need to see the device through the runtime's eyes without changing
it: which batch the scheduler submitted, on which engine, with how many jobs already in flight
(§8, §14), when each completed and with which return code (§16, R19.2), and which lifecycle calls
a load or an unload made in which order (§11, §12). One wrapper records all of it
(:class:`ObservedCalRT` → :class:`ObservedDevice` → :class:`ObservedKvManager`), in one shared
:class:`DeviceObservation` that outlives a device restart (recovery creates a new device from the
same runtime).

:class:`DeviceObserver` hooks are called around the CalRT calls, on the thread that drives the
device (the engine's actor, DESIGN principle 2), in call order. An observer may also act as the
device would on a bad day — refuse a call by raising a :class:`~calculet.errors.CalculetError`
carrying its return code, report another outcome for a result, report other memory figures — which
is how tests inject what the simulator's own fault kinds do not cover. An observer must not call
the device itself. The wrappers' ``statistics()`` are the wrapped objects' (they are drop-in
devices); the observation's own figures are :meth:`DeviceObservation.statistics`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np

from calculet.adapters.calrt import (
    BufferHandle,
    Calbin,
    CalRT,
    DecodeJob,
    JobBuffers,
    JobId,
    JobKind,
    JobResult,
    JobSpec,
    JobTicket,
    KvManager,
    KvSeqId,
    MemInfo,
    VirtualDevice,
)
from calculet.errors import CalculetError

LIFECYCLE_CALLS = ("create_calbin", "configure", "create_kv_manager", "allocate_job_buffers", "free_job_buffers",
                   "destroy_kv_manager", "destroy_calbin", "reset_configuration")
"""The calls that change what the device holds (§11 load steps, §12 release order); each is logged."""

_R = TypeVar("_R")


@dataclass
class ObservedJob:
    """One job the device accepted, and its completion once a result was handed to the runtime.

    ``kind``, ``engine`` and ``rc`` are labels (``"decode"``, ``"ping"``, ``"CCU_FAULT"``).
    """

    device_job: int
    generation: int
    calbin_id: int
    kind: str
    engine: str
    compiled_batch: int
    seqs: tuple[int, ...]
    """Device sequences of the valid lanes."""
    inflight_before: int
    """Jobs already in flight on the device when this one was submitted."""
    submitted_at: float
    buffers: tuple[int, int]
    """(InputBuf, OutputBuf) ids."""
    completed_at: float | None = None
    rc: str = ""


class DeviceObserver:
    """Hooks an :class:`ObservedCalRT` calls around the CalRT calls of its devices (no-ops here)."""

    def device_created(self, device: VirtualDevice, index: int) -> None:
        """A device was created (``index`` 0 at bring-up, then one per restart); ``device`` is the
        wrapped one, so an observer may arm what the device itself offers (fault rules...)."""

    def calling(self, call: str) -> None:
        """Before ``create_virtual_device``, a lifecycle call or ``submit`` reaches the device;
        raising a CalculetError refuses the call as the device would."""

    def calbin_created(self, calbin: Calbin) -> None:
        """CreateCalbin returned ``calbin``."""

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        """The device accepted ``job`` (a refused submit raises before this)."""

    def delivering(self, result: JobResult) -> JobResult:
        """A result is about to be handed to the runtime; return it, or the outcome to report instead."""
        return result

    def completed(self, result: JobResult) -> None:
        """A result was handed to the runtime (poll, wait or wait_any)."""

    def memory_read(self, chip: int, info: MemInfo) -> MemInfo:
        """ReadMem(chip) returned ``info``; return it, or the figures to report instead."""
        return info

    def sequence_allocated(self, seq: int) -> None:
        """A KV sequence was allocated on the device."""

    def sequence_freed(self, seq: int) -> None:
        """A KV sequence was freed on the device."""

    def device_reset(self) -> None:
        """ResetConfiguration or close: every job and KV sequence of the device is gone."""


@dataclass(frozen=True)
class ObservationStatistics:
    """Figures over what the observation holds (a test may clear its logs after bring-up)."""

    devices: int
    jobs: int
    completed: int
    completed_by_rc: Mapping[str, int]
    max_overlap: int
    """Most jobs ever in flight together, counting the one submitted (1: serial; 2: ping/pong)."""
    submits_refused: int
    calls: Mapping[str, int]
    resets: int
    sequences_allocated: int
    sequences_freed: int


@dataclass
class DeviceObservation:
    """What every device of one observed runtime did, in order; survives a device restart."""

    observers: list[DeviceObserver] = field(default_factory=list)
    jobs: list[ObservedJob] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    devices: list[ObservedDevice] = field(default_factory=list)
    submits_refused: int = 0
    resets: int = 0
    sequences_allocated: int = 0
    sequences_freed: int = 0

    def record_submit(self, job: JobSpec, ticket: JobTicket, inflight_before: int) -> None:
        seqs = (tuple(int(s) for s, v in zip(job.seq_ids, job.lane_valid) if v) if isinstance(job, DecodeJob)
                else (int(job.seq_id),))
        self.jobs.append(ObservedJob(int(ticket.job_id), job.generation, job.calbin_id, job.kind.value,
                                   job.engine.name.lower(), job.compiled_batch, seqs, inflight_before,
                                   ticket.submitted_at, (job.buffers.input.buffer_id, job.buffers.output.buffer_id)))
        for o in self.observers:
            o.submitted(job, ticket)

    def record_result(self, result: JobResult) -> JobResult:
        for o in self.observers:
            result = o.delivering(result)
        for entry in reversed(self.jobs):
            if entry.device_job == int(result.job_id):
                entry.completed_at, entry.rc = result.completed_at, result.rc.name
                break
        for o in self.observers:
            o.completed(result)
        return result

    def statistics(self) -> ObservationStatistics:
        done = [j for j in self.jobs if j.completed_at is not None]
        return ObservationStatistics(
            devices=len(self.devices), jobs=len(self.jobs), completed=len(done),
            completed_by_rc=MappingProxyType(dict(Counter(j.rc for j in done))),
            max_overlap=max((j.inflight_before + 1 for j in self.jobs), default=0),
            submits_refused=self.submits_refused, calls=MappingProxyType(dict(Counter(self.calls))),
            resets=self.resets, sequences_allocated=self.sequences_allocated, sequences_freed=self.sequences_freed)


class ObservedKvManager:
    """A device KvManager whose allocations and frees are recorded; everything else is delegated."""

    def __init__(self, inner: KvManager, observation: DeviceObservation) -> None:
        self.inner = inner
        self._observation = observation

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def allocate_sequence(self) -> KvSeqId:
        seq = self.inner.allocate_sequence()
        self._observation.sequences_allocated += 1
        for o in self._observation.observers:
            o.sequence_allocated(int(seq))
        return seq

    def free_sequence(self, seq_id: KvSeqId) -> None:
        self.inner.free_sequence(seq_id)
        self._observation.sequences_freed += 1
        for o in self._observation.observers:
            o.sequence_freed(int(seq_id))


class ObservedDevice:
    """A VirtualDevice that records what it does; every call is delegated to ``inner``.

    Attributes the protocol does not name (a simulator's ``faults``, ``clock``...) are the inner
    device's, so the wrapper is a drop-in replacement.
    """

    def __init__(self, inner: VirtualDevice, observation: DeviceObservation) -> None:
        self.inner = inner
        self.observation = observation

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def physical_index(self) -> int:
        return self.inner.physical_index

    def _lifecycle(self, call: str, fn: Callable[..., _R], *args: Any) -> _R:
        self.observation.calls.append(call)
        for o in self.observation.observers:
            o.calling(call)
        return fn(*args)

    def _deliver(self, results: list[JobResult]) -> list[JobResult]:
        return [self.observation.record_result(r) for r in results]

    def _reset_seen(self) -> None:
        for o in self.observation.observers:
            o.device_reset()

    # --- lifecycle ---------------------------------------------------------------------------

    def create_calbin(self, package_dir: Any) -> Calbin:
        calbin = self._lifecycle("create_calbin", self.inner.create_calbin, package_dir)
        for o in self.observation.observers:
            o.calbin_created(calbin)
        return calbin

    def destroy_calbin(self, calbin: Calbin) -> None:
        self._lifecycle("destroy_calbin", self.inner.destroy_calbin, calbin)

    def configure(self, calbin: Calbin, profiles: Sequence[int] | None = None) -> None:
        self._lifecycle("configure", self.inner.configure, calbin, profiles)

    def reset_configuration(self) -> None:
        self._lifecycle("reset_configuration", self.inner.reset_configuration)
        self.observation.resets += 1
        self._reset_seen()

    def create_kv_manager(self, calbin: Calbin) -> ObservedKvManager:
        kv = self._lifecycle("create_kv_manager", self.inner.create_kv_manager, calbin)
        return ObservedKvManager(kv, self.observation)

    def destroy_kv_manager(self, kv: KvManager) -> None:
        inner = kv.inner if isinstance(kv, ObservedKvManager) else kv
        self._lifecycle("destroy_kv_manager", self.inner.destroy_kv_manager, inner)

    def allocate_job_buffers(self, calbin: Calbin, kind: JobKind, compiled_batch: int = 1) -> JobBuffers:
        return self._lifecycle("allocate_job_buffers", self.inner.allocate_job_buffers, calbin, kind, compiled_batch)

    def free_job_buffers(self, buffers: JobBuffers) -> None:
        self._lifecycle("free_job_buffers", self.inner.free_job_buffers, buffers)

    def close(self) -> None:
        self.inner.close()
        self._reset_seen()

    # --- jobs --------------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobTicket:
        try:
            for o in self.observation.observers:
                o.calling("submit")
            before = len(self.inner.inflight())
            ticket = self.inner.submit(job)
        except CalculetError:
            self.observation.submits_refused += 1
            raise
        self.observation.record_submit(job, ticket, before)
        return ticket

    def poll(self) -> list[JobResult]:
        return self._deliver(self.inner.poll())

    def wait(self, job_id: JobId, timeout_s: float) -> JobResult:
        return self._deliver([self.inner.wait(job_id, timeout_s)])[0]

    def wait_any(self, timeout_s: float) -> list[JobResult]:
        return self._deliver(self.inner.wait_any(timeout_s))

    def next_completion_time(self) -> float | None:
        return self.inner.next_completion_time()

    def inflight(self) -> tuple[JobTicket, ...]:
        return self.inner.inflight()

    def read_buffer(self, handle: BufferHandle) -> np.ndarray:
        return self.inner.read_buffer(handle)

    def read_mem(self, chip: int) -> MemInfo:
        info = self.inner.read_mem(chip)
        for o in self.observation.observers:
            info = o.memory_read(chip, info)
        return info

    def statistics(self) -> Any:
        return self.inner.statistics()


class ObservedCalRT:
    """A CalRT runtime whose devices (the first and any a restart creates) are observed."""

    def __init__(self, inner: CalRT, observers: Sequence[DeviceObserver] = ()) -> None:
        self.inner = inner
        self.observation = DeviceObservation(list(observers))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def version(self) -> str:
        return self.inner.version

    @property
    def devices(self) -> list[ObservedDevice]:
        return self.observation.devices

    @property
    def device(self) -> ObservedDevice:
        """The device created last (after a restart, the replacement)."""
        return self.observation.devices[-1]

    @property
    def jobs(self) -> list[ObservedJob]:
        return self.observation.jobs

    @property
    def calls(self) -> list[str]:
        return self.observation.calls

    def create_virtual_device(self, physical_index: int = 0) -> ObservedDevice:
        for o in self.observation.observers:
            o.calling("create_virtual_device")
        inner = self.inner.create_virtual_device(physical_index)
        device = ObservedDevice(inner, self.observation)
        self.observation.devices.append(device)
        for o in self.observation.observers:
            o.device_created(inner, len(self.observation.devices) - 1)
        return device

    def statistics(self) -> Any:
        return self.inner.statistics()


__all__ = [
    "LIFECYCLE_CALLS", "DeviceObservation", "DeviceObserver", "ObservedJob", "ObservationStatistics",
    "ObservedCalRT", "ObservedDevice", "ObservedKvManager",
]
