"""Issue #13: the edge's deadline on a request's line and headers is one deadline per request and one timer per
connection (:class:`~calculet.server.edge_answers.EdgeGuard`), not a timer armed and cancelled per request: the 408
comes at the deadline of the head being read, never for a head that arrived, and a kept-alive connection's requests
within one timeout arm one timer.

Mutants caught (each checked to fail here): the pending timer answering 408 at its own (earlier) time without reading
the current deadline, no re-arm when it fires early (the late head never refused), a disarmed head refused anyway,
a timer armed per request (``call_at`` at each), the timer of a lost connection left pending.
"""

from __future__ import annotations

from typing import Any

from calculet.server.edge_answers import EdgeGuard


class _Loop:
    """A loop whose clock the test sets; ``call_at`` keeps the handles, :meth:`run_due` runs those due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> _Handle:
        handle = _Handle(when, callback)
        self.handles.append(handle)
        return handle

    def run_due(self, until: float) -> None:
        while True:
            due = [h for h in self.handles if not h.cancelled and h.when <= until]
            if not due:
                break
            handle = min(due, key=lambda h: h.when)
            self.handles.remove(handle)
            self.now = handle.when
            handle.callback()
        self.now = until


class _Handle:
    def __init__(self, when: float, callback: Any) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _Base:
    def connection_lost(self, exc: Exception | None) -> None:
        pass


class _Guard(EdgeGuard, _Base):
    header_timeout_s = 10.0

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop  # type: ignore[assignment]
        self.refused: list[tuple[float, int]] = []
        self.closing = False
        self.transport = self  # type: ignore[assignment]

    def is_closing(self) -> bool:
        return self.closing

    def _awaiting_head(self) -> bool:
        return True

    def _app_has_request(self) -> bool:
        return False

    def _answerable(self, app_has_request: bool) -> bool:
        return True

    def _refuse(self, status: int, code: str, reason: str) -> None:
        self.refused.append((self.loop.time(), status))


def test_the_408_comes_at_the_deadline_of_the_head_being_read():
    loop = _Loop()
    guard = _Guard(loop)
    guard._arm_header_timer()      # request 1's head from 0: due at 10
    loop.run_due(1.0)
    guard._disarm_header_timer()   # arrived at 1
    loop.run_due(5.0)
    guard._arm_header_timer()      # request 2's head from 5: due at 15 (the timer armed at 0 fires at 10)
    loop.run_due(14.9)
    assert guard.refused == []
    loop.run_due(20.0)
    assert guard.refused == [(15.0, 408)]


def test_a_head_that_arrived_is_never_refused_and_requests_within_a_timeout_arm_one_timer():
    loop = _Loop()
    guard = _Guard(loop)
    for k in range(50):            # 50 kept-alive requests, a head every 0.1 s, each arriving at once
        loop.run_due(k / 10)
        guard._arm_header_timer()
        guard._disarm_header_timer()
    loop.run_due(100.0)
    assert guard.refused == [] and len(loop.handles) == 0
    calls: list[float] = []
    loop.call_at = lambda when, cb, calls=calls, at=loop.call_at: calls.append(when) or at(when, cb)  # type: ignore
    for k in range(50):
        loop.run_due(100.0 + k / 10)
        guard._arm_header_timer()
        guard._disarm_header_timer()
    assert len(calls) == 1


def test_a_lost_connection_leaves_no_timer():
    loop = _Loop()
    guard = _Guard(loop)
    guard._arm_header_timer()
    guard.connection_lost(None)
    assert all(h.cancelled for h in loop.handles) and guard._header_timer is None
    loop.run_due(30.0)
    assert guard.refused == []
