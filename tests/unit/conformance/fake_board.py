"""A test double of a vendor distribution's device plug-in: a "board" that is the simulator underneath
but does not say so (``simulated = False``), so a passing conformance report earns tiers for it.

Only tests use it, through an ``importlib.metadata`` double of the ``calculet.devices`` table.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.adapters.calrt import VirtualDevice
from calculet.adapters.devices import DeviceRequest, FaultHooks
from calculet.adapters.sim import SimCalRT
from calculet.adapters.sim.plugin import PLUGIN as SIM


@dataclass(frozen=True)
class FakeBoard:
    name: str = "fakeboard"
    description: str = "a test double of a vendor board (the simulator underneath)"
    simulated: bool = False

    def open_runtime(self, request: DeviceRequest) -> SimCalRT:
        return SIM.open_runtime(request)

    def fault_hooks(self, device: VirtualDevice) -> FaultHooks | None:
        return SIM.fault_hooks(device)


PLUGIN = FakeBoard()
