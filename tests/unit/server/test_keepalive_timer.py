"""Issue #13: the httptools edge keeps uvicorn's keep-alive timeout as one deadline per idle spell and one timer per
connection (:meth:`~calculet.server.http_fast.FastEdgeProtocol.on_response_complete`), not a timer armed at every
response and cancelled at the next request's first byte: the connection closes at the deadline of its last response,
never while a request is being read, and a kept-alive connection's responses within one timeout arm one timer.

Mutants caught (each checked to fail here): the pending timer closing at its own (earlier) time without reading the
current deadline, no re-arm when it fires early (the idle connection never closed), the deadline not cleared by the
next request's first byte (closed mid-request), a timer armed per response, the timer of a lost connection left
pending, a pipelined request not started.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from uvicorn.server import ServerState

from calculet.server.http_fast import fast_protocol_class
from tests.unit.server.test_head_timer import _Handle
from tests.unit.server.test_head_timer import _Loop as _HeadLoop

KEEP_ALIVE_S = 5.0


class _Loop(_HeadLoop):
    """test_head_timer's loop (the test sets its clock; :meth:`run_due` runs the handles due), counting the idle
    timers armed: this edge's own and uvicorn's ``call_later``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = 0

    def call_at(self, when: float, callback: Any) -> _Handle:
        self.armed += getattr(callback, "__name__", "") == "_idle_due"
        return super().call_at(when, callback)

    def call_later(self, delay: float, callback: Any) -> _Handle:
        self.armed += 1  # uvicorn's own keep-alive timer: counted as an idle timer too
        return super().call_at(self.now + delay, callback)


class _Transport:
    def __init__(self) -> None:
        self.closing = False
        self.closed_at: float | None = None
        self.loop: _Loop | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.closed_at = self.loop.time() if self.loop else None

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never run: no request is completed here
    raise AssertionError


def _connection() -> tuple[Any, _Loop, _Transport]:
    config = uvicorn.Config(_app, timeout_keep_alive=int(KEEP_ALIVE_S), lifespan="off")
    config.load()
    loop = _Loop()
    protocol = fast_protocol_class(10.0)(config=config, server_state=ServerState(), app_state={},
                                         _loop=loop)  # type: ignore[arg-type]
    transport = _Transport()
    transport.loop = loop
    protocol.connection_made(transport)
    return protocol, loop, transport


def _request_and_response(protocol: Any, loop: _Loop, at: float) -> None:
    """The next request at ``at`` (what its first bytes do first: ``_parse``), its response written then."""
    loop.run_due(at)
    protocol._unset_keepalive_if_required()
    protocol.on_response_complete()


def test_an_idle_connection_closes_at_the_deadline_of_its_last_response() -> None:
    protocol, loop, transport = _connection()
    protocol.on_response_complete()  # a response at 0: idle until 5
    _request_and_response(protocol, loop, 2.0)
    _request_and_response(protocol, loop, 4.0)  # idle until 9
    assert loop.armed == 1  # the responses within one timeout share the timer armed at the first
    loop.run_due(8.0)
    assert transport.closed_at is None  # the timer fired at 5, found 9, waited again
    loop.run_due(10.0)
    assert transport.closed_at == 4.0 + KEEP_ALIVE_S


def test_a_request_being_read_is_never_closed_for_idleness() -> None:
    protocol, loop, transport = _connection()
    protocol.on_response_complete()
    loop.run_due(1.0)
    protocol.data_received(b"GET / HTTP/1.1\r\n")  # a head under way when the timer fires at 5
    loop.run_due(6.0)
    assert transport.closed_at is None


def test_a_lost_connection_leaves_no_timer() -> None:
    protocol, loop, transport = _connection()
    protocol.on_response_complete()
    protocol.connection_lost(None)
    assert all(h.cancelled for h in loop.handles if getattr(h.callback, "__name__", "") == "_idle_due")


def test_a_pipelined_request_starts_instead_of_the_idle_deadline() -> None:
    protocol, loop, transport = _connection()
    started: list[Any] = []
    protocol._start_asgi_task = lambda cycle, app: started.append((cycle, app))  # type: ignore[method-assign]
    protocol.pipeline.append(("cycle", "app"))
    protocol.on_response_complete()
    assert started == [("cycle", "app")] and loop.armed == 0
    assert protocol.server_state.total_requests == 1
