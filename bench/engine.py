"""Throughput of the whole engine path in virtual time, against the device-bound limit (a benchmark).

For each profile B in {1, 4, 8, 16} the engine serves a saturating closed batch of requests on
the simulated NPU in virtual time — admission, WRR, prefill, batch building, submit, completion,
result verification, sampling, streaming, KV release — and reports:

* **tokens/s (virtual)** — generated tokens over the virtual time the device needed, including
  every prefill and every under-filled batch the scheduler produced;
* **limit** — the device-bound decode limit of the cost model: all B lanes full, back to back,
  zero host cost (``CostModel.device_bound_tokens_per_s``);
* **ratio** — the two divided: the share of the device the scheduling path keeps busy with
  useful decode lanes (target >= 0.9 at saturation with B16);
* **host µs/tick** — wall time of the engine's own tick work (dispatch + schedule, the
  simulator's bookkeeping inside the adapter calls included, model numerics off), and **host
  µs/step** — the whole driver loop's wall time per device decode step, against the modelled
  device step time: the host keeps up in real time while host/step stays well below 1.

Numerics are off (the device computes no model, so wall time is host time); invariant monitors
run at the production default (``monitoring``: on, one event in 256 checked — README "Monitors"). Figures, not a pass/fail test (DESIGN principle 10). The
cost model is an assumption (``--cost tiny`` ms-scale, ``--cost reference`` the assumed
reference-model shape, §13.1), never a measurement of the NPU.

    python bench/engine.py [--cost tiny|reference] [--new 240] [--waves 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, package_dir
from calculet.config import default_config, parse_config
from calculet.machines.monitor import MONITOR
from calculet.clock import FakeClock
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.request import NullSink

PROFILES = (1, 4, 8, 16)
PROMPT = 16


@dataclass(frozen=True)
class Row:
    compiled_batch: int
    requests: int
    tokens: int
    virtual_s: float
    tokens_per_s: float
    limit_tokens_per_s: float
    ratio: float
    fill_ratio: float
    decode_steps: int
    host_us_per_tick: float
    host_us_per_step: float
    device_step_us: float
    host_cpu_us_per_step: float = 0.0
    """The driver loop's process CPU time per decode step (the figure the monitor comparison uses)."""


def run(batch: int, *, cost: CostModel, new: int, waves: int) -> Row:
    clock = FakeClock()
    runtime = SimCalRT(SimConfig(clock=clock, numerics=False, cost=cost))
    requests = waves * batch
    config = parse_config({
        "schema": "calculet-scheduler/v1",
        "admission": {"max_sequences": 2 * batch, "max_waiting_requests": requests + 8,
                      "max_waiting_prompt_tokens": 10 ** 9},
        "batch": {"profiles": [1, batch] if batch > 1 else [1],
                  **({"select_thresholds": {batch: 1}} if batch > 1 else {})},
    })
    driver = EngineDriver(config, runtime, package_dir("future"), clock=clock,
                          options=EngineOptions(verify_golden=False, monitor_mode=None))
    sink = NullSink()
    prompt = tuple(range(1, PROMPT + 1))
    for _ in range(requests):
        driver.submit(GenerateRequest(prompt, new), sink)
    start_virtual = clock.now()
    start, cpu = time.perf_counter(), time.process_time()
    driver.run_until_idle()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    stats = driver.statistics()
    virtual = clock.now() - start_virtual
    decode = stats.scheduler.decode
    tokens = requests * new
    driver.stop()
    limit = cost.device_bound_tokens_per_s(batch)
    tps = tokens / virtual
    return Row(batch, requests, tokens, virtual, tps, limit, tps / limit, decode.fill_ratio, decode.batches,
               stats.host_time_per_tick_s * 1e6, wall / max(decode.batches, 1) * 1e6, cost.decode_s(batch) * 1e6,
               cpu / max(decode.batches, 1) * 1e6)


def compare_monitors(cost: CostModel, new: int, waves: int, sample_every: int, rounds: int = 3) -> int:
    """B16 with monitors off, at the production default (1 in ``sample_every``: each transition, and
    each engine tick's joint requests x lanes and KV-pool checks) and on every event and tick; the
    settings interleaved round by round, host µs per decode step as the median of per-round ratios."""
    settings = (("off", False, 1), (f"1 in {sample_every} (default)", True, sample_every), ("every event", True, 1))
    per: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    for _ in range(rounds):
        for name, enabled, every in settings:
            MONITOR.configure(enabled=enabled, mode="count", sample_every=every)
            per[name].append(run(16, cost=cost, new=new, waves=waves).host_cpu_us_per_step)
    MONITOR.configure(enabled=False)
    base = per["off"]
    print(f"B16, {waves * 16} requests x {new} tokens, numerics off: host CPU µs per decode step (engine tick + "
          f"driver loop, process time), medians of {rounds} interleaved rounds")
    for name, _, _ in settings:
        ratio = statistics.median(v / b for v, b in zip(per[name], base))
        print(f"  monitors {name:<22} {statistics.median(per[name]):>9.1f} CPU µs/step  {ratio:>5.2f}x off")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cost", choices=("tiny", "reference"), default="tiny")
    parser.add_argument("--new", type=int, default=240, help="tokens generated per request (prompt is 16)")
    parser.add_argument("--waves", type=int, default=4, help="requests per run = waves x B")
    parser.add_argument("--monitors", choices=("default", "compare"), default="default",
                        help="compare: B16 only, monitors off / at the production default / on every event "
                             "and tick, interleaved, host CPU per decode step as ratios to off (issue #20)")
    args = parser.parse_args(argv)
    cost = CostModel.tiny() if args.cost == "tiny" else CostModel.reference()
    monitoring = default_config().monitoring
    if args.monitors == "compare":
        return compare_monitors(cost, args.new, args.waves, monitoring.sample_every)
    MONITOR.configure(enabled=monitoring.invariants, mode="count", sample_every=monitoring.sample_every)
    rows = [run(b, cost=cost, new=args.new, waves=args.waves) for b in PROFILES]
    print(f"engine path in virtual time, cost model '{args.cost}' (an assumption, not an NPU measurement); "
          f"prompt {PROMPT}, {args.new} new tokens per request, numerics off, monitors at the production default")
    header = (f"{'B':>3} {'reqs':>5} {'tokens':>7} {'virtual s':>9} {'tokens/s':>10} {'limit':>10} {'ratio':>6} "
              f"{'fill':>5} {'steps':>6} {'host us/tick':>12} {'host us/step':>12} {'device us/step':>14}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.compiled_batch:>3} {r.requests:>5} {r.tokens:>7} {r.virtual_s:>9.3f} {r.tokens_per_s:>10.0f} "
              f"{r.limit_tokens_per_s:>10.0f} {r.ratio:>6.3f} {r.fill_ratio:>5.2f} {r.decode_steps:>6} "
              f"{r.host_us_per_tick:>12.1f} {r.host_us_per_step:>12.1f} {r.device_step_us:>14.1f}")
    b16 = rows[-1]
    verdict = "meets" if b16.ratio >= 0.9 else "MISSES"
    print(f"\nB16 at saturation: {b16.ratio:.3f} of the device-bound limit ({verdict} the 0.9 target); "
          f"host {b16.host_us_per_step / b16.device_step_us:.2f} x the modelled device step per decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
