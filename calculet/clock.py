"""The only source of time in the core (DESIGN principle 3).

Deadlines are monotonic (§2: ``std::chrono::steady_clock``), so the protocol exposes only a
monotonic reading in seconds. Tests and the virtual-time simulator use :class:`FakeClock`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""
        ...


class MonotonicClock:
    """Real time for production: ``time.monotonic``."""

    now = staticmethod(time.monotonic)
    """``time.monotonic`` itself, not a method calling it: the actor reads the clock about ten times per
    streamed token, and the extra Python frame was one of its per-token calls (issue #20)."""


class FakeClock:
    """Time that moves only when told to; thread-safe so real-thread stress tests can share it."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"FakeClock cannot go backwards (advance({seconds}))")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, when: float) -> float:
        with self._lock:
            if when < self._now:
                raise ValueError(f"FakeClock is monotonic: set({when}) < now ({self._now})")
            self._now = float(when)
            return self._now
