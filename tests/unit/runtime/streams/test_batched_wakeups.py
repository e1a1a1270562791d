"""One hop per device result to the HTTP loop (issue #20, §3 "one owner of state").

The actor delivers a decode step's tokens to every stream of the batch; within
``batched_wakeups`` each consumer loop is woken once for all of them (not once per token), and
every consumer still sees every event in order.
"""

from __future__ import annotations

import asyncio
import threading
from unittest import mock

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamWriter, batched_wakeups, flush_wakeups, held_wakeups, hold_wakeups


def _outcome(request_id: int) -> RequestOutcome:
    return RequestOutcome(request_id=request_id, state="completed", finish_reason=FinishReason.LENGTH,
                          generated_tokens=3, http_status=200)


@pytest.mark.req("R3.1", "R4.7")
def test_one_step_for_many_streams_is_one_wakeup_of_their_loop_and_nothing_is_lost():
    streams = [StreamWriter() for _ in range(8)]
    seen: dict[int, list[tuple[int, ...]]] = {i: [] for i in range(8)}

    async def consume(i: int) -> None:
        async for event in streams[i].aevents():
            seen[i].append(event.tokens)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(consume(i)) for i in range(8)]
        await asyncio.sleep(0)  # every consumer is waiting
        calls = 0
        real = loop.call_soon_threadsafe

        def counting(*args: object) -> object:
            nonlocal calls
            calls += 1
            return real(*args)  # type: ignore[arg-type]

        with mock.patch.object(loop, "call_soon_threadsafe", counting):
            for step in range(3):
                def actor() -> None:
                    with batched_wakeups():
                        for i, stream in enumerate(streams):
                            stream.token(i, 65 + step)
                            if step == 2:
                                stream.close(_outcome(i))
                thread = threading.Thread(target=actor)
                thread.start()
                thread.join()
                await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return calls

    calls = asyncio.run(main())
    assert calls == 3  # one per step for the 8 streams of one loop
    for i in range(8):
        assert seen[i] == [(65,), (66,), (67,), ()]


def test_without_a_batch_each_token_wakes_its_loop_at_once():
    stream = StreamWriter()

    async def main() -> list[tuple[int, ...]]:
        got: list[tuple[int, ...]] = []

        async def consume() -> None:
            async for event in stream.aevents():
                got.append(event.tokens)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        threading.Thread(target=lambda: stream.token(1, 70)).start()
        for _ in range(100):
            await asyncio.sleep(0.005)
            if got:
                break
        assert got == [(70,)]
        stream.close(_outcome(1))
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(main()) == [(70,), ()]


@pytest.mark.req("R3.1", "R4.7")
def test_abatches_hands_over_every_event_there_at_a_wakeup_in_order_with_its_generated_count():
    """Issue #20: an SSE writer sends what a wake-up finds in one write; every token is still its own event,
    and each event says how many tokens had been generated when it was emitted (continuous usage)."""
    stream = StreamWriter()

    async def main() -> list[list[tuple[tuple[int, ...], int]]]:
        batches: list[list[tuple[tuple[int, ...], int]]] = []

        async def consume() -> None:
            async for batch in stream.abatches():
                batches.append([(e.tokens, e.generated) for e in batch])

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)

        def actor() -> None:
            with batched_wakeups():
                for token in (70, 71, 72):
                    stream.token(1, token)

        thread = threading.Thread(target=actor)
        thread.start()
        thread.join()
        await asyncio.sleep(0.01)
        stream.token(1, 73)
        stream.close(_outcome(1))
        await asyncio.wait_for(task, 5)
        return batches

    batches = asyncio.run(main())
    assert batches[0] == [((70,), 1), ((71,), 2), ((72,), 3)]
    assert [e for b in batches for e in b] == [((70,), 1), ((71,), 2), ((72,), 3), ((73,), 4), ((), 4)]


def test_held_wakeups_reach_each_loop_once_when_flushed_and_none_before():
    """The actor holds wake-ups across turns (hold_wakeups) and hands them over with flush_wakeups: none is
    sent before, one per consumer loop after, and release stops holding."""
    streams = [StreamWriter() for _ in range(3)]

    async def main() -> tuple[int, int, list[list[tuple[int, ...]]]]:
        loop = asyncio.get_running_loop()
        seen: list[list[tuple[int, ...]]] = [[] for _ in streams]

        async def consume(i: int) -> None:
            async for event in streams[i].aevents():
                seen[i].append(event.tokens)

        tasks = [asyncio.create_task(consume(i)) for i in range(3)]
        await asyncio.sleep(0)
        calls = []
        real = loop.call_soon_threadsafe
        counts: list[int] = []

        def actor() -> None:
            hold_wakeups()
            for turn in range(4):  # four actor turns, one token each per stream
                for i, stream in enumerate(streams):
                    stream.token(i, 80 + turn)
            counts.append(len(calls))
            counts.append(held_wakeups())
            flush_wakeups()
            for i, stream in enumerate(streams):
                stream.close(_outcome(i))
            flush_wakeups(release=True)
            assert held_wakeups() == 0

        with mock.patch.object(loop, "call_soon_threadsafe", lambda *a: calls.append(a) or real(*a)):
            thread = threading.Thread(target=actor)
            thread.start()
            while thread.is_alive():
                await asyncio.sleep(0.001)
            thread.join()
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return counts[0], len(calls), seen

    before, after, seen = asyncio.run(main())
    assert before == 0  # nothing handed over while held
    assert 1 <= after <= 2  # one per flush for the one loop (none at the second if nobody was waiting)
    assert all(s == [(80,), (81,), (82,), (83,), ()] for s in seen)
