"""The ModelManager on the real-time, threaded Engine: thread-safe, blocking, one lifecycle at a time.

The engine's actor owns every state change; ``engine.models.load/unload/rollback/status`` are
called from other threads (as the admin API will) and block on the actor's reply. Nothing
sleeps: threads meet on events, and the simulated NPU runs in real time with the tiny cost model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from calculet.adapters.calrt import MemoryFootprint
from calculet.adapters.sim import SimCalRT, SimConfig, TimeMode
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions, TokenProvenance
from calculet.runtime.models.capacity import CapacityPlan, CapacityPlanner, ChipMemory, ResidentModel
from calculet.runtime.models.reports import LoadStep
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.models.support import (
    ALIAS,
    ModelsEnv,
    assert_isolated,
    reference_tokens,
    request,
)

WAIT = 30.0


def _engine(env: ModelsEnv, package: Path, *, planner: CapacityPlanner | None = None
            ) -> tuple[ThreadedEngine, list[TokenProvenance]]:
    provenance: list[TokenProvenance] = []
    lock = threading.Lock()

    def record(p: TokenProvenance) -> None:
        with lock:
            provenance.append(p)

    runtime = SimCalRT(SimConfig(time_mode=TimeMode.REAL))
    engine = ThreadedEngine(env.config(package), runtime, options=EngineOptions(monitor_mode=None), planner=planner,
                    provenance=record)
    engine.start()
    return engine, provenance


def _run(target: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = target(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


def _join(thread: threading.Thread, box: dict[str, Any]) -> Any:
    thread.join(WAIT)
    assert not thread.is_alive(), "the operation did not finish"
    if "error" in box:
        raise box["error"]
    return box["result"]


@pytest.mark.req("R10.4", "R10.3", "R11.10", "R19.16", "R19.17", "R3.1")
def test_loads_and_a_rollback_from_other_threads_while_clients_stream_and_readers_watch(env: ModelsEnv) -> None:
    """Started from the configuration (no package argument), the engine serves client threads
    while another thread replaces the model and rolls it back. Reader threads watching ``status()``
    never see a torn alias: the current generation is always a Ready, published one whose sha256 is
    the one that generation was loaded with. Every token comes from its request's generation."""
    a, b = env.package("model-a"), env.package("model-b", seed=7)
    engine, provenance = _engine(env, a)
    sha = {str(a): engine.models.status().generations[0].calbin_sha256}
    stop = threading.Event()
    seen: list[tuple[int, str]] = []
    problems: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            status = engine.models.status(timeout=WAIT)
            current = status.current
            if current is None:
                continue
            gen = status.generation(current)
            if gen.state != "ready" or not gen.published:
                problems.append(f"alias -> generation {current} in state {gen.state}")
            seen.append((current, gen.calbin_sha256))

    streams: list[StreamWriter] = []
    streams_lock = threading.Lock()

    def client(n: int) -> None:
        for _ in range(n):
            stream = StreamWriter()
            engine.submit(request(6), stream, timeout=WAIT)
            with streams_lock:
                streams.append(stream)
            stream.result(WAIT)

    readers = [threading.Thread(target=reader, daemon=True) for _ in range(2)]
    clients = [threading.Thread(target=client, args=(6,), daemon=True) for _ in range(3)]
    for t in readers + clients:
        t.start()
    load_thread, load_box = _run(engine.models.load, ALIAS, b)
    report = _join(load_thread, load_box)
    sha[str(b)] = report.calbin_sha256
    back = engine.models.rollback(ALIAS, timeout=WAIT)
    for t in clients:
        t.join(WAIT)
    stop.set()
    for t in readers:
        t.join(WAIT)
    assert report.ok and back.ok and back.calbin_sha256 == sha[str(a)] and back.generation == 3
    assert not problems and seen, problems[:3]
    by_gen: dict[int, set[str]] = {}
    for gen_id, digest in seen:
        by_gen.setdefault(gen_id, set()).add(digest)
    assert all(len(d) == 1 for d in by_gen.values()), by_gen
    expected = {1: reference_tokens(a), 2: reference_tokens(b), 3: reference_tokens(a)}
    for stream in streams:
        result = stream.result(WAIT)
        if result.outcome.state == "completed":
            gens = {p.request_generation for p in provenance if p.request_id == result.outcome.request_id}
            assert len(gens) == 1 and result.raw_tokens == expected[gens.pop()]
        else:
            assert result.outcome.state == "failed" and result.outcome.http_status == 503, result.outcome
    assert sum(s.result(WAIT).outcome.state == "completed" for s in streams) >= 12
    assert_isolated(provenance)
    final = engine.stop(drain_timeout_s=WAIT)
    assert final.live_requests == 0


class _BlockingPlanner(CapacityPlanner):
    """Blocks the ``block_on``-th plan until released (a slow capacity plan, R11.4)."""

    def __init__(self, block_on: int) -> None:
        self.block_on = block_on
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def plan(self, footprint: MemoryFootprint, pool_bytes: int, chips: Sequence[ChipMemory],
             resident: Sequence[ResidentModel]) -> CapacityPlan:
        self.calls += 1
        if self.calls == self.block_on:
            self.entered.set()
            assert self.release.wait(WAIT)
        return super().plan(footprint, pool_bytes, chips, resident)


@pytest.mark.req("R11.4", "R11.5")
def test_the_capacity_plan_runs_outside_the_lifecycle_lock(env: ModelsEnv) -> None:
    """While one load is blocked in its capacity plan (step 4), the lifecycle lock is free:
    ``status()`` answers and a second load runs all of steps 5–11 to the end. The first load then
    continues and replaces the second one."""
    a, b, c = env.package("model-a"), env.package("model-b", seed=7), env.package("model-c", seed=11)
    planner = _BlockingPlanner(block_on=2)  # 1: bring-up, 2: the load of b
    engine, _ = _engine(env, a, planner=planner)
    slow_thread, slow_box = _run(engine.models.load, ALIAS, b)
    assert planner.entered.wait(WAIT)
    assert not engine.models.lifecycle_busy()
    assert engine.models.status(timeout=WAIT).current == 1
    fast = engine.models.load(ALIAS, c, timeout=WAIT)
    assert fast.ok and fast.replaced == 1 and engine.models.status(timeout=WAIT).current == fast.generation
    planner.release.set()
    slow = _join(slow_thread, slow_box)
    assert slow.ok and slow.replaced == fast.generation and slow.generation == 2 and fast.generation == 3
    engine.stop(drain_timeout_s=WAIT)


@pytest.mark.req("R11.5")
def test_concurrent_lifecycle_operations_serialise_on_the_lock(env: ModelsEnv) -> None:
    """Three threads load, load and unload at once. Steps 1–4 may overlap (they run on the callers'
    threads), but from step 5 on each operation runs alone: the operations seen at every later step
    form one contiguous run each (the actor's operation queue is the lifecycle lock)."""
    a, b, c = env.package("model-a"), env.package("model-b", seed=7), env.package("model-c", seed=11)
    engine, _ = _engine(env, a)
    owners: list[str] = []

    def hook(step: LoadStep | object, gen: int) -> None:
        if isinstance(step, LoadStep) and step < LoadStep.LOCK:
            return  # steps 1-4: no lock, the caller's thread
        operation = engine.models.status().operation  # on the actor: read inline
        assert operation is not None
        owners.append(operation.split(":")[0])

    engine.models.step_hook = hook
    go = threading.Event()

    def after_go(fn: Any, *args: Any) -> Any:
        assert go.wait(WAIT)
        return fn(*args)

    threads = [_run(after_go, engine.models.load, ALIAS, b), _run(after_go, engine.models.load, ALIAS, c),
               _run(after_go, engine.models.unload, ALIAS)]
    go.set()
    outcomes = []
    for thread, box in threads:
        try:
            outcomes.append(_join(thread, box))
        except Exception as exc:  # noqa: BLE001 - an unload queued after everything may find nothing to unload
            outcomes.append(exc)
    runs = [o for i, o in enumerate(owners) if i == 0 or owners[i - 1] != o]
    assert len(runs) == len(set(runs)) == 3, runs
    assert sum(1 for o in outcomes if not isinstance(o, Exception)) == 3, outcomes
    engine.stop(drain_timeout_s=WAIT)
