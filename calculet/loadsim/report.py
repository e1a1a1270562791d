"""Markdown + PNG report of a load sweep: per-policy tables and plots (goodput first, issue #13).

Why a file report rather than console output: the spec wants policy thresholds "obtained from
A/B tests" (§8) and acceptance gates stated as ratios against a baseline (§19 M1–M3); those
decisions are argued from a document that someone can read later, with the exact command that
produced it in its header so it can be re-run.

Plots are drawn with matplotlib's object API on an Agg canvas (no ``pyplot``, no global
backend switch) and saved without the software-version metadata, so the same figures give the
same bytes. matplotlib is imported only when a report is written: the workload and analysis
modules do not need it.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from calculet.errors import DefinitionError
from calculet.loadsim.analysis import PROMPT_CLASSES, LatencyStats, RunSummary, ServiceTimeline

if TYPE_CHECKING:  # matplotlib is imported lazily, at plot time
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PolicyResult", "ReportFiles", "write_report", "render_markdown"]


@dataclass(frozen=True)
class PolicyResult:
    """One policy at one offered load: its summary and (optionally) its per-tenant timeline."""

    policy_name: str
    offered_load: float
    summary: RunSummary
    timeline: ServiceTimeline | None = None
    goodput_per_s: float | None = None
    """On-time completions per second (issue #13); plotted and tabled first when given."""
    on_time_fraction: float | None = None
    bound_per_s: float | None = None
    """The offline bound on on-time completions of the same requests, per second (drawn dotted)."""


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    markdown: Path
    plots: tuple[Path, ...]


_REPORT = "report.md"
_GOODPUT = "goodput_vs_load.png"
_THROUGHPUT = "throughput_vs_load.png"
_TTFT = "p99_ttft_vs_load.png"


def write_report(results: Sequence[PolicyResult], out_dir: str | Path, *, command_line: str | Sequence[str],
                 title: str = "Calculet load simulation", load_label: str = "offered load",
                 device_bound_tokens_per_s: float | None = None, workload_limits: Mapping[float, float] | None = None,
                 notes: Sequence[str] = ()) -> ReportFiles:
    """Write ``report.md`` and the PNG plots into ``out_dir`` (created if missing).

    ``command_line`` is quoted verbatim in the header (a sequence is joined with shell quoting).
    ``device_bound_tokens_per_s`` (the decode-only limit, see
    :func:`~calculet.loadsim.baselines.device_bound_limit`) is drawn as a ceiling on the
    throughput plot and listed in the header; ``workload_limits`` (per offered load, see
    :func:`~calculet.loadsim.analysis.workload_limit`) likewise, as a second line.
    """
    if not results:
        raise DefinitionError("a report needs at least one PolicyResult")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = [out / _THROUGHPUT, out / _TTFT]
    by_policy = _by_policy(results)
    files = {"throughput": _THROUGHPUT, "ttft": _TTFT}
    if any(r.goodput_per_s is not None for r in results):
        plots.insert(0, out / _GOODPUT)
        files["goodput"] = _GOODPUT
        _line_plot(plots[0], by_policy, lambda r: r.goodput_per_s, ylabel="on-time completions/s",
                   title="Goodput vs offered load (dotted: offline bound)", xlabel=load_label,
                   dotted=lambda r: r.bound_per_s)
    _line_plot(out / _THROUGHPUT, by_policy, lambda r: r.summary.output_tokens_per_s, ylabel="output tokens/s",
               title="Throughput vs offered load", xlabel=load_label, ceiling=device_bound_tokens_per_s,
               workload_limits=workload_limits)
    _line_plot(out / _TTFT, by_policy,
               lambda r: None if r.summary.ttft_s.p99 is None else r.summary.ttft_s.p99 * 1000,
               ylabel="P99 TTFT (ms)", title="P99 time to first token vs offered load", xlabel=load_label,
               log_y=True)
    service_plots: dict[str, Path] = {}
    for policy, rows in by_policy.items():
        with_timeline = [r for r in rows if r.timeline is not None]
        if with_timeline:
            chosen = with_timeline[-1]  # the highest offered load: where fairness is tested
            path = out / f"tenant_service_{_slug(policy)}.png"
            assert chosen.timeline is not None
            _service_plot(path, chosen.timeline, f"{policy} at {load_label} {chosen.offered_load:g}")
            service_plots[policy] = path
    plots += service_plots.values()
    text = render_markdown(results, command_line=command_line, title=title, load_label=load_label,
                           device_bound_tokens_per_s=device_bound_tokens_per_s, workload_limits=workload_limits,
                           notes=notes, plot_files={**files,
                                                    **{f"service:{p}": path.name for p, path in service_plots.items()}})
    md = out / _REPORT
    md.write_text(text, encoding="utf-8")
    return ReportFiles(markdown=md, plots=tuple(plots))


def render_markdown(results: Sequence[PolicyResult], *, command_line: str | Sequence[str],
                    title: str = "Calculet load simulation", load_label: str = "offered load",
                    device_bound_tokens_per_s: float | None = None,
                    workload_limits: Mapping[float, float] | None = None, notes: Sequence[str] = (),
                    plot_files: dict[str, str] | None = None) -> str:
    """The Markdown text of the report (no file I/O; ``plot_files`` names the images to link)."""
    cmd = command_line if isinstance(command_line, str) else shlex.join(list(command_line))
    lines = [f"# {title}", "", "Command line:", "", "```", cmd, "```", ""]
    if device_bound_tokens_per_s is not None:
        lines += [f"Device-bound limit, decode only (largest profile, every lane busy, no host cost, no prefill): "
                  f"{device_bound_tokens_per_s:.1f} output tokens/s.", ""]
    if workload_limits:
        lines += ["Workload limit (the offered requests with the device never idle, every decode step of the "
                  "largest profile full, each prefill paid once, no host cost), by " + load_label + ": "
                  + ", ".join(f"{k:g}: {v:.1f}" for k, v in sorted(workload_limits.items()))
                  + " output tokens/s.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += ["Times are virtual (simulated device time). TTFT = first token − arrival; ITL = gap between "
              "consecutive tokens; queue wait = prefill start − arrival; fill = active / compiled lanes; "
              "Jain = Jain's index of each tenant's tokens over its weighted max-min fair share of the tokens "
              "delivered (a tenant with a request waiting wants more; one without wanted what it got), "
              "token-weighted over the stretches where the set of waiting tenants is constant: 1.0 = every tenant "
              "got its fair share. Starvation = requests passed over by a later arrival of their own prompt class "
              "(after a wait past the threshold, or expiring unserved).", ""]
    for policy, rows in _by_policy(results).items():
        lines += _policy_section(policy, rows, load_label, plot_files)
    if plot_files:
        lines += ["## Plots", ""]
        if "goodput" in plot_files:
            lines += [f"![goodput vs offered load]({plot_files['goodput']})", ""]
        if "throughput" in plot_files:
            lines += [f"![throughput vs offered load]({plot_files['throughput']})", ""]
        if "ttft" in plot_files:
            lines += [f"![P99 TTFT vs offered load]({plot_files['ttft']})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _policy_section(policy: str, rows: Sequence[PolicyResult], load_label: str,
                    plot_files: dict[str, str] | None) -> list[str]:
    """One policy's tables (goodput first when given) and its per-tenant service plot."""
    lines: list[str] = []
    lines += [f"## {policy}", ""]
    if any(r.goodput_per_s is not None for r in rows):
        lines += _table([load_label, "goodput (on time/s)", "on-time fraction", "offline bound /s"],
                        [[f"{r.offered_load:g}", _ratio(r.goodput_per_s), _ratio(r.on_time_fraction),
                          _ratio(r.bound_per_s)] for r in rows])
    lines += _table(
        [load_label, "out tok/s", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms", "ITL P99 ms",
         "queue P50 ms", "queue P99 ms", "fill", "lane waste", "requests", "completed", "rejected",
         "Jain", "starvation"],
        [[f"{r.offered_load:g}", f"{r.summary.output_tokens_per_s:.2f}", _ms(r.summary.ttft_s.p50),
          _ms(r.summary.ttft_s.p99), _ms(r.summary.itl_s.p50), _ms(r.summary.itl_s.p99),
          _ms(r.summary.queue_wait_s.p50), _ms(r.summary.queue_wait_s.p99), _ratio(r.summary.fill_ratio),
          _ratio(r.summary.lane_waste), str(r.summary.requests), str(r.summary.completed),
          str(r.summary.rejected), _ratio(r.summary.jain_fairness), str(r.summary.starvation_events)]
         for r in rows])
    for label, attr, cell in (("TTFT P99 by prompt class (ms)", "ttft_by_class_s", _class_cell),
                              ("Inter-token latency P99 by prompt class (ms)", "itl_by_class_s", _class_cell),
                              ("Queue wait P99 / longest by prompt class (ms)", "queue_wait_by_class_s",
                               _class_cell_with_max)):
        lines += [f"**{label}**", ""]
        lines += _table([load_label, *PROMPT_CLASSES],
                        [[f"{r.offered_load:g}", *(cell(getattr(r.summary, attr)[k]) for k in PROMPT_CLASSES)]
                         for r in rows])
    lines += ["**Batches, rejections and finishes**", ""]
    lines += _table([load_label, "batches (B: count)", "batch wait P99 ms", "rejections", "finish reasons",
                     "tokens by tenant"],
                    [[f"{r.offered_load:g}", _counts(r.summary.compiled_batches) or "—",
                      _ms(r.summary.batch_wait_s.p99), _counts(r.summary.rejections_by_reason) or "none",
                      _counts(r.summary.finish_reasons) or "—", _counts(r.summary.tenant_output_tokens) or "—"]
                     for r in rows])
    if plot_files and f"service:{policy}" in plot_files:
        lines += [f"![per-tenant service, {policy}]({plot_files[f'service:{policy}']})", ""]
    return lines


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _by_policy(results: Sequence[PolicyResult]) -> dict[str, list[PolicyResult]]:
    """Policies in first-seen order, each sorted by offered load (stable)."""
    grouped: dict[str, list[PolicyResult]] = defaultdict(list)
    for r in results:
        grouped[r.policy_name].append(r)
    return {p: sorted(rows, key=lambda r: r.offered_load) for p, rows in grouped.items()}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out + [""]


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _class_cell(stats: LatencyStats) -> str:
    return "—" if stats.count == 0 else f"{_ms(stats.p99)} (n={stats.count})"


def _class_cell_with_max(stats: LatencyStats) -> str:
    """P99 and the longest: a class's worst wait stays visible even when it is not starvation."""
    return "—" if stats.count == 0 else f"{_ms(stats.p99)} / {_ms(stats.max)} (n={stats.count})"


def _counts(mapping: Mapping[object, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in mapping.items())


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "policy"


def _new_figure() -> tuple[Figure, Axes]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def _line_plot(path: Path, by_policy: dict[str, list[PolicyResult]], value: Callable[[PolicyResult], float | None],
               *, ylabel: str, title: str, xlabel: str, ceiling: float | None = None,
               workload_limits: Mapping[float, float] | None = None, log_y: bool = False,
               dotted: Callable[[PolicyResult], float | None] | None = None) -> None:
    fig, ax = _new_figure()
    any_positive = False
    labelled = ceiling is not None or bool(workload_limits)
    for policy, rows in by_policy.items():
        points = [(r.offered_load, value(r)) for r in rows]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            xs, ys = zip(*points)
            line = ax.plot(xs, ys, marker="o", label=policy)[0]
            any_positive |= any(y > 0 for y in ys)
            labelled = True
            extra = [(r.offered_load, dotted(r)) for r in rows] if dotted is not None else []
            extra = [(x, y) for x, y in extra if y is not None]
            if extra:
                ax.plot(*zip(*extra), linestyle=":", color=line.get_color())
    if ceiling is not None:
        ax.axhline(ceiling, linestyle="--", color="grey", label="device-bound limit (decode only)")
    if workload_limits:
        xs_w, ys_w = zip(*sorted(workload_limits.items()))
        ax.plot(xs_w, ys_w, linestyle=":", color="black", marker="x", label="workload limit")
    if log_y and any_positive:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if labelled:
        ax.legend(loc="best", fontsize="small")
    _save(fig, path)


def _service_plot(path: Path, timeline: ServiceTimeline, title: str) -> None:
    fig, ax = _new_figure()
    ends = timeline.bin_ends()
    for tenant in timeline.tenants:
        ax.plot(ends, timeline.cumulative_normalized(tenant),
                label=f"{tenant} (w={timeline.weights.get(tenant, 1.0):g})")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("cumulative tokens / weight")
    ax.set_title(f"Per-tenant service over time — {title}")
    ax.grid(True, alpha=0.3)
    if timeline.tenants:
        ax.legend(loc="best", fontsize="small")
    _save(fig, path)
