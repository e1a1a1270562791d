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

    def unawaited(self) -> bool:
        return self.alone

    alone = True


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


def test_an_admission_nobody_else_waits_on_rides_with_the_held_stream_wake_ups() -> None:
    """Issue #20: on a thread that holds stream wake-ups (the actor), an admitted answer that no other request waits
    on is handed to the loop at the flush, with the wake-ups (one hand-over); a refusal, or an answer other requests
    wait on (held ones are decided at each answer, #13), goes at once. Catches: every answer held (a burst's held
    requests would wait for the flush), none held (two hand-overs), a held answer lost at the flush."""
    from calculet.runtime.scheduling.admission import AdmissionOutcome, Decision
    from calculet.runtime.streams.writer import flush_wakeups, held_wakeups, hold_wakeups

    async def run() -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, int]] = []
        refused = Submission(5, AdmissionOutcome(Decision.REJECT_CAPACITY, "busy", retry_after_s=1.0))
        for name, submission, alone in (("admitted", Submission(3, ADMITTED), True),
                                        ("awaited", Submission(4, ADMITTED), False), ("refused", refused, True)):
            service = _Service(3600.0)
            service.early_admission.alone = alone
            task = asyncio.ensure_future(_submit(service, object(), object()))  # type: ignore[arg-type]
            await asyncio.sleep(0)

            def actor(submission: Submission = submission, service: _Service = service) -> int:
                hold_wakeups()  # as the actor's loop holds them
                service.engine.done(submission, None)
                held = held_wakeups()
                flush_wakeups(release=True)
                return held

            held = await loop.run_in_executor(None, actor)
            got = await asyncio.wait_for(task, 60)  # a guard, not a measure
            assert got == submission
            seen.append((name, held))
        return seen

    assert asyncio.run(run()) == [("admitted", 1), ("awaited", 0), ("refused", 0)]
