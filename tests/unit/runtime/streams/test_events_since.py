"""``StreamWriter.events_since`` (issue #20): the SSE response's read of a stream — the events from an index on,
and a future of the caller's set when the next one comes (from the actor's thread, through the future's loop)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.tokenizer import ByteTokenizer
from calculet.runtime.streams.writer import StreamWriter


@pytest.mark.req("R4.7")
def test_events_since_an_index_and_a_wake_set_by_the_next_event_from_another_thread() -> None:
    """Catches: a wake registered although events were there (a stale waiter woken later), a wake never set
    (the consumer would sleep forever), events before the index handed over again."""
    async def run() -> tuple[list[str], list[str], bool, list[str]]:
        loop = asyncio.get_running_loop()
        stream = StreamWriter(tokenizer=ByteTokenizer())
        stream.token(1, ord("a"))
        early = loop.create_future()
        first = [e.text for e in stream.events_since(0, early)]
        wake = loop.create_future()
        none = [e.text for e in stream.events_since(1, wake)]
        actor = threading.Thread(target=lambda: (stream.token(1, ord("b")), stream.close(
            RequestOutcome(1, "completed", FinishReason.LENGTH, 2, 200))))
        actor.start()
        await asyncio.wait_for(wake, 10)
        actor.join()
        return first, none, early.done(), [e.text for e in stream.events_since(1)]

    first, none, early_set, rest = asyncio.run(run())
    assert first == ["a"] and none == [] and not early_set
    assert rest == ["b", ""]  # the token, then the final event
