"""The simulated Calculet NPU: a CalRT 0.7.6 VirtualDevice that computes for real (numpy).

Entry points::

    from calculet.adapters.sim import SimCalRT, SimConfig, TimeMode, open_sim, package_dir
    session = open_sim("future")            # virtual time, FakeClock, real numerics, B1/B4/B8/B16
    dev, kv, calbin = session.device, session.kv, session.calbin

It is a device plug-in like any other (:mod:`.plugin`, registered as ``sim`` in the
``calculet.devices`` entry points) and proves nothing about hardware (§20). See
:mod:`calculet.adapters.sim.device` for the device contract, :mod:`.config` for how a
device is built, :mod:`.build` for packages (:mod:`.bundled`: the bundled tiny model with its BPE
tokenizer and chat template), :mod:`.cost` for the latency model, :mod:`.memory` for
DRAM accounting and :mod:`.faults` / :mod:`.fault_effects` for fault injection. (``build`` is not imported here so that ``python -m
calculet.adapters.sim.build`` runs it as a fresh module.)
"""

from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.calbin import CalbinStatistics, SimCalbin
from calculet.adapters.sim.config import SimConfig, TimeMode
from calculet.adapters.sim.device import DeviceStatistics, RuntimeStatistics, SimCalRT, SimVirtualDevice
from calculet.adapters.host_driver import GoldenOutcome, HostDriver
from calculet.adapters.sim.faults import FaultInjector, FaultRule, InjectedFault
from calculet.adapters.sim.kv import KvSequenceView, SimKvManager
from calculet.adapters.sim.memory import BoardPreset, MemoryLedger
from calculet.adapters.sim.model import TinyConfig, TinyTransformer
from calculet.adapters.sim.presets import SimSession, open_sim, package_dir

__all__ = [
    "BoardPreset", "CalbinStatistics", "CostModel", "DeviceStatistics", "FaultInjector", "InjectedFault",
    "FaultRule", "GoldenOutcome", "HostDriver", "KvSequenceView", "MemoryLedger", "RuntimeStatistics",
    "SimCalRT", "SimCalbin", "SimConfig", "SimKvManager", "SimSession", "SimVirtualDevice", "TimeMode",
    "TinyConfig", "TinyTransformer", "open_sim", "package_dir",
]
