"""The argument parser and entry point of ``python -m calculet.bench`` (see :mod:`calculet.bench`).

Why this exists: the command line is the benchmark's interface — every report quotes the exact
command that made it — so parsing, validating numbers and mapping errors to exit codes (2 bad
input, 1 a failed soak) live in one thin module; the commands do the work.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from calculet.bench.comparison import CAPACITY_MULTIPLES, COMPARISON_PRESET, DEADLINE_SETTINGS
from calculet.bench.comparison_seeds import MAX_SEED_COUNT
from calculet.bench.commands import PROG, BadInput, cmd_all, cmd_goodput, cmd_list, cmd_run
from calculet.bench.estimate_bound_report import add_estimate_bound_parser
from calculet.bench.soak_command import cmd_soak
from calculet.bench.sweep import COSTS, PRESET_LOADS
from calculet.loadsim.policies import GOODPUT_GROUP, POLICIES
from calculet.loadsim.soak_products import PRODUCTS
from calculet.loadsim.soak_report import SoakOptions
from calculet.loadsim.workload import preset_names

__all__ = ["build_parser", "main", "parse_loads", "parse_seeds"]

DESCRIPTION = "policies judged in virtual time against the baselines and the device bound."


def _listed(text: str, what: str, example: str, convert: Callable[[str], Any]) -> list[Any]:
    """A comma-separated list, each item ``convert``-ed (it raises ``ArgumentTypeError`` with its own rule):
    no empty item, no item twice — one parser for every list flag, so they refuse bad input alike."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"expected {example}; got {text!r}")
    values: list[Any] = []
    for part in parts:
        value = convert(part)
        if value in values:
            raise argparse.ArgumentTypeError(f"{what} {part!r} is listed twice")
        values.append(value)
    return values


def _load(part: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"load {part!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"load {part!r} must be a finite number > 0 (a multiple of the "
                                         "workload's arrival rate)")
    return value


def _seed(part: str) -> int:
    try:
        value = int(part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {part!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed {part!r} must be >= 0")
    return value


def parse_loads(text: str) -> tuple[float, ...]:
    """``"0.5,1,2"`` → ``(0.5, 1.0, 2.0)``: finite, > 0, no duplicates, sorted as given."""
    return tuple(_listed(text, "load", "comma-separated load scales such as 0.5,1,2", _load))


def parse_seeds(text: str) -> int | tuple[int, ...]:
    """``"11,12,13"`` → ``(11, 12, 13)`` (integers >= 0, no duplicates); ``"3"`` → 3, a count of seeds
    (2..MAX_SEED_COUNT: one seed is ``--seed``, and a bare ``13`` meant as one seed must not run 13)."""
    seeds = _listed(text, "seed", "comma-separated seeds such as 11,12,13 or a count such as 3", _seed)
    if len(seeds) > 1:
        return tuple(seeds)
    if not 2 <= seeds[0] <= MAX_SEED_COUNT:
        raise argparse.ArgumentTypeError(f"a count of seeds must be 2..{MAX_SEED_COUNT}, got {seeds[0]} (one seed: "
                                         f"--seed {seeds[0]}; chosen seeds: a list such as 11,12,13)")
    return seeds[0]


def _number(kind: Callable[[str], Any], ok: Callable[[Any], bool], rule: str,
            what: str = "") -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` that must satisfy ``ok``, else a message stating ``rule``."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (ok(value) and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{what}{text!r} {rule}")
        return value
    return parse


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    return _number(kind, lambda v: v > 0, "must be > 0")


_non_negative_int = _number(int, lambda v: v >= 0, "must be >= 0")
_non_negative_float = _number(float, lambda v: v >= 0, "must be a finite number >= 0")
_rate = _number(float, lambda v: 0 <= v <= 0.05, "must be in [0, 0.05] per fault kind per job", "fault rate ")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{run,all,goodput,soak,list}")
    sub.required = True

    run = sub.add_parser("run", help="run a workload under several policies at several loads; write a report")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", help=f"a bundled workload: {', '.join(preset_names())}")
    source.add_argument("--workload", type=Path, help="a calculet-loadsim/v1 YAML file")
    _sweep_arguments(run)
    run.add_argument("--loads", type=parse_loads, default=None,
                     help="comma-separated load scales (multiples of the workload's arrival rate); default: "
                          "the preset's sweep (" + "; ".join(f"{k} {','.join(f'{v:g}' for v in vs)}"
                                                            for k, vs in PRESET_LOADS.items()) + ")")
    run.add_argument("--out", type=Path, required=True, help="output folder (created; report.md, PNGs, summary.json)")
    run.set_defaults(func=cmd_run, parser=run)

    every = sub.add_parser("all", help="run the four presets with their default sweeps into OUT/<preset>/, the "
                                       "goodput comparison into OUT/goodput/, and write OUT/README.md")
    _sweep_arguments(every)
    every.add_argument("--out", type=Path, required=True, help="results folder, e.g. bench/results")
    every.add_argument("--soak-hours", type=_non_negative_float, default=0.0,
                       help="also run a soak of this many virtual hours into OUT/soak/ (default 0: none)")
    _multiples_argument(every)
    every.add_argument("--no-goodput", dest="goodput", action="store_false",
                       help="skip the goodput comparison (OUT/goodput/, see the goodput command)")
    every.set_defaults(func=cmd_all, parser=every)

    _goodput_parser(sub)
    add_estimate_bound_parser(sub, parse_loads, _positive, _non_negative_int)

    soak = sub.add_parser("soak", help="24 h of traffic in virtual time with faults; exit 1 on any violation")
    soak.add_argument("--hours", type=_positive(float), default=24.0, help="virtual hours (default 24)")
    soak.add_argument("--product", choices=list(PRODUCTS), default=SoakOptions.product,
                      help="what to soak: " + "; ".join(f"{p.name}: {p.description} (default preset {p.preset}, "
                                                        f"load {p.load_scale:g}, fault rate {p.fault_rate:g})"
                                                        for p in PRODUCTS.values()))
    source = soak.add_mutually_exclusive_group()
    source.add_argument("--preset", default=None, help="bundled workload (default: the product's, steady)")
    source.add_argument("--workload", type=Path, help="a calculet-loadsim/v1 YAML file")
    soak.add_argument("--load", type=_positive(float), default=None, help="load scale (default: the product's)")
    soak.add_argument("--policy", default=None,
                      help=f"engine policy of --product policy (default {SoakOptions.policy})")
    soak.add_argument("--fault-rate", type=_rate, default=None,
                      help="injected faults per kind per job (six kinds; default: the product's)")
    soak.add_argument("--seed", type=_non_negative_int, default=1)
    soak.add_argument("--cost", choices=sorted(COSTS), default="reference")
    soak.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (~4.5x slower)")
    soak.add_argument("--no-monitors", action="store_true", help="do not run the invariant monitors")
    soak.add_argument("--out", type=Path, help="also write soak.md into this folder")
    soak.add_argument("--quiet", action="store_true", help="no progress bar")
    soak.set_defaults(func=cmd_soak, parser=soak)

    listing = sub.add_parser("list", help="list presets and policies")
    listing.set_defaults(func=cmd_list, parser=listing)
    return parser


def _multiples_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--multiples", type=parse_loads, default=CAPACITY_MULTIPLES,
                        help="goodput comparison: offered load as multiples of each device's capacity (default "
                             + ",".join(f"{x:g}" for x in CAPACITY_MULTIPLES) + ")")


def _goodput_parser(sub: Any) -> None:
    """``goodput``: the issue #13 item 7 comparison in one run (calculet/bench/comparison.py)."""
    settings = ", ".join(f"{label} x{scale:g}" for label, scale in DEADLINE_SETTINGS)
    cmd = sub.add_parser("goodput", help=f"B1 FCFS, strict EDF, at_risk and the default on_time on B1 (shared) and "
                                         f"B16, {COMPARISON_PRESET} preset, load multiples of each device's capacity, "
                                         f"deadlines {settings}; acceptance table and report")
    _multiples_argument(cmd)
    cmd.add_argument("--duration", type=_positive(float), default=None,
                     help="virtual seconds of arrivals (default: the preset's duration_s)")
    seeds = cmd.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=_non_negative_int, default=None, help="override the preset's seed")
    seeds.add_argument("--seeds", type=parse_seeds, default=None,
                       help="run the comparison once per seed and judge every check over them: a list such as "
                            f"11,12,13, or a count N (2..{MAX_SEED_COUNT}): the preset's seed and the N-1 after "
                            "it; each seed's report in OUT/seed-<S>/, the checks per seed and pooled in OUT/report.md")
    cmd.add_argument("--cost", choices=sorted(COSTS), default="reference", help="cost model (default reference)")
    cmd.add_argument("--out", type=Path, required=True, help="output folder (report.md, summary.json, one folder "
                                                             "per device and deadline setting, or per seed)")
    cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    cmd.set_defaults(func=cmd_goodput, parser=cmd)


def _sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", default="all",
                        help=f"comma-separated policies, 'all' (default) or '{GOODPUT_GROUP}' (FCFS and calculet-b1/-b16 "
                             f"under every batch.deadline_order): {', '.join(POLICIES)}; an engine policy may name "
                             "a §7.2 decode order, e.g. calculet-b1@strict")
    parser.add_argument("--deadline-scale", type=_positive(float), default=1.0,
                        help="multiply every offered deadline (default 1; e.g. 4 turns the overload preset's tight "
                             "10 s into a loose 40 s)")
    parser.add_argument("--duration", type=_positive(float), default=None,
                        help="virtual seconds of arrivals (default: the workload's duration_s)")
    parser.add_argument("--seed", type=_non_negative_int, default=None, help="override the workload's seed")
    parser.add_argument("--cost", choices=sorted(COSTS), default="reference",
                        help="cost model of the simulated NPU (default reference; the presets are sized for it)")
    parser.add_argument("--starvation-threshold", type=_positive(float), default=30.0,
                        help="seconds a request may wait while later arrivals of its prompt class start before "
                             "it counts as starved (default 30)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference runs (the same requests without the workload's storms, or "
                             "without its noisy tenant)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 1 for a failed soak)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    command: argparse.ArgumentParser = args.parser
    with _QuietEngineLogs():
        try:
            return int(args.func(args, args_list, console))
        except BadInput as exc:
            command.print_usage(sys.stderr)
            print(f"{command.prog}: error: {exc}", file=sys.stderr)
            return 2


class _QuietEngineLogs:
    """The engine logs every injected fault, recovery and ping/pong degrade as it happens; the
    reports carry those as figures (faults by kind, resets, degrade reasons), so the terminal
    keeps only the progress bars and critical errors."""

    def __enter__(self) -> None:
        self.logger = logging.getLogger("calculet")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        self.logger.setLevel(self.level)
