"""Goodput and wasted device work (issue #13, DESIGN "Goodput before throughput", §16).

A serving system is judged by the requests it finishes within their deadlines, and device time
spent on a request that then expires or is failed by the system is thrown away. Both are facts
only the place where requests end can count: it sees the outcome, the deadline and the clock.
The engine's :class:`~calculet.runtime.engine.requests.RequestDesk` owns one
:class:`GoodputLedger` on the actor; the job path tells it what each device job computed
(:meth:`GoodputLedger.job_done`, once per job, one integer add per lane) and the desk tells it how
each accepted request ended (:meth:`GoodputLedger.ended`).

What is counted:

* **on time**: completed (STOP or LENGTH) at or before its deadline, per tenant; completed
  after it is **late** (the scheduler ends most late requests as DEADLINE; a completion in the
  tick that crosses the deadline is the rest);
* **computed**: prefill tokens (each job's, chunk by chunk) and decode tokens (one per active
  lane of each decode job), for every request, and the device seconds each job kept the device
  busy, shared equally among its lanes — measured on the device's own clock, from the later of
  its submit and the previous job's completion to its completion (ping/pong overlap is not
  counted twice);
* **wasted**: what was computed for requests that then ended DEADLINE or ERROR, by phase and
  reason. Cancelled requests are the client's choice and are not counted as waste; work lost in
  a device reset (no result) is not seen here (the recovery statistics count resets).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from calculet.machines.request import FinishReason

__all__ = ["GoodputLedger", "GoodputStatistics", "RequestWork", "WASTE_REASONS", "PHASES"]

PHASES = ("prefill", "decode")
WASTE_REASONS = ("deadline", "error")
_WASTE = {FinishReason.DEADLINE: "deadline", FinishReason.ERROR: "error"}
_COMPLETED = (FinishReason.STOP, FinishReason.LENGTH)


@dataclass(frozen=True)
class GoodputStatistics:
    """§16 / #13: on-time completions per tenant, and device work by phase and by waste reason."""

    on_time: dict[str, int]
    """Requests completed (STOP/LENGTH) at or before their deadline, by tenant."""
    late: dict[str, int]
    """Requests completed after their deadline, by tenant."""
    computed_tokens: dict[str, int]
    """Tokens the device computed, by phase (prefill, decode), for every request."""
    wasted_tokens: dict[tuple[str, str], int]
    """Tokens computed for requests that then ended DEADLINE or ERROR, by (phase, reason)."""
    device_seconds: float
    """Device busy seconds attributed to requests (all jobs that returned a result)."""
    wasted_device_seconds: dict[str, float]
    """Device seconds attributed to requests that then ended DEADLINE or ERROR, by reason."""

    @property
    def goodput(self) -> int:
        return sum(self.on_time.values())

    @property
    def wasted_share(self) -> float:
        """Wasted device seconds as a share of the attributed device seconds (0 when idle)."""
        wasted = sum(self.wasted_device_seconds.values())
        return wasted / self.device_seconds if self.device_seconds > 0 else 0.0


class RequestWork:
    """What the device computed for one live request so far (held by the desk's record)."""

    __slots__ = ("tenant", "deadline", "prefill", "decode", "device_s")

    def __init__(self, tenant: str, deadline: float) -> None:
        self.tenant = tenant
        self.deadline = deadline
        self.prefill = 0
        self.decode = 0
        self.device_s = 0.0


class GoodputLedger:
    """Counts on-time completions and wasted work; updated on the actor only."""

    def __init__(self) -> None:
        self._on_time: Counter[str] = Counter()
        self._late: Counter[str] = Counter()
        self._computed: Counter[str] = Counter()
        self._wasted: Counter[tuple[str, str]] = Counter()
        self._device_s = 0.0
        self._wasted_s: Counter[str] = Counter()
        self._device_free_at = float("-inf")

    def job_done(self, lanes: Sequence[RequestWork | None], phase: str, tokens: int, submitted_at: float,
                 completed_at: float) -> None:
        """A job returned: ``tokens`` of ``phase`` per lane, its busy time shared among the lanes (one call per job,
        the lanes given as one sequence, issue #20).

        A lane whose request is no longer on record (None) still counts as computed."""
        share = self.busy(len(lanes), phase, tokens, submitted_at, completed_at)
        prefill = phase == "prefill"
        for work in lanes:
            if work is None:
                continue
            if prefill:
                work.prefill += tokens
            else:
                work.decode += tokens
            work.device_s += share

    def busy(self, lanes: int, phase: str, tokens: int, submitted_at: float, completed_at: float) -> float:
        """:meth:`job_done`'s device part: the job's busy time (from its submission, or from when the device was
        last free if later) counted, ``tokens`` of ``phase`` per lane computed; returns each lane's share of the
        busy time (0.0 with no lane). The caller adds the lanes' own work (:meth:`job_done` does, or a caller that
        walks its lanes anyway: the desk's decode step, one pass over them, issue #20)."""
        free_at = self._device_free_at
        start = submitted_at if submitted_at > free_at else free_at
        busy = completed_at - start if completed_at > start else 0.0
        if completed_at > free_at:
            self._device_free_at = completed_at
        self._device_s += busy
        self._computed[phase] += tokens * lanes
        return busy / lanes if lanes else 0.0

    def ended(self, work: RequestWork, reason: FinishReason, now: float) -> None:
        """An accepted request ended with ``reason`` at ``now`` (scheduler clock)."""
        if reason in _COMPLETED:
            (self._on_time if now <= work.deadline else self._late)[work.tenant] += 1
            return
        waste = _WASTE.get(reason)
        if waste is None:
            return
        self._wasted["prefill", waste] += work.prefill
        self._wasted["decode", waste] += work.decode
        self._wasted_s[waste] += work.device_s

    def statistics(self) -> GoodputStatistics:
        return GoodputStatistics(
            on_time=dict(self._on_time), late=dict(self._late), computed_tokens=dict(self._computed),
            wasted_tokens=dict(self._wasted), device_seconds=self._device_s,
            wasted_device_seconds=dict(self._wasted_s))
