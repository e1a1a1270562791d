"""The long-prefill storm in a sweep report: short-prompt latency with and without the storm (§6).

Why this exists: without chunking (§6: five preconditions), a storm of long prompts holds an
engine for each whole prefill. The report compares each policy against the same background
requests without the storm and explains why finishing every long prompt and keeping short
prompts fast can trade against each other on one engine.
"""

from __future__ import annotations

from collections import Counter

from calculet.bench.figures import nominal_loads, ratio_text
from calculet.bench.sweep import Cell, SweepResult

__all__ = ["storm_capacity_text", "storm_figures", "storm_section"]


def storm_figures(c: Cell, ref: Cell) -> tuple[float | None, float | None, int, int, float | None]:
    """Short P99 TTFT with and without the storm, long prompts completed/offered, longest long wait."""
    storm, calm = c.summary.ttft_by_class_s["short"].p99, ref.summary.ttft_by_class_s["short"].p99
    longs = [r for r in c.run.requests if r.klass == "long"]
    done = sum(1 for r in longs if r.finish_reason in ("length", "stop"))
    waits = [((r.service_start_s if r.service_start_s is not None else r.finish_s or r.arrival_s) - r.arrival_s)
             for r in longs]
    return storm, calm, done, len(longs), (max(waits) if waits else None)


def storm_capacity_text(result: SweepResult) -> str:
    """Why the storm's two figures trade against each other: device time needed vs the deadline.

    A storm's prefill work is fixed by the cost model; finishing it before the deadline needs a
    share of the device over that window. The background traffic needs the share its no-storm
    reference run used. When the two exceed one engine, a policy chooses which figure to miss.
    """
    w, cost = result.workload, result.cost
    deadline_ms = w.deadline_ms.upper_bound() if w.deadline_ms is not None else None
    parts = []
    for storm in w.storms:
        tokens = int(storm.prompt_tokens.upper_bound())
        work = storm.count * cost.prefill_s(tokens)
        text = f"{storm.count} × {tokens} tokens = {work:.0f} s of prefill"
        if deadline_ms:
            text += f" ({work / (deadline_ms / 1000):.0%} of the device over its {deadline_ms / 1000:.0f} s deadline)"
        parts.append(text)
    need = []
    for load in nominal_loads(result):
        refs = [c for c in result.reference if c.load == load and c.min_device_s is not None]
        arrivals = [r.arrival_s for c in refs[:1] for r in c.run.requests]
        if refs and arrivals and max(arrivals) > 0:
            need.append(f"{refs[0].min_device_s / max(arrivals):.0%} at load {load:g}")  # type: ignore[operator]
    text = "Capacity: each storm brings " + "; ".join(dict.fromkeys(parts)) + "."
    if need:
        text += (" The background traffic alone needs at least " + ", ".join(need) + " of the device (its "
                 "prefills once, every decode step full: the workload limit's accounting; real batches are not "
                 "full, so more). Where a storm's share and the background's add up to more than one engine, no "
                 "single-engine policy can both finish every long prompt before its deadline and keep short "
                 "prompts' latency: chunking protects the short prompts and lets long ones miss their deadline; "
                 "whole-prompt prefill finishes more long prompts and blocks the short ones behind them.")
    return text


def storm_section(result: SweepResult) -> list[str]:
    if result.reference_label != "no storm":
        return []
    lines = ["## Long-prefill storm vs no storm", "",
             "The same policy on the same background requests without the storm prompts (reference runs). "
             "`short TTFT P99` is over the short-class (≤ 512 tokens) requests of the whole run; long prompts: "
             "completed / offered, and their longest wait for service (arrival → prefill start).", "",
             "| load | policy | short TTFT P99 s, storm | no storm | ratio | long completed | long max wait s | "
             "starvation events (by class) |", "|---|---|---|---|---|---|---|---|"]
    for load in result.loads:
        for policy in result.policies:
            c, ref = result.cell(policy.name, load), result.cell(policy.name, load, reference=True)
            if c is None or ref is None:
                continue
            storm, calm, done, offered, wait = storm_figures(c, ref)
            by_class = Counter(e.klass for e in c.summary.starvation)
            lines.append(f"| {load:g} | {policy.name} | {ratio_text(storm)} | {ratio_text(calm)} | "
                         f"{ratio_text(storm / calm if storm is not None and calm else None)} | {done}/{offered} | "
                         f"{ratio_text(wait, 1)} | "
                         f"{', '.join(f'{k}: {v}' for k, v in sorted(by_class.items())) or '0'} |")
    return lines + [""]
