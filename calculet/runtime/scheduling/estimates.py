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

from dataclasses import dataclass

DEFAULT_SMOOTHING = 0.125
"""Weight of the newest sample (the TCP RTT estimator's 1/8): about the last 16 steps count."""


@dataclass(frozen=True)
class StepTimeStatistics:
    """§16-style view: the current estimate and how many steps it has seen."""

    decode_step_s: float
    samples: int


class StepTimer:
    """Exponentially smoothed decode step time, starting from a prior until a step is measured."""

    __slots__ = ("_estimate", "_samples", "_alpha")

    def __init__(self, prior_s: float = 0.0, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if prior_s < 0 or not 0 < smoothing <= 1:
            raise ValueError("a step timer needs prior_s >= 0 and 0 < smoothing <= 1")
        self._estimate = prior_s
        self._samples = 0
        self._alpha = smoothing

    @property
    def decode_step_s(self) -> float:
        return self._estimate

    def observe(self, seconds: float) -> float:
        """One decode job took ``seconds`` from submission to completion; returns the new estimate."""
        if seconds < 0:
            return self._estimate
        if self._samples == 0:
            self._estimate = seconds
        else:
            self._estimate += self._alpha * (seconds - self._estimate)
        self._samples += 1
        return self._estimate

    def statistics(self) -> StepTimeStatistics:
        return StepTimeStatistics(self._estimate, self._samples)


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
