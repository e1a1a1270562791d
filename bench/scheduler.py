"""Host cost of the scheduling core: one B16 decode tick and admission, against queue depth and tenants.

A decode tick is what the host does per device step, excluding the device and sampling:
``step()`` (deadline sweep, admission pump, WRR, ``build_decode_batch`` with its host tensors
and KV reservation) + ``submitted()`` (job, KV and request transitions) +
``on_decode_complete()`` (per-lane checks, KV commits, request transitions, re-queueing). The
completion object itself — the device's output — is built outside the timed region.

Measured in CPU time (``time.thread_time``) with 256, 4096 and 65536 sequences ready across 8
tenants (weights 1..8), so the tick chooses 16 lanes out of N; growth must stay logarithmic in N
(heaps, no per-tick sort). Then 4096 ready on the same 8 tenants with 1 000 tenants configured, each of the
992 others having had work once before (one decode step, then done): the tick must not grow with tenants that
have no work (issue #20: ≤ 1.2× the 8-tenant figure). The two schedulers hold the same work in the same state
and are ticked in pairs in one process, so each pair makes the same choices (checked) under nearly the same
load; the ratio is the median of the per-pair ratios, over both orders of building the two (``tick_cost_pair``).
Until session 13 the idle tenants' steps ran among the 8 tenants' work, the two schedules were out of phase,
and a tick's cost varies with what it chooses: 500 ticks gave 1.04-1.14x from run to run (1.24x once under
load) where 3 000 gave 1.01-1.03x. Session 13, 6 runs per tree alternated, load 3.5: 971bcd6 1.018-1.027x,
0dcb57b 1.012-1.029x, with the tenant index compacted (``ReadyBucket.compact``) 1.006-1.020x; at 4 000
tenants 1.078-1.092x -> 1.050-1.057x. The calls per tick are the same at 8 and 1 000 tenants (cProfile; but
the rare sampled monitor checks); what is left is where the objects lie in memory (every function of the
tick a few per cent slower at 4 000 tenants, none walking more). Admission is ``submit()`` of one request on top of N already waiting
(Queue) and into a budget with room (Admit), the median of per-call CPU times (issue #20: ≤ 20 µs),
in two cases. *Idle* (``submit→Queue``/``submit→Admit``): no decode step measured yet, so the
``on_time`` policy's §5.2 prospect screen has no estimate and returns at once. *Production*
(``…(screen)``): the step and prefill timers have measured steps (STEP_S per B16 step, PREFILL_S per
prompt) and every request carries a deadline it meets, so the screen runs as it does on a serving
device — the device model, the request as a pending job, its place at the tail of the cached EDF lane
schedule. The issue's ≤ 20 µs target is judged on the production ``submit→Admit (screen)`` column.
``→Queue (screen)``'s median does not grow with the waiting requests: the admission-order estimate is
incremental (``on_time_order.AdmissionOrderIndex``; 52–74 µs median from 1 024 to 32 768 waiting, load 2–3). Its
mean does not either here, where every request has one shape (a newcomer joins the order's leading run of its
shape and no lane state is rebuilt: 47-49 µs mean from 1 024 to 16 384 waiting, load 3.5); with mixed shapes a
submit that lands before others rebuilds the lane states after it, and the mean grows with the queue (0.09 ms at
1 024 waiting, 0.8 ms at 16 384).
Monitors run at the production default of ``monitoring`` (on: one event in ``sample_every`` = 256
checked, counted not raised — README "Monitors"; the checks that walk every lane, the KV pool's and
jobs × lanes', at that rate scaled down by lanes / 64, ``KvLaneManager.whole_pool_drawn``, so their
cost is O(1) amortized and stays out of the p99), or as ``--monitors`` says (``on``: every event
checked, as in the tests). Figures, not a pass/fail test (DESIGN
principle 10).

``--profile-submit``: instead of the figures, where the production admitted submit's CPU goes — a CPU-time
(``thread_time``) cProfile of 3 000 ``submit→Admit (screen)`` calls, self time by function with calls per
submit (the rare O(lanes) pool checks left out, as they stay out of the median).

``--submit``: instead of the figures, the screened ``submit()`` (measured timers, a deadline every request meets)
as a matrix of JSON lines (``SUBMIT_CASES``): queued behind 256 and 4 096 waiting with as many KV lanes as the
profile's batch (``calculet-b1`` / ``-b16``: the admission queue's order binds the reported estimate, so a queued
submit pays for the order index and the overtaking term) and admitted into a budget with room, on B1 and B16, with
1, 8 and 1 000 configured tenants (8 sending) — issue #20: ≤ 20 µs median, queued as well as admitted, constant in
the queue's length and in the configured tenants. Each line names the tree it measured (``calculet.__file__``),
so two trees' runs can be interleaved by running this script with each tree's interpreter. Session 22, 6 runs
interleaved with 807bb1c, load 1.1-1.7, median of the runs' medians (807bb1c -> session 22): queued B1 256 waiting
19.2 -> 16.0 (1 tenant), 24.3 -> 18.6 (8), 382 -> 18.4 (1 000 configured: every configured tenant's overtaking
window was walked); B16 4 096 waiting 20.6 -> 16.9, 26.5 -> 20.2, 360 -> 20.3; admitted 12-16 -> 12-13 µs.

``--profile-tick``: instead of the figures, where the B16 tick's CPU goes at 4 096 ready on 8 tenants — a
CPU-time (``thread_time``) cProfile of 2 000 ticks (``step()`` + ``submitted()`` + ``on_decode_complete()``,
the completion objects built before profiling), self time by function with calls per tick.

    python bench/scheduler.py [--ticks N] [--sizes 256,4096,65536] [--profile-submit] [--profile-tick]
                              [--submit [--submit-count 2000] [--submit-cases SUBSTRING]]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import re
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
STEP_S = 0.02
"""Measured B16 decode step of the production admission case (the timers' input, not a wall time)."""
PREFILL_S = 0.004
"""Measured prefill of one PROMPT-token job in the production admission case."""
FAR_DEADLINE_MS = 10**9
"""The production case's deadline: every request meets it, so each is admitted at the schedule's tail."""


def tenants(count: int) -> list[dict[str, Any]]:
    """``count`` configured tenants; the work goes to the first 8 (weights 1..8)."""
    return [{"name": f"t{i}", "weight": float(i % 8 + 1), **({"api_key_sha256": f"{i:064x}"} if i else {})}
            for i in range(count)]


def config(waiting: int, sequences: int, configured: int = 8, batch: int = B) -> SchedulerConfig:
    return parse_config({
        "schema": "calculet-scheduler/v1", "tenants": tenants(configured),
        "admission": {"max_sequences": sequences, "max_waiting_requests": waiting + 10_000,
                      "max_waiting_prompt_tokens": 10**12},
        # setup runs the prefills first; the measured ticks see an empty prefill queue
        "queues": {"decode_weight": 1, "short_prefill_weight": 64},
        "batch": {"profiles": [batch], "select_thresholds": {batch: 1} if batch > 1 else {}},
    })


def scheduler(cfg: SchedulerConfig, lanes: int, batch: int = B) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    kv = KvLaneManager(lanes, MAX_SEQ, clock=clock)
    s = Scheduler(cfg, clock=clock, kv=kv, device_kv_tokens=lanes * (PROMPT + NEW), max_seq=MAX_SEQ)
    profiles = ProfileSet([ProfileSpec(batch, MAX_SEQ, LaneFill(7), True)], requested=[batch],
                          thresholds=cfg.batch.select_thresholds, multi_profile_residency=False)
    s.set_model(1, ModelAvailability.READY, profiles)
    return s, clock


def completion_of(batch: DecodeBatch) -> DecodeCompletion:
    lanes = tuple(LaneOutcome(b.lane, b.request_id, b.seq_id, b.generation, True, (b.position % 30000) + 1)
                  for b in batch.active)
    return DecodeCompletion(batch.job_id, batch.generation, True, lanes)


def ready_scheduler(n: int, configured: int = 8) -> Scheduler:
    """N sequences in DecodeReady (prefilled), spread over 8 tenants of ``configured``.

    Every other configured tenant has had work once, *before* the N arrive: one request each, prefilled, one
    decode step, done. So the 8 tenants' work meets the same scheduler state but for the idle tenants (their
    admission and WFQ entries; the virtual times only moved by a constant), and the two schedulers of the
    idle-tenant row choose the same tenants tick for tick (``tick_cost_pair`` checks it)."""
    s, _ = scheduler(config(0, n + B, configured), n + B)
    sink = NullSink()
    for i in range(8, configured):
        s.submit(InferenceRequest(PROMPT, 2, f"t{i}"), sink)
    prefill_all(s)
    while s.decode.ready_count(1):  # their one decode step each
        plan = s.step()
        s.submitted(plan.work.job_id)  # type: ignore[union-attr]
        s.on_decode_complete(completion_of(plan.work))  # type: ignore[arg-type]
    for command in s.take_commands():  # their KV lanes, released by the device (§9.2)
        s.confirm_release(command.lane, command.seq_id)
    assert len(s.registry) == 0 and s.kv.free_lanes == s.kv.lanes, "an idle tenant's request is still live"
    for i in range(n):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}"), sink)
    prefill_all(s)
    assert s.decode.ready_count(1) == n
    return s


def prefill_all(s: Scheduler) -> None:
    """Run every queued prefill (the decode steps the arbiter interleaves are put back unrun)."""
    while s.prefill.nonempty():
        plan = s.step()
        work: Any = plan.work
        if isinstance(work, DecodeBatch):
            s.submit_failed(work.job_id)
            continue
        s.submitted(work.job_id)
        s.on_prefill_complete(PrefillCompletion(work.job_id, work.generation, work.request_id, work.seq_id, True, 1))


def warm_scheduler(n: int, configured: int = 8) -> Scheduler:
    """``ready_scheduler`` after 50 warm-up ticks."""
    s = ready_scheduler(n, configured)
    for _ in range(50):
        one_tick(s)
    return s


def one_tick(s: Scheduler) -> tuple[float, DecodeBatch]:
    """CPU µs of one tick (build + submit + apply; the completion object is built outside), and its batch."""
    clock = time.thread_time_ns
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
    return ((t1 - t0) + (t3 - t2)) / 1000, batch


def tick_cost(n: int, ticks: int, configured: int = 8) -> list[float]:
    """CPU µs per tick, ``ticks`` ticks."""
    s = warm_scheduler(n, configured)
    gc.collect()
    return [one_tick(s)[0] for _ in range(ticks)]


def tick_cost_pair(n: int, ticks: int, configured: int) -> tuple[list[float], list[float], float]:
    """The 8-tenant and the ``configured``-tenant schedulers ticked in pairs, the pair's order alternating:
    both sample lists and the ratio — the geometric mean of two halves' medians of per-pair ratios, one half
    with the 8-tenant scheduler built first, the other with it built second.

    The two hold the same work in the same state (``ready_scheduler``), so the k-th tick of each chooses the
    same tenants' lanes — checked here — and the pair differs only by the idle tenants (module doc: why). The
    halves: the scheduler built second ticked 2-3 % slower whichever it was (8 or 1 000 tenants, in phase, 500
    pairs: 1.018-1.032x built 8 first, 0.994-1.001x built 1 000 first), where its objects are laid out in
    memory; the mean of the two cancels that."""
    a: list[float] = []
    b: list[float] = []
    halves = []
    for few_first in (True, False):
        if few_first:
            few, many = warm_scheduler(n), warm_scheduler(n, configured)
        else:
            many, few = warm_scheduler(n, configured), warm_scheduler(n)
        gc.collect()
        ratios = []
        for i in range(ticks // 2):
            if i % 2:
                tb, batch_b = one_tick(many)
                ta, batch_a = one_tick(few)
            else:
                ta, batch_a = one_tick(few)
                tb, batch_b = one_tick(many)
            assert [x.tenant for x in batch_a.active] == [x.tenant for x in batch_b.active], "out of phase"
            a.append(ta)
            b.append(tb)
            ratios.append(tb / ta)
        halves.append(statistics.median(ratios))
        del few, many
    return a, b, math.sqrt(halves[0] * halves[1])


def measured(s: Scheduler, batch: int = B) -> Scheduler:
    """``s`` after the engine has reported decode steps and prefills (as on a serving device): the on_time
    screen then has a device model and runs on every submit."""
    at = 0.0
    for _ in range(4):
        s.prefill_times.observe(PROMPT, PREFILL_S)
        s.step_times.prefill_ran(PREFILL_S)
        at += STEP_S + PREFILL_S
        s.step_times.observe(STEP_S, lanes=batch, compiled=batch, decoding=batch, now=at)
    assert s.on_time is not None and s.on_time.model() is not None
    return s


def admission_cost(n: int, count: int, screen: bool = False) -> tuple[float, float]:
    """Median CPU µs per submit(): queued behind n waiting requests, and admitted into free budget;
    ``screen``: with measured timers and a deadline, the production case (the on_time screen runs)."""
    sink = NullSink()
    clock = time.thread_time_ns
    deadline = FAR_DEADLINE_MS if screen else None
    ready = measured if screen else (lambda s: s)
    expected = {False: "queue", True: "admit"}

    def timed(s: Scheduler, admitted: bool) -> float:
        samples = []
        for i in range(count):
            request = InferenceRequest(PROMPT, NEW, f"t{i % 8}", deadline_ms=deadline)
            t0 = clock()
            out = s.submit(request, sink)
            samples.append((clock() - t0) / 1000)
            assert out.outcome.decision.value == expected[admitted], out.outcome
        return statistics.median(samples)

    s = ready(scheduler(config(n + count, B), B)[0])
    for i in range(n):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % 8}", deadline_ms=deadline), sink)
    gc.collect()
    queued = timed(s, False) if n >= B else float("nan")
    s2 = ready(scheduler(config(0, count + 1), count + 1)[0])
    gc.collect()
    return queued, timed(s2, True)


def submit_cost(batch: int, n: int, count: int, configured: int = 8, spread: int = 8,
                admitted: bool = False) -> float:
    """Median CPU µs of a production (screened) ``submit()`` on a B``batch`` device: queued behind ``n`` waiting
    requests with ``batch`` KV lanes (as ``calculet-b1``/``-b16``: the admission queue's order binds the estimate),
    or, ``admitted``, into a budget with room (``count`` + 1 lanes, nothing waiting). ``configured`` tenants, the
    work spread over the first ``spread`` of them (issue #20: constant in ``n`` and in tenants)."""
    sink = NullSink()
    clock = time.thread_time_ns
    lanes = count + 1 if admitted else batch
    s = measured(scheduler(config(n + count, lanes, configured, batch), lanes, batch)[0], batch)
    for i in range(0 if admitted else n):
        s.submit(InferenceRequest(PROMPT, NEW, f"t{i % spread}", deadline_ms=FAR_DEADLINE_MS), sink)
    requests = [InferenceRequest(PROMPT, NEW, f"t{i % spread}", deadline_ms=FAR_DEADLINE_MS) for i in range(count)]
    expected = "admit" if admitted else "queue"
    gc.collect()
    samples = []
    for request in requests:
        t0 = clock()
        out = s.submit(request, sink)
        samples.append((clock() - t0) / 1000)
        assert out.outcome.decision.value == expected, out.outcome
    return statistics.median(samples)


SUBMIT_CASES = tuple(
    (f"B{batch} {'admitted' if n is None else f'queued {n}w'} {label}", batch, n or 0, configured, sending, n is None)
    for batch in (1, 16) for n in (256, 4096, None) for label, configured, sending in
    (("1t", 1, 1), ("8t", 8, 8), ("1000t", 1000, 8)))
"""``--submit``'s matrix, rows (label, batch, waiting, configured tenants, tenants sending, admitted): queued behind 256
and 4 096 waiting and admitted, on B1 and B16, with 1 tenant, 8 (weights 1..8) and 1 000 configured of which the
same 8 send (issue #20: constant in the queue's length and in the configured tenants)."""


def submit_matrix(count: int, cases: str) -> None:
    """Print one JSON line per ``SUBMIT_CASES`` row (``cases``: a substring filter): the median CPU µs of a
    screened submit, with the tree measured (``calculet.__file__``), so runs of two trees interleave."""
    import json
    import calculet

    for label, batch, n, configured, spread, admitted in SUBMIT_CASES:
        if cases and cases not in label:
            continue
        median = submit_cost(batch, n, count, configured, spread, admitted)
        print(json.dumps({"case": label, "median_us": round(median, 2), "tree": calculet.__file__}), flush=True)


def profile_submit(count: int = 3000, rows: int = 30) -> None:
    """Print where ``submit→Admit (screen)`` spends its CPU: self time by function and calls per submit."""
    s = measured(scheduler(config(0, count + 1), count + 1)[0])
    s.kv.whole_pool_drawn = lambda: False  # type: ignore[method-assign]  # the rare O(lanes) checks: not per submit
    sink = NullSink()
    requests = [InferenceRequest(PROMPT, NEW, f"t{i % 8}", deadline_ms=FAR_DEADLINE_MS) for i in range(count)]
    gc.collect()
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    for request in requests:
        s.submit(request, sink)
    profile.disable()
    print_profile(profile, count, f"submit→Admit (screen), {count} submits", "submit", rows)


def profile_tick(n: int = 4096, count: int = 2000, rows: int = 35) -> None:
    """Print where a B16 decode tick spends its CPU at ``n`` ready on 8 tenants: self time by function and
    calls per tick (monitors as configured in ``main``)."""
    s = warm_scheduler(n)
    gc.collect()
    profile = cProfile.Profile(time.thread_time)
    for _ in range(count):
        profile.enable()
        batch: Any = s.step().work
        s.submitted(batch.job_id)
        profile.disable()
        result = completion_of(batch)  # the device's output: outside the tick, as in one_tick
        profile.enable()
        s.on_decode_complete(result)
        profile.disable()
    print_profile(profile, count, f"B{B} decode tick at {n} ready / 8 tenants, {count} ticks", "tick", rows)


def print_profile(profile: cProfile.Profile, count: int, title: str, unit: str, rows: int) -> None:
    """Self time by function of ``profile`` over ``count`` units of work, with calls per unit."""
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(tt for _cc, _nc, tt, _ct, _callers in stats.values())
    calls = sum(nc for _cc, nc, _tt, _ct, _callers in stats.values())
    print(f"{title} under cProfile (CPU): {calls / count:.1f} calls per {unit} (Python and C), "
          f"{1e6 * total / count:.0f} µs per {unit} profiled; self time by function")
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])
    for (path, _line, name), (_cc, nc, tt, _ct, _callers) in ranked[:rows]:
        where = re.sub(r" at 0x[0-9a-f]+", "", name) if path == "~" else f"{path.rsplit('/', 1)[-1]}:{name}"
        print(f"{100 * tt / total:6.1f}%  {nc / count:6.2f}/{unit}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--sizes", default="256,4096,65536")
    parser.add_argument("--tenants", type=int, default=1000, help="configured tenants of the idle-tenant row")
    parser.add_argument("--monitors", choices=("default", "on", "off"), default="default")
    parser.add_argument("--profile-submit", action="store_true",
                        help="profile the production admitted submit instead of measuring (issue #20)")
    parser.add_argument("--submit", action="store_true",
                        help="only the screened submit() matrix, B1/B16 queued/admitted (issue #20), JSON lines")
    parser.add_argument("--submit-count", type=int, default=2000)
    parser.add_argument("--submit-cases", default="", help="only the --submit rows whose label contains this")
    parser.add_argument("--profile-tick", action="store_true",
                        help="profile the B16 decode tick at 4096 ready / 8 tenants instead of measuring (issue #20)")
    args = parser.parse_args()
    if args.monitors == "default":
        monitoring = production_monitoring()
        MONITOR.configure(enabled=monitoring.invariants, mode="count", sample_every=monitoring.sample_every)
    else:
        MONITOR.configure(enabled=args.monitors == "on", mode="count", sample_every=1)
    if args.profile_submit:
        profile_submit()
        return
    if args.submit:
        submit_matrix(args.submit_count, args.submit_cases)
        return
    if args.profile_tick:
        profile_tick()
        return
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for n in sizes:
        samples = tick_cost(n, args.ticks)
        queued, admitted = admission_cost(n, 2000)
        queued_screen, admitted_screen = admission_cost(n, 2000, screen=True)
        samples.sort()
        rows.append((n, 8, statistics.median(samples), samples[int(0.9 * len(samples))],
                     samples[int(0.99 * len(samples))], queued, admitted, queued_screen, admitted_screen))
    few, many, tenant_ratio = tick_cost_pair(4096, args.ticks, args.tenants)
    few.sort()
    many.sort()
    rows.append((4096, 8, statistics.median(few), few[int(0.9 * len(few))], few[int(0.99 * len(few))],
                 *[float("nan")] * 4))
    rows.append((4096, args.tenants, statistics.median(many), many[int(0.9 * len(many))],
                 many[int(0.99 * len(many))], *[float("nan")] * 4))
    base = rows[0][2]
    ref = rows[-2][2]
    print(f"B{B} decode tick (build + submit + apply, no device/sampling), CPU µs; work on 8 tenants; "
          f"monitors {'on, 1 in ' + str(MONITOR.sample_every) if MONITOR.enabled else 'off'} ({args.monitors})")
    print(f"{'ready':>8} {'tenants':>8} {'tick p50':>9} {'p90':>8} {'p99':>8} {'vs first':>9} {'vs 4096/8':>10} "
          f"{'µs/lane':>8} {'submit→Queue':>13} {'submit→Admit':>13} {'→Queue (screen)':>16} {'→Admit (screen)':>16}")
    for n, configured, p50, p90, p99, queued, admitted, queued_screen, admitted_screen in rows:
        print(f"{n:>8} {configured:>8} {p50:>9.1f} {p90:>8.1f} {p99:>8.1f} {p50 / base:>8.2f}x {p50 / ref:>9.2f}x "
              f"{p50 / B:>8.1f} {queued:>13.1f} {admitted:>13.1f} {queued_screen:>16.1f} {admitted_screen:>16.1f}")
    print(f"the last two rows ticked in pairs, the same work in the same state: {args.tenants} configured tenants / 8 = "
          f"{tenant_ratio:.3f}x (median of per-pair ratios, geometric mean of both build orders)")
    print("targets (#20): tick p50 <= 200 µs at 4096 ready / 8 tenants, <= 1.2x that with 1000 configured tenants; "
          "growth no worse than log(N); submit() median <= 20 µs, judged on →Admit (screen): measured step, deadline, "
          "the on_time screen running (production)")


def production_monitoring() -> Any:
    """The production default of ``monitoring`` (the §15 defaults): whether, and how often, it checks."""
    from calculet.config import default_config

    return default_config().monitoring


if __name__ == "__main__":
    main()
