"""The finish estimate the ``on_time`` planner reports on B>1: the decode set's rollout (issue #13 session 20).

Why this module exists: the estimate admission decides by (the plan's, slowed by the margin) and the estimate a
client and the bench read (``RequestRecord.estimated_finish``) were one value; on B>1 the reported one is now the
rollout of the decode set over a law of arrivals (:mod:`.decode_rollout`, ``docs/estimator.md`` session 20), which
no decision may read. This keeps the two apart: the planner's own estimate of each request whose reported one is the
rollout's, returned to the planner when the request ends (the admission margin scores it), and the law of arrivals,
told of every submit and every end. Without a rollout (B1) or a law, the planner's estimate is reported as before.

At most :data:`ROLLOUTS_PER_COMPLETION` rollouts between two device completions (:attr:`ReportedEstimate.step_key`):
a rollout costs 0.7-6.7 ms of the engine thread's CPU on B>1 (``docs/estimator.md`` session 20) and every submit of a
burst lands in the same engine turn, so a rollout per submit would hold the next device step back by a second for
300 submits, and made ``submit()`` 100x its #20 budget (``bench/scheduler.py``). The first four submits after a
completion are rolled out; the others until the next one report the planner's estimate, as on B1. Measured on the
bursty preset's B16 rows (P90, loads pooled; no gate / 4 / 2 / 1 a completion): b16 27.9 / 28.2 / 29.3 / 30.3 %,
b16-pingpong 31.6 / 31.6 / 31.6 / 34.1 %, b8 20.1 / 20.1 / 20.5 / 20.5 %.
"""

from __future__ import annotations

from typing import Callable, Iterable

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.arrival_law import ArrivalLawStatistics
from calculet.runtime.scheduling.decode_rollout import ArrivalFeed
from calculet.runtime.scheduling.registry import RequestRecord

Rollout = Callable[[RequestRecord, float, Callable[[], Iterable[RequestRecord]], "float | None"], "float | None"]
"""(candidate, now, the live requests, its expected admission if it waits) -> its rollout finish, or None."""
_SCORED = (FinishReason.STOP, FinishReason.LENGTH)
PENDING = 256
"""Submits kept at most before the law is told of them (:meth:`ReportedEstimate.arrived`): a bound on the list."""
ROLLOUTS_PER_COMPLETION = 4
"""Rollouts made at most between two device completions (:meth:`ReportedEstimate.admitted`)."""


class ReportedEstimate:
    """The rollout reported in place of the planner's estimate, and the planner's kept apart for the margin."""

    __slots__ = ("rollout", "arrivals", "_own", "step_key", "_rolled_at", "_left", "rolled", "skipped", "_pending")

    def __init__(self, step_key: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> None:
        self.rollout: Rollout | None = None
        """The reported estimate's model on B>1 (set by the policy; None: the plan's finish is reported)."""
        self.arrivals: ArrivalFeed | None = None
        """The law the rollout forecasts from (set by the policy on B>1; None: none, the plan's finish is reported:
        without later arrivals the present drains, worse than the plan's on every bursty B16 load measured)."""
        self._own: dict[int, float] = {}
        """The planner's own estimate of each live request whose reported one is the rollout's."""
        self.step_key = step_key
        """The device completions measured so far (decode steps, prefills): at most :data:`ROLLOUTS_PER_COMPLETION`
        rollouts are made per value."""
        self._rolled_at: tuple[int, int] | None = None
        self._left = 0
        self._pending: list[tuple[float, int, int]] = []
        """Submits the law has not learned from yet (:meth:`arrived`)."""
        self.rolled = 0
        """Admissions reported by the rollout."""
        self.skipped = 0
        """Admissions left with the planner's estimate: the rollouts allowed since the last completion were made."""

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        """A submit screened, for the law of arrivals: kept, and told before the next rollout reads the law (or every
        :data:`PENDING` submits). Learning costs about 7 µs a submit, over a third of ``submit()``'s #20 budget, and
        the law is read only by a rollout; what it learns depends on the arrivals' instants alone, so it is the same."""
        pending = self._pending
        pending.append((now, prompt_tokens, max_new_tokens))
        if len(pending) >= PENDING:
            self.told()

    def told(self) -> None:
        """Tell the law every submit kept by :meth:`arrived`, in order."""
        arrivals = self.arrivals
        if arrivals is not None:
            for submit in self._pending:
                arrivals.arrived(*submit)
        self._pending.clear()

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
            if self._left <= 0:
                self.skipped += 1
                return
        else:
            self._rolled_at, self._left = key, ROLLOUTS_PER_COMPLETION
        self._left -= 1
        self.rolled += 1
        if self._pending:
            self.told()
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

    def law_statistics(self) -> ArrivalLawStatistics | None:
        """The learned law's statistics (:meth:`.ArrivalLaw.statistics`), the submits kept for it told first (so they
        count); None without a law, or with one that keeps none (the bench's stand-ins)."""
        arrivals = self.arrivals
        statistics = getattr(arrivals, "statistics", None)
        if statistics is None:
            return None
        self.told()
        result = statistics()
        return result if isinstance(result, ArrivalLawStatistics) else None

    def planned_finish(self, rec: RequestRecord) -> float | None:
        """The planner's own estimate of a live ``rec``: ``estimated_finish`` unless the rollout's is reported there."""
        own = self._own.get(rec.request_id)
        return rec.estimated_finish if own is None else own
