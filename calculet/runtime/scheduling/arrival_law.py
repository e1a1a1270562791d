"""The law of arrivals, learned online from the submits: a rate and an on/off phase (issue #13, §5.2).

Why this module exists: session 19 (``docs/estimator.md``, "An information bound on any admission-time
estimate") measured that a finish estimate which rolls the scheduler forward over futures drawn from the
*law* of arrivals meets issue #13's 25 % on every B>1 row, but only if that law knows its phase: on the
bursty preset a stationary law gives 34.5 % on b16 against 17.0 % with the phase. The forecasts of
sessions 12-13 read a trailing rate, which lags exactly at a burst's edges. The runtime does not know the
workload; it has to learn the law from the submits it has seen. This module does that, without I/O and
without knowing any preset: :meth:`ArrivalLaw.arrived` at each submit (the offered load, accepted or
not), :meth:`ArrivalLaw.finished` at each request ended by stop or length, and
:meth:`ArrivalLaw.forecast` gives the expected arrival rate over ``[now, now + horizon)`` as a few
constant pieces.

The model: a two-regime Markov-modulated Poisson process (MMPP; Fischer & Meier-Hellstern, "The
Markov-modulated Poisson process (MMPP) cookbook", Performance Evaluation 18, 1993), learned as an
alternating renewal process so that fixed on/off durations are learned as well as exponential ones:

* **Change detection.** The current regime's rate ``λ0`` is tested against a higher and a lower
  alternative ``λ1`` by Page's CUSUM (Page, "Continuous inspection schemes", Biometrika 41, 1954) on the
  Poisson likelihood ratio: each arrival adds ``ln(λ1/λ0)``, each second without one adds ``λ0 - λ1``;
  a score reaching :data:`THRESHOLD` declares a change. The alternatives: a change by the smallest factor
  looked for (:data:`NEAR_RATIO`) each way, and, once learned, the other kind's rate towards it (Lorden's
  multi-alternative CUSUM, 1971; a fixed 10x alternative before anything is learned raised a false alarm
  about once in 1 000 Poisson arrivals, four close arrivals being common). A burst's end is seen as
  silence: the downward score grows between arrivals, so its crossing instant is computed exactly whenever
  the law is next told the time (an arrival or a forecast); λ0 moves only at arrivals and changes, so what
  is learned does not depend on when forecasts are asked. Each direction's λ0 leaves out the data of its
  own open excursion (it must not absorb the change it tests for: a quiet regime counting a burst's first
  arrivals needs ever more of them). While a regime is younger than half the shortest complete duration
  of its kind, a change needs :data:`GUARD` more (log prior odds: a change that early is against every
  one seen). The change point is not the alarm instant but where the sharper test's excursion began (the
  CUSUM's own estimate), moved by the posterior mean of a change between two Poisson rates,
  ``1 / |λ1 - λ0|``, towards the quiet side (a burst starts before its first arrival, ends after its last).
* **Each regime's rate** is the Gamma-Poisson posterior mean over the arrivals since the change's alarm
  (those before it were selected for being dense or sparse: counting them a 3 req/s burst read 4.9), with
  the regime kind's pooled rate of its last :data:`~.arrival_memory.MEMORY` regimes as a prior worth
  :data:`~.arrival_memory.PRIOR_ARRIVALS` arrivals; a kind not learned yet starts from the test's alternative, worth
  :data:`HINT_ARRIVALS`. The forecast's rate of the current regime (session 22) mixes that with the kind's pooled
  rate at its empirical Bayes weight (:meth:`ArrivalLaw._regime_rate`); the change tests read the own rate alone.
  What is remembered of each kind, and why the mixture, is :mod:`.arrival_memory`'s (split from here, session 24).
* **Each regime's duration**: the current regime is expected to last the kind's empirical mean residual life at its
  age (:meth:`.arrival_memory.KindMemory.residual`, where the why is).
* **The forecast**: the current regime's rate until its expected end, then the other kind's rate for
  its mean duration, alternating to the horizon.
* **Steady traffic** settles to one rate and invents no phase: the first false change comes after about 5 000
  Poisson arrivals (10 seeds; none in ``bench/arrival_forecast.py``'s steady traces, 75-1 200 arrivals each), later
  ones more often (0-9 in 10 000 arrivals, 10 seeds), and a phase is forecast only when the two kinds' remembered
  rates differ by :data:`NEAR_RATIO` or more. A regime's remembered rate counts only its arrivals after its alarm:
  counted from its change point, the silence that raised a false alarm made a 'low' regime of 0.23 req/s in a
  1 req/s stream, and a phase. A change the two-regime picture cannot place (up from the high regime, down from the
  low one) ends no regime: its rate is measured again from there (``rate_restarts``).

Known weakness: after a false change the rate starts again from a few arrivals and a weak prior (up to 4x the true
rate for a moment, seen once in 100 000 arrivals; 90 % of forecasts within 9 %); under a mild drift (1 -> 1.3 req/s)
false changes come more often (3-14 in 4 500 arrivals, 10 seeds), each such a restart.

A drift by less than :data:`NEAR_RATIO` is never a change: the regime's rate follows it over its last :data:`WINDOW`
to 2 x WINDOW arrivals. Not done: the first seconds' rate rests on a few arrivals (with an
origin and one arrival 0.05 s in, 20 req/s): a consumer may wait for :data:`FIRST_ARRIVALS`.

Cost: O(1) per :meth:`arrived` (four scores); :meth:`forecast` a few pieces (at most
:data:`MAX_PIECES`). Times are the caller's clock, seconds, never going backwards; a caller's mistake
(time backwards, a negative horizon, negative token counts) raises :class:`DefinitionError`.
Measured in ``bench/arrival_forecast.py`` against the presets' true law and a trailing-rate baseline.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from calculet.errors import DefinitionError
from calculet.runtime.scheduling.arrival_memory import PRIOR_ARRIVALS, KindMemory, KindMixture

__all__ = ["ArrivalLaw", "ArrivalLawStatistics", "RatePiece"]

NEAR_RATIO = 3.0
"""The smallest change of rate looked for, and the least ratio between two regimes' rates for a phase."""
THRESHOLD = 8.0
"""CUSUM decision threshold on the log-likelihood ratio: a false alarm about once in 5 000 Poisson arrivals (10 in
53 000 measured; at 10, 4 in 150 000). 9 and 10 learned fewer of the bursty preset's cycles at 0.5x (7 and 5 changes
of 8), where a burst has about 15 arrivals, and its forecast's error over 40 s against the true law doubled or more."""
HINT_ARRIVALS = 1.0
"""Weight, in arrivals, of the detector's alternative as the rate of a regime of a kind not yet learned."""
FIRST_ARRIVALS = 5
"""Arrivals the first regime needs before its rate is tested (no prior then)."""
WINDOW = 256
"""A regime's rate is measured over at most its last 2 x WINDOW arrivals (WINDOW at least, once it has had them): a drift
under :data:`NEAR_RATIO`, never a change, is followed within a few hundred arrivals, with about 1/sqrt(WINDOW) (6 %) of
Poisson noise. The bursty preset's regimes have at most about 60 arrivals each; steady at 4x has 600 in a run."""
MAX_PIECES = 64
"""Most pieces in a forecast; past them the rest of the horizon gets the cycle's mean rate."""
GUARD = 4.0
"""Added to :data:`THRESHOLD` while a regime is younger than half the shortest complete duration of its kind: a
change that early is against everything seen (log prior odds; with exponential durations the shortest is short
and the guard lapses at once). On the bursty preset at 2x it keeps a 2 s silence inside a 3 req/s burst from
splitting it."""
MIN_FINISHED = 8
"""Weight, in requests, of the mean ``max_new_tokens`` in the mean output (shrinkage until enough finish)."""
LENGTHS = 128
"""Recent prompts (of the submits) and outputs (of the requests ended by stop or length) kept for
:meth:`ArrivalLaw.lengths`: an empirical sample a drawn future's arrivals take their lengths from (session 21). A
lognormal's mean prompt is a larger §6 class than most prompts (bursty: median 300, mean about 495 tokens); 128 is
enough to hold the body and a tail of a few per cent, and follows a change of the mix within a few bursts."""

_LOW, _HIGH = 0, 1
_KIND_NAMES = ("low", "high")
_UP_NEAR, _UP_FAR, _DOWN_NEAR, _DOWN_FAR = 0, 1, 2, 3
_DETECTORS = 4


@dataclass(frozen=True, slots=True)
class RatePiece:
    """Expected arrivals per second on ``[start, end)``."""

    start: float
    end: float
    rate_per_s: float


@dataclass(frozen=True, slots=True)
class ArrivalLawStatistics:
    """§16-style view of the learned law."""

    arrivals: int
    """Submits seen."""
    finished: int
    """Requests seen ending by stop or length."""
    regime_changes: int
    """Changes of rate detected (``rate_restarts`` among them)."""
    rate_restarts: int
    """Changes the two-regime picture cannot place (up from the high regime, down from the low one): the regime
    goes on and its rate is measured again from there."""
    phased: bool
    """True when the forecast alternates between two learned regimes; False: one rate."""
    regime: str
    """``"high"``, ``"low"``, or ``"single"`` before any change."""
    rate_per_s: float
    """The current regime's rate."""
    regime_age_s: float
    """Time since the current regime's estimated start."""
    high_rate_per_s: float
    """The high kind's learned rate (0: not learned)."""
    low_rate_per_s: float
    """The low kind's learned rate (0: not learned)."""
    high_mean_duration_s: float
    """The high kind's mean duration (0: not learned)."""
    low_mean_duration_s: float
    """The low kind's mean duration (0: not learned)."""
    mean_prompt_tokens: float
    mean_output_tokens: float
    high_prior_arrivals: float = PRIOR_ARRIVALS
    """Weight, in arrivals, of the high kind's pooled rate in a high regime's rate (empirical Bayes, session 22):
    PRIOR_ARRIVALS until two high regimes are seen and where their rates scatter, up to the arrivals pooled."""
    low_prior_arrivals: float = PRIOR_ARRIVALS
    """The same for the low kind."""
    like_kind: float = 0.0
    """Posterior probability that the current regime has its kind's rate rather than one of its own (0: one prior)."""


class ArrivalLaw:
    """Online learner of a two-regime Poisson arrival law (see the module docstring for the why)."""

    __slots__ = ("_origin", "_now", "_rate_t", "_rate_n", "_recent", "_arrivals", "_kind", "_start", "_start_n",
                 "_censored", "_hint", "_ref", "_alt", "_memory", "_mix", "_guard_end", "_armed", "_score", "_since_t",
                 "_since_n", "_since_prev", "_last_arrival", "_changes", "_restarts",
                 "_prompt_sum", "_max_new_sum", "_generated_sum", "_finished", "_prompts", "_max_news", "_outputs")

    def __init__(self, origin: float | None = None) -> None:
        """``origin``: when observation began (the service's start), if known; else the first arrival.

        With it the first regime's rate is ``n / (now - origin)``; without it the first arrival only opens the
        window (``(n - 1) / (now - first)``), which under-states a trace that started before it less than it
        would over-state by counting it."""
        if origin is not None and not math.isfinite(origin):
            raise DefinitionError(f"origin must be finite, got {origin}")
        self._origin = origin
        self._now: float | None = origin
        self._arrivals = 0
        self._kind: int | None = None
        """The current regime's kind; None before the first change (one regime, kind unknown)."""
        self._start = 0.0 if origin is None else origin
        self._start_n = 0
        """Arrivals before the current regime (its own are ``_arrivals - _start_n``)."""
        self._rate_t, self._rate_n = self._start, 0
        self._recent: deque[float] = deque(maxlen=WINDOW)
        """The last WINDOW arrival instants (where the rate window may start)."""
        """Where the current regime's rate is measured from: the change's alarm, not its start, since the arrivals
        that raised the alarm were selected for being dense (counting them, a burst read 4.9 req/s for 3)."""
        self._censored = True
        self._hint = 0.0
        """The rate the change detector assumed for the current regime (its prior before its kind is learned)."""
        self._ref = [0.0] * _DETECTORS
        """λ0 of the detectors, fixed at each arrival or change so a crossing between arrivals is exact."""
        self._armed = False
        self._alt = [0.0] * _DETECTORS
        self._score = [0.0] * _DETECTORS
        self._since_t = [0.0] * _DETECTORS
        self._since_n = [0] * _DETECTORS
        self._since_prev = [0.0] * _DETECTORS
        self._last_arrival = 0.0
        self._memory = KindMemory()
        """What each kind's ended regimes taught: pooled rates, their weights, durations (told at each change)."""
        self._mix: KindMixture | None = None
        """The current regime's two priors (:meth:`KindMemory.mixture`), fixed at its change; None: its own alone."""
        self._guard_end = -math.inf
        self._changes = 0
        self._restarts = 0
        self._prompt_sum = 0
        self._max_new_sum = 0
        self._generated_sum = 0
        self._finished = 0
        self._prompts: deque[int] = deque(maxlen=LENGTHS)
        self._max_news: deque[int] = deque(maxlen=LENGTHS)
        self._outputs: deque[int] = deque(maxlen=LENGTHS)

    # ------------------------------------------------------------------ inputs

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        """One submit at ``now`` (every one offered, accepted or not: the law is of the offered load)."""
        if prompt_tokens < 0 or max_new_tokens < 0:
            raise DefinitionError(f"token counts must be >= 0, got prompt {prompt_tokens}, max_new {max_new_tokens}")
        self._elapse(now)
        self._arrivals += 1
        self._prompt_sum += prompt_tokens
        self._max_new_sum += max_new_tokens
        self._prompts.append(prompt_tokens)
        self._max_news.append(max_new_tokens)
        if self._arrivals == 1 and self._origin is None:
            self._start, self._start_n, self._last_arrival = now, 1, now
            self._rate_t, self._rate_n = now, 1
            self._recent.append(now)
            self._rearm(now)
            return
        if self._testing():
            self._arrival_scores(now)
        self._last_arrival = now
        self._recent.append(now)
        if self._arrivals - self._rate_n > 2 * WINDOW:
            self._slide()
        self._set_reference(now)

    def _slide(self) -> None:
        """Start the rate window at the WINDOW-th last arrival, unless a test's open excursion began before it (its
        λ0 is read up to there); O(1), at most once in WINDOW arrivals."""
        start = self._recent[0]
        for i in range(_DETECTORS):
            if self._score[i] > 0 and self._since_t[i] < start:
                return
        self._rate_t, self._rate_n = start, self._arrivals - WINDOW + 1

    def finished(self, generated_tokens: int) -> None:
        """A request ended by stop or length after ``generated_tokens`` tokens."""
        if generated_tokens < 0:
            raise DefinitionError(f"generated_tokens must be >= 0, got {generated_tokens}")
        self._finished += 1
        self._generated_sum += generated_tokens
        self._outputs.append(generated_tokens)

    # ------------------------------------------------------------------ outputs

    @property
    def mean_prompt_tokens(self) -> float:
        return self._prompt_sum / self._arrivals if self._arrivals else 0.0

    @property
    def mean_output_tokens(self) -> float:
        """Mean generated tokens of finished requests, shrunk towards the mean ``max_new_tokens``.

        The first requests to finish are the short ones, so their mean alone under-states; the submits'
        mean ``max_new_tokens`` weighs :data:`MIN_FINISHED` requests against them.
        """
        if not self._arrivals:
            return self._generated_sum / self._finished if self._finished else 0.0
        prior = self._max_new_sum / self._arrivals
        return (self._generated_sum + MIN_FINISHED * prior) / (self._finished + MIN_FINISHED)

    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prompts, outputs): the last :data:`LENGTHS` submits' prompts and the last requests' generated tokens (the
        submits' ``max_new_tokens`` while fewer than :data:`MIN_FINISHED` have ended: the first to end are the
        short ones). A drawn future's arrival takes one of each at random (:mod:`.decode_rollout`), where the mean
        path gives every arrival the means; empty before the first submit."""
        outputs = self._outputs if len(self._outputs) >= MIN_FINISHED else self._max_news
        return tuple(self._prompts), tuple(outputs)

    def forecast(self, now: float, horizon_s: float) -> tuple[RatePiece, ...]:
        """Expected arrivals per second over ``[now, now + horizon_s)``, in consecutive ordered pieces."""
        if not (horizon_s >= 0 and math.isfinite(horizon_s)):
            raise DefinitionError(f"horizon_s must be finite and >= 0, got {horizon_s}")
        self._elapse(now)
        end = now + horizon_s
        if end <= now:
            return ()
        rate = self._regime_rate(now)
        kind = self._kind
        if kind is None or not self._phased(now):
            return (RatePiece(now, end, rate),)
        other = 1 - kind
        durations = (self._memory.mean_duration(_LOW), self._memory.mean_duration(_HIGH))
        rates = [0.0, 0.0]
        rates[kind], rates[other] = self._kind_rate(kind, now), self._kind_rate(other, now)
        pieces: list[RatePiece] = []
        t, k, r, d = now, kind, rate, self._memory.residual(kind, now - self._start)
        while t < end and len(pieces) < MAX_PIECES - 1:
            e = min(t + d, end)
            if e > t:
                pieces.append(RatePiece(t, e, r))
            t, k = e, 1 - k
            r, d = rates[k], durations[k]
        if t < end:
            cycle = durations[0] + durations[1]
            mean = (rates[0] * durations[0] + rates[1] * durations[1]) / cycle if cycle > 0 else rate
            pieces.append(RatePiece(t, end, mean))
        return tuple(pieces)

    def statistics(self) -> ArrivalLawStatistics:
        now = self._now if self._now is not None else 0.0
        kind = self._kind
        memory, mix = self._memory, self._mix
        learned = [self._kind_rate(k, now) if memory.has_rate(k) or k == kind else 0.0 for k in (_LOW, _HIGH)]
        durations = [memory.mean_duration(k) if memory.has_duration(k) else 0.0 for k in (_LOW, _HIGH)]
        return ArrivalLawStatistics(
            arrivals=self._arrivals, finished=self._finished, regime_changes=self._changes,
            rate_restarts=self._restarts, phased=kind is not None and self._phased(now),
            regime="single" if kind is None else _KIND_NAMES[kind], rate_per_s=self._regime_rate(now),
            regime_age_s=max(now - self._start, 0.0) if self._arrivals else 0.0,
            high_rate_per_s=learned[_HIGH], low_rate_per_s=learned[_LOW],
            high_mean_duration_s=durations[_HIGH], low_mean_duration_s=durations[_LOW],
            mean_prompt_tokens=self.mean_prompt_tokens, mean_output_tokens=self.mean_output_tokens,
            high_prior_arrivals=memory.prior_weight(_HIGH), low_prior_arrivals=memory.prior_weight(_LOW),
            like_kind=0.0 if mix is None else mix.like_kind(self._arrivals - self._rate_n,
                                                            max(now - self._rate_t, 0.0)))

    # ------------------------------------------------------------------ rates and durations

    def _regime_rate(self, now: float, arrivals: int | None = None, mixed: bool = True) -> float:
        """Posterior mean of the current regime's rate over its rate window up to ``now`` (with ``arrivals`` of all
        the submits up to ``now``: every one seen when None).

        Gamma-Poisson with the prior of :meth:`_prior`; where the kind's regimes have shown one rate (an empirical
        Bayes weight above :data:`PRIOR_ARRIVALS`), a mixture of two priors at even odds: the regime is like its kind
        (that weight) or has a rate of its own (PRIOR_ARRIVALS), each weighed by how well it predicts the regime's own
        count (:class:`~.arrival_memory.KindMixture`, where the why is).

        ``mixed=False``: the own prior alone, as the change tests read λ0 (:meth:`_set_reference`): what they test,
        and so every change point, is as before session 22, and an arrival costs what it did (the mixture's
        log-gamma terms are paid per forecast, not per submit: #20)."""
        if not self._arrivals:
            return 0.0
        n = (self._arrivals if arrivals is None else arrivals) - self._rate_n
        span = max(now - self._rate_t, 0.0)
        prior_n, prior_s = self._prior()
        if prior_s + span <= 0:
            return 0.0
        own = (prior_n + n) / (prior_s + span)
        mix = self._mix
        if mix is None or not mixed:
            return own
        return mix.rate(n, span, own)

    def _prior(self) -> tuple[float, float]:
        """(arrivals, seconds) of the current regime's own Gamma prior: its kind's learned rate worth
        PRIOR_ARRIVALS, else the detector's hint."""
        kind = self._kind
        if kind is not None and self._memory.has_rate(kind):
            return PRIOR_ARRIVALS, PRIOR_ARRIVALS / self._memory.pooled(kind)
        if self._hint > 0:
            return HINT_ARRIVALS, HINT_ARRIVALS / self._hint
        return 0.0, 0.0

    def _kind_rate(self, kind: int, now: float) -> float:
        """The kind's rate for a future regime: its remembered regimes pooled with the current one if it is of it."""
        n, seconds = self._memory.totals(kind)
        if kind == self._kind:
            n += self._arrivals - self._start_n
            seconds += max(now - self._start, 0.0)
        if kind == self._kind and not self._memory.has_rate(kind):
            return self._regime_rate(now)
        return (n + 0.5) / seconds if seconds > 0 else 0.0

    def _phased(self, now: float) -> bool:
        """A phase is forecast only between two learned regimes whose rates differ by NEAR_RATIO or more."""
        kind = self._kind
        if kind is None or not self._memory.has_rate(1 - kind) or not self._memory.has_duration(1 - kind):
            return False
        high, low = self._kind_rate(_HIGH, now), self._kind_rate(_LOW, now)
        return high >= NEAR_RATIO * low

    # ------------------------------------------------------------------ change detection

    def _testing(self) -> bool:
        """Whether the scores run: decided with λ0 (:meth:`_set_reference`), held until it is set again."""
        return self._armed

    def _testable(self) -> bool:
        """The first regime (no prior) is tested once it has FIRST_ARRIVALS arrivals of its own."""
        return min(self._ref) > 0 and (self._kind is not None or self._arrivals - self._start_n >= FIRST_ARRIVALS)

    def _set_reference(self, now: float) -> None:
        """λ0 of each test and the alternatives, fixed until the next arrival or change.

        Each direction's λ0 is the regime's rate up to the earliest open excursion of its own tests, so that it does
        not absorb the change it tests for: a quiet regime counting a burst's first arrivals would need ever more of
        them, a busy one counting its silence ever longer silences. The upward cut applies from the first change on;
        the downward one only in a regime of a learned kind (its prior then carries λ0): in a quiet regime of a kind
        not learned yet, its silence is its own rate's only evidence, and cut it would keep the detector's guess.
        """
        prior_n, prior_s = self._prior()
        learned = self._kind is not None and self._memory.has_rate(self._kind)
        read: tuple[float, int, float] | None = None
        for group, cut in (((_UP_NEAR, _UP_FAR), self._kind is not None), ((_DOWN_NEAR, _DOWN_FAR), learned)):
            cut_t, cut_n = now, self._arrivals
            for i in group if cut else ():
                if self._score[i] > 0 and self._since_t[i] < cut_t:
                    cut_t, cut_n = self._since_t[i], self._since_n[i]
            if prior_s + (cut_t - self._rate_t) > 0:
                if read is None or read[0] != cut_t or read[1] != cut_n:  # both groups often read up to now
                    read = (cut_t, cut_n, self._regime_rate(cut_t, cut_n, mixed=False))
                rate = read[2]
                for i in group:
                    self._ref[i] = rate
        self._armed = self._testable()
        if not self._armed:
            self._rearm(now)
            return
        kind = self._kind
        other = self._memory.pooled(1 - kind) if kind is not None and self._memory.has_rate(1 - kind) else 0.0
        up, down = self._ref[_UP_NEAR], self._ref[_DOWN_NEAR]
        # the far alternative is the other kind's learned rate, towards it only; otherwise it is the near one
        self._alt[_UP_NEAR] = self._alt[_UP_FAR] = up * NEAR_RATIO
        self._alt[_DOWN_NEAR] = self._alt[_DOWN_FAR] = down / NEAR_RATIO
        if kind == _LOW and other > up * NEAR_RATIO:
            self._alt[_UP_FAR] = other
        elif kind == _HIGH and 0 < other < down / NEAR_RATIO:
            self._alt[_DOWN_FAR] = other

    def _rearm(self, now: float) -> None:
        """Every score to 0, the excursions starting now."""
        for i in range(_DETECTORS):
            self._score[i] = 0.0
            self._since_t[i] = now
            self._since_n[i] = self._arrivals
            self._since_prev[i] = self._last_arrival

    def _elapse(self, now: float) -> None:
        """Let time pass to ``now``: the downward scores grow, and one reaching THRESHOLD changes the regime
        at its exact crossing instant (then the rest of the gap runs under the new regime)."""
        if not math.isfinite(now):
            raise DefinitionError(f"time must be finite, got {now}")
        if self._now is not None and now < self._now:
            raise DefinitionError(f"time went backwards: {now} after {self._now}")
        if self._now is None:
            self._now = now
            return
        while now > self._now:
            guard_ends = self._guard_ends()
            until = min(now, guard_ends) if self._now < guard_ends else now
            threshold = self._threshold(self._now)
            crossing, fired = math.inf, -1
            if self._testing():
                for i in (_DOWN_NEAR, _DOWN_FAR):
                    at = self._now + max(threshold - self._score[i], 0.0) / (self._ref[i] - self._alt[i])
                    if at <= until and at < crossing:
                        crossing, fired = at, i
            if fired < 0:
                self._drift(until - self._now)
                self._now = until
                continue
            self._drift(crossing - self._now)
            self._now = crossing
            hint = self._alt[fired]
            at = _DOWN_FAR if self._score[_DOWN_FAR] > 0 else fired
            # where: the sharper alternative's excursion (a slow drift starts it too early); the regime ended
            # after its last arrival, the change's posterior mean 1/(λ0 - λ1) later
            tau = min(self._since_t[at] + 1.0 / (self._ref[at] - self._alt[at]), crossing)
            self._change(up=False, tau=tau, before=self._since_n[at], hint=hint, now=crossing)

    def _guard_ends(self) -> float:
        """When the current regime's age reaches half the shortest complete duration of its kind (-inf: no guard)."""
        return self._guard_end

    def _set_guard(self) -> None:
        kind = self._kind
        shortest = self._memory.shortest_complete(kind) if kind is not None else None
        self._guard_end = self._start + 0.5 * shortest if shortest is not None else -math.inf

    def _threshold(self, now: float) -> float:
        return THRESHOLD + GUARD if now < self._guard_ends() else THRESHOLD

    def _drift(self, dt: float) -> None:
        if not self._testing() or dt <= 0:
            return
        ref = self._ref
        for i in (_UP_NEAR, _UP_FAR):
            self._score[i] = max(0.0, self._score[i] - (self._alt[i] - ref[i]) * dt)
        for i in (_DOWN_NEAR, _DOWN_FAR):
            self._score[i] += (ref[i] - self._alt[i]) * dt

    def _arrival_scores(self, now: float) -> None:
        """An arrival's jump in each score; an upward score reaching THRESHOLD changes the regime."""
        ref = self._ref
        threshold = self._threshold(now)
        fired = -1
        for i in (_UP_NEAR, _UP_FAR):
            if self._score[i] == 0.0:  # this arrival opens the excursion: the new regime would start with it
                self._since_t[i], self._since_n[i], self._since_prev[i] = now, self._arrivals - 1, self._last_arrival
            self._score[i] += math.log(self._alt[i] / ref[i])
            if self._score[i] >= threshold and (fired < 0 or self._score[i] > self._score[fired]):
                fired = i
        for i in (_DOWN_NEAR, _DOWN_FAR):
            self._score[i] = max(0.0, self._score[i] - math.log(ref[i] / self._alt[i]))
            if self._score[i] == 0.0:
                self._since_t[i], self._since_n[i], self._since_prev[i] = now, self._arrivals, now
        if fired >= 0:
            # where: the sharper alternative's excursion (open: this arrival raised it), as for a fall; the burst
            # began before its first arrival, the change's posterior mean 1/(λ1 - λ0) earlier
            at = _UP_FAR
            tau = max(self._since_t[at] - 1.0 / (self._alt[at] - ref[at]), self._since_prev[at], self._start)
            self._change(up=True, tau=tau, before=self._since_n[at], hint=self._alt[fired], now=now)

    def _change(self, *, up: bool, tau: float, before: int, hint: float, now: float) -> None:
        """Close the current regime at ``tau`` (its arrivals: up to ``before``) and open the other kind's."""
        new = _HIGH if up else _LOW
        self._changes += 1
        if self._kind == new:
            # up from the high regime or down from the low one: the two-regime picture cannot place it, so the
            # regime goes on (no duration ends) and only its rate is measured again, from here
            self._restarts += 1
            self._rate_t, self._rate_n, self._hint = now, self._arrivals, hint
            self._rearm(now)
            self._set_reference(now)
            return
        ended = 1 - new
        tau = max(tau, self._start)
        duration = tau - self._start
        if duration > 0:
            # its rate over its rate window only (from its alarm, or the slide): the arrivals or the silence that
            # raised the alarm were selected, and a steady stream's false alarm on a silence made a 'low' regime of
            # 0.23 req/s for 1 req/s, and with it a phase
            self._memory.remember(ended, duration, self._censored, before - self._rate_n, tau - self._rate_t)
        self._kind, self._start, self._start_n, self._censored, self._hint = new, tau, before, False, hint
        self._rate_t, self._rate_n = now, self._arrivals
        self._set_guard()
        self._mix = self._memory.mixture(new)
        self._rearm(now)
        self._set_reference(now)
