"""Workloads of the load simulator: a YAML description, validated, turned into seeded requests.

Why a declared workload instead of ad-hoc loops in a benchmark: the scheduler's policies (WRR
queue classes §6, WFQ fairness §5.3, profile selection §8) are tuned "through load experiments"
(§6), and an experiment is only worth something if it can be re-run exactly and read by someone
else. So a workload is a small ``calculet-loadsim/v1`` YAML file; unknown keys and bad values are
errors naming the field (``tenants[1].prompt_tokens.sigma: ...``), and
:func:`generate_requests` is a pure function of (workload, duration, load scale, seed).

Randomness is split into named streams (arrivals, tenant choice, one per tenant and attribute,
one per storm), each seeded from ``(seed, crc32(name))``. Two consequences are deliberate:

* adding a tenant or a storm does not reshuffle the other tenants' requests;
* with time-rescaled arrivals (see :mod:`calculet.loadsim.arrivals`) a higher ``load_scale``
  replays the same background requests compressed in time, so a sweep over offered load
  compares like with like.

Scripted long-prefill storms (§6 "a single 40K prefill will still cause head-of-line
blocking") are *not* scaled by ``load_scale``: they are a fixed event placed at a known moment.

The distributions a workload draws from are :mod:`calculet.loadsim.distributions`.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import numpy as np
from pydantic import Field, Strict, ValidationError, field_validator, model_validator

from calculet.config import LabelName, PosFloat, PosInt, TenantConfig
from calculet.config.base import FieldProblem
from calculet.errors import ConfigError
from calculet.loadsim.arrivals import on_off_arrivals, poisson_arrivals, spread_arrivals
from calculet.loadsim.distributions import (EmpiricalDist, FixedDist, LogNormalDist, NonNegFloat, TokenDist,
                                            ValueDist, WorkloadModel, sample_tokens)
from calculet.yamlfile import read_yaml_file

__all__ = [
    "SCHEMA_ID", "PRESETS_DIR", "PromptClass", "SimRequest", "OfferedLoad", "WorkloadError",
    "PoissonArrivals", "OnOffArrivals",
    "CancellationSpec", "PromptClasses", "TenantSpec", "StormSpec", "Workload",
    "prompt_class", "parse_workload", "load_workload", "preset_names", "load_preset",
    "generate_requests", "offered_load",
]

SCHEMA_ID = "calculet-loadsim/v1"
PRESETS_DIR = Path(__file__).resolve().parent / "presets"

PromptClass = Literal["short", "medium", "long"]

Probability = Annotated[float, Strict(), Field(ge=0, le=1)]


class WorkloadError(ConfigError):
    """A workload file or mapping was rejected; the message names every offending field path."""

    code = "workload_error"


# --------------------------------------------------------------------------------------------
# arrivals, tenants, storms
# --------------------------------------------------------------------------------------------


class PoissonArrivals(WorkloadModel):
    """Steady traffic: independent arrivals at ``rate_per_s`` (before ``load_scale``)."""

    kind: Literal["poisson"]
    rate_per_s: PosFloat

    def mean_rate(self) -> float:
        return float(self.rate_per_s)

    def times(self, rng: np.random.Generator, duration_s: float, load_scale: float) -> np.ndarray:
        return poisson_arrivals(rng, self.rate_per_s * load_scale, duration_s)


class OnOffArrivals(WorkloadModel):
    """Bursty traffic: ``on_rate_per_s`` for ``on_s`` seconds, ``off_rate_per_s`` for ``off_s``, repeated."""

    kind: Literal["on_off"]
    on_rate_per_s: PosFloat
    off_rate_per_s: NonNegFloat = 0.0
    on_s: PosFloat
    off_s: PosFloat

    def mean_rate(self) -> float:
        return (self.on_rate_per_s * self.on_s + self.off_rate_per_s * self.off_s) / (self.on_s + self.off_s)

    def times(self, rng: np.random.Generator, duration_s: float, load_scale: float) -> np.ndarray:
        return on_off_arrivals(rng, self.on_rate_per_s * load_scale, self.off_rate_per_s * load_scale,
                               self.on_s, self.off_s, duration_s)


Arrivals = Annotated[Union[PoissonArrivals, OnOffArrivals], Field(discriminator="kind")]


class CancellationSpec(WorkloadModel):
    """Each request is cancelled with ``probability``, ``delay_s`` seconds after it arrives."""

    probability: Probability
    delay_s: ValueDist


class PromptClasses(WorkloadModel):
    """§6 queue-class thresholds: short ≤ ``short_max_tokens`` < medium ≤ ``medium_max_tokens`` < long."""

    short_max_tokens: PosInt = 512
    medium_max_tokens: PosInt = 4096

    @model_validator(mode="after")
    def _ordered(self) -> PromptClasses:
        if self.short_max_tokens >= self.medium_max_tokens:
            raise FieldProblem("medium_max_tokens",
                                f"must be > short_max_tokens ({self.short_max_tokens}); §6 classes must not overlap")
        return self


class TenantSpec(WorkloadModel):
    """A tenant: its §5.3 weight and limits (for the scheduler) and its share of the traffic.

    ``share`` is relative: shares are normalised over all tenants, so ``5, 1, 1`` means 5/7,
    1/7, 1/7 of the arrivals. Length, deadline and cancellation settings default to the
    workload's; set them here to override (``deadline_ms: null`` explicitly means no deadline).
    """

    name: LabelName
    weight: PosFloat = 1.0
    share: PosFloat = 1.0
    max_active_sequences: PosInt | None = None
    max_waiting_tokens: PosInt | None = None
    qps: PosFloat | None = None
    prompt_tokens: TokenDist | None = None
    max_new_tokens: TokenDist | None = None
    deadline_ms: ValueDist | None = None
    cancellation: CancellationSpec | None = None


class StormSpec(WorkloadModel):
    """A long-prefill storm (§6): ``count`` long prompts from ``start_s``, evenly over ``spread_s``.

    ``tenant`` null: each storm request's tenant is drawn by traffic share. Deadlines and
    cancellations follow that tenant's settings.
    """

    start_s: NonNegFloat
    count: PosInt
    prompt_tokens: TokenDist
    max_new_tokens: TokenDist = FixedDist(value=64)
    spread_s: NonNegFloat = 0.0
    tenant: LabelName | None = None


def _default_tenants() -> tuple[TenantSpec, ...]:
    return (TenantSpec(name="default"),)


class Workload(WorkloadModel):
    """A ``calculet-loadsim/v1`` workload."""

    schema_id: Annotated[str, Strict()] = Field(alias="schema")
    name: LabelName
    description: str = ""
    seed: Annotated[int, Strict(), Field(ge=0)] = 0
    duration_s: PosFloat = 300.0
    context_limit_tokens: PosInt = 40960
    prompt_classes: PromptClasses = PromptClasses()
    arrivals: Arrivals
    prompt_tokens: TokenDist
    max_new_tokens: TokenDist
    deadline_ms: ValueDist | None = None
    cancellation: CancellationSpec | None = None
    tenants: tuple[TenantSpec, ...] = Field(default_factory=_default_tenants, min_length=1)
    storms: tuple[StormSpec, ...] = ()

    @field_validator("schema_id")
    @classmethod
    def _known_schema(cls, value: str) -> str:
        if value != SCHEMA_ID:
            raise ValueError(f"unknown schema {value!r}; this loader reads {SCHEMA_ID!r}")
        return value

    @model_validator(mode="after")
    def _cross_fields(self) -> Workload:
        seen: dict[str, int] = {}
        for i, tenant in enumerate(self.tenants):
            if tenant.name in seen:
                raise FieldProblem(f"tenants[{i}].name",
                                    f"duplicate tenant name {tenant.name!r} (also tenants[{seen[tenant.name]}])")
            seen[tenant.name] = i
        for i, storm in enumerate(self.storms):
            if storm.tenant is not None and storm.tenant not in seen:
                raise FieldProblem(f"storms[{i}].tenant",
                                    f"unknown tenant {storm.tenant!r} (tenants: {', '.join(seen)})")
        # Every request must fit the context window with at least one output token; checking the
        # distributions' upper bounds here turns a silent clip into an error at load time.
        limit = self.context_limit_tokens
        prompt_sources: list[tuple[str, Any]] = [("prompt_tokens", self.prompt_tokens)]
        prompt_sources += [(f"tenants[{i}].prompt_tokens", t.prompt_tokens)
                           for i, t in enumerate(self.tenants) if t.prompt_tokens is not None]
        prompt_sources += [(f"storms[{i}].prompt_tokens", s.prompt_tokens) for i, s in enumerate(self.storms)]
        for path, dist in prompt_sources:
            if dist.upper_bound() >= limit:
                raise FieldProblem(path, f"prompts up to {dist.upper_bound():g} tokens do not fit "
                                          f"context_limit_tokens {limit} with at least one output token")
        return self

    # --- effective per-tenant settings --------------------------------------------------------

    def tenant(self, name: str) -> TenantSpec:
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    def prompt_tokens_for(self, tenant: TenantSpec) -> FixedDist | LogNormalDist | EmpiricalDist:
        return tenant.prompt_tokens if tenant.prompt_tokens is not None else self.prompt_tokens

    def max_new_tokens_for(self, tenant: TenantSpec) -> FixedDist | LogNormalDist | EmpiricalDist:
        return tenant.max_new_tokens if tenant.max_new_tokens is not None else self.max_new_tokens

    def deadline_for(self, tenant: TenantSpec) -> FixedDist | LogNormalDist | EmpiricalDist | None:
        return tenant.deadline_ms if "deadline_ms" in tenant.model_fields_set else self.deadline_ms

    def cancellation_for(self, tenant: TenantSpec) -> CancellationSpec | None:
        return tenant.cancellation if "cancellation" in tenant.model_fields_set else self.cancellation

    def shares(self) -> dict[str, float]:
        """Normalised traffic shares by tenant name."""
        total = sum(t.share for t in self.tenants)
        return {t.name: t.share / total for t in self.tenants}

    def weights(self) -> dict[str, float]:
        return {t.name: float(t.weight) for t in self.tenants}

    def tenant_configs(self) -> tuple[TenantConfig, ...]:
        """The tenants as scheduler ``TenantConfig``s (weights and limits from this file, R5.3.7).

        Each gets a synthetic, deterministic API-key hash (sha256 of ``loadsim-tenant:<name>``)
        because a scheduler config allows at most one keyless tenant; the simulator submits
        requests in-process and never presents a key.
        """
        return tuple(
            TenantConfig(name=t.name, weight=float(t.weight),
                         api_key_sha256=hashlib.sha256(f"loadsim-tenant:{t.name}".encode()).hexdigest(),
                         max_active_sequences=t.max_active_sequences,
                         max_waiting_tokens=t.max_waiting_tokens, qps=t.qps)
            for t in self.tenants)


# --------------------------------------------------------------------------------------------
# requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One offered request. Times in seconds of virtual time from the start of the run.

    ``deadline_ms`` and ``cancel_after_s`` are relative to ``arrival_s`` (``None``: none).
    ``klass`` is the §6 prompt class under the workload's thresholds.
    """

    arrival_s: float
    tenant: str
    prompt_tokens: int
    max_new_tokens: int
    deadline_ms: int | None
    cancel_after_s: float | None
    klass: PromptClass


def prompt_class(prompt_tokens: int, short_max_tokens: int = 512, medium_max_tokens: int = 4096) -> PromptClass:
    """§6 queue class: ``short`` ≤ 512 < ``medium`` ≤ 4096 < ``long`` (thresholds configurable)."""
    if prompt_tokens <= short_max_tokens:
        return "short"
    if prompt_tokens <= medium_max_tokens:
        return "medium"
    return "long"


def _rng(seed: int, stream: str) -> np.random.Generator:
    """An independent generator per named stream (crc32, not ``hash``: stable across processes)."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(stream.encode())]))


def _deadlines_and_cancels(workload: Workload, tenant: TenantSpec, rng: np.random.Generator,
                           n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-request deadline (ms, NaN = none) and cancel delay (s, NaN = none).

    Every request draws from every stream whether or not it ends up cancelled, so that changing a
    probability does not shift the other requests' draws.
    """
    deadline = workload.deadline_for(tenant)
    deadlines = (np.full(n, np.nan) if deadline is None
                 else np.maximum(np.rint(deadline.sample(rng, n)), 1.0))
    cancel = workload.cancellation_for(tenant)
    if cancel is None:
        return deadlines, np.full(n, np.nan)
    hit = rng.random(n) < cancel.probability
    delays = cancel.delay_s.sample(rng, n)
    return deadlines, np.where(hit, delays, np.nan)


_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""Per-request arrays: arrival time, tenant index, prompt tokens, output tokens, deadline ms, cancel delay s."""


def generate_requests(workload: Workload, duration_s: float | None = None, load_scale: float = 1.0,
                      *, seed: int | None = None) -> tuple[SimRequest, ...]:
    """The offered requests of one run, sorted by arrival (ties keep generation order).

    ``duration_s`` defaults to the workload's; arrivals fall in ``[0, duration_s)``.
    ``load_scale`` multiplies the background arrival rates (not storms). ``seed`` overrides the
    workload's. Same arguments → identical tuple. ``max_new_tokens`` is trimmed so that prompt +
    output fits ``context_limit_tokens`` (prompts always fit: checked at load).
    """
    duration = workload.duration_s if duration_s is None else float(duration_s)
    if not (duration > 0 and math.isfinite(duration)):
        raise WorkloadError(f"duration_s must be finite and > 0, got {duration_s}")
    if not (load_scale > 0 and math.isfinite(load_scale)):
        raise WorkloadError(f"load_scale must be finite and > 0, got {load_scale}")
    base_seed = workload.seed if seed is None else int(seed)
    if base_seed < 0:
        raise WorkloadError(f"seed must be >= 0, got {seed}")
    names = [t.name for t in workload.tenants]
    share = np.asarray([workload.shares()[name] for name in names])
    parts = [_background(workload, base_seed, duration, load_scale, share)]
    parts += [_storm(workload, si, storm, base_seed, duration, share) for si, storm in enumerate(workload.storms)]
    t_all, o_all, p_all, out_all, d_all, c_all = (np.concatenate(column) for column in zip(*parts))
    order = np.argsort(t_all, kind="stable")
    o_all, p_all, d_all, c_all = o_all[order], p_all[order], d_all[order], c_all[order]
    limit = workload.context_limit_tokens
    m_all = np.minimum(out_all[order], limit - p_all)
    classes = workload.prompt_classes
    return tuple(
        SimRequest(
            arrival_s=float(t_all[j]), tenant=names[int(o_all[i])], prompt_tokens=int(p_all[i]),
            max_new_tokens=int(m_all[i]),
            deadline_ms=None if math.isnan(d_all[i]) else int(d_all[i]),
            cancel_after_s=None if math.isnan(c_all[i]) else float(c_all[i]),
            klass=prompt_class(int(p_all[i]), classes.short_max_tokens, classes.medium_max_tokens))
        for i, j in enumerate(order))


def _background(workload: Workload, base_seed: int, duration: float, load_scale: float,
                share: np.ndarray) -> _Columns:
    """The steady or bursty traffic: arrivals, then each tenant's lengths, deadlines and cancels."""
    times = workload.arrivals.times(_rng(base_seed, "arrivals"), duration, load_scale)
    times = times[times < duration]
    n = times.size
    owner = _rng(base_seed, "tenants").choice(len(workload.tenants), size=n, p=share)
    prompts = np.zeros(n, dtype=np.int64)
    outputs = np.zeros(n, dtype=np.int64)
    deadlines = np.full(n, np.nan)
    cancels = np.full(n, np.nan)
    for ti, tenant in enumerate(workload.tenants):
        idx = np.flatnonzero(owner == ti)
        k = idx.size
        prompts[idx] = sample_tokens(workload.prompt_tokens_for(tenant), _rng(base_seed, f"tenant/{tenant.name}/prompt"), k)
        outputs[idx] = sample_tokens(workload.max_new_tokens_for(tenant), _rng(base_seed, f"tenant/{tenant.name}/output"), k)
        deadlines[idx], cancels[idx] = _deadlines_and_cancels(
            workload, tenant, _rng(base_seed, f"tenant/{tenant.name}/deadline-cancel"), k)
    return times, owner, prompts, outputs, deadlines, cancels


def _storm(workload: Workload, si: int, storm: StormSpec, base_seed: int, duration: float,
           share: np.ndarray) -> _Columns:
    """Storm ``si``'s requests, all drawn from its own stream (tenant, deadlines, lengths)."""
    st = spread_arrivals(storm.start_s, storm.count, storm.spread_s)
    st = st[st < duration]
    k = st.size
    rng = _rng(base_seed, f"storm/{si}")
    if storm.tenant is None:
        s_owner = rng.choice(len(workload.tenants), size=k, p=share)
    else:
        s_owner = np.full(k, [t.name for t in workload.tenants].index(storm.tenant))
    s_deadlines = np.full(k, np.nan)
    s_cancels = np.full(k, np.nan)
    for ti, tenant in enumerate(workload.tenants):
        idx = np.flatnonzero(s_owner == ti)
        s_deadlines[idx], s_cancels[idx] = _deadlines_and_cancels(workload, tenant, rng, idx.size)
    prompts = sample_tokens(storm.prompt_tokens, rng, k)
    outputs = sample_tokens(storm.max_new_tokens, rng, k)
    return st, s_owner, prompts, outputs, s_deadlines, s_cancels


@dataclass(frozen=True, slots=True)
class OfferedLoad:
    """The nominal offered load of a workload (expected values, storms averaged over the run)."""

    requests_per_s: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float


def offered_load(workload: Workload, duration_s: float | None = None, load_scale: float = 1.0) -> OfferedLoad:
    """Expected requests and tokens per second — the x axis of a load sweep.

    Computed from the distributions' exact means rather than from a sample, so it does not vary
    with the seed. Ignores the trimming of outputs to the context window.
    """
    duration = workload.duration_s if duration_s is None else float(duration_s)
    rate = workload.arrivals.mean_rate() * load_scale
    shares = workload.shares()
    prompt = sum(shares[t.name] * workload.prompt_tokens_for(t).mean() for t in workload.tenants)
    output = sum(shares[t.name] * workload.max_new_tokens_for(t).mean() for t in workload.tenants)
    in_run = [(int(np.sum(spread_arrivals(s.start_s, s.count, s.spread_s) < duration)), s) for s in workload.storms]
    storm_n = sum(k for k, _ in in_run)
    storm_p = sum(k * s.prompt_tokens.mean() for k, s in in_run)
    storm_o = sum(k * s.max_new_tokens.mean() for k, s in in_run)
    return OfferedLoad(requests_per_s=rate + storm_n / duration,
                       prompt_tokens_per_s=rate * prompt + storm_p / duration,
                       output_tokens_per_s=rate * output + storm_o / duration)


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def parse_workload(data: object, *, source: str = "<workload>") -> Workload:
    """Validate already-parsed YAML data; every problem is reported at once, one line per field."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{source}: the top level must be a mapping, got {type(data).__name__}",
                            source=source, errors=[("", "not a mapping")])
    if data.get("schema") != SCHEMA_ID:
        message = (f"required: a workload starts with 'schema: {SCHEMA_ID}'" if "schema" not in data
                   else f"unknown schema {data['schema']!r}; this loader reads {SCHEMA_ID!r}")
        raise WorkloadError(f"{source}: schema: {message}", source=source, errors=[("schema", message)])
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e) for e in exc.errors(include_url=False)]
        lines = "\n".join(f"  {path}: {msg}" if path else f"  {msg}" for path, msg in problems)
        count = len(problems)
        raise WorkloadError(f"{source}: {count} invalid setting{'s' if count != 1 else ''}:\n{lines}",
                            source=source, errors=problems) from None


def load_workload(path: str | Path) -> Workload:
    """Load a workload YAML file; errors name the file and each offending field path."""
    file = Path(path)
    data = read_yaml_file(file, WorkloadError, "workload")
    return parse_workload(data, source=str(file))


def preset_names() -> tuple[str, ...]:
    """Names of the bundled presets (file stems in ``presets/``)."""
    return tuple(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))


def load_preset(name: str) -> Workload:
    """A bundled preset by name: ``steady``, ``bursty``, ``long-prefill-storm``, ``noisy-neighbour``."""
    names = preset_names()
    if name not in names:
        raise WorkloadError(f"unknown preset {name!r}; presets: {', '.join(names)}", source=name)
    return load_workload(PRESETS_DIR / f"{name}.yaml")


_TAGS = {"fixed", "lognormal", "empirical", "poisson", "on_off"}


def _format_error(error: Mapping[str, Any]) -> tuple[str, str]:
    """One pydantic error as ``(field path, message)``; union tags and validator names are dropped."""
    loc = [seg for seg in error["loc"]
           if not (isinstance(seg, str) and (seg in _TAGS or "[" in seg or "(" in seg))]
    kind = error["type"]
    ctx = error.get("ctx") or {}
    path = _path(loc)
    if kind == "value_error":
        problem = ctx.get("error")
        if isinstance(problem, FieldProblem):
            return (f"{path}.{problem.field}" if path else problem.field), problem.message
        return path, str(problem if problem is not None else error["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return path, "required field is missing"
    if kind == "extra_forbidden":
        return path, "unknown key"
    if kind == "union_tag_not_found":
        if path.endswith("arrivals"):
            return path, "needs 'kind: poisson' or 'kind: on_off'"
        return path, "needs 'kind' (fixed, lognormal or empirical) or a plain number"
    if kind == "union_tag_invalid":
        return path, f"unknown kind {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    return path, f"{error['msg']} (got {error.get('input')!r})"


def _path(loc: list[Any]) -> str:
    out = ""
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += ("." if out else "") + str(seg)
    return out.replace("schema_id", "schema")
