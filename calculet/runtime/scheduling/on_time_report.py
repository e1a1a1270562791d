"""The finish estimate the ``on_time`` planner reports on B>1: the decode set's rollout (issue #13 session 20).

Why this module exists: the estimate admission decides by (the plan's, slowed by the margin) and the estimate a
client and the bench read (``RequestRecord.estimated_finish``) were one value; on B>1 the reported one is now the
rollout of the decode set over a law of arrivals (:mod:`.decode_rollout`, ``docs/estimator.md`` session 20), which
no decision may read. This keeps the two apart: the planner's own estimate of each request whose reported one is the
rollout's, returned to the planner when the request ends (the admission margin scores it), and the law of arrivals,
told of every submit and every end. Without a rollout (B1) or a law, the planner's estimate is reported as before.

At most one rollout between two device completions (:attr:`ReportedEstimate.step_key`): a rollout costs 0.7-6.7 ms of
the engine thread's CPU on B>1 (``docs/estimator.md`` session 20) and every submit of a burst lands in the same engine
turn, so an unbounded rollout per submit would hold the next device step back by a second for 300 submits, and made
``submit()`` 100x its #20 budget (`bench/scheduler.py`). The first submit after a completion is rolled out; the others
until the next one report the planner's estimate, as on B1. The bench's presets rarely see two submits between two
completions, so their rows keep the rollout (measured in ``docs/estimator.md``).
"""

from __future__ import annotations

from typing import Callable, Iterable

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.decode_rollout import ArrivalFeed
from calculet.runtime.scheduling.registry import RequestRecord

Rollout = Callable[[RequestRecord, float, Callable[[], Iterable[RequestRecord]], "float | None"], "float | None"]
"""(candidate, now, the live requests, its expected admission if it waits) -> its rollout finish, or None."""
_SCORED = (FinishReason.STOP, FinishReason.LENGTH)


class ReportedEstimate:
    """The rollout reported in place of the planner's estimate, and the planner's kept apart for the margin."""

    __slots__ = ("rollout", "arrivals", "_own", "step_key", "_rolled_at", "rolled", "skipped")

    def __init__(self, step_key: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> None:
        self.rollout: Rollout | None = None
        """The reported estimate's model on B>1 (set by the policy; None: the plan's finish is reported)."""
        self.arrivals: ArrivalFeed | None = None
        """The law the rollout forecasts from (set by the policy on B>1; None: none, the plan's finish is reported:
        without later arrivals the present drains, worse than the plan's on every bursty B16 load measured)."""
        self._own: dict[int, float] = {}
        """The planner's own estimate of each live request whose reported one is the rollout's."""
        self.step_key = step_key
        """The device completions measured so far (decode steps, prefills): a rollout is made at most once per value."""
        self._rolled_at: tuple[int, int] | None = None
        self.rolled = 0
        """Admissions reported by the rollout."""
        self.skipped = 0
        """Admissions left with the planner's estimate: a rollout was already made since the last completion."""

    def admitted(self, rec: RequestRecord, now: float, finish: float,
                 records: Callable[[], Iterable[RequestRecord]], start: float | None) -> None:
        """``rec`` was admitted with the planner's ``finish`` (``start``: its expected admission if it waits): report
        the rollout's in ``rec.estimated_finish`` if there is one. The caller calls it only with a law of arrivals
        (:attr:`arrivals`: the planner tests it, an attribute read per submit where none is, #20)."""
        rollout = self.rollout
        if rollout is None:
            return
        key = self.step_key()
        if key == self._rolled_at:
            self.skipped += 1
            return
        self._rolled_at = key
        self.rolled += 1
        reported = rollout(rec, now, records, start)
        if reported is not None:
            self._own[rec.request_id] = finish
            rec.estimated_finish = reported

    def ended(self, rec: RequestRecord) -> float | None:
        """``rec`` reached its outcome: the planner's own estimate of it (what the margin scores); the law is told
        of a request that ended with its tokens (stop or length)."""
        own = self._own.pop(rec.request_id, None) if self._own else None
        arrivals = self.arrivals
        if arrivals is not None and rec.machine.finish_reason in _SCORED:
            arrivals.finished(rec.machine.generated_tokens)
        return rec.estimated_finish if own is None else own

    def planned_finish(self, rec: RequestRecord) -> float | None:
        """The planner's own estimate of a live ``rec``: ``estimated_finish`` unless the rollout's is reported there."""
        own = self._own.get(rec.request_id)
        return rec.estimated_finish if own is None else own
