"""Per-tenant service in a sweep report: tokens, latency, stalls and rejections by tenant (§5.3).

Why this exists: weighted fairness (§5.3) is a per-tenant promise, and a per-request starvation
count does not show a tenant that waits while others are served. This section puts each
tenant's service side by side, with its P99 TTFT alone (the noisy tenant removed) when the
workload has a noisy neighbour.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from calculet.bench.figures import ratio_text
from calculet.bench.sweep import SweepResult
from calculet.loadsim.analysis import SimRequestRecord, latency_stats

__all__ = ["per_tenant", "tenant_section", "tenant_stalls"]


def tenant_section(result: SweepResult) -> list[str]:
    w = result.workload
    if len(w.tenants) < 2:
        return []
    noisy = result.noisy_tenant if result.reference_label.startswith("without ") else None
    lines = ["## Per-tenant service", "",
             "Tokens delivered, tokens / weight, P99 TTFT (s), longest stall (s: the longest stretch without a "
             "token while the tenant had a request outstanding) and rejections per tenant. Jain's index (also in "
             "the policy tables) compares each tenant's tokens with its weighted max-min fair share (notes above)."]
    if noisy:
        lines[-1] += (f" `alone` = the tenant's P99 TTFT in the reference run: the same requests with `{noisy}`'s "
                      "removed.")
    header = " | ".join(f"{t.name} (w={t.weight:g}): tok, tok/w, TTFT P99{', alone' if noisy and t.name != noisy else ''}"
                        f", stall, rejected" for t in w.tenants)
    lines += ["", f"| load | policy | {header} | Jain |", "|---|---|" + "---|" * (len(w.tenants) + 1)]
    stalls: list[tuple[float, str, float, str, float]] = []
    for load in result.loads:
        for policy in result.policies:
            c = result.cell(policy.name, load)
            if c is None:
                continue
            per = per_tenant(c.run.requests)
            stall = tenant_stalls(c.run.requests)
            ref = result.cell(policy.name, load, reference=True) if noisy else None
            alone = per_tenant(ref.run.requests) if ref is not None else {}
            cells = []
            for t in w.tenants:
                tokens, ttft_p99, rejected = per.get(t.name, (0, None, 0))
                extra = ""
                if noisy and t.name != noisy:
                    extra = f", {ratio_text(alone.get(t.name, (0, None, 0))[1], 1)}"
                gap, at = stall.get(t.name, (0.0, 0.0))
                if gap >= result.starvation_threshold_s and policy.kind == "engine":
                    stalls.append((gap, policy.name, load, t.name, at))
                cells.append(f"{tokens}, {tokens / t.weight:.0f}, {ratio_text(ttft_p99, 1)}{extra}, {gap:.1f}, "
                             f"{rejected}")
            lines.append(f"| {load:g} | {policy.name} | " + " | ".join(cells) +
                         f" | {ratio_text(c.summary.jain_fairness, 3)} |")
    lines.append("")
    if stalls:
        worst = sorted(stalls, reverse=True)[:5]
        lines += [f"Engine runs where a tenant went ≥ {result.starvation_threshold_s:g} s without a token while it had "
                  "a request outstanding: " + "; ".join(f"`{p}` at load {x:g}: {t} {g:.0f} s from t={a:.0f} s"
                                                        for g, p, x, t, a in worst) + ".", ""]
    return lines


def tenant_stalls(records: Sequence[SimRequestRecord]) -> dict[str, tuple[float, float]]:
    """Per tenant, its longest stretch without a token while it had an admitted request outstanding.

    Returns ``{tenant: (gap_s, start_s)}``. Outstanding = from an admitted request's arrival to its
    finish (merged over the tenant's requests); within each such stretch the gaps between its
    start, the tenant's token instants and its end are measured. A long gap while other tenants
    are served is a per-tenant starvation the per-request starvation count does not show.
    """
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.admitted and r.finish_s is not None:
            spans[r.tenant].append((r.arrival_s, r.finish_s))
            tokens[r.tenant].extend(r.token_times_s)
    out: dict[str, tuple[float, float]] = {}
    for tenant, intervals in spans.items():
        times = sorted(tokens[tenant])
        best = (0.0, 0.0)
        merged: list[list[float]] = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        j = 0
        for a, b in merged:
            last = a
            while j < len(times) and times[j] <= b:
                if times[j] >= a:
                    if times[j] - last > best[0]:
                        best = (times[j] - last, last)
                    last = times[j]
                j += 1
            if b - last > best[0]:
                best = (b - last, last)
        out[tenant] = best
    return out


def per_tenant(records: Sequence[SimRequestRecord]) -> dict[str, tuple[int, float | None, int]]:
    tokens: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    ttft: dict[str, list[float]] = defaultdict(list)
    for r in records:
        tokens[r.tenant] += r.generated_tokens
        if not r.admitted:
            rejected[r.tenant] += 1
        if r.first_token_s is not None:
            ttft[r.tenant].append(r.first_token_s - r.arrival_s)
    names = set(tokens) | set(rejected) | set(ttft)
    return {n: (tokens[n], latency_stats(ttft.get(n, [])).p99, rejected[n]) for n in names}
