"""The ``run``, ``all`` and ``list`` commands of ``python -m calculet.bench``.

Why this exists: each command turns parsed arguments into a sweep (or several) and its reports;
``all`` regenerates the committed results folder (``bench/results``) with one command line that
every report quotes, so a figure can always be reproduced.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from calculet.bench.acceptance import acceptance, acceptance_table
from calculet.bench.comparison import CAPACITY_MULTIPLES, COMPARISON_PRESET, run_comparison
from calculet.bench.comparison_report import acceptance_matrix, write_comparison_report
from calculet.bench.comparison_seeds import resolve_seeds
from calculet.bench.comparison_seeds_report import run_seeds, seed_folder
from calculet.bench.report import write_sweep_report
from calculet.bench.sweep import COSTS, DEFAULT_LOADS, PRESET_LOADS, SweepResult, run_sweep
from calculet.loadsim.policies import POLICIES, PolicyError, PolicySpec, parse_policies
from calculet.loadsim.workload import Workload, WorkloadError, load_preset, load_workload, preset_names

__all__ = [
    "PROG", "BadInput", "cmd_all", "cmd_goodput", "cmd_list", "cmd_run", "command_line", "policies_of", "workload_of",
]

PROG = "python -m calculet.bench"


class BadInput(Exception):
    """A command-line error found after parsing (unknown preset, policy...): exit code 2."""


def workload_of(preset: str | None, path: Path | None) -> Workload:
    """The workload of ``--preset`` or ``--workload``; a bad one is a :class:`BadInput`."""
    try:
        return load_workload(path) if path is not None else load_preset(str(preset))
    except WorkloadError as exc:
        raise BadInput(str(exc)) from None


def policies_of(text: str) -> tuple[PolicySpec, ...]:
    """The policies of ``--policies``; an unknown one is a :class:`BadInput`."""
    try:
        return parse_policies(text)
    except PolicyError as exc:
        raise BadInput(str(exc)) from None


def command_line(argv: Sequence[str]) -> str:
    """The command line a report quotes, so that it can be run again."""
    return shlex.join([*PROG.split(), *argv])


def _sweep(args: argparse.Namespace, workload: Workload, loads: Sequence[float], out: Path,
           argv: Sequence[str], console: Console) -> tuple[SweepResult, Path]:
    policies = policies_of(args.policies)
    result = run_sweep(workload, policies, loads, cost=COSTS[args.cost](), duration_s=args.duration, seed=args.seed,
                       starvation_threshold_s=args.starvation_threshold, reference=not args.no_reference,
                       deadline_scale=args.deadline_scale,
                       console=console, quiet=args.quiet)
    report = write_sweep_report(result, out, command_line(argv))
    return result, report


def cmd_run(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    workload = workload_of(args.preset, args.workload)
    policies_of(args.policies)  # fail fast, before any run
    loads = args.loads or PRESET_LOADS.get(workload.name, DEFAULT_LOADS)
    _, report = _sweep(args, workload, loads, args.out, argv, console)
    console.print(f"report: {report}")
    return 0


def cmd_all(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    policies_of(args.policies)
    start = time.perf_counter()
    sections: list[str] = []
    for name in PRESET_LOADS:
        sections += _preset_section(args, name, console)
    if args.goodput:
        sections += _goodput_section(args, console)
    sections += _committed_seed_comparisons(args.out)
    soak_ok = True
    if args.soak_hours > 0:
        soak_ok, soak_lines = _soak_section(args)
        sections += soak_lines
    else:
        sections += _committed_soaks(args.out)
    readme = args.out / "README.md"
    readme.write_text("\n".join([
        "# Load-simulation results", "",
        "Each folder holds `report.md` (acceptance figures, headline table, per-policy tables, plots), the PNG "
        "plots and `summary.json`, written by the command shown (also in each report's header). All figures "
        "are virtual time on the simulated NPU's cost model (`CostModel.reference()`) — assumptions, not NPU "
        "measurements; the engine, scheduler and executor are the real ones. `calculet-b1-shared` is B1 as the "
        "service ships it (one job in flight, the shipped KV lanes shared by decode rotation); `calculet-b1` is "
        "one KV lane, strictly serial. Regenerate everything with:", "",
        "```", command_line(argv), "```", "", f"Wall time of this command: {time.perf_counter() - start:.0f} s.",
        *_omitted_policies(args.policies), "", "## Acceptance figures by preset", "",
        *sections]), encoding="utf-8")
    console.print(f"index: {readme}")
    return 0 if soak_ok else 1


def _omitted_policies(text: str) -> list[str]:
    """The README's note when the preset sweeps ran part of the catalogue (``--policies``)."""
    ran = {p.name for p in policies_of(text)}
    left = [name for name in POLICIES if name not in ran]
    if not left:
        return []
    return ["", "The preset sweeps ran part of the catalogue to fit the regeneration in about 15 minutes on a "
            "shared 2-core machine; not run: " + ", ".join(f"`{n}`" for n in left) + " (`--policies all` runs "
            "them; the goodput comparison always runs its own policies)."]


def _preset_section(args: argparse.Namespace, name: str, console: Console) -> list[str]:
    """One preset's sweep with its default loads into OUT/<preset>/, and its lines of the index."""
    workload = workload_of(name, None)
    loads = PRESET_LOADS[name]
    sub_argv = ["run", "--preset", name, "--loads", ",".join(f"{x:g}" for x in loads),
                "--out", str(args.out / name)] + _passthrough(args)
    result, report = _sweep(args, workload, loads, args.out / name, sub_argv, console)
    rows, _ = acceptance(result)
    lines = [f"### [{name}]({name}/report.md)", "", f"`{command_line(sub_argv)}` — "
             f"{len(result.cells) + len(result.reference)} runs in {result.wall_s:.0f} s wall.", ""]
    if rows:
        lines += acceptance_table(rows)
        lines.append("")
    console.print(f"report: {report}")
    return lines


def cmd_goodput(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    if args.seeds is not None:
        return _goodput_seeds(args, argv, console)
    _, report = _comparison(args, args.out, argv, console)
    console.print(f"report: {report}")
    return 0


def _goodput_seeds(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    """``goodput --seeds``: the comparison once per seed into OUT/seed-<S>/, then the checks over them."""
    seeds = resolve_seeds(args.seeds, workload_of(COMPARISON_PRESET, None).seed)

    def run(seed: int) -> Any:
        return _run_comparison(args, seed, console)

    def command_of(seed: int) -> str:
        return command_line(_goodput_argv(args, args.out / seed_folder(seed), seed) + (["--quiet"] if args.quiet
                                                                                         else []))
    report, _ = run_seeds(seeds, args.out, run, command_of, command_line(argv), console, args.quiet)
    console.print(f"report: {report}")
    return 0


def _run_comparison(args: argparse.Namespace, seed: int | None, console: Console) -> Any:
    workload = workload_of(COMPARISON_PRESET, None)
    return run_comparison(workload, COSTS[args.cost](), multiples=args.multiples, duration_s=args.duration,
                          seed=seed, console=console, quiet=args.quiet)


def _comparison(args: argparse.Namespace, out: Path, argv: Sequence[str], console: Console) -> tuple[Any, Path]:
    comparison = _run_comparison(args, args.seed, console)
    return comparison, write_comparison_report(comparison, out, command_line(argv))


def _goodput_argv(args: argparse.Namespace, out: Path, seed: int | None) -> list[str]:
    """The ``goodput`` command line of one comparison into ``out`` (the options that differ from the defaults)."""
    sub_argv = ["goodput", "--out", str(out)]
    if args.multiples != CAPACITY_MULTIPLES:
        sub_argv += ["--multiples", ",".join(f"{x:g}" for x in args.multiples)]
    if args.duration is not None:
        sub_argv += ["--duration", f"{args.duration:g}"]
    if seed is not None:
        sub_argv += ["--seed", str(seed)]
    if args.cost != "reference":
        sub_argv += ["--cost", args.cost]
    return sub_argv


def _goodput_section(args: argparse.Namespace, console: Console) -> list[str]:
    """The goodput comparison of ``all`` into OUT/goodput/, and its lines of the index."""
    sub_argv = _goodput_argv(args, args.out / "goodput", args.seed)
    comparison, report = _comparison(args, args.out / "goodput", sub_argv, console)
    matrix, met, judged = acceptance_matrix(comparison)
    console.print(f"report: {report}")
    return ["### [goodput comparison](goodput/report.md) (issue #13 item 7)", "",
            f"`{command_line(sub_argv)}` — {sum(len(a.result.cells) for a in comparison.arms)} runs in "
            f"{comparison.wall_s:.0f} s wall. {met} of {judged} judged checks met.", "", *matrix, ""]


def _soak_section(args: argparse.Namespace) -> tuple[bool, list[str]]:
    """The soak of ``all --soak-hours`` into OUT/soak/, and its lines of the index."""
    # a fresh process: the sweeps' records would otherwise mask (or fake) the soak's memory growth
    soak_argv = ["soak", "--hours", f"{args.soak_hours:g}", "--out", str(args.out / "soak")]
    if args.cost != "reference":
        soak_argv += ["--cost", args.cost]
    if args.quiet:
        soak_argv.append("--quiet")
    code = subprocess.run([sys.executable, "-m", "calculet.bench", *soak_argv], check=False).returncode
    lines = _soak_lines(args.out / "soak", f"`{command_line(soak_argv)}` (its own process)")
    if lines is None:
        lines = ["### [soak](soak/soak.md)", "", f"The soak did not write its report (exit code {code}).", ""]
    return code == 0, lines


def _soak_lines(folder: Path, how: str) -> list[str] | None:
    """A soak folder's lines of the index, from its ``soak.json``; None when it has none."""
    try:
        figures = json.loads((folder / "soak.json").read_text(encoding="utf-8"))
        verdict = (f"{'PASS' if figures['ok'] else 'FAIL'}: {figures['virtual_s'] / 3600:.1f} h of virtual "
                   f"time in {figures['wall_s'] / 60:.1f} min wall ({figures['speedup']:.0f}x real time); "
                   f"{figures['submitted']} requests; {sum(figures['injected'].values())} faults injected; "
                   f"{len(figures['violations'])} violations.")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [f"### [{folder.name}]({folder.name}/soak.md)", "", how, "", verdict, ""]


def _committed_seed_comparisons(out: Path) -> list[str]:
    """The multi-seed goodput comparisons already in OUT (``goodput --seeds``, each made by its own
    command, minutes per seed): listed with their tally from ``summary.json``, not re-run."""
    lines: list[str] = []
    for folder in sorted(p for p in out.glob("goodput-seeds*") if p.is_dir()):
        try:
            data = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
            tally = data["tally"]
            per_seed = "; ".join(f"seed {s} {v['met']} of {v['judged']}" for s, v in tally["per_seed"].items())
            verdict = (f"Judged checks met: {per_seed}; pooled {tally['pooled']['met']} of "
                       f"{tally['pooled']['judged']}; met on every seed {tally['met_on_every_seed']}.")
            command = data["command"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        lines += [f"### [{folder.name}]({folder.name}/report.md)", "",
                  f"Not re-run by this command; made by `{command}`.", "", verdict, ""]
    return lines


def _committed_soaks(out: Path) -> list[str]:
    """``all`` without a soak: the soak reports already in OUT (each made by its own command)."""
    lines: list[str] = []
    for folder in sorted(p for p in out.glob("soak*") if p.is_dir()):
        command = f"Not re-run by this command; made by the command in [its report]({folder.name}/soak.md)."
        lines += _soak_lines(folder, command) or []
    return lines


def _passthrough(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.policies != "all":
        out += ["--policies", args.policies]
    if args.duration is not None:
        out += ["--duration", f"{args.duration:g}"]
    if args.seed is not None:
        out += ["--seed", str(args.seed)]
    if args.cost != "reference":
        out += ["--cost", args.cost]
    if args.starvation_threshold != 30.0:
        out += ["--starvation-threshold", f"{args.starvation_threshold:g}"]
    if args.no_reference:
        out.append("--no-reference")
    if args.deadline_scale != 1.0:
        out += ["--deadline-scale", f"{args.deadline_scale:g}"]
    return out


def cmd_list(args: argparse.Namespace, argv: Sequence[str], console: Console) -> int:
    console.print("presets:", highlight=False)
    for name in preset_names():
        w = load_preset(name)
        loads = ",".join(f"{x:g}" for x in PRESET_LOADS.get(name, DEFAULT_LOADS))
        console.print(f"  {name:20s} {w.description} (default loads {loads})", highlight=False, markup=False)
    console.print("policies:", highlight=False)
    for p in POLICIES.values():
        console.print(f"  {p.name:22s} {p.description}", highlight=False, markup=False)
    return 0
