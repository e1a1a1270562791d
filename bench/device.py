"""Decode throughput of the simulated NPU per compiled batch profile (a benchmark, not a test).

Two figures per profile (DESIGN principle 10: figures and ratios against a baseline in the same
run, never pass/fail timings):

* **host numpy tokens/s** — real numerics: the tiny transformer decoding full B-lane batches
  through the whole adapter path (submit → device → KV commit → result), wall-clock time;
* **cost-model tokens/s** — the device-bound throughput the latency model assigns to the same
  profile, for the tiny preset and for the assumed reference-model preset (§13.1). These are
  model assumptions, not measurements.

Usage: ``python bench/device.py [--steps N] [--prompt-len N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calculet.adapters.calrt import KvSeqId
from calculet.adapters.sim import CostModel, SimConfig, open_sim
from calculet.adapters.host_driver import HostDriver
from calculet.clock import FakeClock

PROFILES = (1, 4, 8, 16)


@dataclass(frozen=True)
class Row:
    compiled_batch: int
    steps: int
    host_tokens_per_s: float
    host_ms_per_step: float
    tiny_cost_tokens_per_s: float
    reference_cost_tokens_per_s: float


def measure(batch: int, steps: int, prompt_len: int, numerics: bool = True) -> tuple[float, float]:
    """(tokens/s, ms/step) of full-batch decode with real numerics, wall clock."""
    config = SimConfig(clock=FakeClock(), numerics=numerics, cost=CostModel.instant())
    with open_sim("future", config=config) as session:
        driver = HostDriver(session.device, session.calbin, session.kv)
        rng = np.random.default_rng(batch)
        seqs: list[KvSeqId] = []
        tokens: list[int] = []
        for _ in range(batch):
            seq = session.kv.allocate_sequence()
            first = driver.prefill(seq, [256, *rng.integers(0, 256, size=prompt_len - 1).tolist()])
            seqs.append(seq)
            tokens.append(int(first.lanes[0].greedy_token or 0))
        driver.decode(batch, list(zip(seqs, tokens, strict=True)))  # warm-up
        start = time.perf_counter()
        for _ in range(steps):
            result = driver.decode(batch, list(zip(seqs, tokens, strict=True)))
            tokens = [int(lane.greedy_token or 0) for lane in result.lanes]
        elapsed = time.perf_counter() - start
    return batch * steps / elapsed, 1000.0 * elapsed / steps


def run(steps: int, prompt_len: int) -> list[Row]:
    tiny, ref = CostModel.tiny(), CostModel.reference()
    rows = []
    for b in PROFILES:
        tps, ms = measure(b, steps, prompt_len)
        rows.append(Row(b, steps, tps, ms, tiny.device_bound_tokens_per_s(b), ref.device_bound_tokens_per_s(b)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompt-len", type=int, default=32)
    args = parser.parse_args(argv)
    rows = run(args.steps, args.prompt_len)
    base = rows[0]
    print(f"simulated NPU decode, {args.steps} steps per profile, prompts of {args.prompt_len} tokens, "
          "full batches (future package)")
    print(f"{'profile':>7} | {'host numpy tok/s':>16} | {'ms/step':>8} | {'x B1':>5} | "
          f"{'cost tiny tok/s':>15} | {'cost reference tok/s':>20} | {'x B1':>5}")
    print("-" * 98)
    for r in rows:
        print(f"{'B' + str(r.compiled_batch):>7} | {r.host_tokens_per_s:16.0f} | {r.host_ms_per_step:8.3f} | "
              f"{r.host_tokens_per_s / base.host_tokens_per_s:5.2f} | {r.tiny_cost_tokens_per_s:15.0f} | "
              f"{r.reference_cost_tokens_per_s:20.1f} | "
              f"{r.reference_cost_tokens_per_s / base.reference_cost_tokens_per_s:5.2f}")
    off_tps, off_ms = measure(16, args.steps, args.prompt_len, numerics=False)
    print(f"\nnumerics off (cost model only), B16: {off_tps:.0f} tok/s host, {off_ms:.3f} ms/step")
    ref = CostModel.reference()
    print(f"reference cost model: decode step = {ref.decode_fixed_s * 1e3:.1f} ms + "
          f"{ref.decode_per_lane_s * 1e3:.1f} ms/compiled lane, ping/pong overlap {ref.pingpong_overlap} "
          "(assumptions, not NPU measurements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
