"""What an injected fault does to a job's outcome (the effects of :mod:`calculet.adapters.sim.faults`).

The rules decide *which* job suffers *which* fault at submit; this module says what that fault
does when the job completes, in one place per kind:

* ``CCU_FAULT`` — the job fails with rc CCU_FAULT and commits nothing; with lane-level failure
  isolation (a capability, R7.4.6) only the decision's lanes fail and the others commit (§7.4).
* ``DMA_UNKNOWN`` — the job fails with rc DMA_UNKNOWN, commits nothing, and its output buffer
  holds garbage (NaN).
* ``LANE_CROSSTALK`` — rc OK, but two lanes' outputs (with their tags) are swapped (§14 R14.5).
* ``BAD_COUNTERS`` — rc OK, but the status counters are wrong (§14 R14.6).
* ``TIMEOUT`` and ``DEVICE_BUSY`` act at submit (no completion instant; a refused submit), not here.

After a CCU fault or unknown DMA the device is poisoned until reset when its configuration says
so (§12): :func:`poisons`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calculet.adapters.calrt import LaneResult, ReturnCode, StatusCounters
from calculet.adapters.sim.faults import FaultDecision, InjectedFault


def discards_numerics(decision: FaultDecision | None, isolated: bool) -> bool:
    """True when a whole-job fault means nothing will be committed, so nothing need be computed."""
    kind = decision.kind if decision else None
    return kind is InjectedFault.DMA_UNKNOWN or (kind is InjectedFault.CCU_FAULT and not isolated)


def return_codes(decision: FaultDecision | None, isolated: bool, valid: Sequence[bool]
                 ) -> tuple[ReturnCode, list[ReturnCode]]:
    """The job's return code and each lane's (an inactive lane is never failed by a fault)."""
    b = len(valid)
    kind = decision.kind if decision else None
    if kind is InjectedFault.CCU_FAULT:
        assert decision is not None
        hit = set(decision.lanes if (isolated and decision.lanes) else range(b))
        return ReturnCode.CCU_FAULT, [ReturnCode.CCU_FAULT if (i in hit and valid[i]) else ReturnCode.OK
                                      for i in range(b)]
    if kind is InjectedFault.DMA_UNKNOWN:
        return ReturnCode.DMA_UNKNOWN, [ReturnCode.DMA_UNKNOWN if valid[i] else ReturnCode.OK for i in range(b)]
    return ReturnCode.OK, [ReturnCode.OK] * b


def corrupt(decision: FaultDecision | None, lanes: list[LaneResult], counters: StatusCounters,
            output: np.ndarray | None) -> StatusCounters:
    """Apply a fault's damage to a completed job's lanes (in place), output rows and counters."""
    kind = decision.kind if decision else None
    if kind is InjectedFault.DMA_UNKNOWN and output is not None:
        output[:] = np.nan
    if kind is InjectedFault.LANE_CROSSTALK and decision is not None:
        a, c = decision.lanes
        lanes[a], lanes[c] = lanes[c], lanes[a]
        if output is not None:
            output[[a, c]] = output[[c, a]]
    if kind is InjectedFault.BAD_COUNTERS:
        return StatusCounters(engine_sequence=counters.engine_sequence - 1,
                              lanes_valid=counters.lanes_valid + 1,
                              tokens_processed=counters.tokens_processed + 1,
                              kv_tokens_written=counters.kv_tokens_written)
    return counters


def poisons(rc: ReturnCode) -> bool:
    """After these the device's state is unknown: it takes no job until reset (§9.2, §12)."""
    return rc in (ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN)
