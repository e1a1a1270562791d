"""How a simulated CalRT runtime builds its device: time mode, clock, numerics, costs, board, faults.

One frozen record so a test, a benchmark or the load simulator states the whole simulated NPU it
runs against in one place (DESIGN principle 3: time is injected — virtual time on a FakeClock by
default, real time on the monotonic clock with a device worker thread).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from calculet.adapters.sim.cost import CostModel
from calculet.adapters.sim.faults import FaultRule, InjectedFault
from calculet.adapters.sim.memory import BoardPreset
from calculet.clock import Clock, FakeClock, MonotonicClock
from calculet.errors import DefinitionError


class TimeMode(str, enum.Enum):
    VIRTUAL = "virtual"
    """Completion instants on an injected FakeClock; nothing waits in real time."""
    REAL = "real"
    """A device worker thread completes jobs at their instants on the monotonic clock."""


@dataclass(frozen=True)
class SimConfig:
    """How a :class:`SimCalRT` builds its device.

    ``numerics=False`` keeps the cost model, KV lengths, faults and tags but computes no model:
    results carry deterministic pseudo-tokens (:func:`pseudo_next_token`) and no logits, for fast
    load simulation.
    """

    time_mode: TimeMode = TimeMode.VIRTUAL
    clock: Clock | None = None
    numerics: bool = True
    cost: CostModel = field(default_factory=CostModel.tiny)
    board: BoardPreset = field(default_factory=BoardPreset.tiny)
    fault_rules: tuple[FaultRule, ...] = ()
    fault_seed: int | None = None
    fault_rates: Mapping[InjectedFault, float] = field(default_factory=dict)
    fault_requires_reset: bool = True
    """After CCU_FAULT / DMA_UNKNOWN, new submits fail INVALID_STATE until reset (§12)."""
    wait_advances_clock: bool = True
    """Virtual time: ``wait``/``wait_any`` advance the FakeClock (waiting consumes virtual time)."""

    def __post_init__(self) -> None:
        if not self.cost.numerics:  # the null device (CostModel.null): its cost says numerics off
            object.__setattr__(self, "numerics", False)

    @property
    def completes_inline(self) -> bool:
        """Real time, numerics off and no device time (the null device): every job completes inside submit —
        there is no device time to wait for and no numerics to keep off the caller's thread, so a hop to the
        worker thread would be pure host overhead (issue #20). The result is published and Wait/WaitAny callers
        notified exactly as the worker would; a host that polls after each submission needs no thread blocked
        in WaitAny for it (``SimVirtualDevice.completes_at_submit``)."""
        cost = self.cost
        return (self.time_mode is TimeMode.REAL and not self.numerics
                and cost.prefill_fixed_s == cost.prefill_per_token_s == 0.0
                and cost.decode_fixed_s == cost.decode_per_lane_s == 0.0)

    def resolved_clock(self) -> Clock:
        if self.time_mode is TimeMode.REAL:
            if self.clock is None:
                return MonotonicClock()
            if isinstance(self.clock, FakeClock):
                raise DefinitionError("TimeMode.REAL needs a real monotonic clock, not a FakeClock")
            return self.clock
        return self.clock if self.clock is not None else FakeClock()
