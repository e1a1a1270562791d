"""Issue #13 (session 22): the httptools edge skips the exact sum of a head's size when the bytes read since the head
began bound it (:meth:`~calculet.server.http_fast.FastEdgeProtocol.on_headers_complete`); the bound must hold for every
head llhttp accepts, the smallest separators included (``Name:value``: the counted size then exceeds the wire's by 1 a
header), so no head over ``server.max_header_bytes`` escapes its 431.

Mutants caught (each checked to fail here): the bound without its slack (``_head_bytes <= max_header_bytes``: the
head below, 189 bytes on the wire and 207 counted, goes unrefused); the skip taken for a pipelined request's head (not
timed from its first byte: the second request's head, over the limit, goes unrefused).
"""

from __future__ import annotations

from typing import Any

import uvicorn
from uvicorn.server import ServerState

from calculet.server.http_fast import fast_protocol_class
from tests.unit.server.test_head_timer import _Loop
from tests.unit.server.test_keepalive_timer import _Transport

LIMIT = 200


class _Task:
    def add_done_callback(self, callback: Any) -> None:
        pass


class _TaskLoop(_Loop):
    """test_head_timer's loop; a request's ASGI task is kept, never run (only the scope's state is read here)."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[dict[str, Any]] = []

    def create_task(self, coroutine: Any, **_kwargs: Any) -> _Task:
        self.scopes.append(coroutine.cr_frame.f_locals["self"].scope)
        coroutine.close()
        return _Task()


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never run
    raise AssertionError


def _connection() -> tuple[Any, _TaskLoop]:
    config = uvicorn.Config(_app, lifespan="off", h11_max_incomplete_event_size=LIMIT)
    config.load()
    loop = _TaskLoop()
    protocol = fast_protocol_class(10.0)(config=config, server_state=ServerState(), app_state={},
                                         _loop=loop)  # type: ignore[arg-type]
    transport = _Transport()
    transport.loop = loop  # type: ignore[assignment]
    protocol.connection_made(transport)
    return protocol, loop


def _counted(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The head's size as the limit counts it (the edge's rule)."""
    return len(method) + len(target) + 12 + sum(len(name) + len(value) + 4 for name, value in headers)


def _head(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A head with the smallest separators llhttp accepts (``Name:value``, CRLF): 1 byte a header under the count."""
    return b"GET /x HTTP/1.1\r\n" + b"".join(name + b":" + value + b"\r\n" for name, value in headers) + b"\r\n"


def _headers(host_bytes: int) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"h" * host_bytes)] + [(b"x%02d" % k, b"v") for k in range(19)]


def _refused(scope: dict[str, Any]) -> bool:
    error = scope["state"].get("protocol_error")
    return error is not None and error[0] == 431


def test_a_head_with_the_smallest_separators_over_the_limit_is_refused_though_its_wire_bytes_are_not() -> None:
    headers = _headers(30)
    head = _head(headers)
    assert len(head) <= LIMIT < _counted(b"GET", b"/x", headers)  # the case the bound's slack is for
    protocol, loop = _connection()
    protocol.data_received(head)
    assert len(loop.scopes) == 1 and _refused(loop.scopes[0])


def test_a_head_within_the_limit_is_not_refused_whether_its_size_is_summed_or_bounded() -> None:
    for headers in ([(b"host", b"h")], _headers(18)):  # bounded by the bytes read; summed (close to the limit)
        assert _counted(b"GET", b"/x", headers) <= LIMIT
        protocol, loop = _connection()
        protocol.data_received(_head(headers))
        assert len(loop.scopes) == 1 and not _refused(loop.scopes[0])


def test_a_pipelined_heads_size_is_summed() -> None:
    """The second request of a read is not timed from its first byte (the count began at the first's): its head, over
    the limit and completed by a later read, is summed whatever the bytes read."""
    small = b"GET /a HTTP/1.1\r\nhost: h\r\n\r\n"
    second = _head(_headers(30))
    protocol, loop = _connection()
    protocol.data_received(small + second[:10])
    protocol.data_received(second[10:])
    protocol.on_response_complete()  # the first answered: the pipelined one starts
    assert [_refused(scope) for scope in loop.scopes] == [False, True]
