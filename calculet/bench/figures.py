"""Small figures and their text, shared by every section of a sweep report.

Why this exists: the headline, the acceptance rows and the storm and tenant sections quote the
same ratios, latencies and limits; each is computed and formatted once, here, so two sections
can never disagree about a figure.
"""

from __future__ import annotations

import math

from calculet.adapters.sim.cost import CostModel
from calculet.bench.sweep import Cell, SweepResult
from calculet.loadsim.baselines import device_bound_limit

__all__ = ["decode_efficiency", "limits_text", "ms", "nominal_loads", "ratio_text"]


def ratio_text(value: float | None, digits: int = 2) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.0f}"


def nominal_loads(result: SweepResult) -> tuple[float, ...]:
    """The workload's own rate (load 1) when swept, else every load."""
    return (1.0,) if 1.0 in result.loads else result.loads


def decode_efficiency(c: Cell, cost: CostModel) -> float | None:
    """Tokens from decode steps per second of decode work, over the policy's largest-profile bound."""
    run = c.run
    if run.decode_work_s <= 0:
        return None
    decode_tokens = c.summary.output_tokens - sum(1 for r in run.requests if r.token_times_s)
    return decode_tokens / run.decode_work_s / device_bound_limit(cost, c.policy.max_profile)


def limits_text(result: SweepResult) -> str:
    """Both limits in one sentence (the headline and the acceptance notes use it)."""
    b = result.largest_profile
    limits = result.workload_limits()
    per_load = ", ".join(f"{load:g}: {v:.1f}" for load, v in sorted(limits.items())) or "—"
    return (f"Decode-only limit (the issue's device-bound limit): {result.device_bound:.1f} output tokens/s — B{b} "
            f"lanes always full, back to back, no host cost, no ping/pong overlap, no prefill. Workload limit: the "
            f"offered requests' output tokens / (Σ prefill time + Σ (output − 1) × decode_s(B{b}) / {b}) — the "
            "device never idle, every decode step full, each prefill paid once, no host cost — by load scale: "
            f"{per_load} output tokens/s.")
