"""The actor's hand-off of held wake-ups (issue #20, session 26): ``flush_wakeups(hand_off_s=...)`` wakes each
consumer loop once and returns once that loop has run the consumers' steps the wake-up started (or the bound has
passed), so the loop's work on a wake-up runs in one stretch instead of beside a turning actor. Nothing is lost
or reordered, a closed loop or the caller's own loop is never waited for."""

from __future__ import annotations

import asyncio

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamWriter, call_soon_held, flush_wakeups, held_wakeups, hold_wakeups

BOUND_S = 30.0
"""A bound never reached in these tests: the loop is idle but for the consumers (a safety net, not a timing)."""


def _outcome(request_id: int) -> RequestOutcome:
    return RequestOutcome(request_id=request_id, state="completed", finish_reason=FinishReason.LENGTH,
                          generated_tokens=2, http_status=200)


@pytest.mark.req("R3.1", "R4.7")
def test_a_hand_off_returns_after_the_woken_consumers_ran_and_loses_nothing() -> None:
    streams = [StreamWriter() for _ in range(4)]
    seen: list[list[tuple[int, ...]]] = [[] for _ in streams]

    async def consume(i: int) -> None:
        async for event in streams[i].aevents():
            seen[i].append(event.tokens)

    async def main() -> list[list[int]]:
        tasks = [asyncio.create_task(consume(i)) for i in range(len(streams))]
        await asyncio.sleep(0)  # every consumer waits for its stream
        answered: list[str] = []
        loop = asyncio.get_running_loop()
        at_return: list[list[int]] = []

        def actor() -> None:
            hold_wakeups()
            for turn in range(2):
                for i, stream in enumerate(streams):
                    stream.token(i, 40 + turn)
            call_soon_held(loop, lambda: answered.append("submit answered"))
            flush_wakeups(hand_off_s=BOUND_S)
            at_return.append([len(s) for s in seen])  # what the consumers had seen when the hand-off returned
            at_return.append([len(answered)])
            for i, stream in enumerate(streams):
                stream.close(_outcome(i))
            flush_wakeups(hand_off_s=BOUND_S)
            at_return.append([len(s) for s in seen])
            flush_wakeups(release=True)
            assert held_wakeups() == 0

        await asyncio.to_thread(actor)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return at_return

    at_return = asyncio.run(main())
    assert at_return[0] == [2, 2, 2, 2]  # each consumer took both tokens (one batch) before the actor went on
    assert at_return[1] == [1]  # the held callback rode with them
    assert at_return[2] == [3, 3, 3, 3]  # and the close: both tokens and the final event, in order
    assert all(s == [(40,), (41,), ()] for s in seen)


def test_a_hand_off_to_a_closed_loop_or_the_callers_own_does_not_wait() -> None:
    closed = asyncio.new_event_loop()
    closed.close()
    ran: list[str] = []

    async def own() -> None:
        hold_wakeups()
        call_soon_held(asyncio.get_running_loop(), lambda: ran.append("own"))
        call_soon_held(closed, lambda: ran.append("closed"))
        flush_wakeups(hand_off_s=BOUND_S, release=True)  # would never return if it waited for either loop
        assert ran == []  # the own loop runs it once this coroutine yields; the closed one never
        await asyncio.sleep(0)

    asyncio.run(own())
    assert ran == ["own"]
