"""The ``soak`` command of ``python -m calculet.bench``: §19 M0's analogue in virtual time.

Why this exists: the soak runs hours of traffic with injected faults through the real engine
and exits 1 on any violation (:mod:`calculet.loadsim.soak` does the work); this module turns
the command line into :class:`~calculet.loadsim.soak_report.SoakOptions` for the product asked
(``--product policy``, today's B16 ping/pong soak, or ``b1-shipped``, the shipped configuration:
:mod:`calculet.loadsim.soak_products`), shows progress and writes ``soak.md`` / ``soak.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from calculet.bench.commands import BadInput, command_line, workload_of
from calculet.bench.sweep import COSTS
from calculet.loadsim.policies import POLICIES
from calculet.loadsim.soak import run_soak
from calculet.loadsim.soak_products import PRODUCTS
from calculet.loadsim.soak_report import SoakOptions, SoakReport

__all__ = ["cmd_soak"]


def cmd_soak(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    product = PRODUCTS[args.product]
    workload = workload_of(product.preset if args.preset is None else args.preset, args.workload)
    if args.policy is not None and args.product != "policy":
        raise BadInput(f"--policy applies to --product policy; {args.product} runs {product.description}")
    policy = SoakOptions.policy if args.policy is None else args.policy
    if policy not in POLICIES or POLICIES[policy].kind != "engine":
        engines = [n for n, p in POLICIES.items() if p.kind == "engine"]
        raise BadInput(f"--policy {policy!r}: a soak runs an engine policy: {', '.join(engines)}")
    options = SoakOptions.for_product(args.product, hours=args.hours, preset=workload.name, workload=workload,
                                      load_scale=args.load, policy=policy, fault_rate=args.fault_rate,
                                      seed=args.seed, cost=COSTS[args.cost](), trace_memory=args.tracemalloc,
                                      monitors=not args.no_monitors)
    report = _run_soak(options, args.quiet, console)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.md").write_text(report.markdown(command_line(argv)), encoding="utf-8")
        (args.out / "soak.json").write_text(json.dumps(report.to_json(command_line(argv)), indent=2) + "\n",
                                            encoding="utf-8")
    _print_soak(report, console)
    return 0 if report.ok else 1


def _run_soak(options: SoakOptions, quiet: bool, console: Console) -> SoakReport:
    """The soak with a progress bar over virtual hours."""
    total = options.hours * 3600.0
    with Progress(TextColumn("soak"), BarColumn(), TextColumn("{task.fields[label]}"), TimeElapsedColumn(),
                  console=console, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task("soak", total=total, label="")

        def update(virtual_s: float, horizon_s: float) -> None:
            bar.update(task, completed=min(virtual_s, horizon_s),
                       label=f"{virtual_s / 3600:.1f} / {horizon_s / 3600:g} h virtual")

        return run_soak(options, progress=update)


def _print_soak(report: SoakReport, console: Console) -> None:
    verdict = "[green]PASS[/green]" if report.ok else "[red]FAIL[/red]"
    console.print(f"soak {verdict}: {report.virtual_s / 3600:.2f} h virtual in {report.wall_s / 60:.1f} min wall "
                  f"({report.speedup:.0f}x); {report.submitted} requests, outcomes "
                  f"{', '.join(f'{k} {v}' for k, v in report.outcomes.items())}; faults injected "
                  f"{sum(report.injected.values())} ({', '.join(f'{k} {v}' for k, v in report.injected.items())}); "
                  f"resets {report.resets}, restarts {report.restarts} (budget {report.reset_budget}/10 min "
                  f"{report.budget_note}, peak {report.peak_resets_in_window} in 10 min, recovery "
                  f"{report.recovery_state}); RSS growth {report.rss_growth_bytes / (1 << 20):+.1f} MiB, objects "
                  f"{report.object_growth:+d}", highlight=False)
    g = report.goodput_json()
    if g is not None:
        console.print(f"goodput: {g['on_time']} on time ({g['goodput_per_s']:.4f}/s), on-time fraction "
                      f"{g['on_time_fraction']:.1%}, late {g['late']}, wasted device work {g['wasted_share']:.2%}",
                      highlight=False)
    for v in report.violations[:50]:
        console.print(f"  violation: {v}", highlight=False, markup=False)
