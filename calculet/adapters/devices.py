"""Devices as plug-ins: a CalRT binding is found by name through the ``calculet.devices`` entry points.

Why: CalRT 0.7.6 is a vendor library calculet cannot ship, so the service must not know which
binding it drives. A distribution (the vendor's binding, a test double, calculet itself for the
simulated NPU) registers an object under the entry-point group :data:`ENTRY_POINT_GROUP`::

    [project.entry-points."calculet.devices"]
    sim = "calculet.adapters.sim.plugin:PLUGIN"        # calculet's own pyproject.toml
    myboard = "myvendor_calculet:PLUGIN"               # a vendor's pyproject.toml

and the operator picks one by name (``python -m calculet.run --device myboard``, ``device: {name:
myboard}`` in the configuration). The object satisfies :class:`DevicePlugin`: it opens a
:class:`~calculet.adapters.calrt.protocol.CalRT` (the protocol every call of which is documented
for an implementer in ``docs/devices.md``), says whether it is a simulator (a simulator never
earns a capability tier, §20), and may offer :class:`FaultHooks` so the conformance kit
(``python -m calculet.conformance``) can exercise fault behaviour (§9.2, §12, §18).

The simulated NPU registers itself exactly this way; nothing in calculet builds ``SimCalRT``
by name any more.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

from calculet.adapters.calrt.protocol import CalRT, VirtualDevice
from calculet.clock import Clock
from calculet.errors import ConfigError, DefinitionError

ENTRY_POINT_GROUP = "calculet.devices"
DEFAULT_DEVICE = "sim"


class HookedFault(str, enum.Enum):
    """Faults the conformance kit asks a device to produce on its next job (§9.2, §12, §18)."""

    CCU_FAULT = "ccu_fault"
    """The next job fails with rc CCU_FAULT."""
    TIMEOUT = "timeout"
    """The next job never completes (Wait times out; only a reset discards it)."""


@runtime_checkable
class FaultHooks(Protocol):
    """Optional: a device that can fail its next job on request (a vendor test mode, the simulator).

    Without hooks the kit cannot observe fault behaviour; the capabilities that depend on it are
    reported as *not established*, never as passed.
    """

    def fail_next_job(self, kind: HookedFault) -> None: ...


@dataclass(frozen=True)
class DeviceRequest:
    """What the caller asks of a plug-in when it opens the runtime."""

    real_time: bool = True
    """True for serving (completions on the device's own time); False for virtual time on ``clock``."""
    clock: Clock | None = None
    """The injected clock of a virtual-time run (DESIGN principle 3)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Plug-in specific settings (``device.options`` in the configuration)."""


@runtime_checkable
class DevicePlugin(Protocol):
    """What an entry point of :data:`ENTRY_POINT_GROUP` must name (see ``docs/devices.md``)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def simulated(self) -> bool:
        """True for a simulator: its capabilities keep the spec's tiers whatever the kit finds (§20)."""
        ...

    def open_runtime(self, request: DeviceRequest) -> CalRT: ...

    def fault_hooks(self, device: VirtualDevice) -> FaultHooks | None: ...


EntryPointSource = Callable[[], Iterable[metadata.EntryPoint]]
"""Where entry points come from: the installed distributions, or a test double of that table."""


def installed_entry_points() -> Iterable[metadata.EntryPoint]:
    """The ``calculet.devices`` entry points of every installed distribution."""
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


@dataclass(frozen=True)
class DeviceRegistry:
    """The device plug-ins the installed distributions register, found by name."""

    source: EntryPointSource | None = None
    """None: the installed distributions' table (:func:`installed_entry_points`, looked up at each call)."""

    def _entries(self) -> list[metadata.EntryPoint]:
        source = self.source if self.source is not None else installed_entry_points
        return [ep for ep in source() if ep.group == ENTRY_POINT_GROUP]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted({ep.name for ep in self._entries()}))

    def load(self, name: str) -> DevicePlugin:
        """The plug-in registered as ``name``; :class:`ConfigError` naming the known ones otherwise."""
        found = [ep for ep in self._entries() if ep.name == name]
        if not found:
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"device: no device plug-in named {name!r} (entry-point group {ENTRY_POINT_GROUP!r}; "
                              f"installed: {known})", errors=[("device.name", f"unknown device {name!r}")])
        values = {ep.value for ep in found}
        if len(values) > 1:
            raise ConfigError(f"device: {name!r} is registered by more than one distribution ({sorted(values)}); "
                              "uninstall one", errors=[("device.name", "ambiguous device name")])
        try:
            plugin = found[0].load()
        except Exception as exc:  # noqa: BLE001 - a broken plug-in is a configuration problem, named
            raise ConfigError(f"device: plug-in {name!r} ({found[0].value}) failed to import: {exc}",
                              errors=[("device.name", "plug-in failed to import")]) from exc
        if not isinstance(plugin, DevicePlugin):
            raise DefinitionError(f"device plug-in {name!r} ({found[0].value}) does not satisfy DevicePlugin "
                                  "(name, description, simulated, open_runtime, fault_hooks; docs/devices.md)")
        return plugin

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(self.names())


@dataclass(frozen=True)
class RegistryStatistics:
    devices: tuple[str, ...]


def load_device(name: str, registry: DeviceRegistry | None = None) -> DevicePlugin:
    """The plug-in named ``name`` from the installed entry points (or ``registry``)."""
    return (registry or DeviceRegistry()).load(name)


__all__ = ["DEFAULT_DEVICE", "ENTRY_POINT_GROUP", "DevicePlugin", "DeviceRegistry", "DeviceRequest",
           "EntryPointSource", "FaultHooks", "HookedFault", "RegistryStatistics", "installed_entry_points",
           "load_device"]
