"""Devices as plug-ins (#18): the ``calculet.devices`` entry-point group, found by name.

R3.4: the simulated NPU, registered like any vendor binding, still drives one device per process.
"""

from __future__ import annotations

from importlib import metadata

import pytest

from calculet.adapters.devices import (
    ENTRY_POINT_GROUP,
    DevicePlugin,
    DeviceRegistry,
    DeviceRequest,
    HookedFault,
    load_device,
)
from calculet.adapters.sim import SimCalRT, TimeMode
from calculet.adapters.sim.plugin import PLUGIN, SimFaultHooks, sim_config_for
from calculet.clock import FakeClock
from calculet.errors import ConfigError, DefinitionError

NOT_A_PLUGIN = object()


def table(*entries: tuple[str, str]) -> DeviceRegistry:
    """A test double of the installed entry-point table."""
    eps = [metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP) for name, value in entries]
    return DeviceRegistry(source=lambda: eps)


def test_the_simulator_is_registered_by_the_installed_distribution() -> None:
    """The sim is found through the real entry points of calculet's own pyproject (R3.4)."""
    plugin = load_device("sim")
    assert plugin is PLUGIN
    assert isinstance(plugin, DevicePlugin)
    assert plugin.simulated
    assert "sim" in DeviceRegistry().names()


def test_a_device_from_another_distribution_is_found_by_name() -> None:
    registry = table(("sim", "calculet.adapters.sim.plugin:PLUGIN"),
                     ("fakeboard", "tests.unit.conformance.fake_board:PLUGIN"))
    assert registry.names() == ("fakeboard", "sim")
    plugin = registry.load("fakeboard")
    assert plugin.name == "fakeboard" and not plugin.simulated


def test_an_unknown_device_names_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match=r"no device plug-in named 'board9'.*installed: sim"):
        table(("sim", "calculet.adapters.sim.plugin:PLUGIN")).load("board9")


def test_a_name_registered_twice_is_refused() -> None:
    registry = table(("sim", "calculet.adapters.sim.plugin:PLUGIN"), ("sim", "elsewhere:PLUGIN"))
    with pytest.raises(ConfigError, match="more than one distribution"):
        registry.load("sim")


def test_a_plugin_that_fails_to_import_or_is_not_a_plugin_is_named() -> None:
    with pytest.raises(ConfigError, match="failed to import"):
        table(("gone", "no_such_module_xyz:PLUGIN")).load("gone")
    with pytest.raises(DefinitionError, match="does not satisfy DevicePlugin"):
        table(("odd", "tests.unit.adapters.test_devices:NOT_A_PLUGIN")).load("odd")


def test_sim_options_choose_time_and_cost() -> None:
    clock = FakeClock()
    virtual = sim_config_for(DeviceRequest(real_time=False, clock=clock, options={"cost": "instant"}))
    assert virtual.time_mode is TimeMode.VIRTUAL and virtual.clock is clock and virtual.cost.decode_fixed_s == 0
    assert sim_config_for(DeviceRequest()).time_mode is TimeMode.REAL
    with pytest.raises(ConfigError, match="unknown simulated cost model"):
        sim_config_for(DeviceRequest(options={"cost": "warp"}))


def test_sim_fault_hooks_fail_the_next_job() -> None:
    runtime = PLUGIN.open_runtime(DeviceRequest(real_time=False, clock=FakeClock()))
    assert isinstance(runtime, SimCalRT)
    device = runtime.create_virtual_device()
    try:
        hooks = PLUGIN.fault_hooks(device)
        assert isinstance(hooks, SimFaultHooks)
        hooks.fail_next_job(HookedFault.CCU_FAULT)
        assert device.faults.statistics().rules == 1
    finally:
        device.close()
