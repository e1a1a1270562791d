"""Run-time monitors: the declared invariants, evaluated concretely after every transition.

The predicates are the very ones z3 proves (DESIGN: declare once). Monitoring is on in every
test, checking every event, where a violation raises
:class:`~calculet.machines.errors.InvariantViolation`; in production it is configured by
``monitoring.invariants`` and ``monitoring.sample_every`` (default: on, one event in 256 checked,
drawn at random — issue #20's figures in the README, "Monitors"), and a violation is counted per
(machine, invariant) and logged with the pre- and post-state instead of stopping the service.

Sampling is random, not every Nth event: a decode step fires a fixed cycle of events, and a
fixed period would check the same few events of it forever. A corrupted variable stays corrupted,
so a sampled monitor still finds it at a later checked event of that instance. The draw is a
countdown to the next checked event, whose length is geometric with mean ``sample_every`` —
the same distribution as a coin per event, but an unchecked event costs one decrement, which the
generated ``fire`` inlines (issue #20: a sampled monitor added ~0.25 µs per event as a call).
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from calculet.machines.definition import Step
from calculet.machines.errors import InvariantViolation

log = logging.getLogger("calculet.invariants")

Mode = Literal["raise", "count"]


@dataclass(frozen=True)
class MonitorStatistics:
    enabled: bool
    mode: str
    checks: int
    violations: dict[tuple[str, str], int]
    sample_every: int = 1
    """One event in this many is checked, on average (1: every event)."""


class Monitor:
    """Global switch read by every compiled instance's ``fire`` (one attribute read when off)."""

    def __init__(self) -> None:
        self.enabled = False
        self.mode: Mode = "raise"
        self.sample_every = 1
        """Check one event in ``sample_every`` on average (1: every event)."""
        self.every_event = False
        """Set by the test suite: whatever ``configure`` is asked, every event is checked."""
        self._rate = 1.0
        self._random = random.Random(20).random
        self.countdown = 1
        """Events until the next checked one (the generated ``fire`` decrements it inline)."""
        self._lock = threading.Lock()
        self._violations: Counter[tuple[str, str]] = Counter()
        self._checks = 0

    def configure(self, enabled: bool, mode: Mode = "raise", sample_every: int = 1) -> None:
        if mode not in ("raise", "count"):
            raise ValueError(f"monitor mode must be 'raise' or 'count', not {mode!r}")
        if sample_every < 1:
            raise ValueError(f"sample_every must be >= 1, not {sample_every}")
        self.enabled = enabled
        self.mode = mode
        self.sample_every = 1 if self.every_event else sample_every
        self._rate = 1.0 / self.sample_every
        self.countdown = self.draw()

    def draw(self) -> int:
        """The distance to the next checked event: 1 when every event is checked, else geometric
        with mean ``sample_every`` (each event checked with probability 1/``sample_every``)."""
        if self._rate >= 1.0:
            return 1
        return 1 + int(math.log(1.0 - self._random()) / math.log(1.0 - self._rate))

    def sampled(self) -> bool:
        """Whether this event is checked (always, unless sampling is configured)."""
        self.countdown -= 1
        if self.countdown > 0:
            return False
        self.countdown = self.draw()
        return True

    def reset(self) -> None:
        with self._lock:
            self._violations.clear()
            self._checks = 0

    def broken(self, instance: Any, pre: Any | None = None) -> list[tuple[str, str]]:
        """(name, R-id) of every invariant (and, given ``pre``, step property) that is false.

        Evaluates the formulas compiled from the proved z3 terms (``codegen``), not the
        declaration's callables, so a monitored event costs microseconds.
        """
        broken: list[tuple[str, str]] = instance._check_invariants(pre)
        return broken

    @staticmethod
    def broken_on_step(instance: Any, pre: Any, transition: Any) -> list[tuple[str, str]]:
        """(name, R-id) of every step property that sees the event and is false for this step
        (evaluated on the live values: the event and row are known, the arguments are not)."""
        d = instance.definition
        step = Step(transition.event, transition.name)
        return [(sp.name, sp.rid) for sp in d.event_properties if not sp.predicate(pre, instance, step)]

    def after(self, instance: Any, pre: Any, transition: Any) -> None:
        self._checks += 1
        broken = self.broken(instance, pre)
        if instance.definition.event_properties:
            broken = broken + self.broken_on_step(instance, pre, transition)
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

    def check_whole(self, name: str, invariants: Any, view: Any, after: str, state: Any = None,
                    extra: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:  # type: ignore[assignment]
        """Pool- or system-level monitoring: every declared invariant of ``invariants`` (objects
        with ``name``, ``rid`` and ``predicate(view)``) evaluated on the live ``view`` after the
        runtime operation ``after``, plus ``extra`` (name, R-id) faults the caller found (an index
        kept beside the machines that no longer matches them). Counted, and raised in ``raise``
        mode, exactly like an instance's invariants; in ``count`` mode the (name, R-id) of what
        was broken is returned (a caller that checks only what moved then looks at everything next time)."""
        self._checks += 1
        broken = [(inv.name, inv.rid) for inv in invariants if not inv.predicate(view)] + list(extra)
        if not broken:
            return broken
        with self._lock:
            for inv_name, _rid in broken:
                self._violations[(name, inv_name)] += 1
        if self.mode == "raise":
            first, rid = broken[0]
            raise InvariantViolation(name, first, rid, after, {}, {"broken": broken, "state": state})
        log.error("invariant violated", extra={"machine": name, "invariants": [n for n, _ in broken],
                                               "transition": after, "post": state})
        return broken

    def statistics(self) -> MonitorStatistics:
        with self._lock:
            return MonitorStatistics(self.enabled, self.mode, self._checks, dict(self._violations), self.sample_every)


MONITOR = Monitor()
