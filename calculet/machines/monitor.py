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
precomputed random pattern of :data:`PATTERN_LENGTH` (a prime, so no cycle of events a runtime
repeats lines up with it) coin tosses, each true with probability 1/``sample_every``, walked by a
C iterator: a draw is ``next`` of it (~30 ns), which the generated ``fire`` makes inline (issue #20: an
attribute countdown cost ~90 ns per event, the gap between ``fire`` and its dispatch). Each
machine's ``fire`` and ``fire_each`` come in two variants, with and without the draw, and
:meth:`Monitor.configure` installs the one its configuration needs (:meth:`Monitor.install`):
monitors off cost nothing per event.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Iterator, Literal

from calculet.machines.definition import Step
from calculet.machines.errors import InvariantViolation

log = logging.getLogger("calculet.invariants")

Mode = Literal["raise", "count"]

PATTERN_LENGTH = 65_521
"""The sampling pattern's length: a prime; a ``sample_every`` above it checks one event in this many."""


@dataclass(frozen=True)
class MonitorStatistics:
    enabled: bool
    mode: str
    checks: int
    violations: dict[tuple[str, str], int]
    sample_every: int = 1
    """One event in this many is checked, on average (1: every event)."""


class Monitor:
    """The global switch: installs each compiled machine's ``fire`` variant, and draws which events are checked."""

    def __init__(self) -> None:
        self.enabled = False
        self.mode: Mode = "raise"
        self.sample_every = 1
        """Check one event in ``sample_every`` on average (1: every event)."""
        self.every_event = False
        """Set by the test suite: whatever ``configure`` is asked, every event is checked."""
        self._random = random.Random(20)
        self.draws: Iterator[bool] = itertools.repeat(False)
        """The draws: ``next`` of it is true when this event is checked (a walk over the pattern). Read only;
        a hot check site draws with ``next(MONITOR.draws)`` — :meth:`sampled` without its call (issue #20)."""
        self._installed: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()
        """Each compiled machine class and its generated namespace (weakly: a mutant class may go away)."""
        self._patterns: dict[int, list[bool]] = {}
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
        self.draws = self._walk(enabled, self.sample_every)
        for cls, namespace in list(self._installed.items()):
            self._apply(cls, namespace)

    def _walk(self, enabled: bool, sample_every: int) -> Iterator[bool]:
        """The draw for this configuration: never (off), always (every event), else a walk over a fresh
        random pattern (each toss true with probability 1/``sample_every``; at least one true)."""
        if not enabled:
            return itertools.repeat(False)
        if sample_every <= 1:
            return itertools.repeat(True)
        pattern = self._patterns.get(sample_every)
        if pattern is None:
            rate = 1.0 / sample_every
            toss = self._random.random
            pattern = self._patterns[sample_every] = [toss() < rate for _ in range(PATTERN_LENGTH)]
            if True not in pattern:
                pattern[int(toss() * PATTERN_LENGTH)] = True
        start = int(self._random.random() * PATTERN_LENGTH)  # a fresh walk: from a random place
        walk = itertools.cycle(pattern[start:] + pattern[:start])
        # one period walked now: a cycle's first pass copies what it yields (a third dearer per draw)
        deque(itertools.islice(walk, PATTERN_LENGTH), maxlen=0)
        return walk

    def install(self, cls: type, namespace: dict[str, Any]) -> None:
        """Keep a compiled machine class's ``fire``/``fire_each`` in step with the configuration: its
        generated namespace holds both variants (``fire_plain``/``fire_sampled``, ``fire_each_plain``/
        ``fire_each_sampled``) and reads the draws as its global ``_draws``."""
        self._installed[cls] = namespace
        self._apply(cls, namespace)

    def _apply(self, cls: type, namespace: dict[str, Any]) -> None:
        namespace["_draws"] = self.draws
        variant = "sampled" if self.enabled else "plain"
        cls.fire = namespace[f"fire_{variant}"]  # type: ignore[attr-defined]
        cls.fire_each = staticmethod(namespace[f"fire_each_{variant}"])  # type: ignore[attr-defined]

    def sampled(self) -> bool:
        """Whether this event is checked (always, unless sampling is configured)."""
        return next(self.draws)

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
