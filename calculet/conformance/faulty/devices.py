"""The broken devices of :mod:`calculet.conformance.faulty`: the simulated NPU behind a wrapper that
breaks one rule (see the package docstring for the table).

Each wrapper delegates every CalRT call to a :class:`~calculet.adapters.sim.device.SimVirtualDevice`
and changes only what its :class:`Breakage` names: a result on its way back (crosstalk, counters),
or the KV store of the simulator's :class:`~calculet.adapters.sim.kv.SimKvManager` right after a
job completes or a sequence is allocated (inactive-lane writes, non-atomic commit, stale KV). The
kit runs in virtual time, where the device has no worker thread, so the wrapper touches the store
from the caller's thread without racing a completion.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from calculet.adapters.calrt import (
    NO_SEQUENCE,
    Calbin,
    DecodeJob,
    JobId,
    JobResult,
    JobSpec,
    JobTicket,
    KvSeqId,
)
from calculet.adapters.devices import DeviceRequest, FaultHooks
from calculet.adapters.sim.calbin import SimCalbin
from calculet.adapters.sim.device import SimCalRT, SimVirtualDevice
from calculet.adapters.sim.kv import KvSequenceView, SimKvManager
from calculet.adapters.sim.plugin import SimFaultHooks, sim_config_for


class Breakage(str, enum.Enum):
    INACTIVE_WRITES_KV = "inactive-kv"
    CROSSTALK = "crosstalk"
    LYING_COUNTERS = "counters"
    NON_ATOMIC_COMMIT = "non-atomic"
    STALE_KV_AFTER_RESET = "stale-reset"


EXPECTED_FINDINGS: Mapping[Breakage, str] = {
    Breakage.INACTIVE_WRITES_KV: "inactive_lane_wrote_kv",
    Breakage.CROSSTALK: "lane_crosstalk",
    Breakage.LYING_COUNTERS: "status_counters",
    Breakage.NON_ATOMIC_COMMIT: "non_atomic_commit",
    Breakage.STALE_KV_AFTER_RESET: "stale_kv_after_reset",
}
"""The one finding the kit must report for each broken device (and no other)."""


class FaultyKv:
    """A SimKvManager whose new sequences may inherit stale KV (:attr:`Breakage.STALE_KV_AFTER_RESET`)."""

    def __init__(self, inner: SimKvManager, shape: tuple[int, int, int], stale: list[KvSequenceView]) -> None:
        self.inner = inner
        self.shape = shape
        self.stale = stale
        self.live: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def allocate_sequence(self) -> KvSeqId:
        seq_id = self.inner.allocate_sequence()
        self.live.add(int(seq_id))
        if self.stale:
            view = self.stale.pop(0)
            self.inner.commit(self.inner.lookup(seq_id), view.k, view.v, view.committed_len)
        return seq_id

    def free_sequence(self, seq_id: KvSeqId) -> None:
        self.inner.free_sequence(seq_id)
        self.live.discard(int(seq_id))

    def append_garbage(self, seq_id: int) -> None:
        """One KV row of zeros at the end of ``seq_id``: what a broken device writes where it must not."""
        layers, heads, dim = self.shape
        row = np.zeros((layers, 1, heads, dim))
        self.inner.commit(self.inner.lookup(seq_id), row, row.copy(), 1)


class FaultyVirtualDevice:
    """A simulated VirtualDevice that breaks one rule; every other call is the simulator's."""

    def __init__(self, inner: SimVirtualDevice, breakage: Breakage) -> None:
        self.inner = inner
        self.breakage = breakage
        self._jobs: dict[JobId, JobSpec] = {}
        self._kv: FaultyKv | None = None
        self._stale: list[KvSequenceView] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def physical_index(self) -> int:
        return self.inner.physical_index

    def create_kv_manager(self, calbin: Calbin) -> FaultyKv:
        assert isinstance(calbin, SimCalbin)
        arch = calbin.manifest.architecture
        self._kv = FaultyKv(self.inner.create_kv_manager(calbin), (arch.n_layers, arch.n_heads, arch.head_dim),
                            self._stale)
        return self._kv

    def destroy_kv_manager(self, kv: FaultyKv) -> None:
        self.inner.destroy_kv_manager(kv.inner)

    def reset_configuration(self) -> None:
        if self.breakage is Breakage.STALE_KV_AFTER_RESET and self._kv is not None:
            self._stale[:] = [self._kv.inner.inspect(KvSeqId(s)) for s in sorted(self._kv.live)]
        self.inner.reset_configuration()

    def submit(self, job: JobSpec) -> JobTicket:
        ticket = self.inner.submit(job)
        self._jobs[ticket.job_id] = job
        return ticket

    def wait(self, job_id: JobId, timeout_s: float) -> JobResult:
        return self._broken(self.inner.wait(job_id, timeout_s))

    def wait_any(self, timeout_s: float) -> list[JobResult]:
        return [self._broken(r) for r in self.inner.wait_any(timeout_s)]

    def poll(self) -> list[JobResult]:
        return [self._broken(r) for r in self.inner.poll()]

    def _broken(self, result: JobResult) -> JobResult:
        job = self._jobs.pop(result.job_id, None)
        b = self.breakage
        if b is Breakage.LYING_COUNTERS:
            return result._replace(counters=result.counters._replace(
                tokens_processed=result.counters.tokens_processed + 1))
        if not isinstance(job, DecodeJob) or self._kv is None:
            return result
        valid = [i for i, v in enumerate(job.lane_valid) if v]
        if b is Breakage.INACTIVE_WRITES_KV:
            for i, sid in enumerate(job.seq_ids):
                if not job.lane_valid[i] and sid != NO_SEQUENCE and self._kv.inner.exists(sid):
                    self._kv.append_garbage(sid)
        elif b is Breakage.CROSSTALK and result.ok and len(valid) >= 2:
            lanes = list(result.lanes)
            lanes[valid[0]], lanes[valid[1]] = lanes[valid[1]], lanes[valid[0]]
            return result._replace(lanes=tuple(lanes))
        elif b is Breakage.NON_ATOMIC_COMMIT and not result.ok and valid:
            self._kv.append_garbage(job.seq_ids[valid[0]])
        return result


class FaultyRuntime:
    """The CalRT library of a broken device: a SimCalRT whose devices are wrapped."""

    def __init__(self, inner: SimCalRT, breakage: Breakage) -> None:
        self.inner = inner
        self.breakage = breakage

    @property
    def version(self) -> str:
        return self.inner.version

    def create_virtual_device(self, physical_index: int = 0) -> FaultyVirtualDevice:
        return FaultyVirtualDevice(self.inner.create_virtual_device(physical_index), self.breakage)

    def statistics(self) -> Any:
        return self.inner.statistics()


@dataclass(frozen=True)
class FaultyDevicePlugin:
    """A device plug-in for one :class:`Breakage` (simulated: it earns nothing even when it passes)."""

    breakage: Breakage

    @property
    def name(self) -> str:
        return f"faulty-{self.breakage.value}"

    @property
    def description(self) -> str:
        return f"the simulated NPU, broken on purpose ({self.breakage.name.lower()}); for the conformance kit"

    @property
    def simulated(self) -> bool:
        return True

    def open_runtime(self, request: DeviceRequest) -> FaultyRuntime:
        return FaultyRuntime(SimCalRT(sim_config_for(request)), self.breakage)

    def fault_hooks(self, device: object) -> FaultHooks | None:
        return SimFaultHooks(device.inner) if isinstance(device, FaultyVirtualDevice) else None


FAULTY_DEVICES: Mapping[str, FaultyDevicePlugin] = {p.name: p for p in map(FaultyDevicePlugin, Breakage)}
