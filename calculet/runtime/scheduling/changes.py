"""The scheduler's count of changes: what its steady decode step may take from the last step (issue #20)."""

from __future__ import annotations

__all__ = ["Changes"]


class Changes:
    """What the steady decode step may take from the last step instead of asking again (issue #20).

    A step's admission pass (``Scheduler._pump``) admits nothing while no request waits, and its wake-up is the
    deadlines' next due. A request starts waiting only by a reported transition (placed at submit: ``bind``,
    ``wait_model``), and the deadlines change only at submit — before that request's first transition — and in
    the sweep. So ``count`` moves with every transition the registry reports to ``Scheduler._on_transition``
    (the decode cycle's two moves are not reported: they start no wait and move no deadline) and with every
    sweep. ``calm`` is the count at which a pass found no request waiting and the next due deadline was
    ``wake``: while the count stays there, the pass would admit nothing and the next due is still ``wake`` —
    the step and the decode result skip both (the usual step of a saturated decode rotation). ``reuse`` False
    (a test's switch) never records a calm count: every step asks again."""

    __slots__ = ("count", "calm", "wake", "reuse", "blocked")

    def __init__(self) -> None:
        self.count = 0
        self.calm = -1
        self.wake: float | None = None
        self.reuse = True
        self.blocked: tuple[int, int, int | None] | None = None
        """(count, free KV lanes, decode cap) at which an admission pass ended on a head the budget held out
        (``AdmissionController.blocked_by``): while all three stay, the next pass would end the same way — the
        waiting set, the budget's counters and the held-back tenants move only by reported transitions, the lanes
        and the cap are compared by value (a saturated rotation with requests waiting, issue #20)."""

    def held_out(self, blocker: str | None, free_lanes: int, cap: int | None) -> None:
        """An admission pass just ended, on a head held out by ``blocker`` (None: nothing it could admit was
        held out): remembered as :attr:`blocked` (not while ``reuse`` is off). A kept key holds only a pass that
        the decode cap let run: the cap is in the key, and the active count moves only by transitions."""
        if blocker is not None and self.reuse:
            self.blocked = (self.count, free_lanes, cap)

    def settle(self, nothing_waits: bool, wake: float | None) -> float | None:
        """A pass just ran at the current count and found ``wake`` the next due deadline: remembered when it found
        nothing waiting. Returns ``wake``."""
        if nothing_waits and self.reuse:
            self.calm = self.count
            self.wake = wake
        return wake
