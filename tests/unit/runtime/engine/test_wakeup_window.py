"""The actor's hold on stream wake-ups (issue #20, session 16): held across turns for ``wake_coalesce_s``, but a
turn still chains ready steps for at most ``CHAIN_READY_S``, and a stream's final event is handed over after the
turn it came in, whatever the window.

Mutants caught: the chain tied to the window again (``chain_ready_s = wake_coalesce_s``: a longer window makes
every turn as long, messages and the admission snapshot wait that long); a close held like a token (its wake-up
handed over only when the actor sleeps or the window ends: the test's other stream has finished by then).
"""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

from calculet.adapters.sim import CostModel, SimCalRT, SimConfig, TimeMode, package_dir
from calculet.runtime.engine.threaded import CHAIN_READY_S, ThreadedEngine
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams import writer
from calculet.runtime.streams.writer import StreamWriter
from tests.integration.engine.support import engine_config, request


def _engine(window_s: float) -> ThreadedEngine:
    return ThreadedEngine(engine_config(), SimCalRT(SimConfig(time_mode=TimeMode.REAL, cost=CostModel.null())),
                          package_dir("current"), options=EngineOptions(verify_golden=False, monitor_mode=None,
                                                                        wake_coalesce_s=window_s))


def test_a_turn_chains_for_the_window_but_never_longer_than_the_chain_bound() -> None:
    for window, chain in ((30.0, CHAIN_READY_S), (CHAIN_READY_S / 2, CHAIN_READY_S / 2), (0.0, 0.0)):
        engine = _engine(window)
        try:
            assert engine._core.chain_ready_s == chain  # noqa: SLF001 - what the actor's turns chain for
        finally:
            engine._core.teardown()  # noqa: SLF001 - never started


class _AlwaysAwaited(StreamWriter):
    """A stream whose asyncio consumer is always waiting: after each token a fresh wake-up is registered (on a loop
    that is not running: the wake-up is queued there, never run)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._loop = loop
        self.events_since(0, loop.create_future())

    def token(self, request_id: int, token: int) -> None:
        super().token(request_id, token)
        self.events_since(self.statistics().events, self._loop.create_future())


def test_a_streams_final_event_is_handed_over_after_its_turn_not_when_the_window_ends() -> None:
    """With a window far longer than the test, a short stream ends while a long one keeps the actor turning: the
    short one's final wake-up is handed to its loop while the long one still runs."""
    engine = _engine(30.0)
    loop = asyncio.new_event_loop()
    short, long = _AlwaysAwaited(loop, tokenizer=engine.tokenizer), StreamWriter(tokenizer=engine.tokenizer)
    handed: list[bool] = []  # at each hand-off to a loop after the short stream closed: had the long one ended?
    real = writer._wake_now

    def recording(waiters: Any) -> None:
        if short.closed and not handed:
            handed.append(long.closed)
        real(waiters)

    core = engine._core  # noqa: SLF001 - both submitted in one message: the long one runs before the short ends
    with mock.patch.object(writer, "_wake_now", recording):
        engine.start()
        try:
            engine._call(lambda: [core.submit(request(0, 4), short), core.submit(request(1, 240), long)],  # noqa: SLF001
                         30)
            assert long.result(30).outcome.state == "completed"
        finally:
            engine.stop(5)
            loop.close()
    assert short.result(0).outcome.state == "completed"
    assert handed == [False]
