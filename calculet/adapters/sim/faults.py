"""Fault injection for the simulated NPU, by rule or at random with a seed.

Faults exist so the runtime's recovery paths run on every commit, not only on a bad day on
hardware (§14 degrade triggers, §9.2 Unknown lanes, §12 timeout/reset contract, R19.2 "all error
codes visible"). Kinds:

* ``TIMEOUT`` — the job never completes; ``wait`` times out, its buffers stay bound until reset.
* ``CCU_FAULT`` — the job completes with rc CCU_FAULT; nothing it wrote is committed. With
  lane-level failure isolation (a capability) only the rule's lanes fail.
* ``DMA_UNKNOWN`` — the job completes with rc DMA_UNKNOWN; the output buffer holds garbage.
* ``DEVICE_BUSY`` — submit itself is refused with DEVICE_BUSY.
* ``LANE_CROSSTALK`` — rc OK, but two lanes' outputs (with their tags) are swapped.
* ``BAD_COUNTERS`` — rc OK, but the status counters are wrong.

A rule such as "the 3rd decode job on engine PONG times out" is
``FaultRule(InjectedFault.TIMEOUT, job_kind=JobKind.DECODE, engine=JobEngine.PONG, nth=3)``.
"""

from __future__ import annotations

import enum
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from calculet.adapters.calrt import JobKind
from calculet.machines.job import JobEngine
from calculet.errors import DefinitionError


class InjectedFault(str, enum.Enum):
    """A fault the simulator injects into one job (what goes wrong on the device), not how the
    runtime classifies a failed job (:class:`calculet.runtime.scheduling.completion.FaultKind`)."""

    TIMEOUT = "timeout"
    CCU_FAULT = "ccu_fault"
    DMA_UNKNOWN = "dma_unknown"
    DEVICE_BUSY = "device_busy"
    LANE_CROSSTALK = "lane_crosstalk"
    BAD_COUNTERS = "bad_counters"


@dataclass(frozen=True)
class FaultRule:
    """Fire ``kind`` on the ``nth`` matching submit (1-based) and the ``count - 1`` after it.

    ``count=0`` fires on every matching submit from the nth on. ``lanes`` picks the lanes for
    LANE_CROSSTALK (exactly two; default: the first two valid lanes) or, with lane-level failure
    isolation, the lanes a CCU_FAULT hits (default: all).
    """

    kind: InjectedFault
    job_kind: JobKind | None = None
    engine: JobEngine | None = None
    nth: int = 1
    count: int = 1
    lanes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.nth < 1 or self.count < 0:
            raise DefinitionError(f"FaultRule nth must be >= 1 and count >= 0, got nth={self.nth} count={self.count}")
        if self.kind is InjectedFault.LANE_CROSSTALK and self.lanes and len(self.lanes) != 2:
            raise DefinitionError("a LANE_CROSSTALK rule swaps exactly two lanes")

    def applies(self, job_kind: JobKind, engine: JobEngine, valid_lanes: Sequence[int]) -> bool:
        if self.job_kind is not None and self.job_kind is not job_kind:
            return False
        if self.engine is not None and self.engine is not engine:
            return False
        if self.kind is InjectedFault.LANE_CROSSTALK:
            chosen = self.lanes or tuple(valid_lanes[:2])
            return len(chosen) == 2 and all(lane in valid_lanes for lane in chosen)
        return True

    def describe(self) -> str:
        parts = [self.kind.value, f"nth={self.nth}", f"count={self.count or 'inf'}"]
        if self.job_kind:
            parts.append(f"job={self.job_kind.value}")
        if self.engine is not None:
            parts.append(f"engine={self.engine.name.lower()}")
        if self.lanes:
            parts.append(f"lanes={list(self.lanes)}")
        return " ".join(parts)


@dataclass(frozen=True)
class FaultDecision:
    """The fault the device will apply to one submitted job."""

    kind: InjectedFault
    lanes: tuple[int, ...]
    origin: str


@dataclass(frozen=True)
class FaultStatistics:
    rules: int
    random_rates: Mapping[InjectedFault, float]
    decisions: int
    injected: Mapping[InjectedFault, int]


class FaultInjector:
    """Decides, at submit, which fault (if any) a job suffers. Thread-safe and deterministic.

    Rules are checked in the order they were added; each rule counts its own matching submits.
    Random faults draw from ``random.Random(seed)`` in a fixed order, so a seed replays exactly.
    """

    def __init__(self, rules: Sequence[FaultRule] = (), seed: int | None = None,
                 rates: Mapping[InjectedFault, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._seen: list[int] = []
        self._fired: list[int] = []
        self._rng = random.Random(seed)
        self._rates: dict[InjectedFault, float] = {}
        self._decisions = 0
        self.passed = 0
        """Submits the device accepted without asking :meth:`decide`, while nothing was :attr:`armed` (the null
        device's plan, issue #20): each is a decision that injected nothing, counted in ``decisions``."""
        self._injected: dict[InjectedFault, int] = {k: 0 for k in InjectedFault}
        self.armed = False
        """Whether any rule or positive random rate is set: with none, :meth:`decide` can only answer None (the
        null device's plan asks this per step, an attribute, instead of calling :meth:`decide`)."""
        for rule in rules:
            self.add(rule)
        if rates:
            self.set_random(seed, rates)

    def add(self, rule: FaultRule) -> None:
        with self._lock:
            self._rules.append(rule)
            self._seen.append(0)
            self._fired.append(0)
        self._changed()

    def clear(self) -> None:
        """Remove every rule and random rate (counters of injected faults are kept)."""
        with self._lock:
            self._rules.clear()
            self._seen.clear()
            self._fired.clear()
            self._rates.clear()
        self._changed()

    def _changed(self) -> None:
        self.armed = bool(self._rules) or any(rate > 0.0 for rate in self._rates.values())

    def set_random(self, seed: int | None, rates: Mapping[InjectedFault, float]) -> None:
        for kind, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise DefinitionError(f"fault rate for {kind.value} must be in [0, 1], got {rate}")
        with self._lock:
            self._rng = random.Random(seed)
            self._rates = dict(rates)
        self._changed()

    def decide(self, job_kind: JobKind, engine: JobEngine, valid_lanes: Sequence[int]) -> FaultDecision | None:
        """Consume one submit; return the fault to apply, or None.

        Called by the device's Submit only, under the device lock: one caller at a time. With nothing to inject
        (serving, benchmarks) the count is all there is to do, without this injector's own lock (issue #20); a rule
        or rate set meanwhile from another thread applies from the next submit, as it would after the lock. (The
        null device does not ask while nothing is :attr:`armed`: it counts :attr:`passed` instead.)"""
        if not self._rules and not self._rates:
            self._decisions += 1
            return None
        with self._lock:
            self._decisions += 1
            chosen: FaultDecision | None = None
            for i, rule in enumerate(self._rules):
                if not rule.applies(job_kind, engine, valid_lanes):
                    continue
                self._seen[i] += 1
                in_window = self._seen[i] >= rule.nth and (rule.count == 0 or self._fired[i] < rule.count)
                if in_window and chosen is None:
                    self._fired[i] += 1
                    chosen = FaultDecision(rule.kind, rule.lanes or self._default_lanes(rule.kind, valid_lanes),
                                           f"rule[{i}] {rule.describe()}")
            for kind in InjectedFault:
                rate = self._rates.get(kind, 0.0)
                if rate <= 0.0:
                    continue
                hit = self._rng.random() < rate
                if hit and chosen is None and (kind is not InjectedFault.LANE_CROSSTALK or len(valid_lanes) >= 2):
                    chosen = FaultDecision(kind, self._default_lanes(kind, valid_lanes), f"random {kind.value}")
            if chosen is not None:
                self._injected[chosen.kind] += 1
            return chosen

    @staticmethod
    def _default_lanes(kind: InjectedFault, valid_lanes: Sequence[int]) -> tuple[int, ...]:
        if kind is InjectedFault.LANE_CROSSTALK:
            return tuple(valid_lanes[:2])
        return tuple(valid_lanes)

    def statistics(self) -> FaultStatistics:
        with self._lock:
            return FaultStatistics(rules=len(self._rules), random_rates=MappingProxyType(dict(self._rates)),
                                   decisions=self._decisions + self.passed, injected=MappingProxyType(dict(self._injected)))
