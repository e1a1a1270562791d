"""What a soak runs and what it reports (§19 M0 analogue): options, memory samples, the report.

Kept apart from the run (:mod:`calculet.loadsim.soak`) because the CLI and the benchmark
report read and write these without driving an engine: the options validate up front (an
engine policy, finite hours, a bounded fault rate), and the report renders the same figures
as Markdown for people and JSON for machines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from calculet.adapters.sim import CostModel
from calculet.errors import DefinitionError
from calculet.loadsim.policies import POLICIES
from calculet.loadsim.soak_products import PRODUCTS
from calculet.loadsim.workload import Workload
from calculet.runtime.engine.goodput import GoodputStatistics

__all__ = ["MIB", "MemorySample", "SoakOptions", "SoakReport"]

MIB = 1 << 20


@dataclass(frozen=True)
class SoakOptions:
    """What a soak runs. Defaults: 24 h of ``steady`` under ping/pong B16, ~1e-5 faults per kind per job.

    :meth:`for_product` fills preset, load and fault rate from a product's defaults
    (:mod:`calculet.loadsim.soak_products`)."""

    hours: float = 24.0
    product: str = "policy"
    """``policy``: the engine policy below with a raised reset budget; ``b1-shipped``: the shipped
    ``default.yaml`` (B1, no ping/pong, the spec's reset budget; ``policy`` is then unused)."""
    preset: str = "steady"
    workload: Workload | None = None
    """Overrides ``preset`` when given."""
    load_scale: float = 1.0
    policy: str = "calculet-b16-pingpong"
    """ping/pong + B16 + §8 selection: every executor path (two engines, degrade) is exercised."""
    fault_rate: float = 1e-5
    """Per fault kind, per submitted job (six kinds)."""
    seed: int = 1
    cost: CostModel = field(default_factory=CostModel.reference)
    chunk_s: float = 3600.0
    """Requests are generated this many virtual seconds at a time (each chunk its own seed)."""
    sample_every_s: float = 1800.0
    """Virtual seconds between memory samples and lane audits."""
    warmup_fraction: float = 0.1
    """Memory growth is measured after this share of the run (caches, pools and the allocator settle)."""
    rss_growth_limit_bytes: int = 64 * MIB
    traced_growth_limit_bytes: int = 8 * MIB
    object_growth_limit: int = 20_000
    """Growth of GC-tracked objects after warm-up, per type and in total, beyond the allowances."""
    bounded_histories: Mapping[str, int] = field(default_factory=lambda: {"RequestOutcome": 65_536})
    """Object types the runtime keeps in a deliberately bounded history, with the bound: they may
    grow by up to that many. ``RequestOutcome``: the registry keeps the last ``retain_terminal``
    (65 536) ended requests' outcomes so a late ``cancel``/status call still gets an answer
    (``runtime/scheduling/registry.py``); a day at the steady preset's rate ends ~43 000 requests, so that
    history is still filling when the soak ends and grows by one object per request."""
    trace_memory: bool = False
    """Also run ``tracemalloc`` (exact Python allocations; measured ~4.5x slower here, so off by
    default: RSS and the GC object count are sampled in every run)."""
    max_resets_per_10min: int | None = None
    """Recovery budget (§15); None = the product's (``policy``: 50, so injected faults never
    exhaust it; ``b1-shipped``: the shipped 2). A value given is applied and named in the report."""
    monitors: bool = True
    """Run the declared machines' invariant monitors (counting mode) throughout."""

    def __post_init__(self) -> None:
        if not (self.hours > 0 and math.isfinite(self.hours)):
            raise DefinitionError(f"hours must be finite and > 0, got {self.hours}")
        if not (self.load_scale > 0 and math.isfinite(self.load_scale)):
            raise DefinitionError(f"load_scale must be finite and > 0, got {self.load_scale}")
        if not 0 <= self.fault_rate <= 0.05:
            raise DefinitionError(f"fault_rate must be in [0, 0.05] per kind per job, got {self.fault_rate}")
        if self.product not in PRODUCTS:
            raise DefinitionError(f"unknown soak product {self.product!r}; choose from: {', '.join(PRODUCTS)}")
        if self.policy not in POLICIES or POLICIES[self.policy].kind != "engine":
            engines = [n for n, p in POLICIES.items() if p.kind == "engine"]
            raise DefinitionError(f"soak policy must be an engine policy ({', '.join(engines)}), got {self.policy!r}")
        if self.chunk_s <= 0 or self.sample_every_s <= 0:
            raise DefinitionError("chunk_s and sample_every_s must be > 0")
        if self.max_resets_per_10min is not None and not 0 <= self.max_resets_per_10min <= 1000:
            raise DefinitionError(f"max_resets_per_10min must be in [0, 1000], got {self.max_resets_per_10min}")

    @classmethod
    def for_product(cls, product: str, *, preset: str | None = None, load_scale: float | None = None,
                    fault_rate: float | None = None, **given: Any) -> SoakOptions:
        """Options for ``product``: preset, load and fault rate default to the product's."""
        if product not in PRODUCTS:
            raise DefinitionError(f"unknown soak product {product!r}; choose from: {', '.join(PRODUCTS)}")
        p = PRODUCTS[product]
        return cls(product=product, preset=p.preset if preset is None else preset,
                   load_scale=p.load_scale if load_scale is None else load_scale,
                   fault_rate=p.fault_rate if fault_rate is None else fault_rate, **given)


@dataclass(frozen=True)
class MemorySample:
    virtual_s: float
    wall_s: float
    rss_bytes: int
    traced_bytes: int | None
    objects: int
    """Objects tracked by the garbage collector: a leak of Python objects shows here exactly,
    at a fraction of tracemalloc's cost (one ``gc.get_objects()`` per sample)."""


@dataclass(frozen=True)
class SoakReport:
    """The soak's figures and every violation found (empty: the run passed)."""

    options: SoakOptions
    virtual_s: float
    wall_s: float
    submitted: int
    outcomes: Mapping[str, int]
    tokens: int
    injected: Mapping[str, int]
    resets: int
    restarts: int
    degrade: str
    lanes: int
    audits: int
    quarantines: int
    """Device sequences quarantined by the guard (their job failed or did not check out)."""
    monitor_checks: int
    memory: tuple[MemorySample, ...]
    rss_growth_bytes: int
    traced_growth_bytes: int | None
    object_growth: int
    type_growth: Mapping[str, int]
    """Largest per-type growth of GC-tracked objects from the end of the warm-up to the end."""
    bounded_growth: int
    """Growth of the object types in ``options.bounded_histories`` (each capped at its bound)."""
    violations: tuple[str, ...]
    label: str = ""
    """What ran: the policy, or the product's configuration (``b1-shipped (default.yaml)``)."""
    reset_budget: int = 0
    budget_note: str = ""
    """``shipped``, ``raised for the soak`` or ``changed from the shipped N``."""
    peak_resets_in_window: int = 0
    """Most resets + restarts in any sliding 10 minutes (the budget's window)."""
    budget_refusals: int = 0
    recovery_state: str = "healthy"
    goodput: GoodputStatistics | None = None
    """The engine's count (§16, issue #13): on time, late, device work and what was wasted."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def speedup(self) -> float:
        return self.virtual_s / self.wall_s if self.wall_s > 0 else math.inf

    def to_json(self, command_line: str = "") -> dict[str, object]:
        """The headline figures, machine-readable (``soak.json``)."""
        o = self.options
        policy = o.policy if o.product == "policy" else None  # b1-shipped runs default.yaml, not --policy's default
        return {"command": command_line, "ok": self.ok, "hours": o.hours, "workload": o.workload.name if o.workload
                else o.preset, "load_scale": o.load_scale, "policy": policy, "fault_rate": o.fault_rate,
                "virtual_s": self.virtual_s, "wall_s": round(self.wall_s, 3), "speedup": round(self.speedup, 1),
                "submitted": self.submitted, "outcomes": dict(self.outcomes), "tokens": self.tokens,
                "injected": dict(self.injected), "resets": self.resets, "restarts": self.restarts,
                "quarantines": self.quarantines, "monitor_checks": self.monitor_checks,
                "rss_growth_bytes": self.rss_growth_bytes, "object_growth": self.object_growth,
                "bounded_growth": self.bounded_growth, "product": o.product, "configuration": self.label,
                "lanes": self.lanes, "reset_budget_per_10min": self.reset_budget, "reset_budget_source": self.budget_note,
                "peak_resets_in_10min": self.peak_resets_in_window, "budget_refusals": self.budget_refusals,
                "recovery_state": self.recovery_state, "goodput": self.goodput_json(),
                "violations": list(self.violations)}

    @property
    def on_time_fraction(self) -> float:
        """On-time completions as a share of the submitted requests."""
        return self.goodput.goodput / self.submitted if self.goodput and self.submitted else 0.0

    def goodput_json(self) -> dict[str, object] | None:
        g = self.goodput
        if g is None:
            return None
        cancelled = self.outcomes.get("cancelled", 0)
        return {"on_time": g.goodput, "late": sum(g.late.values()), "on_time_by_tenant": dict(sorted(g.on_time.items())),
                "goodput_per_s": round(g.goodput / self.virtual_s, 6) if self.virtual_s > 0 else 0.0,
                "on_time_fraction": round(self.on_time_fraction, 6),
                "on_time_fraction_not_cancelled": round(g.goodput / (self.submitted - cancelled), 6)
                if self.submitted > cancelled else 0.0,
                "computed_tokens": dict(g.computed_tokens),
                "wasted_tokens": {f"{phase}/{reason}": n for (phase, reason), n in sorted(g.wasted_tokens.items())},
                "device_seconds": round(g.device_seconds, 3),
                "wasted_device_seconds": {k: round(v, 3) for k, v in sorted(g.wasted_device_seconds.items())},
                "wasted_share": round(g.wasted_share, 6)}


    def _goodput_lines(self) -> list[str]:
        g = self.goodput_json()
        if g is None:
            return ["- goodput: not counted by this engine"]
        return [f"- goodput: {g['on_time']} requests completed on time ({g['goodput_per_s']:.4f}/s), on-time fraction "
                f"{g['on_time_fraction']:.1%} of submitted ({g['on_time_fraction_not_cancelled']:.1%} of those not "
                f"cancelled), late completions {g['late']}; wasted device work {g['wasted_share']:.2%} of "
                f"{g['device_seconds']:.0f} device s ({_counts(g['wasted_device_seconds']) or 'none'} s; tokens "
                f"{_counts(g['wasted_tokens']) or 'none'}; the work lost in a reset is not counted)"]  # type: ignore[arg-type]

    def markdown(self, command_line: str = "") -> str:
        """A short Markdown report (what ``python -m calculet.bench soak --out`` writes)."""
        o = self.options
        lines = ["# Calculet soak (virtual time)", ""]
        if command_line:
            lines += ["Command line:", "", "```", command_line, "```", ""]
        lines += [f"- result: **{'PASS' if self.ok else 'FAIL'}**",
                  *self._goodput_lines(),
                  f"- virtual time {self.virtual_s / 3600:.2f} h in {self.wall_s / 60:.1f} min wall "
                  f"({self.speedup:.0f}x real time)",
                  f"- workload `{o.workload.name if o.workload else o.preset}` at load {o.load_scale:g}, policy "
                  f"`{self.label or o.policy}`, {self.lanes} KV lanes, cost model {_cost_text(o.cost)}",
                  f"- product `{o.product}`: reset budget {self.reset_budget} per 10 min "
                  f"({self.budget_note or 'given'}); most resets + restarts in any 10 min "
                  f"{self.peak_resets_in_window}; budget refusals {self.budget_refusals}; recovery ended "
                  f"{self.recovery_state}",
                  f"- faults: rate {o.fault_rate:g} per kind per job; injected {_counts(self.injected) or 'none'}; "
                  f"device resets {self.resets}, restarts {self.restarts}; ping/pong degrade: {self.degrade or 'none'}",
                  f"- requests submitted {self.submitted}; outcomes {_counts(self.outcomes)}; tokens delivered "
                  f"{self.tokens}",
                  f"- lane audits {self.audits}; device sequences quarantined after a failed job "
                  f"{self.quarantines} (a use before a free or reset is a violation); invariant monitor checks "
                  f"{self.monitor_checks}",
                  f"- memory after warm-up ({o.warmup_fraction:.0%} of the run): RSS "
                  f"{self.rss_growth_bytes / MIB:+.1f} MiB (limit {o.rss_growth_limit_bytes / MIB:.0f} MiB); "
                  f"GC-tracked objects {self.object_growth:+d}, of which bounded histories "
                  f"{self.bounded_growth:+d} (allowed: {_counts(dict(o.bounded_histories))}), limit "
                  f"{o.object_growth_limit} beyond those; largest growth by type: "
                  f"{_counts(self.type_growth) or 'none'}"
                  + ("" if self.traced_growth_bytes is None else
                     f"; tracemalloc {self.traced_growth_bytes / MIB:+.2f} MiB "
                     f"(limit {o.traced_growth_limit_bytes / MIB:.0f} MiB)"), ""]
        if self.violations:
            lines += ["## Violations", ""] + [f"- {v}" for v in self.violations[:200]] + [""]
        lines += ["## Memory samples", "", "| virtual h | wall s | RSS MiB | GC objects | traced MiB |",
                  "|---|---|---|---|---|"]
        lines += [f"| {m.virtual_s / 3600:.2f} | {m.wall_s:.0f} | {m.rss_bytes / MIB:.1f} | {m.objects} | "
                  f"{'—' if m.traced_bytes is None else f'{m.traced_bytes / MIB:.2f}'} |" for m in self.memory]
        return "\n".join(lines) + "\n"


def _counts(mapping: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in mapping.items())


def _cost_text(cost: CostModel) -> str:
    return (f"(prefill {cost.prefill_fixed_s * 1e3:g} ms + {cost.prefill_per_token_s * 1e3:g} ms/token, decode "
            f"{cost.decode_fixed_s * 1e3:g} ms + {cost.decode_per_lane_s * 1e3:g} ms/lane, ping/pong overlap "
            f"{cost.pingpong_overlap:g})")
