"""Run-time monitors: the declared invariants, evaluated concretely after every transition.

The predicates are the very ones z3 proves (DESIGN: declare once). Monitoring is on in every
test, where a violation raises :class:`~calculet.machines.errors.InvariantViolation`; in
production it is a configuration switch, and a violation is counted per (machine, invariant)
and logged with the pre- and post-state instead of stopping the service.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from calculet.machines.errors import InvariantViolation

log = logging.getLogger("calculet.invariants")

Mode = Literal["raise", "count"]


@dataclass(frozen=True)
class MonitorStatistics:
    enabled: bool
    mode: str
    checks: int
    violations: dict[tuple[str, str], int]


class Monitor:
    """Global switch read by every compiled instance's ``fire`` (one attribute read when off)."""

    def __init__(self) -> None:
        self.enabled = False
        self.mode: Mode = "raise"
        self._lock = threading.Lock()
        self._violations: Counter[tuple[str, str]] = Counter()
        self._checks = 0

    def configure(self, enabled: bool, mode: Mode = "raise") -> None:
        if mode not in ("raise", "count"):
            raise ValueError(f"monitor mode must be 'raise' or 'count', not {mode!r}")
        self.enabled = enabled
        self.mode = mode

    def reset(self) -> None:
        with self._lock:
            self._violations.clear()
            self._checks = 0

    def broken(self, instance: Any, pre: Any | None = None) -> list[tuple[str, str]]:
        """(name, R-id) of every invariant (and, given ``pre``, step property) that is false.

        Evaluates the formulas compiled from the proved z3 terms (``codegen``), not the
        declaration's callables, so a monitored event costs microseconds.
        """
        return instance._check_invariants(pre)

    def after(self, instance: Any, pre: Any, transition: Any) -> None:
        self._checks += 1
        broken = self.broken(instance, pre)
        if not broken:
            return
        d = instance.definition
        with self._lock:
            for name, _rid in broken:
                self._violations[(d.name, name)] += 1
        pre_values = {"state": pre.state, **pre.values()}
        post_values = {"state": instance.state, **instance.values()}
        name, rid = broken[0]
        if self.mode == "raise":
            raise InvariantViolation(d.name, name, rid, transition.name, pre_values, post_values)
        log.error("invariant violated", extra={
            "machine": d.name, "invariants": [n for n, _ in broken], "transition": transition.name,
            "pre": pre_values, "post": post_values})

    def statistics(self) -> MonitorStatistics:
        with self._lock:
            return MonitorStatistics(self.enabled, self.mode, self._checks, dict(self._violations))


MONITOR = Monitor()
