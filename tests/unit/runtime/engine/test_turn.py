"""One turn of the real-time actor (issue #20): :meth:`EngineCore.turn` dispatches, schedules and applies the results a
device that completes at submit (the null device) already has, under one host-time sample.

Mutants caught: the turn without its own collect after scheduling (the job's result is left on the device for the
completion thread: the turn answers False with a job in flight), and a second accounting for the results (two
ticks counted per turn, as before 5425453).
"""

from __future__ import annotations

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import engine_config, request


def test_a_turn_applies_the_results_the_null_device_already_has_under_one_host_time_sample() -> None:
    engine = ThreadedEngine(engine_config(), SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                            package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None))
    core = engine._core  # noqa: SLF001 - driven on this thread: the actor is never started
    core.chain_ready_s = 0.0  # no chaining inside the schedule: each job's result is the turn's own collect
    stream = StreamWriter()
    core.submit(request(0, 4), stream)
    applied = []
    try:
        for _ in range(20):
            if core.idle():
                break
            ticks = core.statistics().ticks
            applied.append(core.turn())
            assert core.statistics().ticks == ticks + 1  # one host-time sample for the whole turn
            assert core.executor.inflight() == 0  # nothing left on the device for the completion thread
        result = stream.result(0)
        assert len(result.raw_tokens) == 4 and result.outcome.state == "completed"
        assert sum(applied) == core.executor.statistics().submitted == 4  # a prefill and three decode steps
    finally:
        core.teardown()


def test_a_chained_turn_frees_an_ended_streams_lane_before_its_next_step() -> None:
    """Results applied inside a chained schedule are settled there (``JobPath.apply``): the stream that ends frees
    its KV lane (the ``FreeSequence`` command runs, the release is confirmed, the waiting request admitted) before
    the chain's next step, which then prefills the newcomer in the same turn. Mutant caught (checked): ``apply``
    without its settling (the lane stays held until the schedule ends: the chain finds nothing to plan, and the
    newcomer waits for the next turn)."""
    engine = ThreadedEngine(engine_config(admission={"max_sequences": 1}),
                            SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                            package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None))
    core = engine._core  # noqa: SLF001 - driven on this thread: the actor is never started
    core.chain_ready_s = 60.0  # one turn chains every ready result (a null device's, at once)
    first, second = StreamWriter(), StreamWriter()
    core.submit(request(0, 3), first)
    core.submit(request(1, 3), second)
    try:
        core.turn()
        assert first.result(0).outcome.state == "completed"
        assert second.result(0).outcome.state == "completed"  # admitted, prefilled and decoded in the same turn
    finally:
        core.teardown()
