"""Measured decode step time: what the scheduler expects the next decode step to take.

Two rules of the spec need a step time and neither says where it comes from: §7.2 item 4
(the batching window must not make the earliest deadline time out, so it stops one step
before it) and §5.2 (a request is queued only with a prospect of service before its
deadline). A configured guess would be wrong on every device but one, so the scheduler
measures it: each completed decode job's time from submission to completion, smoothed.
Submission-to-completion is what a sequence waits per token, including the other engine's
job under ping/pong, which is the figure both rules need.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

DEFAULT_SMOOTHING = 0.125
"""Weight of the newest sample (the TCP RTT estimator's 1/8): about the last 16 steps count."""


@dataclass(frozen=True)
class StepTimeStatistics:
    """§16-style view: the current estimate and how many steps it has seen."""

    decode_step_s: float
    samples: int
    token_s: float = 0.0
    """Wall seconds per token of a decoding sequence (:attr:`StepTimer.token_s`)."""
    period_s: float = 0.0
    """Back-to-back decode steps' completion-to-completion time (:attr:`StepTimer.period_s`)."""
    period_high_s: float = 0.0
    """Its tail, mean plus four mean deviations (:attr:`StepTimer.period_high_s`)."""
    slot_token_s: float = 0.0
    """Wall seconds a KV slot is held per token it yields (:attr:`StepTimer.slot_token_s`)."""


PERIOD_DEVIATION_WEIGHT = 0.25
"""Weight of the newest sample in the period's mean deviation (RFC 6298's β = 1/4)."""
PERIOD_DEVIATIONS = 4.0
"""The high period is the mean plus this many mean deviations (RFC 6298's RTO = SRTT + 4·RTTVAR): a
stream's inter-token latency is judged at its P99, not its mean, so the cap is sized on the tail."""
PERIOD_CAP = 2.0
"""A completion-to-completion interval longer than this many step times is idle time, not a period."""
TOKEN_SMOOTHING = 1 / 256
"""Weight of the newest decode step in the per-token time: prefills arrive every few seconds and
streams come and go, so it is averaged over a few hundred steps (about a request's lifetime)."""


class Holding(Protocol):
    """The count of sequences holding a KV slot (the admission budget's active sequences)."""

    @property
    def active(self) -> int: ...


class StepTimer:
    """Exponentially smoothed decode step time, starting from a prior until a step is measured.

    It also measures the wall time per token a *decoding sequence* sees (issue #13), by Little's
    law over a long window: Σ (sequences in decode × time since the previous decode step) /
    Σ tokens produced. That includes what the step time alone does not: the prefills of later
    arrivals run between steps (§6 WRR), the profile grows with the streams (§8), and a profile
    smaller than the streams rotates them. Idle device time is not counted (the interval is
    capped at the step plus the prefills completed since the previous step), nor is waiting for
    a lane beyond the widest batch seen (the estimate's lane schedule models that rotation).

    Where the long window errs (at changes of load) and the forecasts tried in its place and not kept,
    with their figures: ``docs/estimator.md``.
    """

    __slots__ = ("decode_step_s", "_samples", "_alpha", "_last_done", "_prefill_since", "_waited", "_tokens", "_widest",
                 "_period", "_period_dev", "_held", "holding", "_by_batch", "overlap")

    def __init__(self, prior_s: float = 0.0, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if prior_s < 0 or not 0 < smoothing <= 1:
            raise ValueError("a step timer needs prior_s >= 0 and 0 < smoothing <= 1")
        self.decode_step_s = prior_s
        """The estimate: the prior until a step is measured, then smoothed (written by :meth:`observe` only). A plain
        attribute, not a property: the steady decode step reads it (the drift check, the batching window), and
        a property is a call per read (issue #20)."""
        self._samples = 0
        self._alpha = smoothing
        self._last_done: float | None = None
        self._prefill_since = self._waited = self._tokens = self._period = self._period_dev = self._held = 0.0
        self._widest = 0
        self._by_batch: dict[int, float] | None = None  # step_at(): the smoothed step per compiled batch, if asked
        self.overlap: OverlapTimer | None = None
        """Under ping/pong with the rollout reporting (set by the ``on_time`` policy): the overlap of the two engines'
        jobs, told of every completion by the applier (:class:`OverlapTimer`, #13 session 22); None elsewhere."""
        self.holding: Holding | None = None
        """What counts the sequences that hold a KV slot now (admitted, not yet released: waiting for or running their
        prefill, decoding, finishing): its ``active``, read at each decode step measured; set by the ``on_time``
        policy to the admission budget itself (None: :attr:`slot_token_s` reads :attr:`token_s`)."""

    @property
    def samples(self) -> int:
        """Decode steps measured so far: every estimate read from this timer can change only when it does
        (the on_time device model is rebuilt on it, issue #20)."""
        return self._samples

    @property
    def token_s(self) -> float:
        """Wall seconds per token of a decoding sequence over the long window (0 until measured)."""
        return self._waited / self._tokens if self._tokens > 0 else 0.0

    def step_at(self, compiled: int) -> float:
        """The smoothed decode step of jobs of ``compiled`` lanes (0 until one is measured): the device's own time for
        a step of that profile, without the prefills between steps or the rotation. The ``on_time`` planner's bound on
        the per-token time a candidate could see on a lane free now (:func:`.on_time_refusal.lane_free_bet`, #13)."""
        by_batch = self._by_batch
        return 0.0 if by_batch is None else by_batch.get(compiled, 0.0)

    def measure_per_batch(self) -> None:
        """Measure the step per compiled batch from now on (:meth:`step_at`): asked by the ``on_time`` policy where
        lane-free bets are made; a device that never asks pays nothing for it per step (#20)."""
        if self._by_batch is None:
            self._by_batch = {}

    @property
    def slot_token_s(self) -> float:
        """Wall seconds a KV slot is held per token it yields, over the same long window as :attr:`token_s` (0 until
        measured): Little's law over the slots held rather than the sequences decoding. A slot is held from the
        request's admission into prefill to its release, so this also counts the time a newcomer holds its slot
        before its first decode step — waiting for its prefill behind the other newcomers' (§6 serves one prefill
        between decode steps) — and a freed slot's turnover. Issue #13 measured it on the goodput comparison's B16
        4x runs at 1.3x the per-token time (the device decodes 11-12 sequences on average of the 16 slots held):
        a lane schedule that hands a freed lane to the next job at once, at :attr:`token_s`, overstates how fast
        the queue drains by that much (``DeviceModel.slot_token_s``)."""
        return self._held / self._tokens if self._tokens > 0 else 0.0

    @property
    def period_s(self) -> float:
        """Seconds from one decode step's completion to the next's when they run back to back, less the
        prefills between them (0 until measured): the step plus the host's time between steps, which
        a stream's inter-token latency pays once per step of its rotation and the step time does not
        show (issue #13 measured ITL P99 206 ms under a 200 ms target sized on the step alone)."""
        return self._period

    @property
    def period_high_s(self) -> float:
        """The period's tail (0 until measured): the mean plus four mean deviations, as TCP bounds a round
        trip (RFC 6298). The ITL cap is sized on it: issue #13 measured the worst stream's ITL P99 at
        203 ms under a 200 ms target sized on the mean period (the host's time between steps varies)."""
        return self._period + PERIOD_DEVIATIONS * self._period_dev

    def prefill_ran(self, seconds: float) -> None:
        """A prefill job took ``seconds`` of device time (between two decode steps)."""
        if seconds > 0:
            self._prefill_since += seconds

    def observe(self, seconds: float, *, lanes: int = 0, compiled: int = 0, decoding: int = 0,
                now: float | None = None) -> float:
        """One decode job took ``seconds`` from submission to completion; returns the new estimate.

        ``lanes`` is its active lanes of ``compiled``, ``decoding`` the sequences in decode when it
        completed (these lanes included) and ``now`` the completion instant: the per-token sample.
        Under ping/pong ``compiled`` and ``decoding`` include the other decode job in flight: its
        sequences wait too, and the two jobs' lanes decode at once (issue #13). The period (:attr:`period_s`) takes
        one completion-to-completion interval less the prefills between, if the two steps ran back to back: an
        interval over PERIOD_CAP steps means the device idled (nothing was ready), which no stream waits for."""
        if seconds < 0:
            return self.decode_step_s
        if self._samples == 0:
            self.decode_step_s = seconds
        else:
            self.decode_step_s += self._alpha * (seconds - self.decode_step_s)
        self._samples += 1
        by_batch = self._by_batch
        if by_batch is not None and compiled > 0:
            last = by_batch.get(compiled)
            by_batch[compiled] = seconds if last is None else last + self._alpha * (seconds - last)
        if now is not None and lanes > 0:
            busy = seconds + self._prefill_since
            keep = 1.0 - TOKEN_SMOOTHING
            widest = self._widest  # max(widest, compiled, lanes) as conditionals: builtin calls a step fewer (#20)
            if compiled > widest:
                widest = compiled
            if lanes > widest:
                widest = lanes
            self._widest = widest
            last_done = self._last_done
            if last_done is None:  # the first step: only its own lanes' wait is known (under ping/pong
                interval, waiting = busy, lanes  # the other job's sequences may have been submitted just now)
            else:  # the completion-to-completion period (below), inline: once per decode step (#20)
                sample = now - last_done - self._prefill_since
                if 0 < sample <= PERIOD_CAP * seconds:
                    if self._period == 0:
                        self._period = sample  # no spread seen yet (RFC 6298 starts at R/2; a cap held that low
                                               # would keep streams back for dozens of steps after start-up)
                    else:
                        self._period_dev += PERIOD_DEVIATION_WEIGHT * (abs(sample - self._period) - self._period_dev)
                        self._period += self._alpha * (sample - self._period)
                gap = now - last_done  # min(busy, max(0.0, gap)) and max(lanes, min(decoding, widest)), as max and
                if not gap > 0.0:       # min decide (the first of equals kept), without their calls (#20)
                    gap = 0.0
                interval = gap if gap < busy else busy
                waiting = widest if widest < decoding else decoding
                if waiting <= lanes:  # max(lanes, ...) keeps lanes on a tie
                    waiting = lanes
            self._waited = keep * self._waited + waiting * interval
            holding = self.holding
            held = waiting if holding is None else max(waiting, holding.active)
            self._held = keep * self._held + held * interval
            self._tokens = keep * self._tokens + lanes
            self._last_done = now
        self._prefill_since = 0.0
        return self.decode_step_s

    def statistics(self) -> StepTimeStatistics:
        return StepTimeStatistics(self.decode_step_s, self._samples, self.token_s, self._period, self.period_high_s,
                                  self.slot_token_s)


@dataclass(frozen=True)
class PrefillTimeStatistics:
    """The measured prefill cost: ``fixed_s + per_token_s × tokens`` and how many jobs it has seen."""

    fixed_s: float
    per_token_s: float
    samples: int


class PrefillTimer:
    """Prefill cost per job, measured like the decode step (issue #13: the finish estimate needs it).

    A prefill (or chunk) job of ``tokens`` takes ``fixed + per_token × tokens``; both are fitted
    by least squares over exponentially weighted sums (the same 1/8 weight of the newest
    sample), so no configured guess is needed. While every sample has had one length, the
    cost is all per token (``fixed`` 0): an estimate for other lengths then scales linearly.
    """

    __slots__ = ("_alpha", "_samples", "_w", "_t", "_s", "_tt", "_ts")

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError("a prefill timer needs 0 < smoothing <= 1")
        self._alpha = smoothing
        self._samples = 0
        self._w = self._t = self._s = self._tt = self._ts = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < 1 or seconds < 0:
            return
        keep = 1.0 - self._alpha if self._samples else 0.0
        self._w = keep * self._w + 1.0
        self._t = keep * self._t + tokens
        self._s = keep * self._s + seconds
        self._tt = keep * self._tt + tokens * tokens
        self._ts = keep * self._ts + tokens * seconds
        self._samples += 1

    @property
    def samples(self) -> int:
        """Prefill jobs measured so far (0: the cost is not known yet)."""
        return self._samples

    def cost(self) -> tuple[float, float]:
        """(fixed seconds, seconds per token); (0, 0) before the first sample."""
        if not self._samples:
            return 0.0, 0.0
        w, t, s = self._w, self._t, self._s
        var = self._tt - t * t / w
        if var > 1e-9 * self._tt:
            slope = (self._ts - t * s / w) / var
            fixed = (s - slope * t) / w
            if slope >= 0 and fixed >= 0:
                return fixed, slope
        return 0.0, s / t

    def statistics(self) -> PrefillTimeStatistics:
        fixed, per = self.cost()
        return PrefillTimeStatistics(fixed, per, self._samples)


# Ping/pong's overlap, measured: a job's own device time and how fast a job overlapped by the other engine's runs
# (#13).
#
# Why this timer exists: under ping/pong (§14) two jobs are in flight and "a maximum in-flight count of 2 does not
# automatically equal 2B lanes computing at once": the simulated device (``pingpong_overlap``) runs a job submitted
# while the other engine is busy at a reduced rate until that job ends, and leaves the earlier job as it was. The step
# timer keys a decode step by its compiled batch plus the other decode job's in flight at its completion, so one key
# mixes a step alone (B16: 80 ms on the reference cost model) and a step beside a prefill (up to 160 ms): on bursty
# B16 ping/pong at 1x its key 16 read 67-160 ms (mean 114). The decode set's rollout (:mod:`.decode_rollout`) took the
# mix for both, early at every burst's start where prefills crowd in (session 22, ``docs/estimator.md``). Fed the
# device's own mechanics (its cost model's step, prefill and rate), the rollout's error with the arrivals known fell
# from 21.4 to 4.8 % (P90, bursty b16-pingpong at 1x): the model was right but for this. This measures those three at
# run time, from what a completion already tells (its job's submit instant, the submit instants of the jobs still in
# flight), so the rollout can play the overlap as the device does:
#
# * a job's *overlap* ``o``: how long a job submitted before it ran beside it (the earlier job's completion less
#   this job's submit; its whole time if the earlier job is still in flight at its completion; 0: the other engine
#   was idle at its submit, or the earlier one completed first);
# * the *rate* ``r``: the work a job does per second of overlap, ``(solo - (seconds - o)) / o``, smoothed as a ratio
#   of sums (each sample weighs its overlap), from decode steps whose batch's own time is known;
# * a decode step's *own time* per compiled batch: a step with no overlap is its own time; one with overlap is
#   ``seconds - (1 - r) o`` once ``r`` is known (a large batch rarely runs alone under load: 11 of 874 B16 steps at
#   1x);
# * a prefill's own cost: the same correction, fitted as the prefill timer fits (fixed + per token).
#
# Sans-io and O(1) a completion: a completion is matched against the last few (submit, completion) pairs.

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
