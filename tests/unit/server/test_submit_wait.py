"""The route's wait for the engine's §5.2 answer (issue #13, #20: a timer of its own, not ``asyncio.wait_for``): no
answer within ``submit_timeout_s`` is ``TimeoutError`` (the route answers 503), and a request the engine admits
after its caller stopped waiting is cancelled, not left to run for nobody. The timeout here is 0 s: the timer
fires at the loop's next turn, no test time passes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from calculet.runtime.scheduling.admission import ADMITTED
from calculet.runtime.scheduling.plan import Submission
from calculet.server.inference import _submit


class _Early:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def sent(self) -> None:
        self.calls.append("sent")

    def answered(self) -> None:
        self.calls.append("answered")


class _Engine:
    def __init__(self) -> None:
        self.done: Any = None
        self.cancelled: list[int] = []

    def submit_then(self, request: object, stream: object, done: Any) -> None:
        self.done = done  # answered later, or never

    def cancel(self, request_id: int, timeout: float | None = None) -> None:
        self.cancelled.append(request_id)


class _Service:
    def __init__(self, timeout_s: float) -> None:
        self.engine = _Engine()
        self.early_admission = _Early()
        self.submit_timeout_s = timeout_s


@pytest.mark.req("R5.2.5")
def test_no_answer_in_time_is_a_timeout_and_a_late_admission_is_cancelled() -> None:
    """Catches: a wait without a deadline (the route would hang), a late admission left running, the timer left
    armed after an answer."""
    async def run() -> tuple[_Service, bool]:
        service = _Service(0.0)
        waiting = asyncio.ensure_future(_submit(service, object(), object()))  # type: ignore[arg-type]
        await asyncio.wait({waiting}, timeout=60)  # a guard against a wait without a deadline, not a measure
        assert waiting.done() and isinstance(waiting.exception(), TimeoutError)
        service.engine.done(Submission(7, ADMITTED), None)  # the actor's late answer (thread-safe hop)
        for _ in range(5):
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: None)  # the cancel runs on the default executor
        return service, True

    service, _ = asyncio.run(run())
    assert service.engine.cancelled == [7]
    assert service.early_admission.calls == ["sent", "answered"]


def test_an_answer_in_time_is_returned_and_its_timer_disarmed() -> None:
    async def run() -> tuple[Submission, int]:
        service = _Service(3600.0)
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(_submit(service, object(), object()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        service.engine.done(Submission(3, ADMITTED), None)
        got = await task
        return got, sum(not timer.cancelled() for timer in loop._scheduled)  # type: ignore[attr-defined]

    got, armed = asyncio.run(run())
    assert got == Submission(3, ADMITTED) and armed == 0
