"""The host path per token (issue #20): what the engine's actor does once per tick rather than once per call,
and the null device's results applied by the actor itself, in real time, with every token delivered."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.machines.monitor import MONITOR
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.scheduling.joint_checks import JointMonitor
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import engine_config, make_driver, request, submit_all


def _count_checks(driver_step) -> int:  # type: ignore[no-untyped-def]
    calls = []
    real = JointMonitor.check

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(self, *args, **kwargs)

    with mock.patch.object(JointMonitor, "check", counting):
        driver_step()
    return len(calls)


@pytest.mark.req("R9.2.1", "R17.2.4")
def test_sampled_joint_checks_are_drawn_once_per_tick_and_every_call_is_checked_in_tests() -> None:
    """monitoring.sample_every says "one engine tick's joint checks in N": sampled, the actor draws once per
    tick (the check is incremental, so it still covers every request that moved); with every event checked
    (the test suite), each actor call that can move a request is checked where it happens."""
    driver, _ = make_driver("current", numerics=False)
    submit_all(driver, [request(i, 4) for i in range(3)])
    assert MONITOR.sample_every == 1
    assert _count_checks(driver.step) == 2  # dispatch and schedule, each checked
    with mock.patch.object(MONITOR, "sample_every", 256):
        assert _count_checks(driver.step) == 1  # one draw for the whole tick
    driver.run_until_idle()
    driver.stop()


def test_the_threaded_actor_applies_the_null_devices_results_itself_and_delivers_every_token() -> None:
    """The null device completes a job inside submit (no device time); the actor collects it right after its
    tick instead of sleeping until the completion thread posts it, and every stream still gets all its tokens
    in order, each consumer woken on its own loop."""
    engine = ThreadedEngine(engine_config(), SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                            package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None))
    engine.start()
    try:
        async def run() -> list[tuple[int, ...]]:
            streams = [StreamWriter(tokenizer=engine.tokenizer) for _ in range(4)]
            for i, stream in enumerate(streams):
                await asyncio.to_thread(engine.submit, request(i, 12), stream)

            async def consume(stream: StreamWriter) -> tuple[int, ...]:
                tokens: list[int] = []
                async for batch in stream.abatches():
                    for event in batch:
                        tokens.extend(event.tokens)
                return tuple(tokens)

            return list(await asyncio.wait_for(asyncio.gather(*(consume(s) for s in streams)), 30))

        got = asyncio.run(run())
        stats = engine.statistics()
    finally:
        engine.stop(5)
    assert [len(t) for t in got] == [12] * 4
    assert stats.finished == {"length": 4}
    # the completion thread posted at most a few of the 48 results; the actor collected the rest itself
    assert stats.mailbox is not None and stats.mailbox.posted < 4 + 1 + 48 // 2
