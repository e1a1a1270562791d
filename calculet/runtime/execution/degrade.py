"""Ping/pong degrade (§14): when two jobs in flight can no longer be trusted, one at a time.

**DegradeMonitor** watches the triggers: any crosstalk, a status/counter anomaly, P99
inter-token latency under ping/pong beyond ``executor.degrade.p99_regression_ratio`` over the
single-job baseline measured in the same run, ``consecutive_busy_or_timeout`` DeviceBusy refusals
or Wait timeouts with no job accepted in between, or an uncertain recovery. Any of them switches
the executor to one job in flight. Only new jobs are affected: jobs already submitted drain
(R14.10). The degrade is sticky for the life of the engine.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from calculet.config import DegradeConfig

log = logging.getLogger("calculet.runtime.execution.degrade")


class DegradeReason(str, enum.Enum):
    CROSSTALK = "crosstalk"
    COUNTERS = "counters"
    P99_REGRESSION = "p99_regression"
    BUSY_OR_TIMEOUT = "busy_or_timeout"
    UNCERTAIN_RECOVERY = "uncertain_recovery"


@dataclass(frozen=True)
class DegradeStatistics:
    configured_inflight: int
    effective_inflight: int
    degraded: bool
    reason: str
    triggers: dict[str, int]
    busy_or_timeout_streak: int
    solo_samples: int
    pingpong_samples: int
    p99_solo_s: float
    p99_pingpong_s: float


class DegradeMonitor:
    """Watches the §14 triggers and decides the effective in-flight depth (2 → 1, sticky)."""

    CHECK_EVERY = 64

    def __init__(self, config: DegradeConfig, *, configured_inflight: int, min_samples: int = 64,
                 window: int = 2048) -> None:
        self.config = config
        self.configured = configured_inflight
        self.min_samples = min_samples
        self._degraded = False
        self.effective_inflight = configured_inflight
        """How many jobs may be in flight: ``configured``, or 1 once degraded. A plain attribute, set where the
        degrade happens: the engine reads it before every step (issue #20: a property is a call per token)."""
        self._reason = ""
        self._triggers: Counter[str] = Counter()
        self.streak = 0
        """DeviceBusy refusals and Wait timeouts since the device last accepted a job (read it before calling
        :meth:`accepted`, which the engine does only when it is not 0: issue #20, a call per token fewer)."""
        self._solo: deque[float] = deque(maxlen=window)
        self._pp: deque[float] = deque(maxlen=window)
        self._since_check = 0

    @property
    def degraded(self) -> bool:
        return self._degraded

    def trigger(self, reason: DegradeReason, detail: str) -> bool:
        """Record a §14 trigger; returns True when it newly degrades ping/pong."""
        self._triggers[reason.value] += 1
        if self._degraded or self.configured == 1:
            return False
        self._degraded = True
        self.effective_inflight = 1
        self._reason = f"{reason.value}: {detail}"
        log.warning("ping/pong degraded to one job in flight", extra={"reason": reason.value, "detail": detail})
        return True

    def busy_or_timeout(self, detail: str) -> bool:
        self.streak += 1
        if self.streak >= self.config.consecutive_busy_or_timeout:
            return self.trigger(DegradeReason.BUSY_OR_TIMEOUT, f"{self.streak} in a row; last {detail}")
        return False

    def accepted(self) -> None:
        """The device accepted a job: the run of DeviceBusy/timeouts is broken."""
        self.streak = 0

    def latency(self, seconds: float, *, overlapped: bool) -> bool:
        """One inter-token latency sample, taken while one job (solo) or two (ping/pong) ran."""
        (self._pp if overlapped else self._solo).append(seconds)
        self._since_check += 1
        if self._since_check < self.CHECK_EVERY or self._degraded or self.configured == 1:
            return False
        self._since_check = 0
        if len(self._pp) < self.min_samples or len(self._solo) < self.min_samples:
            return False
        solo, pp = self._p99(self._solo), self._p99(self._pp)
        if pp > solo * (1.0 + self.config.p99_regression_ratio):
            return self.trigger(DegradeReason.P99_REGRESSION,
                                f"P99 {pp * 1e3:.3f} ms under ping/pong vs {solo * 1e3:.3f} ms single "
                                f"(> +{self.config.p99_regression_ratio:.0%})")
        return False

    @staticmethod
    def _p99(samples: deque[float]) -> float:
        return float(np.percentile(np.fromiter(samples, dtype=np.float64), 99)) if samples else 0.0

    def statistics(self) -> DegradeStatistics:
        return DegradeStatistics(self.configured, self.effective_inflight, self._degraded, self._reason,
                                 dict(self._triggers), self.streak, len(self._solo), len(self._pp),
                                 self._p99(self._solo), self._p99(self._pp))
