"""The simulated NPU as a device plug-in: registered as ``sim`` in the ``calculet.devices`` group.

Why: the simulator must be found the way a vendor binding is (``calculet/adapters/devices.py``),
so the code path that serves a real board is the one every test runs. ``pyproject.toml``::

    [project.entry-points."calculet.devices"]
    sim = "calculet.adapters.sim.plugin:PLUGIN"

Options (``device.options`` in the configuration): ``cost`` — ``tiny`` (default), ``reference``,
``instant`` or any other :class:`~calculet.adapters.sim.cost.CostModel` constructor name; or
``sim_config`` — a whole :class:`~calculet.adapters.sim.config.SimConfig` (tests, benchmarks). The
plug-in is ``simulated``: whatever the conformance kit finds, its capabilities keep the spec's
tiers (§20). Its :class:`SimFaultHooks` turn the kit's fault requests into fault-injection rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from calculet.adapters.calrt import VirtualDevice
from calculet.adapters.devices import DeviceRequest, FaultHooks, HookedFault
from calculet.adapters.sim.config import SimConfig, TimeMode
from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.device import SimCalRT, SimVirtualDevice
from calculet.adapters.sim.faults import FaultRule, InjectedFault
from calculet.errors import ConfigError

_HOOKED = {HookedFault.CCU_FAULT: InjectedFault.CCU_FAULT, HookedFault.TIMEOUT: InjectedFault.TIMEOUT}


def sim_config_for(request: DeviceRequest) -> SimConfig:
    """The :class:`SimConfig` a request asks for (see the module docstring for the options)."""
    given = request.options.get("sim_config")
    if given is not None:
        if not isinstance(given, SimConfig):
            raise ConfigError("device.options.sim_config must be a SimConfig",
                              errors=[("device.options.sim_config", "not a SimConfig")])
        return given
    cost_name = str(request.options.get("cost", "tiny"))
    factory = getattr(CostModel, cost_name, None)
    if cost_name.startswith("_") or not callable(factory):
        raise ConfigError(f"device.options.cost: unknown simulated cost model {cost_name!r}",
                          errors=[("device.options.cost", "unknown cost model")])
    cost = factory()
    if not isinstance(cost, CostModel):
        raise ConfigError(f"device.options.cost: {cost_name!r} is not a cost model",
                          errors=[("device.options.cost", "not a cost model")])
    if request.real_time:
        return SimConfig(time_mode=TimeMode.REAL, cost=cost)
    return replace(SimConfig(cost=cost), clock=request.clock)


@dataclass(frozen=True)
class SimFaultHooks:
    """Fail the simulated device's next submitted job as the conformance kit asks."""

    device: SimVirtualDevice

    def fail_next_job(self, kind: HookedFault) -> None:
        self.device.faults.add(FaultRule(_HOOKED[kind], nth=1, count=1))


@dataclass(frozen=True)
class SimDevicePlugin:
    """The simulated Calculet NPU (numpy model, CalRT 0.7.6 protocol; proves nothing about hardware)."""

    name: str = "sim"
    description: str = "simulated Calculet NPU (calculet.adapters.sim): a numpy model behind the CalRT 0.7.6 protocol"
    simulated: bool = True

    def open_runtime(self, request: DeviceRequest) -> SimCalRT:
        return SimCalRT(sim_config_for(request))

    def fault_hooks(self, device: VirtualDevice) -> FaultHooks | None:
        return SimFaultHooks(device) if isinstance(device, SimVirtualDevice) else None


PLUGIN = SimDevicePlugin()
"""The object the ``sim`` entry point names."""
