"""§11 step 4 and §13.1: will a new calbin fit on the board beside what stays resident?

A pure function of figures (the board's ReadMem, the manifests' memory footprints), so it runs on
the calling thread outside the lifecycle lock (R11.4) and is unit-tested on the §13.1 reference
figures. Whether two calbins may stay resident together at all is the contracts' call (§13.2):
:func:`coreside`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calculet.adapters.calrt import MemoryFootprint

__all__ = ["CapacityPlan", "CapacityPlanner", "ChipMemory", "ResidentModel", "coreside"]


@dataclass(frozen=True)
class ChipMemory:
    """One chiplet's DRAM as ReadMem reports it."""

    chip: int
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class ResidentModel:
    """A generation holding device memory; ``stays`` when it remains resident during the load."""

    generation: int
    footprint: MemoryFootprint
    stays: bool


@dataclass(frozen=True)
class CapacityPlan:
    feasible: bool
    detail: str
    need_bytes: tuple[int, ...]
    free_bytes: tuple[int, ...]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3f} GiB"


class CapacityPlanner:
    """§11 step 4: will the new calbin fit, given what stays resident? A pure function of figures.

    The calbin's ``reserved_bytes`` (parameters + KV + runtime, §13.1) is spread evenly over its
    chiplets, as the device reserves it; the job pools go to the chiplet with the most room. A
    generation that will be drained first (no co-residency) gives its reservation back. Nothing
    assumes room for a second large model (R13.1.5): the figures decide. The device's own
    reservation at CreateCalbin stays the final word (the plan is made outside the lock).
    """

    def plan(self, footprint: MemoryFootprint, pool_bytes: int, chips: Sequence[ChipMemory],
             resident: Sequence[ResidentModel]) -> CapacityPlan:
        free = [c.total_bytes - c.used_bytes for c in chips]
        freed_by = []
        for r in resident:
            if r.stays:
                continue
            share = -(-r.footprint.reserved_bytes // len(r.footprint.chiplets))
            for c in r.footprint.chiplets:
                if c < len(free):
                    free[c] += share
            freed_by.append(f"generation {r.generation} ({_gib(r.footprint.reserved_bytes)}, drained first)")
        need = [0] * len(free)
        missing = [c for c in footprint.chiplets if not 0 <= c < len(free)]
        if missing:
            return CapacityPlan(False, f"chiplet(s) {missing} do not exist on this board ({len(free)} chiplets)",
                                tuple(need), tuple(free))
        share = -(-footprint.reserved_bytes // len(footprint.chiplets))
        for c in footprint.chiplets:
            need[c] += share
        left = [f - n for f, n in zip(free, need)]
        best = max(range(len(left)), key=lambda c: left[c]) if left else 0
        if left:
            need[best] += pool_bytes
        short = [c for c in range(len(free)) if need[c] > free[c]]
        staying = [f"generation {r.generation} ({_gib(r.footprint.reserved_bytes)})" for r in resident if r.stays]
        detail = (f"needs {_gib(footprint.reserved_bytes)} (parameters {_gib(footprint.parameter_bytes)} + "
                  f"{footprint.kv_dtype.upper()} KV {_gib(footprint.kv_bytes)} + runtime "
                  f"{_gib(footprint.runtime_bytes)}), {_gib(share)} on each of chiplets {list(footprint.chiplets)}, "
                  f"plus {pool_bytes} bytes of job pools; board {_gib(sum(c.total_bytes for c in chips))}, free "
                  f"{[_gib(f) for f in free]}"
                  + (f" after {', '.join(freed_by)}" if freed_by else "")
                  + (f"; staying resident: {', '.join(staying)}" if staying else ""))
        if short:
            return CapacityPlan(False, f"{detail}; short on chiplet(s) {short} (§13.1: no room is assumed for a "
                                       "second large model)", tuple(need), tuple(free))
        return CapacityPlan(True, detail, tuple(need), tuple(free))


def coreside(a: Any, b: Any) -> bool:
    """Two calbins may be resident and configured together only if both contracts say so (§13.2)."""
    if a is None or b is None:
        return False
    return bool(a.model_coresidency.value and b.model_coresidency.value
                and not a.configure_device_global.value and not b.configure_device_global.value)
