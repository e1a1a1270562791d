"""The ``on_time`` planner's admission cache: the kept set's EDF lane schedule, and the last refusal (issue #13).

Why this module exists: :mod:`.on_time_planner` answers most ``submit()`` calls from what its last plan
left — a latest-deadline candidate is placed at the tail of the cached EDF lane schedule in O(lanes), and
a candidate no better than the last refused one is refused in O(1) (the planner's module doc says when
each may be read). These are those two caches; moved out of the planner for the size limits (#20), the
planner re-exports them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S, DeviceModel, PendingJob, edf_schedule
from calculet.runtime.scheduling.lane_time import lane_finish

__all__ = ["_EdfCache", "_Refusal"]

_EPS = ON_TIME_EPS_S
"""The estimator's on-time tolerance: the admission cache accepts exactly what ``fits`` would."""


def _deadline(job: PendingJob) -> float:
    return math.inf if job.deadline is None else job.deadline


class _EdfCache:
    """The kept set's EDF lane schedule at the last plan: lane free times and the least slack.

    A replan builds it :meth:`deferred` (#20, session 26): the schedule is computed at its first read — an admission,
    a refusal, the HTTP front's snapshot — from the inputs the replan gave it, so a replan no submit reads (a request
    ending while nobody arrives; the next event replans first) costs no schedule: 10-20 µs of the replan's 75-170 at
    16-64 live requests. The same inputs give the same schedule whenever it is computed: the kept jobs (a copy: the
    planner's kept list grows with later admissions), the instant, the frozen model and the spared ids."""

    __slots__ = ("free", "min_slack", "latest", "on_lane", "_of", "_step", "_handover", "_tokens", "_prefill", "_from")

    def __init__(self, kept: list[PendingJob], now: float, model: DeviceModel,
                 late_ok: frozenset[int] = frozenset()) -> None:
        """``late_ok``: kept jobs planned late (spared, :func:`spare_harmless`): they hold lanes but no slack
        of theirs is protected."""
        self._from: tuple[list[PendingJob], float, DeviceModel, frozenset[int]] | None = None
        self._build(kept, now, model, late_ok)

    @classmethod
    def deferred(cls, kept: list[PendingJob], now: float, model: DeviceModel,
                 late_ok: frozenset[int] = frozenset()) -> _EdfCache:
        """The cache ``_EdfCache(kept, now, model, late_ok)`` computed at its first read (:meth:`built`)."""
        cache = object.__new__(cls)
        cache._from = (list(kept), now, model, late_ok)
        return cache

    def built(self) -> _EdfCache:
        """This cache with its schedule computed: a deferred cache's first reader builds it. Every reader of the
        planner's cache goes through here (``OnTimePlanner.fit``, ``refusal_cache``, ``on_time_refusal.refuse``); a
        field read before it is unset and raises. Not a ``__getattr__``: a class that defines one loses CPython
        3.11's specialised slot reads on every attribute, ~0.6 µs a queued ``submit()`` (measured, session 26)."""
        source = self._from
        if source is not None:
            self._from = None
            self._build(*source)
        return self

    def _build(self, kept: list[PendingJob], now: float, model: DeviceModel, late_ok: frozenset[int]) -> None:
        finish, self.free = edf_schedule(kept, now, model)  # off a lane, an idle lane waits for the prefill backlog
        self.on_lane = model.prefill_on_lane
        min_slack, latest = math.inf, -math.inf
        for job in kept:  # one pass, no call per job: built at every replan (#20)
            deadline = math.inf if job.deadline is None else job.deadline
            if deadline > latest:
                latest = deadline
            if job.id not in late_ok and deadline - finish[job.id] < min_slack:
                min_slack = deadline - finish[job.id]
        self.min_slack, self.latest = min_slack, latest
        self._of: DeviceModel | None = None
        """The model :meth:`place` last read (a frozen DeviceModel): its lane step, and the prefill of the last
        prompt length placed, are kept for the next ``submit()`` (a burst's prompts are mostly alike, #20)."""
        self._step = self._handover = 0.0
        self._tokens = -1
        self._prefill = 0.0

    def tail_finish(self, job: PendingJob, now: float, model: DeviceModel) -> float | None:
        """The finish of a latest-deadline ``job`` appended to the schedule, on time or not (None: the
        schedule cannot say — an earlier deadline, or a backlog prefill that would shift the lanes)."""
        if _deadline(job) < self.latest or not self.on_lane:
            return None
        return lane_finish(self.free[0], now, model.service_s(job.prefill_tokens, job.decode_steps),
                           job.decode_steps * model.handover_s)

    def place(self, tokens: int, decode_steps: int, deadline: float | None, now: float,
              model: DeviceModel) -> float | None:
        """The finish of a latest-deadline job (its prefill ``tokens``, ``decode_steps`` and ``deadline``, a
        :class:`PendingJob`'s fields) appended to the schedule, or None if it would not fit. Once per
        ``submit()``: attributes read once, no call for what a comparison answers, the job's values rather
        than a job (admission builds one only when it is read, :mod:`.on_time_kept`; #20). Its finish is
        :func:`~.lane_time.lane_finish`, the sum of the plan it appends to (:func:`.edf_schedule`) and of the HTTP
        front's copy of this placement, so the three agree to the last bit (#13: a front ``Retry-After`` 1 s off)."""
        if deadline is None:
            deadline = math.inf
        if deadline < self.latest:
            return None
        if model is not self._of:
            self._of, self._step, self._handover, self._tokens = model, model.lane_step_s, model.handover_s, -1
        if tokens == self._tokens:
            prefill = self._prefill
        else:
            self._tokens = tokens
            self._prefill = prefill = model.prefill_s(tokens)
        on_lane, free, min_slack = self.on_lane, self.free, self.min_slack
        shift = 0.0 if on_lane else prefill
        if shift > min_slack + _EPS:
            return None
        # on a lane its prefill runs at its start (DeviceModel.service_s); off a lane the backlog's runs first
        finish = lane_finish(free[0] + shift, now + shift, (prefill if on_lane else 0.0) + decode_steps * self._step,
                             decode_steps * self._handover)
        if finish > deadline + _EPS:
            return None
        if shift:
            self.free = free = [t + shift for t in free]
        heapq.heapreplace(free, finish)
        min_slack -= shift
        self.min_slack = min_slack if min_slack <= deadline - finish else deadline - finish
        self.latest = deadline
        return finish


@dataclass(frozen=True)
class _Refusal:
    """The last slow-path refusal's facts: valid while the kept set and the device are unchanged."""

    version: int
    model: DeviceModel
    deadline: float
    prefill_tokens: int
    decode_steps: int
    retry_at: float | None

    def covers(self, job: PendingJob, version: int, model: DeviceModel) -> bool:
        """``job`` is refused too: same plan, a deadline no later and no less work."""
        return (version == self.version and model == self.model and job.deadline is not None
                and job.deadline <= self.deadline and job.prefill_tokens >= self.prefill_tokens
                and job.decode_steps >= self.decode_steps)
