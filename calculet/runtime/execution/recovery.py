"""HealthRecovery (§3, §9.2, §12, §15 ``recovery``): what a device fault costs, and when to give up.

The engine reports every fault that leaves the device in doubt — a Wait timeout, a CCU fault,
an unknown DMA, a submit refused because the device is in a bad state, a reset that itself
failed. Recovery then decides the action and keeps the budget; the engine performs it through
the adapter, on its actor, once no healthy job is still on the device (§14: submitted jobs
drain):

* **reset** — ResetConfiguration, then configure, KvManager, buffers and golden again. Only
  where the capability contract declares the reset verified (§12, R12.7). Its domain is the
  device: every job, buffer and KV sequence on it is gone.
* **restart** — close the VirtualDevice and bring the session up on a new one (what a process
  restart does). Used for an unknown DMA when ``recovery.restart_on_unknown_dma`` (§15,
  R15.17), where no verified reset exists, and when a reset failed (uncertain recovery).

Both count against ``recovery.max_resets_per_10min`` in a sliding 600 s window on the injected
clock (R15.16). When the budget is spent — or is 0 — the model becomes Failed: admission
answers 503 and nothing is reset any more (ambiguity 18). Until then the model is Recovering
(503) from the fault to the end of the reset.

What a fault means for requests and KV is decided elsewhere: the scheduler marks the job's
lanes Unknown (quarantined) and fails its requests (§7.4: the whole batch unless the contract
declares lane isolation); the reset recovers Unknown lanes; requests whose committed KV died
with the reset end with the reset's reason as their error detail.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, deque
from dataclasses import dataclass

from calculet.adapters.calrt import DeviceCapabilities, ReturnCode
from calculet.config import RecoveryConfig
from calculet.clock import Clock
from calculet.runtime.distribution import RECOVERY_BOUNDS, Distribution, DistributionSnapshot

log = logging.getLogger("calculet.runtime.execution.recovery")

WINDOW_S = 600.0
"""``max_resets_per_10min`` counts resets in any sliding 10-minute window (§15)."""


class RecoveryAction(enum.IntEnum):
    """Ordered by strength: a pending reset is escalated to a restart, never the reverse."""

    RESET = 1
    RESTART = 2


class FaultReason(str, enum.Enum):
    """Bounded label set for the §16 recovery metrics."""

    TIMEOUT = "timeout"
    CCU_FAULT = "ccu_fault"
    DMA_UNKNOWN = "dma_unknown"
    DEVICE_STATE = "device_state"
    RESET_FAILED = "reset_failed"


_REASON_FOR_RC = {ReturnCode.TIMEOUT: FaultReason.TIMEOUT, ReturnCode.CCU_FAULT: FaultReason.CCU_FAULT,
                  ReturnCode.DMA_UNKNOWN: FaultReason.DMA_UNKNOWN}


@dataclass(frozen=True)
class PendingRecovery:
    action: RecoveryAction
    reasons: tuple[FaultReason, ...]
    detail: str
    since: float


@dataclass(frozen=True)
class RecoveryStatistics:
    """§16 recovery metrics: fault reasons, resets/restarts, refusals, recovery time, state."""

    state: str
    faults: dict[str, int]
    resets: int
    restarts: int
    failed_recoveries: int
    budget_refusals: int
    resets_in_window: int
    max_resets_per_10min: int
    recovery_time_avg_s: float
    recovery_time_max_s: float
    last_detail: str
    recovery_time: DistributionSnapshot | None = None
    """Every successful recovery's duration, fault to serving again (§16 recovery time as a histogram)."""


class HealthRecovery:
    """Fault bookkeeping, the action to take and the reset budget (the engine acts)."""

    def __init__(self, config: RecoveryConfig, *, clock: Clock, capabilities: DeviceCapabilities) -> None:
        self.config = config
        self._clock = clock
        self._reset_verified = capabilities.reset_configuration_verified.value
        self.pending: PendingRecovery | None = None
        """The recovery a fault left pending, None when the device is not in doubt. Written here only (report,
        finished, forget); the engine reads it several times a step, so a plain attribute, not a property (#20)."""
        self._window: deque[float] = deque()
        self._faults: Counter[str] = Counter()
        self._resets = 0
        self._restarts = 0
        self._failed_recoveries = 0
        self._refusals = 0
        self._time = Distribution(RECOVERY_BOUNDS)
        self._failed = False
        self._last = ""

    # ------------------------------------------------------------------ decisions

    @staticmethod
    def reason_for(rc: ReturnCode) -> FaultReason:
        return _REASON_FOR_RC.get(rc, FaultReason.DEVICE_STATE)

    def action_for(self, reason: FaultReason) -> RecoveryAction:
        """The §12/§15 action for a fault: restart for unknown DMA (if configured), for a failed
        reset, and wherever no verified ResetConfiguration exists; otherwise reset."""
        if reason is FaultReason.RESET_FAILED or not self._reset_verified:
            return RecoveryAction.RESTART
        if reason is FaultReason.DMA_UNKNOWN and self.config.restart_on_unknown_dma:
            return RecoveryAction.RESTART
        return RecoveryAction.RESET

    def report(self, reason: FaultReason, detail: str) -> PendingRecovery:
        """A fault left the device in doubt; recovery is pending (escalated if one already is)."""
        now = self._clock.now()
        self._faults[reason.value] += 1
        self._last = detail
        action = self.action_for(reason)
        pending = self.pending
        if pending is None:
            self.pending = PendingRecovery(action, (reason,), detail, now)
        else:
            self.pending = PendingRecovery(max(pending.action, action), (*pending.reasons, reason),
                                           pending.detail, pending.since)
        log.warning("device fault: recovery pending", extra={"reason": reason.value, "detail": detail,
                                                             "action": self.pending.action.name})
        return self.pending

    @property
    def failed(self) -> bool:
        return self._failed

    def budget_left(self) -> int:
        """Resets still allowed in the current sliding window."""
        now = self._clock.now()
        window = self._window
        while window and window[0] <= now - WINDOW_S:
            window.popleft()
        return max(0, self.config.max_resets_per_10min - len(window))

    def begin(self) -> PendingRecovery | None:
        """Take the pending action if the budget allows (it is then spent); None means give up."""
        pending = self.pending
        if pending is None:
            return None
        if self.budget_left() <= 0:
            self._refusals += 1
            return None
        self._window.append(self._clock.now())
        if pending.action is RecoveryAction.RESTART:
            self._restarts += 1
        else:
            self._resets += 1
        return pending

    def finished(self, pending: PendingRecovery, *, ok: bool) -> None:
        """The action ran; a failure leaves a restart pending (uncertain recovery)."""
        now = self._clock.now()
        if ok:
            took = now - pending.since
            self._time.add(took)
            self.pending = None
            log.info("device recovered", extra={"action": pending.action.name, "seconds": took})
            return
        self._failed_recoveries += 1
        self.pending = None
        self.report(FaultReason.RESET_FAILED, f"{pending.action.name.lower()} failed after: {pending.detail}")

    def give_up(self) -> str:
        """The budget is spent: the model becomes Failed (503 from now on)."""
        self._failed = True
        pending = self.pending
        self.pending = None
        detail = (f"model failed: recovery budget of {self.config.max_resets_per_10min} resets per 10 min "
                  f"exhausted ({pending.detail if pending else self._last})")
        self._last = detail
        log.error("recovery gave up", extra={"detail": detail})
        return detail

    def statistics(self) -> RecoveryStatistics:
        state = "failed" if self._failed else "recovering" if self.pending is not None else "healthy"
        return RecoveryStatistics(
            state=state, faults=dict(self._faults), resets=self._resets, restarts=self._restarts,
            failed_recoveries=self._failed_recoveries, budget_refusals=self._refusals,
            resets_in_window=self.config.max_resets_per_10min - self.budget_left(),
            max_resets_per_10min=self.config.max_resets_per_10min,
            recovery_time_avg_s=self._time.avg, recovery_time_max_s=self._time.max,
            last_detail=self._last, recovery_time=self._time.snapshot())
