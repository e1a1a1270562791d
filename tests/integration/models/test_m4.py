"""§19 M4, multi-model lifecycle, on the simulated NPU (simulated evidence only — R19.13–R19.17
are [hardware] items; these tests are their software gates).

* 100 load/unload cycles: after every unload the device memory, calbins, KvManagers, buffers, KV
  lanes, host threads and open files (``/proc/self/fd``) are back at their empty baseline, and
  after every load at the one-model baseline; each loaded generation passes golden and serves.
* A model-switching soak in virtual time: a Poisson client stream at a low, realistic
  utilisation on the reference cost model (40 ms B1 decode steps), a switch every few virtual
  minutes — a load of the other package, or a one-call rollback — with requests in flight on the
  old generation when it begins and requests held for the new one while it runs. No request ever
  receives a token from another generation (provenance of every token), every request ends once
  with exactly its tokens, and the device is back at one model's footprint after every switch.
  The 8-hour run is marked slow; a 30-minute one runs in the default suite.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from typing import Any

import pytest

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode
from calculet.adapters.sim.model import pseudo_continuation
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.models.operations import OperationHandle
from calculet.runtime.request import RequestOutcome
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.models.support import (
    ALIAS,
    Client,
    ModelsEnv,
    Rig,
    assert_counters_consistent,
    assert_isolated,
    make_rig,
    open_fds,
    reference_tokens,
    thread_count,
)


def _resources(rig: Rig) -> tuple[Any, ...]:
    device = rig.device_stats()
    core = rig.driver.core
    return (device.memory.used_bytes, device.calbins, device.kv_managers, device.buffers, device.buffers_bound,
            device.inflight, core.kv.free_lanes, core.executor.statistics().sequences_bound,
            core.session.statistics().live_sequences, thread_count(), open_fds())


@pytest.mark.req("R19.13", "R19.15", "R18.15", "R12.9", "R16.6")
def test_a_hundred_load_unload_cycles_return_every_resource_to_its_baseline(env: ModelsEnv) -> None:
    """100 unload/load cycles alternating two signed packages (simulated evidence for M4): device
    memory, calbins, KvManagers, buffers, KV lanes, bound sequences, threads and open files are
    back at the empty baseline after each unload and at the one-model baseline after each load;
    every load verifies, passes golden and serves its own model's tokens."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    rig = make_rig(env.config(a))
    client = Client(rig)
    loaded = _resources(rig)
    rig.models.unload(ALIAS)
    empty = _resources(rig)
    assert empty[:6] == (0, 0, 0, 0, 0, 0)
    started = time.perf_counter()
    for cycle in range(100):
        package = b if cycle % 2 == 0 else a
        report = rig.models.load(ALIAS, package)
        assert report.ok and report.golden.startswith("passed")
        rid = client.submit(4)
        rig.driver.run_until_idle()
        assert client.tokens(rid) == reference_tokens(package, 4) and client.generation_of(rid) == report.generation
        assert_counters_consistent(rig)
        assert _resources(rig) == loaded, (cycle, _resources(rig), loaded)
        unload = rig.models.unload(ALIAS)
        assert unload.state == "unloaded" and not unload.problems
        assert _resources(rig) == empty, (cycle, _resources(rig), empty)
    elapsed = time.perf_counter() - started
    stats = rig.models.statistics()
    assert stats.loads == 101 and stats.unloads == 101 and stats.escalations == 0 and stats.load_failures == {}
    assert len(rig.models.status().generations) <= 33, "the generation history is bounded"
    assert_isolated(rig.provenance)
    print(f"100 load/unload cycles: {elapsed:.2f} s real time")
    rig.driver.stop()


@pytest.mark.req("R19.15", "R3.4")
def test_load_unload_cycles_on_the_threaded_engine_leak_no_thread_or_file(env: ModelsEnv) -> None:
    """The same cycle on the real-time threaded engine, driven from another thread: the engine's
    two threads (actor, completion) are the only ones, before and after every cycle, and no file
    handle is left open; one physical VirtualDevice the whole time."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    runtime = SimCalRT(SimConfig(time_mode=TimeMode.REAL))
    engine = ThreadedEngine(env.config(a), runtime, options=EngineOptions(monitor_mode=None))
    engine.start()
    threads, fds = thread_count(), open_fds()
    for cycle in range(20):
        engine.models.unload(ALIAS, timeout=30)
        report = engine.models.load(ALIAS, b if cycle % 2 == 0 else a, timeout=30)
        assert report.ok
        stream = StreamWriter()
        engine.submit(GenerateRequest((256, 1, 2), 3, sampling=SamplingParams(ignore_eos=True)), stream)
        assert stream.result(30).outcome.state == "completed"
        assert (thread_count(), open_fds()) == (threads, fds)
        assert runtime.statistics().live_devices == 1
    engine.stop(drain_timeout_s=30)
    assert runtime.statistics().live_devices == 0


# ---------------------------------------------------------------------------------------------
# the model-switching soak
# ---------------------------------------------------------------------------------------------


@dataclass
class _Sink:
    prompt: tuple[int, ...]
    max_new: int
    tokens: list[int] = field(default_factory=list)
    outcomes: list[RequestOutcome] = field(default_factory=list)

    def token(self, request_id: int, token: int) -> None:
        self.tokens.append(token)

    def close(self, outcome: RequestOutcome) -> None:
        self.outcomes.append(outcome)

    def expected(self) -> list[int]:
        return pseudo_continuation(self.prompt, self.max_new)


def soak(env: ModelsEnv, *, hours: float, switch_every_s: float, rate_per_s: float, seed: int) -> dict[str, Any]:
    """Run the switching soak; return its figures (virtual/real time, counts)."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    options = EngineOptions(verify_golden=False, warmup=True, monitor_mode=None, job_timeout_s=30.0)
    config = env.config(a, admission={"max_sequences": 8, "max_waiting_requests": 256},
                        batch={"profiles": [1]})
    rig = make_rig(config, numerics=False, options=options, cost=CostModel.reference())
    driver, models = rig.driver, rig.models
    rng = random.Random(seed)
    end = hours * 3600.0
    sinks: dict[int, _Sink] = {}
    loaded_memory = rig.device_stats().memory.used_bytes
    pending: OperationHandle | None = None
    reports: list[Any] = []
    pinned_at_switch: list[int] = []
    held_during_switch = 0
    switches = 0
    next_arrival = rng.expovariate(rate_per_s)
    next_switch = switch_every_s
    current_package = a
    started = time.perf_counter()

    def arrive() -> None:
        nonlocal held_during_switch
        length = rng.randint(2, 40)
        sink = _Sink(tuple([256] + [rng.randrange(256) for _ in range(length)]), rng.randint(1, 24))
        submission = driver.submit(GenerateRequest(sink.prompt, sink.max_new,
                                                   sampling=SamplingParams(ignore_eos=True)), sink)
        assert not submission.outcome.rejected, submission
        if pending is not None:
            held_during_switch += 1
        sinks[submission.request_id] = sink
        if len(sinks) % 16 == 0:
            assert_counters_consistent(rig)

    def settle() -> None:
        nonlocal pending
        if pending is not None and pending.done():
            report = pending.result()
            assert report.ok and report.downtime_s is not None, report
            assert rig.device_stats().memory.used_bytes == loaded_memory
            assert_counters_consistent(rig)
            reports.append(report)
            pending = None

    while True:
        settle()
        if next_arrival >= end and next_switch >= end:
            break
        if next_switch <= next_arrival:
            driver.run_until(next_switch)
            settle()
            if pending is None:
                switches += 1
                for _ in range(3):  # a small burst, so the old generation has requests in flight
                    arrive()
                driver.advance(0.05)
                status = models.status()
                pinned_at_switch.append(status.generation(status.current).active_requests
                                        if status.current is not None else 0)
                if switches % 4 == 0:
                    pending = models.begin_rollback(ALIAS)
                    current_package = a if current_package == b else b
                else:
                    current_package = b if current_package == a else a
                    pending = models.begin_load(ALIAS, current_package)
            next_switch += switch_every_s
            continue
        driver.run_until(next_arrival)
        arrive()
        next_arrival += rng.expovariate(rate_per_s)
    driver.run_until(end)
    driver.run_until_idle()
    settle()
    assert pending is None
    real = time.perf_counter() - started
    for rid, sink in sinks.items():
        assert len(sink.outcomes) == 1, (rid, sink.outcomes)
        outcome = sink.outcomes[0]
        assert outcome.state == "completed", (rid, outcome)
        assert sink.tokens == sink.expected(), rid
    assert_isolated(rig.provenance)
    gens_per_request: dict[int, set[int]] = {}
    for p in rig.provenance:
        gens_per_request.setdefault(p.request_id, set()).add(p.request_generation)
    assert all(len(g) == 1 for g in gens_per_request.values())
    core = driver.core
    assert core.scheduler.idle() and core.executor.inflight() == 0
    assert rig.device_stats().memory.used_bytes == loaded_memory and rig.device_stats().calbins == 1
    stats = models.statistics()
    figures = {"virtual_s": driver.clock.now(), "real_s": real, "requests": len(sinks), "switches": switches,
               "rollbacks": stats.rollbacks, "generations": len({g for s in gens_per_request.values() for g in s}),
               "pinned_at_switch": sum(pinned_at_switch), "held_during_switch": held_during_switch,
               "downtime_max_s": stats.downtime.max_s, "tokens": len(rig.provenance)}
    driver.stop()
    return figures


@pytest.mark.req("R19.14", "R19.16", "R19.17", "R10.3", "R11.11", "R13.1.2")
def test_a_thirty_minute_model_switching_soak_in_virtual_time(env: ModelsEnv) -> None:
    """The default-suite soak: 30 virtual minutes, a switch every 2 minutes (every 4th a rollback)."""
    figures = soak(env, hours=0.5, switch_every_s=120.0, rate_per_s=0.5, seed=1)
    assert figures["switches"] == 14 and figures["rollbacks"] == 3
    assert figures["pinned_at_switch"] >= figures["switches"] and figures["held_during_switch"] > 0
    assert figures["generations"] == 15
    print(f"30 min soak: {figures}")


@pytest.mark.slow
@pytest.mark.req("R19.14", "R19.16", "R19.17", "R10.3", "R11.11", "R13.1.2")
def test_an_eight_hour_model_switching_soak_in_virtual_time(env: ModelsEnv) -> None:
    """M4's 8-hour model-switching soak (simulated): a switch every 5 virtual minutes."""
    figures = soak(env, hours=8.0, switch_every_s=300.0, rate_per_s=0.5, seed=8)
    assert figures["switches"] == 95 and figures["pinned_at_switch"] >= 95 and figures["held_during_switch"] > 0
    print(f"8 h soak: {figures}")



