"""What the law of arrivals remembers of each kind of regime: rates pooled, their weight, durations (#13, §5.2).

Why this module exists: :class:`~calculet.runtime.scheduling.arrival_law.ArrivalLaw` detects the changes between a
high and a low regime and forecasts from them; what it learns of each *kind* (low, high) from the regimes it has
closed is a responsibility of its own: the last :data:`MEMORY` regimes' arrival counts, exposures and durations, and
what they say about the next regime of that kind. It grew with session 22's pooling until the one learner was past
the project's size limits, and was split from it in session 24 (no behaviour changed). Nothing here detects a change:
the law tells :meth:`KindMemory.remember` each regime it ends, and reads back. Kinds are ``0`` (low) and ``1`` (high),
``1 - kind`` the other.

* **A kind's rate**: its remembered regimes pooled, ``(Σn + 1/2) / Σs`` over their rate windows (half an arrival
  added: never 0 after a silent regime). It is the prior of the kind's next regime's rate, worth
  :data:`PRIOR_ARRIVALS` arrivals (a new burst reads the last bursts' rate from its first second, and moves to its
  own as its arrivals come). The forecast's rate of the current regime (session 22) weighs the kind's pooled rate by
  what its regimes have shown (empirical Bayes, :func:`_prior_weight`: regimes of one rate, as an MMPP's, make it
  worth up to every arrival pooled) in a mixture with the regime's own rate, each by how well it predicts the
  regime's count (:class:`KindMixture`): on the bursty preset after the first cycle the forecast's mean absolute
  error over 10 s fell from 1.93 to 1.39 arrivals at 1x and 3.20 to 2.07 at 2x (``bench/arrival_forecast.py``); a
  burst at a new rate still moves to its own. The change tests read the own rate alone, as before: every change
  point is unchanged.
* **Each regime's duration**: the kind's last :data:`MEMORY` durations (change point to change point).
  The current regime is expected to last the empirical *mean residual life* at its age, ``mean(d - a
  for d > a)``: for fixed durations (the bursty preset's 20 s / 40 s) that is "the learned length minus
  the time already spent", for exponential ones it tends to the mean (memoryless), and past every
  duration seen it is 0 (the change is due). Before a kind has a duration of its own, the other kind's
  mean stands in (an alternating process with no evidence of asymmetry). The first regime's duration
  is censored (it began before the law saw it) and is used only while no complete one exists.

Cost: :meth:`KindMemory.remember` O(MEMORY), at each change only; the reads at each arrival (:meth:`pooled`,
:meth:`has_rate`) O(1); the mixture's constants are fixed at a change (:meth:`KindMemory.mixture`), so its log-gamma
terms are paid per forecast, not per submit (#20).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["MEMORY", "PRIOR_ARRIVALS", "KindMemory", "KindMixture"]

PRIOR_ARRIVALS = 4.0
"""Weight, in arrivals, of the kind's learned rate in the current regime's rate (Gamma prior)."""
MEMORY = 8
"""Regimes of each kind whose rate and duration are remembered."""

_LGAMMA_PRIOR = math.lgamma(PRIOR_ARRIVALS)


def _prior_weight(counts: deque[tuple[int, float]], pooled: float, total_n: int, total_s: float) -> float:
    """The weight, in arrivals, of a kind's pooled rate as the prior of its next regime's rate: empirical Bayes.

    Regimes of one kind are a Gamma(α, β) of rates, each seen as Poisson counts ``n_i`` over ``s_i`` seconds. The
    between-regime variance of the rates by the method of moments (the Poisson part of the counts' scatter
    removed; DerSimonian & Laird, 1986, for rates): ``v = (Σ s_i (n_i/s_i - m)² - (k - 1) m) / (Σs - Σs²/Σs)``;
    the prior's weight ``α = m² / v``. Regimes of one rate (an MMPP) scatter by their Poisson noise alone, v tends
    to 0 and the pooled rate outweighs one burst's few arrivals; regimes whose rates differ leave the current
    one's own count in charge. Bounded by :data:`PRIOR_ARRIVALS` below (the weight before two regimes are seen)
    and the arrivals pooled above (the prior is never surer than its data)."""
    if len(counts) < 2 or total_s <= 0:
        return PRIOR_ARRIVALS
    scatter = sum(s * (n / s - pooled) ** 2 for n, s in counts if s > 0) - (len(counts) - 1) * pooled
    spread = total_s - sum(s * s for _, s in counts) / total_s
    cap = max(float(total_n), PRIOR_ARRIVALS)
    if scatter <= 0 or spread <= 0:
        return cap
    return min(max(pooled * pooled * spread / scatter, PRIOR_ARRIVALS), cap)


@dataclass(frozen=True, slots=True)
class KindMixture:
    """The two priors of a regime of a learned kind, at even odds: like its kind (the kind's pooled rate worth its
    empirical Bayes weight) or a rate of its own (the pooled rate worth PRIOR_ARRIVALS). Fixed from the regime's
    change to the next (:meth:`KindMemory.mixture`), so an arrival costs nothing of it."""

    weight: float
    """Arrivals the kind's prior is worth (:func:`_prior_weight`), above PRIOR_ARRIVALS."""
    seconds: float
    """Seconds the kind's prior is worth: ``weight / pooled``."""
    own_seconds: float
    """Seconds the own prior is worth: ``PRIOR_ARRIVALS / pooled``."""
    lgamma_weight: float
    """``lgamma(weight)``, computed once."""

    def like_kind(self, n: int, span: float) -> float:
        """Posterior probability that a regime with ``n`` arrivals over ``span`` seconds has its kind's rate rather
        than one of its own, at even prior odds: the ratio of the two negative binomial marginal likelihoods of ``n``
        (the ``n!`` and ``span**n`` terms cancel)."""
        log_odds = (PRIOR_ARRIVALS * math.log(self.own_seconds / (self.own_seconds + span))
                    - self.weight * math.log(self.seconds / (self.seconds + span))
                    + math.lgamma(PRIOR_ARRIVALS + n) - math.lgamma(self.weight + n) + self.lgamma_weight
                    - _LGAMMA_PRIOR - n * math.log((self.own_seconds + span) / (self.seconds + span)))
        # the log odds of "a rate of its own", clipped: exp never overflows
        return 1.0 / (1.0 + math.exp(max(min(log_odds, 50.0), -50.0)))

    def rate(self, n: int, span: float, own: float) -> float:
        """The regime's rate: the kind's posterior mean (``n`` arrivals over ``span`` seconds on the kind's prior) and
        ``own`` (the same on the own prior), each weighed by its posterior probability (:meth:`like_kind`). A burst
        like the others reads the kind's rate, not its first arrivals' Poisson noise; a burst at a new rate (a load
        shift under NEAR_RATIO, never a change) moves to its own as its count departs from the kind's."""
        p_kind = self.like_kind(n, span)
        return p_kind * (self.weight + n) / (self.seconds + span) + (1.0 - p_kind) * own


class KindMemory:
    """Each kind's last :data:`MEMORY` regimes: their (arrivals, seconds) and durations, and what is derived from
    them (the pooled rate, its empirical Bayes weight, mean and residual durations). See the module docstring."""

    __slots__ = ("_durations", "_counts", "_pooled", "_weight")

    def __init__(self) -> None:
        self._durations: tuple[deque[tuple[float, bool]], deque[tuple[float, bool]]] = (
            deque(maxlen=MEMORY), deque(maxlen=MEMORY))
        """(duration, censored) of each kind's last regimes."""
        self._counts: tuple[deque[tuple[int, float]], deque[tuple[int, float]]] = (
            deque(maxlen=MEMORY), deque(maxlen=MEMORY))
        """(arrivals, exposure seconds) of each kind's last regimes with any exposure."""
        self._pooled = [0.0, 0.0]
        self._weight = [PRIOR_ARRIVALS, PRIOR_ARRIVALS]
        """Weight, in arrivals, of each kind's pooled rate in a regime's rate (:meth:`remember`)."""

    def remember(self, kind: int, duration: float, censored: bool, arrivals: int, exposure: float) -> None:
        """A regime of ``kind`` ended: its duration remembered, and its rate (``arrivals`` over ``exposure`` seconds)
        if it had any exposure; the kind's pooled rate (half an arrival added: never 0 after a silent regime) and its
        weight recomputed here, once per change, since the law reads the pooled rate at every arrival."""
        self._durations[kind].append((duration, censored))
        if exposure <= 0:
            return
        self._counts[kind].append((max(arrivals, 0), exposure))
        counts = self._counts[kind]
        total_n, total_s = sum(n for n, _ in counts), sum(s for _, s in counts)
        pooled = self._pooled[kind] = (total_n + 0.5) / total_s
        self._weight[kind] = _prior_weight(counts, pooled, total_n, total_s)

    # ------------------------------------------------------------------ rates

    def has_rate(self, kind: int) -> bool:
        """Whether a regime of ``kind`` with any exposure has been remembered (its rate is learned)."""
        return bool(self._counts[kind])

    def pooled(self, kind: int) -> float:
        """The kind's rate over its remembered regimes (0 before :meth:`has_rate`)."""
        return self._pooled[kind]

    def prior_weight(self, kind: int) -> float:
        """Weight, in arrivals, of the kind's pooled rate (:func:`_prior_weight`; PRIOR_ARRIVALS until two regimes)."""
        return self._weight[kind]

    def totals(self, kind: int) -> tuple[int, float]:
        """(arrivals, seconds) summed over the kind's remembered regimes, for a rate pooled with a current one."""
        counts = self._counts[kind]
        return sum(c for c, _ in counts), sum(s for _, s in counts)

    def mixture(self, kind: int | None) -> KindMixture | None:
        """The two priors of a regime of ``kind`` (:class:`KindMixture`); None where they are one (no kind, the kind
        not learned, or its weight no more than PRIOR_ARRIVALS): the regime's own rate alone."""
        if kind is None or not self._counts[kind] or self._weight[kind] <= PRIOR_ARRIVALS:
            return None
        weight, pooled = self._weight[kind], self._pooled[kind]
        return KindMixture(weight, weight / pooled, PRIOR_ARRIVALS / pooled, math.lgamma(weight))

    # ------------------------------------------------------------------ durations

    def has_duration(self, kind: int) -> bool:
        """Whether a regime of ``kind`` has been remembered at all (censored or not)."""
        return bool(self._durations[kind])

    def shortest_complete(self, kind: int) -> float | None:
        """The kind's shortest complete (not censored) duration remembered; None while there is none."""
        complete = [d for d, censored in self._durations[kind] if not censored]
        return min(complete) if complete else None

    def _samples(self, kind: int) -> list[float]:
        """The kind's complete durations, or its censored ones (lower bounds) while none is complete."""
        seen = self._durations[kind]
        complete = [d for d, censored in seen if not censored]
        return complete if complete else [d for d, _ in seen]

    def mean_duration(self, kind: int) -> float:
        """The kind's mean duration, else the other kind's (no evidence of asymmetry), else 0."""
        samples = self._samples(kind) or self._samples(1 - kind)
        return sum(samples) / len(samples) if samples else 0.0

    def residual(self, kind: int, age: float) -> float:
        """Empirical mean residual life of a regime of ``kind`` at ``age``: ``mean(d - age for d > age)``."""
        samples = self._samples(kind) or self._samples(1 - kind)
        longer = [d - age for d in samples if d > age]
        return sum(longer) / len(longer) if longer else 0.0
