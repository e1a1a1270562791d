"""``python -m calculet.bench``: policies judged in virtual time against the baselines and the device bound.

Subcommands::

    python -m calculet.bench run --preset steady --loads 0.5,1,2,4 --out DIR [--policies all]
    python -m calculet.bench run --workload my.yaml --loads 1 --policies b1-serial-fcfs,calculet-b16 --out DIR
    python -m calculet.bench all --out bench/results [--soak-hours 24]   # presets, goodput (+ soak), README.md
    python -m calculet.bench goodput --out DIR                # issue #13 item 7: decode orders on B1/B16
    python -m calculet.bench goodput --seeds 11,12,13 --out DIR   # the same per seed, judged over the seeds
    python -m calculet.bench soak --hours 24 [--out DIR]      # §19 M0 analogue; exit 1 on any violation
    python -m calculet.bench list                             # presets and policies

``run`` generates the workload's requests at each load scale (the same requests, compressed in
time, see :mod:`calculet.loadsim.arrivals`), runs every policy on them — the §1 baselines by
simulation, calculet through the real engine, scheduler and executor on the simulated NPU in
cost-model mode (numerics off) with a FakeClock — and writes ``report.md`` with the PNG plots
(throughput and P99 TTFT vs offered load, per-tenant service over time) plus ``summary.json``.
Every figure is virtual time on an assumed cost model (``CostModel.reference()`` by default),
never a measurement of the NPU; the report header carries the exact command line.

Exit codes: 0 done (a benchmark reports figures, it does not pass or fail — DESIGN principle
10), 2 bad input (unknown preset or policy, bad loads), 1 a soak found a violation.

The rooms: :mod:`~calculet.bench.cli` (arguments, exit codes), :mod:`~calculet.bench.commands`
(run, all, goodput, list), :mod:`~calculet.bench.soak_command`, :mod:`~calculet.bench.sweep` (the
runs), :mod:`~calculet.bench.comparison` (the goodput comparison's arms, its checks in
:mod:`~calculet.bench.comparison_checks` and report in :mod:`~calculet.bench.comparison_report`;
over several seeds :mod:`~calculet.bench.comparison_seeds` and its report
:mod:`~calculet.bench.comparison_seeds_report`),
and the report: :mod:`~calculet.bench.report`, :mod:`~calculet.bench.acceptance`,
:mod:`~calculet.bench.storm`, :mod:`~calculet.bench.tenants`, :mod:`~calculet.bench.figures`.
"""

from calculet.bench.cli import main, parse_loads
from calculet.bench.sweep import PRESET_LOADS, SweepResult, run_sweep

__all__ = ["PRESET_LOADS", "SweepResult", "main", "parse_loads", "run_sweep"]
