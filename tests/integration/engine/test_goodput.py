"""Issue #13 on the real engine path in virtual time: the simulated NPU with the reference cost model.

The decisions of ``batch.deadline_order: on_time`` (§5.2 admission that never accepts what cannot
finish, §7.2 overload-safe ordering, the ITL cap of the latency SLOs) are checked through the
EngineDriver — scheduler, executor, sampler and the simulated device — on a FakeClock: no sleep,
no wall-clock assertion. Figures (goodput vs load) come from ``python -m calculet.bench``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from calculet.adapters.sim import SimCalRT, SimConfig, package_dir
from calculet.adapters.sim.cost import CostModel
from calculet.clock import FakeClock
from calculet.machines.request import FinishReason
from calculet.runtime.engine.driver import EngineDriver
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.request import RequestOutcome
from calculet.runtime.scheduling.finish_estimate import moore_hodgson
from tests.integration.engine.support import engine_config

REFERENCE = CostModel.reference()
B1_STEP_S = REFERENCE.decode_s(1)


@dataclass
class TimedSink:
    """Records each token's virtual arrival time and the outcome."""

    clock: FakeClock
    times: list[float] = field(default_factory=list)
    outcome: RequestOutcome | None = None

    def token(self, request_id: int, token: int) -> None:
        self.times.append(self.clock.now())

    def close(self, outcome: RequestOutcome) -> None:
        self.outcome = outcome


def reference_driver(order: str = "on_time", **sections: Any) -> tuple[EngineDriver, FakeClock]:
    clock = FakeClock()
    runtime = SimCalRT(SimConfig(clock=clock, numerics=False, cost=REFERENCE))
    config = engine_config(batch={"deadline_order": order}, **sections)
    driver = EngineDriver(config, runtime, package_dir("current"), clock=clock,  # type: ignore[arg-type]
                          options=EngineOptions(verify_golden=False, monitor_mode=None))
    return driver, clock


def burst(driver: EngineDriver, clock: FakeClock, lengths: Sequence[int], deadlines_ms: Sequence[int],
          prompt: int = 12) -> list[TimedSink]:
    sinks = []
    start = clock.now()
    for new, deadline in zip(lengths, deadlines_ms):
        sink = TimedSink(clock)
        request = GenerateRequest(tuple(range(1, prompt + 1)), new, deadline_ms=deadline,
                                  sampling=SamplingParams(ignore_eos=True))
        driver.submit(request, sink)
        sinks.append(sink)
    assert clock.now() == start
    driver.run_until_idle()
    return sinks


def on_time(sinks: Sequence[TimedSink]) -> int:
    return sum(s.outcome is not None and s.outcome.state == "completed" for s in sinks)


def _burst_16x32(order: str) -> list[TimedSink]:
    driver, clock = reference_driver(order)
    sinks = burst(driver, clock, [32] * 16, [20_000] * 16)
    driver.stop()
    return sinks


@pytest.mark.req("R5.2.2", "R5.2.4", "R7.2.2")
def test_the_16_by_32_burst_finishes_14_on_time_and_throws_nothing_away():
    """Issue #13: 16 × 32 tokens, deadline 20 s, B1, reference cost. ``at_risk`` finished 1 of 16."""
    sinks = _burst_16x32("on_time")
    assert on_time(sinks) >= 14
    for sink in sinks:
        outcome = sink.outcome
        assert outcome is not None
        if outcome.state == "completed":
            assert sink.times[-1] <= 20.0 + 1e-9
            continue
        # rejected at admission or shed before decoding: never more than a quarter of its tokens
        assert outcome.finish_reason in (FinishReason.REJECTED, FinishReason.DEADLINE), outcome
        assert outcome.generated_tokens <= 32 // 4, outcome


def test_the_old_orders_on_the_same_burst_for_comparison():
    """The same burst under ``at_risk`` and ``strict`` (equal deadlines: both rotate): 3 and 4 of 16
    on time here, the rest expired after 29-31 of their 32 tokens — the waste on_time avoids."""
    for order in ("at_risk", "strict"):
        sinks = _burst_16x32(order)
        assert on_time(sinks) <= 4
        assert all(s.outcome is not None and s.outcome.generated_tokens > 24 for s in sinks)


def _random_burst(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    n = rng.randint(6, 20)
    lengths = [rng.choice((4, 8, 16, 24, 32, 48, 64)) for _ in range(n)]
    deadlines = [rng.randint(2_000, 30_000) for _ in range(n)]
    return lengths, deadlines


def _optimum(lengths: Sequence[int], deadlines_ms: Sequence[int], prompt: int = 12) -> int:
    work = [REFERENCE.prefill_s(prompt) + (n - 1) * B1_STEP_S for n in lengths]
    kept, _ = moore_hodgson(work, [d / 1000 for d in deadlines_ms])
    return len(kept)


def _check_seed(seed: int) -> None:
    lengths, deadlines = _random_burst(seed)
    driver, clock = reference_driver()
    sinks = burst(driver, clock, lengths, deadlines)
    driver.stop()
    best = _optimum(lengths, deadlines)
    assert on_time(sinks) >= 0.9 * best, (seed, on_time(sinks), best)
    for sink in sinks:
        assert sink.outcome is not None
        if sink.outcome.state == "completed":
            assert sink.times[-1] <= clock.now()


@pytest.mark.req("R5.2.2", "R7.2.2")
@pytest.mark.parametrize("seed", range(10))
def test_random_b1_bursts_reach_nine_tenths_of_the_moore_hodgson_optimum(seed: int):
    _check_seed(seed)


@pytest.mark.req("R5.2.2", "R7.2.2", "R7.2.3")
def test_a_sequence_queued_under_rotation_is_not_starved_once_decoding_goes_by_deadline():
    """Seed 55 of the 100 (7 requests, optimum 7): the first request was decoded once under rotation
    and queued again at +inf priority before the plan turned decoding deadline-first; every later
    entry, keyed by its deadline, went ahead of it, and it waited 7.8 s with 8 s of slack until it
    was shed (6 of 7). Turning the order on re-keys what is queued (DecodeScheduler.order_by_deadline)."""
    _check_seed(55)


@pytest.mark.slow
@pytest.mark.req("R5.2.2", "R7.2.2")
@pytest.mark.parametrize("seed", range(10, 110))
def test_random_b1_bursts_reach_nine_tenths_of_the_optimum_on_100_seeds(seed: int):
    """Seeds 82 and 107 were 7 of 8 and 8 of 9 while an at-risk request's prefill waited behind the
    §6 WRR order; with its prefill served deadline-first (issue #13) both reach the optimum."""
    _check_seed(seed)


@pytest.mark.req("R5.2.2", "R7.2.2")
def test_the_itl_target_caps_the_decode_set_and_every_admitted_stream_keeps_it():
    """16 concurrent streams, ITL target 200 ms, B1 reference cost (42.5 ms a step): about 4 decode."""
    driver, clock = reference_driver(admission={"itl_target_ms": 200})
    sinks = burst(driver, clock, [24] * 16, [120_000] * 16)
    stats = driver.core.scheduler.statistics()
    driver.stop()
    assert stats.on_time is not None and stats.on_time.decode_cap in (4, 5)
    gaps = sorted(b - a for s in sinks for a, b in zip(s.times, s.times[1:]))
    assert gaps and gaps[int(0.99 * (len(gaps) - 1))] <= 0.200 + 1e-9
    for sink in sinks:
        assert sink.outcome is not None
        if sink.outcome.generated_tokens:  # admitted into decoding: never failed afterwards
            assert sink.outcome.state == "completed", sink.outcome
    assert on_time(sinks) == 16


@pytest.mark.req("R5.2.2", "R7.2.3")
@pytest.mark.parametrize("prompt", [12, 30, 48])
def test_16_streams_x_32_tokens_every_stream_keeps_its_own_itl_p99_within_200ms(prompt: int):
    """Issue #13 "What it must show", through the engine in virtual time: 16 streaming requests × 32
    tokens, ITL target 200 ms, B1 reference cost. Each admitted stream's own ITL P99 (not the pooled
    one) within the target — before the ITL prefill gate the worst stream's was 209 ms with 30-token
    prompts (two newcomers prefilled in one rotation) —, none failed, the device ≥ 90 % busy."""
    driver, clock = reference_driver(admission={"itl_target_ms": 200})
    sinks = burst(driver, clock, [32] * 16, [120_000] * 16, prompt=prompt)
    stats = driver.core.scheduler.statistics()
    driver.stop()
    for sink in sinks:
        assert sink.outcome is not None and sink.outcome.state == "completed", sink.outcome
        gaps = [b - a for a, b in zip(sink.times, sink.times[1:])]
        assert len(gaps) == 31 and max(gaps) <= 0.200 + 1e-9, max(gaps)  # its longest gap, so its P99 too
    first = min(s.times[0] for s in sinks)
    end = max(s.times[-1] for s in sinks)
    busy = stats.decode.batches * B1_STEP_S + 16 * REFERENCE.prefill_s(prompt)
    assert busy >= 0.9 * (end - first + REFERENCE.prefill_s(prompt))
