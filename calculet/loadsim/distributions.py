"""The distributions a workload draws lengths, deadlines and delays from (``calculet-loadsim/v1``).

Why declared distributions instead of code: a load experiment (§6 "tuned through load
experiments") is only worth something if it can be re-run exactly and read by someone else,
so the shape of the traffic is data — a fixed value, a clipped lognormal given by its median,
or an empirical mix — validated like the rest of the file. Each knows its exact mean (the x
axis of a load sweep, :func:`~calculet.loadsim.workload.offered_load`) and its upper bound
(checked against the context window at load time). A bare number in YAML is a fixed value.

:class:`WorkloadModel` is the base of every part of a workload file: unknown keys are errors
and a loaded workload is immutable.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator

from calculet.config import PosFloat
from calculet.config.base import FieldProblem

__all__ = [
    "Distribution", "EmpiricalDist", "FixedDist", "LogNormalDist", "NonNegFloat", "TokenDist", "ValueDist",
    "WorkloadModel", "sample_tokens",
]

NonNegFloat = Annotated[float, Strict(), Field(ge=0)]


class WorkloadModel(BaseModel):
    """Unknown keys are errors (a typo must not silently fall back to a default); immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# --------------------------------------------------------------------------------------------
# distributions
# --------------------------------------------------------------------------------------------


class FixedDist(WorkloadModel):
    """Always ``value``. A bare number in YAML means this (``max_new_tokens: 128``)."""

    kind: Literal["fixed"] = "fixed"
    value: PosFloat

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))

    def upper_bound(self) -> float:
        return float(self.value)

    def mean(self) -> float:
        return float(self.value)


class LogNormalDist(WorkloadModel):
    """``median · exp(sigma · Z)`` clipped to ``[min, max]``.

    Median and sigma rather than the underlying normal's μ/σ because a median is what people
    know about their prompts ("typical prompt ~300 tokens"); the clip keeps the heavy tail from
    producing prompts the model cannot take.
    """

    kind: Literal["lognormal"]
    median: PosFloat
    sigma: Annotated[float, Strict(), Field(ge=0, le=4)]
    min: PosFloat
    max: PosFloat

    @model_validator(mode="after")
    def _ordered(self) -> LogNormalDist:
        if self.min > self.max:
            raise FieldProblem("min", f"min {self.min} > max {self.max}")
        if not self.min <= self.median <= self.max:
            raise FieldProblem("median", f"median {self.median} is outside [min, max] = [{self.min}, {self.max}]")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = self.median * np.exp(self.sigma * rng.standard_normal(n))
        return np.clip(raw, self.min, self.max)

    def upper_bound(self) -> float:
        return float(self.max)

    def mean(self) -> float:
        """Exact mean of the clipped lognormal (used for the nominal offered load)."""
        lo, hi, s = float(self.min), float(self.max), float(self.sigma)
        if s == 0:
            return float(self.median)
        mu = math.log(self.median)

        def phi(x: float) -> float:
            return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

        z_lo, z_hi = (math.log(lo) - mu) / s, (math.log(hi) - mu) / s
        body = math.exp(mu + s * s / 2) * (phi(z_hi - s) - phi(z_lo - s))
        return lo * phi(z_lo) + body + hi * (1.0 - phi(z_hi))


class EmpiricalDist(WorkloadModel):
    """Observed values with weights (equal weights when omitted) — e.g. a measured prompt mix."""

    kind: Literal["empirical"]
    values: tuple[PosFloat, ...] = Field(min_length=1)
    weights: tuple[NonNegFloat, ...] | None = None

    @model_validator(mode="after")
    def _weights_match(self) -> EmpiricalDist:
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise FieldProblem("weights", f"{len(self.weights)} weights for {len(self.values)} values")
            if sum(self.weights) <= 0:
                raise FieldProblem("weights", "weights must not all be 0")
        return self

    def _probabilities(self) -> np.ndarray:
        w = np.ones(len(self.values)) if self.weights is None else np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.float64), size=n, p=self._probabilities())

    def upper_bound(self) -> float:
        return float(max(self.values))

    def mean(self) -> float:
        return float(np.dot(np.asarray(self.values, dtype=np.float64), self._probabilities()))


def _scalar_as_fixed(value: object) -> object:
    """``128`` → ``{kind: fixed, value: 128}``: the common case stays one token long in YAML."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


def _integral_tokens(dist: Distribution) -> Distribution:
    """Token counts are whole numbers ≥ 1; a bound of 0.5 tokens is a mistake worth reporting."""
    if isinstance(dist, FixedDist):
        bounds = {"value": dist.value}
    elif isinstance(dist, LogNormalDist):
        bounds = {"min": dist.min, "max": dist.max}
    else:
        bounds = {f"values[{i}]": v for i, v in enumerate(dist.values)}
    for name, v in bounds.items():
        if v != int(v) or v < 1:
            raise ValueError(f"{name} must be a whole number of tokens >= 1, got {v}")
    return dist


Distribution = Annotated[Union[FixedDist, LogNormalDist, EmpiricalDist], Field(discriminator="kind")]
"""A positive real distribution: seconds, milliseconds."""
ValueDist = Annotated[Distribution, BeforeValidator(_scalar_as_fixed)]
TokenDist = Annotated[Distribution, BeforeValidator(_scalar_as_fixed), AfterValidator(_integral_tokens)]
"""A distribution of token counts (integers ≥ 1)."""


def sample_tokens(dist: FixedDist | LogNormalDist | EmpiricalDist, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` whole token counts >= 1 drawn from ``dist``."""
    return np.maximum(np.rint(dist.sample(rng, n)), 1).astype(np.int64)
