"""uvicorn as the service runs it: h11 with a header timeout, and the limits of ``server`` (issue #14, §3).

Why our own protocol class: uvicorn times out only *idle* keep-alive connections
(``timeout_keep_alive``); a client that sends half a request line or half its headers and then
waits holds a connection (and a slot of the accept backlog) for as long as it likes — the issue
measured 40 s and counting. :class:`HeaderTimeoutProtocol` arms a timer when a connection opens
and whenever a new request's first byte arrives after a response, and disarms it once h11 has
parsed the request line and headers; if it fires first, the client gets a ``408`` and the
connection is closed. The timer is armed once per request, not once per byte, so a client
trickling one byte at a time gains nothing.

:func:`uvicorn_config` is the one place that turns ``server.*`` of ``calculet-scheduler/v1`` into
uvicorn options (``python -m calculet.run`` and the service tests both use it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from calculet.config.service import ServerConfig

log = logging.getLogger("calculet.server")


def _timeout_response() -> bytes:
    body = json.dumps({"error": {"message": "the request line and headers did not arrive within the header timeout",
                                 "type": "invalid_request_error", "code": "header_timeout", "param": None}}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


TIMEOUT_RESPONSE = _timeout_response()


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request's line and headers."""

    header_timeout_s: float = 10.0
    """Set by :func:`protocol_class` from ``server.header_timeout_s``."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()  # the first byte of a request after a keep-alive pause
        else:
            self._disarm_header_timer()  # h11 has the request line and headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm_header_timer()  # idle now: uvicorn's keep-alive timeout applies until the next byte

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is not h11.IDLE:  # a response of a previous request is still going out
            return
        client = self.client
        log.info("http header timeout: connection closed", extra={
            "client": f"{client[0]}:{client[1]}" if client else None, "status": 408, "code": "header_timeout",
            "header_timeout_s": self.header_timeout_s})
        self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()


def protocol_class(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """A :class:`HeaderTimeoutProtocol` with its timeout set (uvicorn instantiates the class itself)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s})


def uvicorn_config(app: Any, server: ServerConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` under ``server``'s limits; ``options`` pass through."""
    return uvicorn.Config(app, http=protocol_class(server.header_timeout_s),  # type: ignore[arg-type]
                          h11_max_incomplete_event_size=server.max_header_bytes,
                          timeout_keep_alive=server.keep_alive_timeout_s,  # type: ignore[arg-type]
                          log_config=None, access_log=False, lifespan="off", **options)


__all__ = ["HeaderTimeoutProtocol", "TIMEOUT_RESPONSE", "protocol_class", "uvicorn_config"]
