"""The simulated device's statistics records (apart from :mod:`calculet.adapters.sim.device` to keep that module
within the size limit; the façade builds and re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from calculet.adapters.calrt import ReturnCode
from calculet.adapters.sim.config import TimeMode
from calculet.adapters.sim.faults import FaultStatistics
from calculet.adapters.sim.memory import MemoryStatistics
from calculet.machines.job import JobEngine


@dataclass(frozen=True)
class RuntimeStatistics:
    version: str
    devices_created: int
    devices_refused: int
    live_devices: int


@dataclass(frozen=True)
class DeviceStatistics:
    physical_index: int
    time_mode: TimeMode
    numerics: bool
    closed: bool
    config_epoch: int
    calbins: int
    configured_calbins: int
    kv_managers: int
    buffers: int
    buffers_bound: int
    inflight: int
    inflight_never_completing: int
    submitted: int
    submit_refused: Mapping[ReturnCode, int]
    completed: Mapping[ReturnCode, int]
    completed_per_engine: Mapping[JobEngine, int]
    results_uncollected: int
    discarded_by_reset: int
    resets: int
    wait_timeouts: int
    poisoned: ReturnCode | None
    memory: MemoryStatistics
    faults: FaultStatistics
