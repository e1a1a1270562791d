"""The httptools protocol's response head (issue #20, session 26): :class:`HeadCycle` writes uvicorn's bytes and leaves
the cycle as uvicorn's ``send`` leaves it, for every head — the ones it writes itself and the ones it hands to
uvicorn (a length, a transfer coding, a connection header, a name or value uvicorn refuses)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from calculet.server.http_fast import HeadCycle


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.written.append(b"<closed>")


DEFAULT = [(b"server", b"uvicorn"), (b"date", b"Fri, 04 Dec 2026 11:00:00 GMT")]
SSE = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
       (b"content-type", b"text/event-stream; charset=utf-8"), (b"x-request-id", b"abc-123")]


def _cycle(cls: type, *, keep_alive: bool, method: str) -> Any:
    return cls(scope={"method": method, "type": "http"}, transport=_Transport(),
               flow=SimpleNamespace(write_paused=False), logger=logging.getLogger("t"),
               access_logger=logging.getLogger("t.access"), access_log=False, default_headers=list(DEFAULT),
               message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
               on_response=lambda: None)


def _sent(cls: type, message: dict[str, Any], *, keep_alive: bool, method: str) -> tuple[Any, ...]:
    cycle = _cycle(cls, keep_alive=keep_alive, method=method)
    try:
        asyncio.run(cycle.send(dict(message)))
        raised = None
    except RuntimeError as exc:
        raised = str(exc)
    return (raised, cycle.transport.written, cycle.response_started, cycle.chunked_encoding,
            cycle.expected_content_length, cycle.keep_alive, cycle.waiting_for_100_continue)


HEADS = [
    SSE,
    [],
    [(b"Content-Type", b"application/json"), (b"X-Request-Id", b"r")],  # names lowered as uvicorn lowers them
    [(b"content-length", b"12")],
    [(b"transfer-encoding", b"chunked")],
    [(b"connection", b"close")],
    [(b"Connection", b"keep-alive, Close")],
    [(b"bad name", b"x")],
    [(b"x-ok", b"bad\nvalue")],
    [(b"x-tab", b"a\tb")],  # a tab is a valid value character
    [(b"", b"empty name")],
]


@pytest.mark.parametrize("headers", HEADS)
@pytest.mark.parametrize("status", [200, 204, 304, 429])
@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("method", ["POST", "HEAD"])
def test_a_head_is_written_as_uvicorns_send_writes_it(headers: list[tuple[bytes, bytes]], status: int,
                                                      keep_alive: bool, method: str) -> None:
    """Catches: a header lowered, ordered or separated differently, ``connection: close`` or the chunked coding added
    when uvicorn would not (or not added), a refused name or value written, the cycle's state left otherwise."""
    message = {"type": "http.response.start", "status": status, "headers": headers}
    assert _sent(HeadCycle, message, keep_alive=keep_alive, method=method) == _sent(
        RequestResponseCycle, message, keep_alive=keep_alive, method=method)


def test_a_streamed_response_after_its_head_is_uvicorns() -> None:
    """Catches: the body parts after a head written here not chunked (the head's ``chunked_encoding`` not set)."""
    written = []
    for cls in (HeadCycle, RequestResponseCycle):
        cycle = _cycle(cls, keep_alive=True, method="POST")

        async def run(cycle: Any = cycle) -> None:
            await cycle.send({"type": "http.response.start", "status": 200, "headers": SSE})
            await cycle.send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
            await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})

        asyncio.run(run())
        written.append((cycle.transport.written, cycle.response_complete))
    assert written[0] == written[1]


def test_the_common_head_is_written_without_uvicorns_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: the comparison above passing only because every head went to uvicorn's ``send`` (no call saved)."""
    async def refuse(self: Any, message: Any) -> None:
        raise AssertionError("uvicorn's send")

    monkeypatch.setattr(RequestResponseCycle, "send", refuse)
    cycle = _cycle(HeadCycle, keep_alive=True, method="POST")
    asyncio.run(cycle.send({"type": "http.response.start", "status": 200, "headers": SSE}))
    assert cycle.transport.written[0].startswith(b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\n")
