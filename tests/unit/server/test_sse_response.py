"""The SSE response of a stream (issue #20, §4): every event found at a wake-up goes out in one body message, the
last one ends the response in the same message, and a client that goes away ends it at once — also while no
token flows — with the request abandoned (cancelled by the caller) and its end reported once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.tokenizer import ByteTokenizer
from calculet.runtime.streams.writer import StreamWriter, batched_wakeups
from calculet.server.sse import DIRECT_BODY, HEADERS, Frames, SSEResponse


class _Client:
    """The ASGI side of one connection: what was sent, and a ``receive`` that answers a disconnect when told."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone: asyncio.Event = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _response(stream: StreamWriter, calls: list[str], *, first: bytes | None = None) -> SSEResponse:
    frames = Frames(response_id="cmpl-1", created=1, model="m", fingerprint="f", chat=False, prompt_tokens=2,
                    include_usage=False, continuous_usage=False)
    return SSEResponse(stream, frames, first=first, why=lambda event: None, abandon=lambda: calls.append("abandon"),
                       end=lambda gone: calls.append(f"end gone={gone}"))


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.req("R4.3", "R4.7")
def test_the_events_of_a_wakeup_go_out_in_one_message_and_the_last_ends_the_response() -> None:
    """Catches: one message per event, the end sent as a message of its own after the last frames, the end
    reported after the last message (the request's log line would follow the response's), a watch of the client
    that mistakes the response's own end for a disconnect."""
    async def run() -> tuple[list[dict[str, Any]], list[str]]:
        stream = StreamWriter(tokenizer=ByteTokenizer())
        calls: list[str] = []
        client = _Client()

        async def send(message: dict[str, Any]) -> None:
            if not message.get("more_body", True):
                calls.append("last message")
                client.gone.set()  # the server answers a disconnect once the response is complete
            await client.send(message)

        task = asyncio.ensure_future(_response(stream, calls, first=b"first")(
            {"type": "http"}, client.receive, send))  # type: ignore[arg-type]
        await _turns()
        with batched_wakeups():  # two events before the consumer wakes, as the actor hands a step's over
            for token in b"ab":
                stream.token(1, token)
        await _turns()
        stream.close(RequestOutcome(1, "completed", FinishReason.LENGTH, 3, 200))
        await asyncio.wait_for(task, 10)
        return client.sent, calls

    sent, calls = asyncio.run(run())
    assert sent[0] == {"type": "http.response.start", "status": 200, "headers": HEADERS}
    assert sent[1] == {"type": "http.response.body", "body": b"first", "more_body": True}
    bodies = sent[2:]
    assert len(bodies) == 2 and bodies[0]["more_body"] and not bodies[1]["more_body"]
    assert bodies[0]["body"].count(b"data: ") == 2  # both events of the wake-up, one message
    assert bodies[1]["body"].endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in bodies[1]["body"]
    assert calls == ["end gone=False", "last message"]


@pytest.mark.req("R4.3", "R4.5")
def test_a_client_gone_while_no_token_flows_ends_the_response_and_abandons_the_request() -> None:
    """Catches: a response that notices the client only at its next token (a queued request's stream would
    hold its task until the engine ends it), no abandon (the request would never be cancelled), the end not
    reported, or reported twice."""
    async def run() -> tuple[bool, list[str], list[dict[str, Any]]]:
        stream = StreamWriter()
        calls: list[str] = []
        client = _Client()
        task = asyncio.ensure_future(_response(stream, calls)({"type": "http"}, client.receive, client.send))
        await _turns()
        client.gone.set()
        await _turns()
        return task.done(), calls, client.sent

    done, calls, sent = asyncio.run(run())
    assert done
    assert calls == ["abandon", "end gone=True"]
    assert [m["type"] for m in sent] == ["http.response.start"]


def test_a_cancelled_response_abandons_an_open_stream_once() -> None:
    """Catches: the task's cancellation (the server stopping) leaving the engine's request running."""
    async def run() -> list[str]:
        stream = StreamWriter()
        calls: list[str] = []
        client = _Client()
        task = asyncio.ensure_future(_response(stream, calls)({"type": "http"}, client.receive, client.send))
        await _turns()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return calls

    assert asyncio.run(run()) == ["abandon", "end gone=True"]


def test_a_response_whose_head_cannot_be_sent_abandons_the_request() -> None:
    """Catches: the head sent outside the response's cleanup (an ASGI server that raises on a send to a gone
    client, ASGI 2.4, would leave the engine's request running for nobody)."""
    async def run() -> list[str]:
        calls: list[str] = []
        client = _Client()

        async def send(message: dict[str, Any]) -> None:
            raise OSError("the client has gone")

        with pytest.raises(OSError):
            await _response(StreamWriter(), calls)({"type": "http"}, client.receive, send)  # type: ignore[arg-type]
        await _turns()
        return calls

    assert asyncio.run(run()) == ["abandon", "end gone=True"]


class _Direct:
    """The protocol's direct writer (``DIRECT_BODY``): takes parts while ``open``, refuses them (writes paused,
    backpressure) otherwise."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.open = True

    def __call__(self, body: bytes) -> bool:
        if not self.open:
            return False
        self.parts.append(body)
        return True


@pytest.mark.req("R4.3", "R4.7")
def test_with_a_direct_writer_the_wakeups_write_the_parts_and_the_last_ends_through_send() -> None:
    """Catches (issue #20, session 26: parts written from the wake-up's own callback): a part lost or doubled
    between the direct writer and ``send``, a part written directly while writes are paused (backpressure: it must
    wait in ``send``), parts out of order, the last part written directly (the response would never complete)."""
    async def run() -> tuple[list[dict[str, Any]], list[bytes], list[str]]:
        stream = StreamWriter(tokenizer=ByteTokenizer())
        calls: list[str] = []
        client = _Client()
        direct = _Direct()

        async def send(message: dict[str, Any]) -> None:
            if not message.get("more_body", True):
                client.gone.set()
            await client.send(message)

        scope = {"type": "http", "extensions": {DIRECT_BODY: direct}}
        task = asyncio.ensure_future(_response(stream, calls)(scope, client.receive, send))  # type: ignore[arg-type]
        await _turns()
        with batched_wakeups():
            for token in b"ab":
                stream.token(1, token)
        await _turns()
        direct.open = False  # writes paused: the next part goes through send, which waits for the drain
        stream.token(1, ord("c"))
        await _turns()
        direct.open = True
        stream.token(1, ord("d"))
        await _turns()
        stream.close(RequestOutcome(1, "completed", FinishReason.LENGTH, 4, 200))
        await asyncio.wait_for(task, 10)
        return client.sent, direct.parts, calls

    sent, parts, calls = asyncio.run(run())
    assert sent[0]["type"] == "http.response.start"
    via_send = [m["body"] for m in sent[1:]]
    assert len(parts) == 2 and parts[0].count(b"data: ") == 2 and b'"text":"d"' in parts[1]  # a+b, then d
    assert len(via_send) == 2 and b'"text":"c"' in via_send[0]  # c while paused
    assert not sent[-1]["more_body"] and via_send[-1].endswith(b"data: [DONE]\n\n")
    assert calls == ["end gone=False"]
    texts = b"".join([parts[0], via_send[0], parts[1]])
    assert texts.index(b'"text":"a"') < texts.index(b'"text":"b"') < texts.index(b'"text":"c"') < texts.index(
        b'"text":"d"')


def test_with_a_direct_writer_a_client_gone_ends_the_response_and_later_tokens_write_nothing() -> None:
    """Catches: a stale wake-up callback writing to a response that has ended, no abandon."""
    async def run() -> tuple[list[bytes], list[str]]:
        stream = StreamWriter(tokenizer=ByteTokenizer())
        calls: list[str] = []
        client = _Client()
        direct = _Direct()
        scope = {"type": "http", "extensions": {DIRECT_BODY: direct}}
        task = asyncio.ensure_future(_response(stream, calls)(scope, client.receive, client.send))  # type: ignore
        await _turns()
        client.gone.set()
        await _turns()
        assert task.done()
        stream.token(1, ord("x"))  # the callback registered before the client left finds the response ended
        await _turns()
        return direct.parts, calls

    parts, calls = asyncio.run(run())
    assert parts == [] and calls == ["abandon", "end gone=True"]
