"""Ready-made simulated packages and devices for tests, benchmarks and ``python -m calculet.run``.

Packages are built by code (never committed as binaries) into a per-process cache directory the
first time they are asked for — about 50 ms each — and removed at exit. :func:`open_sim` goes
through the same CalRT calls the runtime makes (§11 step 7: CreateCalbin → configure →
KvManager), so a test that uses it exercises the real load order.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calculet.adapters.sim.calbin import SimCalbin
from calculet.adapters.sim.config import SimConfig
from calculet.adapters.sim.device import SimCalRT, SimVirtualDevice
from calculet.adapters.sim.kv import SimKvManager
from calculet.clock import FakeClock

if TYPE_CHECKING:
    from calculet.adapters.sim.build import MemoryKind, Variant

_lock = threading.Lock()
_root: Path | None = None
_built: dict[tuple[str, tuple[int, ...] | None, str], Path] = {}


def _cache_root() -> Path:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="calculet-sim-pkg-"))
        atexit.register(shutil.rmtree, _root, True)
    return _root


def package_dir(variant: Variant = "current", *, profiles: Sequence[int] | None = None,
                memory: MemoryKind = "tiny") -> Path:
    """Directory of a built package (built once per process and argument set)."""
    from calculet.adapters.sim.build import build_package  # deferred: keeps `-m ...build` clean

    key = (variant, None if profiles is None else tuple(sorted(profiles)), memory)
    with _lock:
        path = _built.get(key)
        if path is None:
            batches = "default" if key[1] is None else "-".join(map(str, key[1]))
            path = _cache_root() / f"{variant}-{batches}-{memory}"
            build_package(path, variant=variant, profiles=profiles, memory=memory,
                          name=f"tiny-sim-{variant}" if memory == "tiny" else f"ref-sim-{variant}")
            _built[key] = path
        return path


@dataclass
class SimSession:
    """A loaded simulated device: runtime, device, one configured calbin and its KvManager."""

    runtime: SimCalRT
    device: SimVirtualDevice
    calbin: SimCalbin
    kv: SimKvManager

    @property
    def clock(self) -> FakeClock:
        """The FakeClock of a virtual-time session."""
        clock = self.device.clock
        assert isinstance(clock, FakeClock), "not a virtual-time session"
        return clock

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> SimSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_sim(variant: Variant = "current", *, configure: Sequence[int] | None = None,
             config: SimConfig | None = None, profiles: Sequence[int] | None = None,
             memory: MemoryKind = "tiny") -> SimSession:
    """Create a device, load ``variant`` and configure ``configure`` (default: every profile).

    ``config`` defaults to virtual time on a fresh FakeClock with real numerics.
    """
    runtime = SimCalRT(config or SimConfig(clock=FakeClock()))
    device = runtime.create_virtual_device()
    try:
        calbin = device.create_calbin(package_dir(variant, profiles=profiles, memory=memory))
        device.configure(calbin, configure)
        kv = device.create_kv_manager(calbin)
    except BaseException:
        device.close()
        raise
    return SimSession(runtime, device, calbin, kv)
