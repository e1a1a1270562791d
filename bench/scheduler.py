"""Host cost of the scheduling core: one B16 decode tick, and admission, against queue depth.

A decode tick is what the host does per device step, excluding the device and sampling:
``step()`` (deadline sweep, admission pump, WRR, ``build_decode_batch`` with its host tensors
and KV reservation) + ``submitted()`` (job, KV and request transitions) +
``on_decode_complete()`` (per-lane checks, KV commits, request transitions, re-queueing). The
completion object itself — the device's output — is built outside the timed region.

Measured with 256, 4096 and 65536 sequences ready across 8 tenants (weights 1..8), so the
tick chooses 16 lanes out of N; growth must stay logarithmic in N (heaps, no per-tick sort).
Admission is ``submit()`` of one request on top of N already waiting (Queue) and into a
budget with room (Admit). Monitors are off, as in production by default. Figures, not a
pass/fail test (DESIGN principle 10).

    python bench/scheduler.py [--ticks N] [--sizes 256,4096,65536]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

from calculet.config import SchedulerConfig, parse_config
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.clock import FakeClock
from calculet.runtime.scheduling.completion import DecodeCompletion, LaneOutcome, PrefillCompletion
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.kv import KvLaneManager
from calculet.runtime.scheduling.profiles import LaneFill, ProfileSet, ProfileSpec
from calculet.runtime.request import InferenceRequest, NullSink
from calculet.runtime.scheduling.scheduler import Scheduler

B = 16
MAX_SEQ = 8192
PROMPT = 16
NEW = 4000
TENANTS = [{"name": f"t{i}", "weight": float(i + 1), **({"api_key_sha256": f"{i:064x}"} if i else {})}
           for i in range(8)]


def config(waiting: int, sequences: int) -> SchedulerConfig:
    return parse_config({
        "schema": "calculet-scheduler/v1", "tenants": TENANTS,
        "admission": {"max_sequences": sequences, "max_waiting_requests": waiting + 10_000,
                      "max_waiting_prompt_tokens": 10**12},
        # setup runs the prefills first; the measured ticks see an empty prefill queue
        "queues": {"decode_weight": 1, "short_prefill_weight": 64},
        "batch": {"profiles": [B], "select_thresholds": {B: 1}},
    })


def scheduler(cfg: SchedulerConfig, lanes: int) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    kv = KvLaneManager(lanes, MAX_SEQ, clock=clock)
    s = Scheduler(cfg, clock=clock, kv=kv, device_kv_tokens=lanes * (PROMPT + NEW), max_seq=MAX_SEQ)
    profiles = ProfileSet([ProfileSpec(B, MAX_SEQ, LaneFill(7), True)], requested=[B],
                          thresholds=cfg.batch.select_thresholds, multi_profile_residency=False)
    s.set_model(1, ModelAvailability.READY, profiles)
    return s, clock


def completion_of(batch: DecodeBatch) -> DecodeCompletion:
    lanes = tuple(LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, True, (b.position % 30000) + 1)
                  for b in batch.active)
    return DecodeCompletion(batch.job_id, batch.generation, True, lanes)


def ready_scheduler(n: int) -> Scheduler:
    """N sequences in DecodeReady (prefilled), spread over the 8 tenants."""
    s, _ = scheduler(config(0, n + B), n + B)
    sink = NullSink()
    for i in range(n):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}"), sink)
    while s.prefill.nonempty():
        plan = s.step()
        work: Any = plan.work
        if isinstance(work, DecodeBatch):
            s.submit_failed(work.job_id)
            continue
        s.submitted(work.job_id)
        s.on_prefill_complete(PrefillCompletion(work.job_id, work.generation, work.request_id, work.seq_id, True, 1))
    assert s.decode.ready_count(1) == n
    return s


def tick_cost(n: int, ticks: int) -> list[float]:
    s = ready_scheduler(n)
    for _ in range(50):  # warm up
        plan = s.step()
        s.submitted(plan.work.job_id)  # type: ignore[union-attr]
        s.on_decode_complete(completion_of(plan.work))  # type: ignore[arg-type]
    gc.collect()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(ticks):
        t0 = clock()
        plan = s.step()
        batch: Any = plan.work
        s.submitted(batch.job_id)
        t1 = clock()
        result = completion_of(batch)
        t2 = clock()
        s.on_decode_complete(result)
        t3 = clock()
        assert len(batch.active) == B
        samples.append(((t1 - t0) + (t3 - t2)) / 1000)
    return samples


def admission_cost(n: int, count: int) -> tuple[float, float]:
    """µs per submit(): queued behind n waiting requests, and admitted into free budget."""
    sink = NullSink()
    s, _ = scheduler(config(n + count, B), B)
    for i in range(n):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}"), sink)
    gc.collect()
    t0 = time.perf_counter_ns()
    for i in range(count):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}"), sink)
    queued = (time.perf_counter_ns() - t0) / count / 1000
    s2, _ = scheduler(config(0, count + 1), count + 1)
    gc.collect()
    t0 = time.perf_counter_ns()
    for i in range(count):
        s2.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}"), sink)
    admitted = (time.perf_counter_ns() - t0) / count / 1000
    return queued, admitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--sizes", default="256,4096,65536")
    args = parser.parse_args()
    MONITOR.configure(enabled=False)
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for n in sizes:
        samples = tick_cost(n, args.ticks)
        queued, admitted = admission_cost(n, 2000)
        samples.sort()
        rows.append((n, statistics.median(samples), samples[int(0.9 * len(samples))],
                     samples[int(0.99 * len(samples))], queued, admitted))
    base = rows[0][1]
    print(f"B{B} decode tick (build + submit + apply, no device/sampling), 8 tenants, monitors off")
    print(f"{'ready':>8} {'tick p50 µs':>12} {'p90 µs':>9} {'p99 µs':>9} {'vs first':>9} "
          f"{'µs/lane':>8} {'submit→Queue µs':>16} {'submit→Admit µs':>16}")
    for n, p50, p90, p99, queued, admitted in rows:
        print(f"{n:>8} {p50:>12.1f} {p90:>9.1f} {p99:>9.1f} {p50 / base:>8.2f}x {p50 / B:>8.1f} "
              f"{queued:>16.1f} {admitted:>16.1f}")
    print("targets: tick p50 <= 200 µs at 4096 ready; growth no worse than log(N); admission <= 20 µs")


if __name__ == "__main__":
    main()
