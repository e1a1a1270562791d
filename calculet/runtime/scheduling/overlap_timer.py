"""Ping/pong's overlap, measured: a job's own device time and how fast a job overlapped by the other engine's runs (#13).

Why this module exists: under ping/pong (§14) two jobs are in flight and "a maximum in-flight count of 2 does not
automatically equal 2B lanes computing at once": the simulated device (``pingpong_overlap``) runs a job submitted while
the other engine is busy at a reduced rate until that job ends, and leaves the earlier job as it was. The step timer
keys a decode step by its compiled batch plus the other decode job's in flight at its completion, so one key mixes a
step alone (B16: 80 ms on the reference cost model) and a step beside a prefill (up to 160 ms): on bursty B16
ping/pong at 1x its key 16 read 67-160 ms (mean 114). The decode set's rollout (:mod:`.decode_rollout`) took the mix
for both, early at every burst's start where prefills crowd in (session 22, ``docs/estimator.md``). Fed the device's
own mechanics (its cost model's step, prefill and rate), the rollout's error with the arrivals known fell from 21.4 to
4.8 % (P90, bursty b16-pingpong at 1x): the model was right but for this. This measures those three at run time, from
what a completion already tells (its job's submit instant, the submit instants of the jobs still in flight), so the
rollout can play the overlap as the device does:

* a job's *overlap* ``o``: how long a job submitted before it ran beside it (the earlier job's completion less this
  job's submit; its whole time if the earlier job is still in flight at its completion; 0: the other engine was idle
  at its submit, or the earlier one completed first);
* the *rate* ``r``: the work a job does per second of overlap, ``(solo - (seconds - o)) / o``, smoothed as a ratio of
  sums (each sample weighs its overlap), from decode steps whose batch's own time is known;
* a decode step's *own time* per compiled batch: a step with no overlap is its own time; one with overlap is
  ``seconds - (1 - r) o`` once ``r`` is known (a large batch rarely runs alone under load: 11 of 874 B16 steps at 1x);
* a prefill's own cost: the same correction, fitted as the prefill timer fits (fixed + per token).

Sans-io and O(1) a completion: a completion is matched against the last few (submit, completion) pairs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from calculet.runtime.scheduling.estimates import DEFAULT_SMOOTHING, PrefillTimer

__all__ = ["OverlapStatistics", "OverlapTimer"]

RECENT = 4
"""Completions kept to find the job that was in flight at a submit (two in flight at most: the last two suffice)."""


@dataclass(frozen=True, slots=True)
class OverlapStatistics:
    """What the timer has measured: the rate (0: not known yet) and its samples, the own-time keys, prefills."""

    rate: float
    rate_samples: int
    solo_steps: tuple[tuple[int, float], ...]
    prefill_samples: int


class OverlapTimer:
    """The device's own time of a decode step per compiled batch, of a prefill, and the rate of an overlapped job,
    from each completion's submit instant and the jobs still in flight (:meth:`completed`)."""

    __slots__ = ("_alpha", "_recent", "_solo", "_work", "_over", "_rate_samples", "prefill")

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError("an overlap timer needs 0 < smoothing <= 1")
        self._alpha = smoothing
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT)
        self._solo: dict[int, float] = {}
        self._work = self._over = 0.0  # smoothed sums: work done while overlapped, seconds overlapped
        self._rate_samples = 0
        self.prefill = PrefillTimer(smoothing)
        """A prefill's own cost (fixed + per token), its overlap taken out."""

    @property
    def rate(self) -> float:
        """Work per second of a job overlapped by the other engine's (0: not measured yet; 1: no slowdown)."""
        if self._over <= 0:
            return 0.0
        return min(1.0, max(0.0, self._work / self._over))

    def solo_steps(self) -> dict[int, float]:
        """The own time of a decode step per compiled batch measured so far (a copy)."""
        return dict(self._solo)

    def overlap(self, submitted: float, now: float, ahead: float | None) -> float:
        """Seconds the job submitted at ``submitted`` and completed at ``now`` ran beside one submitted before it.
        ``ahead``: the earliest submit instant among the jobs still in flight (None: none)."""
        if ahead is not None and ahead < submitted:
            return now - submitted  # the earlier job is still running: overlapped throughout
        return max((min(done, now) - submitted for sub, done in self._recent if sub < submitted < done), default=0.0)

    def completed(self, submitted: float, now: float, ahead: float | None, *, compiled: int = 0,
                  tokens: int = 0) -> None:
        """A decode step of ``compiled`` lanes, or a prefill of ``tokens``, submitted at ``submitted``, completed at
        ``now``; ``ahead``: the earliest submit instant among the jobs still in flight (None: none)."""
        seconds = now - submitted
        if seconds < 0:
            return
        o = self.overlap(submitted, now, ahead)
        self._recent.append((submitted, now))
        rate = self.rate
        if compiled > 0:
            solo = self._solo.get(compiled)
            if o > 0 and solo is not None:  # a rate sample: the work done while overlapped, over the overlap
                keep = 1.0 - self._alpha if self._rate_samples else 0.0
                self._work = keep * self._work + min(o, max(0.0, solo - (seconds - o)))
                self._over = keep * self._over + o
                self._rate_samples += 1
                rate = self.rate
            if o > 0 and rate <= 0:
                return  # its own time is not known without the rate
            own = seconds - (1.0 - rate) * o
            self._solo[compiled] = own if solo is None else solo + self._alpha * (own - solo)
        elif tokens > 0 and (o <= 0 or rate > 0):
            self.prefill.observe(tokens, seconds - (1.0 - rate) * o)

    def statistics(self) -> OverlapStatistics:
        return OverlapStatistics(self.rate, self._rate_samples, tuple(sorted(self._solo.items())),
                                 self.prefill.samples)
