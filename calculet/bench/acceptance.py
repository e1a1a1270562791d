"""The issue's acceptance figures for the bundled presets, and the notes that explain a miss.

Why this exists: a benchmark reports figures, it does not pass or fail (DESIGN principle 10);
but the bundled presets each carry a target (saturation throughput against the device-bound
limit and the B1 serial baseline; short-prompt latency under a long-prefill storm, §6; Jain's
fairness with a noisy neighbour, §5.3) and the report says, for each, whether it was met and
what the figures behind a miss are. Other workloads have none.

Issue #13 adds, for ``calculet-b1-shared`` (B1 as the service ships it): Jain ≥ 0.9 with the
well-behaved tenants' P99 TTFT ≤ 2× their value without the noisy tenant; every long prompt of a
storm either completed or refused (429) before device time — none admitted and then expired;
and on ``steady`` and ``bursty`` the admission-time finish estimate's P90 relative error ≤ 25 %.
"""

from __future__ import annotations

import math
from collections import Counter

from calculet.bench.figures import decode_efficiency, limits_text, nominal_loads, ratio_text
from calculet.bench.goodput_section import estimator_json
from calculet.bench.storm import storm_capacity_text, storm_figures
from calculet.bench.sweep import SweepResult
from calculet.bench.tenants import per_tenant

__all__ = ["Row", "acceptance", "acceptance_table"]

TARGET_DEVICE_RATIO = 0.9
TARGET_SERIAL_RATIO = 3.0
TARGET_STORM_TTFT_RATIO = 2.0
TARGET_JAIN = 0.95
TARGET_SPEEDUP = 50.0
SHARED_B1 = "calculet-b1-shared"
"""The issue #13 rows' policy: B1 as the service ships it (loadsim.policies)."""
TARGET_SHARED_JAIN = 0.9
TARGET_TENANT_TTFT_RATIO = 2.0
TARGET_ESTIMATE_P90 = 0.25
ESTIMATOR_PRESETS = ("steady", "bursty")

Row = tuple[str, str, bool]
"""(figure, value, met)."""


def acceptance(result: SweepResult) -> tuple[list[Row], list[str]]:
    """The issue's acceptance figures for the bundled presets — (figure, value, met) rows — and
    notes with the figures that explain a miss. Other workloads have none."""
    name = result.workload.name
    rows: list[Row] = []
    notes: list[str] = []
    if name == "steady":
        _steady(result, rows, notes)
    elif name == "long-prefill-storm" and result.reference_label == "no storm":
        _storm(result, rows, notes)
        rows += storm_outcome_rows(result)
    elif name == "noisy-neighbour":
        _noisy_neighbour(result, rows, notes)
        rows += shared_fairness_rows(result)
    if name in ESTIMATOR_PRESETS:
        rows += estimator_rows(estimator_json(result))
    return rows, notes


def _steady(result: SweepResult, rows: list[Row], notes: list[str]) -> None:
    """Saturation throughput against both limits and the B1 serial baseline; simulation speed."""
    top = max(result.loads)
    serial = result.cell("b1-serial-fcfs", top)
    for policy in ("calculet-b16", "calculet-b16-pingpong"):
        c = result.cell(policy, top)
        if c is None:
            continue
        tps = c.summary.output_tokens_per_s
        ratio = tps / result.device_bound
        rows.append((f"{policy} at load {top:g} (saturation): ≥ {TARGET_DEVICE_RATIO:g} × device-bound limit",
                     f"{tps:.1f} tok/s = {ratio:.2f} × {result.device_bound:.0f}", ratio >= TARGET_DEVICE_RATIO))
        if c.workload_limit:
            wl = tps / c.workload_limit
            rows.append((f"{policy} at load {top:g} (saturation): ≥ {TARGET_DEVICE_RATIO:g} × workload limit "
                         "(not the issue's criterion: decode-only limit + each prefill paid once)",
                         f"{tps:.1f} tok/s = {wl:.2f} × {c.workload_limit:.0f}", wl >= TARGET_DEVICE_RATIO))
        if serial is not None and serial.summary.output_tokens_per_s > 0:
            x = tps / serial.summary.output_tokens_per_s
            rows.append((f"{policy} at load {top:g}: ≥ {TARGET_SERIAL_RATIO:g} × B1 serial baseline",
                         f"{x:.1f} × ({serial.summary.output_tokens_per_s:.1f} tok/s)", x >= TARGET_SERIAL_RATIO))
        work = c.run.prefill_work_s + c.run.decode_work_s
        eff = decode_efficiency(c, result.cost)
        notes.append(f"`{policy}` at load {top:g}: prefill is {c.run.prefill_work_s / work:.0%} of the device "
                     f"work it submitted; its decode steps deliver {ratio_text(eff)} of the limit per second "
                     f"of decode work (fill {ratio_text(c.summary.fill_ratio)}).")
    notes.append(limits_text(result) + " The issue's row is judged against the decode-only limit. Every "
                 "request pays its prefill before its decode tokens, so with one job in flight no policy can "
                 "reach the decode-only limit on this workload; the workload limit charges each prefill once "
                 "and is the ceiling one engine can approach. Ping/pong can exceed either by running "
                 "prefills on the other engine at the cost model's assumed overlap (0.5) — an assumption the "
                 "hardware has not proved (§14).")
    speeds = [c.run.speedup for c in result.cells if c.policy.name == "calculet-b16"]
    if speeds:
        rows.append((f"simulation speed, calculet-b16 (slowest load): ≥ {TARGET_SPEEDUP:g}x real time",
                     f"{min(speeds):.0f}x", min(speeds) >= TARGET_SPEEDUP))


def _storm(result: SweepResult, rows: list[Row], notes: list[str]) -> None:
    """§6: short-prompt P99 TTFT under the storm vs without it; every long prompt completes."""
    for load in nominal_loads(result):
        for policy in result.policies:
            c, ref = result.cell(policy.name, load), result.cell(policy.name, load, reference=True)
            if c is None or ref is None or policy.kind != "engine":
                continue
            storm, calm, done, offered, wait = storm_figures(c, ref)
            if storm is None or not calm:
                continue
            by_class = Counter(e.klass for e in c.summary.starvation)
            ok = storm / calm <= TARGET_STORM_TTFT_RATIO and done == offered and not by_class
            rows.append((f"{policy.name} at load {load:g}: short P99 TTFT ≤ {TARGET_STORM_TTFT_RATIO:g} × "
                         "no-storm; every long prompt completes; no starvation (within a prompt class)",
                         f"{storm:.2f} s / {calm:.2f} s = {storm / calm:.2f}×; long {done}/{offered} (longest "
                         f"wait {ratio_text(wait, 0)} s); starvation "
                         f"{', '.join(f'{k} {v}' for k, v in sorted(by_class.items())) or '0'}", ok))
    chunked = {p.name: p.prefill_chunk_tokens for p in result.policies if p.prefill_chunk_tokens is not None}
    longest = int(max(storm.prompt_tokens.upper_bound() for storm in result.workload.storms))
    for policy_name, chunk in chunked.items():
        notes.append(f"`{policy_name}` runs on a package whose B1 profile declares a {chunk}-token "
                     f"incremental-prefill chunk, so the longest storm prompt ({longest} tokens) is prefilled as "
                     f"{math.ceil(longest / chunk)} jobs with other work between them. Incremental "
                     "prefill is a simulated capability CalRT 0.7.6 does not provide (§6): this shows what "
                     "chunking would buy, not what can ship.")
    notes.append(("Prompts are never chunked: the simulated package" if not chunked else
                  "Under every other policy prompts are never chunked: the simulated package they run on")
                 + " declares incremental prefill, but no profile declares a chunk size, and §6 allows "
                 "chunking only when five conditions are proven. So each long prompt holds one engine for its "
                 "whole prefill, and the long-prefill quota (1) serialises a storm's prompts in arrival order — "
                 "queued, not starved, since no later long prompt starts before them (the `long max wait` "
                 "column shows how long the last one waited). With one job in flight short requests queue "
                 "behind each long prefill; with ping/pong they run on the other engine at the cost model's "
                 "overlap rate.")
    notes.append(storm_capacity_text(result))


def _noisy_neighbour(result: SweepResult, rows: list[Row], notes: list[str]) -> None:
    """§5.3: Jain's index of weighted fairness, and the well-behaved tenants' latency."""
    noisy = result.noisy_tenant
    for load in nominal_loads(result):
        for policy in result.policies:
            c = result.cell(policy.name, load)
            if c is None or policy.kind != "engine":
                continue
            jain = c.summary.jain_fairness
            value = f"{ratio_text(jain, 3)} over {c.summary.fairness_windows} windows"
            ref = result.cell(policy.name, load, reference=True)
            if noisy and ref is not None:
                with_noisy, alone = per_tenant(c.run.requests), per_tenant(ref.run.requests)
                value += "; well-behaved P99 TTFT with / without the noisy tenant: " + ", ".join(
                    f"{t} {ratio_text(with_noisy.get(t, (0, None, 0))[1], 1)}/"
                    f"{ratio_text(alone.get(t, (0, None, 0))[1], 1)} s"
                    for t in sorted(alone) if t != noisy)
            rows.append((f"{policy.name} at load {load:g}: Jain (served / max-min fair share) ≥ {TARGET_JAIN:g}",
                         value,
                         jain is not None and jain >= TARGET_JAIN))
    notes.append("Jain's index uses Jain, Chiu and Hawe's normalisation: each tenant's tokens over its "
                 "weighted max-min fair share of the tokens delivered, where a tenant with a request waiting "
                 "for service wants more (unbounded) and one without wanted what it got; it is evaluated over "
                 "the stretches where the set of waiting tenants does not change and token-weighted "
                 "(loadsim.analysis). 1.0 = every tenant got its fair share, so well-behaved tenants asking "
                 "for less than their weight no longer pull it down; it drops when a tenant waits while "
                 "another gets more than its share. The per-tenant TTFT with and without the noisy tenant "
                 "shows the same from the latency side.")


def shared_fairness_rows(result: SweepResult) -> list[Row]:
    """Issue #13: calculet-b1-shared at the nominal load — Jain ≥ 0.9 and every well-behaved
    tenant's P99 TTFT ≤ 2× its value without the noisy tenant. Each tenant's refusals (429) with and
    without the noisy tenant are shown beside it: a TTFT is only of the requests admitted."""
    rows: list[Row] = []
    noisy = result.noisy_tenant
    for load in nominal_loads(result):
        c, ref = result.cell(SHARED_B1, load), result.cell(SHARED_B1, load, reference=True)
        if c is None or ref is None or noisy is None:
            continue
        jain = c.summary.jain_fairness
        with_noisy, alone = per_tenant(c.run.requests), per_tenant(ref.run.requests)
        ratios = {t: _ratio(with_noisy.get(t, (0, None, 0))[1], alone[t][1]) for t in sorted(alone) if t != noisy}
        ttft_ok = all(r is not None and r <= TARGET_TENANT_TTFT_RATIO for r in ratios.values())
        value = (f"Jain {ratio_text(jain, 3)}; well-behaved P99 TTFT with / without {noisy}: " + ", ".join(
            f"{t} {ratio_text(with_noisy.get(t, (0, None, 0))[1], 2)}/{ratio_text(alone[t][1], 2)} s = "
            f"{ratio_text(r)}× (429 {with_noisy.get(t, (0, None, 0))[2]} vs {alone[t][2]})"
            for t, r in ratios.items()))
        rows.append((f"{SHARED_B1} at load {load:g} (issue #13): Jain ≥ {TARGET_SHARED_JAIN:g} and well-behaved "
                     f"P99 TTFT ≤ {TARGET_TENANT_TTFT_RATIO:g} × without the noisy tenant", value,
                     jain is not None and jain >= TARGET_SHARED_JAIN and ttft_ok))
    return rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def storm_outcome_rows(result: SweepResult) -> list[Row]:
    """Issue #13: on calculet-b1-shared, every long prompt completed or was refused (429) before
    device time — none admitted and then expired (or failed)."""
    rows: list[Row] = []
    for load in result.loads:
        c = result.cell(SHARED_B1, load)
        if c is None:
            continue
        longs = [r for r in c.run.requests if r.klass == "long"]
        outcomes = Counter("completed" if r.finish_reason in ("stop", "length") else
                           "refused" if not r.admitted else f"admitted, then {r.finish_reason}" for r in longs)
        bad = sum(n for k, n in outcomes.items() if k.startswith("admitted"))
        waits = [r.finish_s - r.arrival_s for r in longs if not r.admitted and r.finish_s is not None]
        refused = f" (refused after up to {max(waits):.1f} s in the queue)" if waits else ""
        rows.append((f"{SHARED_B1} at load {load:g} (issue #13): every long prompt completes or is refused at "
                     "admission; none admitted and then expired",
                     f"{len(longs)} long: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())) + refused,
                     bad == 0))
    return rows


def estimator_rows(pooled: dict[str, dict[str, float]]) -> list[Row]:
    """Issue #13 item 2: per policy that gives an estimate, P90 relative finish error ≤ 25 %."""
    rows: list[Row] = []
    for policy, e in pooled.items():
        p90 = float(e["p90_abs"])
        over = "" if p90 <= TARGET_ESTIMATE_P90 else f" — {(p90 - TARGET_ESTIMATE_P90) * 100:.0f} points over"
        rows.append((f"{policy}, every load: admission-time finish estimate P90 relative error ≤ "
                     f"{TARGET_ESTIMATE_P90:.0%}", f"median {float(e['median_abs']):.0%}, P90 {p90:.0%} "
                     f"(n={int(e['count'])}, signed median {float(e['median_signed']):+.0%}){over}",
                     p90 <= TARGET_ESTIMATE_P90))
    return rows


def acceptance_table(rows: list[Row]) -> list[str]:
    """The Markdown table of acceptance rows (the sweep report and the results index share it)."""
    lines = ["| figure | value | |", "|---|---|---|"]
    return lines + [f"| {what} | {value} | {'met' if ok else '**missed**'} |" for what, value, ok in rows]
