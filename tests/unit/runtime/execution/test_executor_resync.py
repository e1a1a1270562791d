"""DeviceExecutor.resync_engine_sequences: the §14 counter check across jobs run outside the executor.

Golden and warm-up jobs (§11 step 9) run on the device through the session's own HostDriver, not
through the executor, and advance the device's per-engine ``engine_sequence`` counters. The
executor must be told (``resync_engine_sequences``), may only be told while it has nothing in
flight, and must keep checking continuity from the next job on. The ModelManager is the one
caller and reaches it only through its engine port (``EnginePort.resync_engine_sequences``),
which the engine core forwards to that public call.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

from calculet.adapters.calrt import Anomaly
from calculet.adapters.sim import InjectedFault, FaultRule, SimCalRT, SimConfig, SimVirtualDevice, package_dir
from calculet.errors import DefinitionError
from calculet.machines.job import JobEngine
from calculet.runtime.engine.core import EngineCore
from calculet.runtime.models import capacity, generations, load, manager, operations, port, prepare, recovery, reports
from calculet.runtime.models import unload
from calculet.clock import FakeClock
from calculet.runtime.execution.executor import DeviceExecutor
from calculet.runtime.execution.inflight import InflightJob
from calculet.runtime.scheduling.prefill import PrefillWork
from calculet.runtime.execution.session import RuntimeSession
from tests.unit.runtime.runtime_support import make_config

PROMPT = (256, 67, 97, 108)


@dataclass
class Rig:
    device: SimVirtualDevice
    session: RuntimeSession
    executor: DeviceExecutor
    _next: int = 0

    def submit(self) -> InflightJob:
        """A whole-prompt prefill on PING for a fresh sequence, submitted through the executor."""
        self._next += 1
        n = self._next
        work = PrefillWork(job_id=n, generation=self.session.generation, request_id=n, seq_id=n, kv_lane=0,
                           start_position=0, tokens=len(PROMPT), prompt_tokens=len(PROMPT), last_chunk=True,
                           queue="short", request_job=n, lease=cast(Any, None), record=cast(Any, None))
        job = self.executor.submit(work, JobEngine.PING, PROMPT)
        assert isinstance(job, InflightJob), job
        return job

    def complete(self, job: InflightJob) -> list[tuple[Anomaly, str]]:
        """Wait for ``job`` and run the executor's checks on its result."""
        result = self.executor.wait(job)
        assert result is not None and result.ok, result
        taken, found = self.executor.complete(result)
        assert taken is job
        return found

    def run_outside(self) -> None:
        """§11 step 9's golden jobs: on the device (PING), but not through the executor."""
        self.session.check_golden()


@pytest.fixture
def rig() -> Iterator[Rig]:
    clock = FakeClock()
    device = SimCalRT(SimConfig(clock=clock)).create_virtual_device()
    config = make_config(batch={"profiles": [1]})
    session = RuntimeSession(device, package_dir("current"), config, generation=1).create()
    executor = DeviceExecutor(session, config.executor, clock=clock, job_timeout_s=5.0,
                              prefill_timeout_per_token_s=0.0)
    yield Rig(device, session, executor)
    device.close()


def _sequence_anomalies(found: list[tuple[Anomaly, str]]) -> list[str]:
    return [text for kind, text in found if kind is Anomaly.COUNTERS and "engine_sequence" in text]


@pytest.mark.req("R14.6")
def test_jobs_run_outside_the_executor_look_like_a_counter_anomaly_without_a_resync(rig: Rig) -> None:
    """Why the call exists: the executor's next result no longer follows the one it last saw."""
    assert rig.complete(rig.submit()) == []
    rig.run_outside()
    assert _sequence_anomalies(rig.complete(rig.submit()))


@pytest.mark.req("R14.6")
def test_after_a_resync_the_next_job_verifies_and_continuity_is_checked_again(rig: Rig) -> None:
    assert rig.complete(rig.submit()) == []
    rig.run_outside()
    rig.executor.resync_engine_sequences()
    assert rig.complete(rig.submit()) == []
    assert rig.complete(rig.submit()) == [], "the re-anchored expectation is followed job by job"
    rig.run_outside()  # no resync this time: the check is on again, not switched off
    assert _sequence_anomalies(rig.complete(rig.submit()))
    assert rig.executor.statistics().anomalies == {Anomaly.COUNTERS.value: 1}


@pytest.mark.req("R14.6")
def test_a_resync_with_a_job_in_flight_is_refused_and_changes_nothing(rig: Rig) -> None:
    assert rig.complete(rig.submit()) == []
    rig.device.faults.add(FaultRule(InjectedFault.BAD_COUNTERS))
    job = rig.submit()
    with pytest.raises(DefinitionError, match=r"1 job\(s\) in flight") as refused:
        rig.executor.resync_engine_sequences()
    assert refused.value.context == {"inflight": 1} and refused.value.http_status == 500
    assert rig.executor.inflight() == 1
    # the expectation survived the refused call: the in-flight job's bad counter is still caught
    assert _sequence_anomalies(rig.complete(job))
    rig.executor.resync_engine_sequences()  # idle now: allowed
    assert rig.complete(rig.submit()) == []


def test_a_resync_keeps_the_bound_kv_sequences(rig: Rig) -> None:
    """A co-resident generation may still serve from its sequences while the new one warms up."""
    assert rig.complete(rig.submit()) == []
    bound = rig.executor.statistics().sequences_bound
    assert bound == 1
    rig.executor.resync_engine_sequences()
    assert rig.executor.statistics().sequences_bound == bound


MODELS_MODULES = (capacity, generations, load, manager, operations, port, prepare, recovery, reports, unload)


def test_the_model_manager_reaches_no_private_executor_field() -> None:
    """The models package resynchronises through the engine port and reads nothing private of the
    engine or the executor; the engine core forwards the call to the executor's public method."""
    for module in MODELS_MODULES:
        tree = ast.parse(inspect.getsource(module))
        private = sorted({f"{ast.unparse(node.value)}.{node.attr}" for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                          and not node.attr.startswith("__")
                          and any(word in ast.unparse(node.value) for word in ("executor", "engine", "core"))})
        assert private == [], module.__name__
    calls = {ast.unparse(node.func) for node in ast.walk(ast.parse(inspect.getsource(load)))
             if isinstance(node, ast.Call)}
    assert "engine.resync_engine_sequences" in calls
    forwarded = {ast.unparse(node.func) for node in ast.walk(ast.parse(inspect.getsource(EngineCore)))
                 if isinstance(node, ast.Call)}
    assert "self.executor.resync_engine_sequences" in forwarded

def test_expired_reads_the_executors_clock_only_with_a_job_in_flight(rig: Rig) -> None:
    """Issue #20: ``expired()`` without ``now`` is the executor's clock; with nothing in flight it is empty without
    reading the clock. A job past its Wait deadline is marked timed out once, given ``now`` or not."""
    clock = rig.executor._clock
    assert isinstance(clock, FakeClock)
    reads = 0
    now = clock.now

    def counted() -> float:
        nonlocal reads
        reads += 1
        return now()

    clock.now = counted  # type: ignore[method-assign]
    assert rig.executor.expired() == [] and reads == 0  # nothing in flight: no clock read
    job = rig.submit()
    assert rig.executor.expired() == [] and reads >= 1  # in flight, before its deadline (5 s)
    assert rig.executor.expired(job.deadline - 1e-6) == []
    clock.set(job.deadline)
    assert rig.executor.expired() == [job] and job.timed_out
    assert rig.executor.expired() == [] and rig.executor.expired(job.deadline + 1) == []  # marked once
