"""uvicorn as the service runs it: h11 with a header timeout, and protocol errors answered like the app's (issue #14, §3).

Why our own protocol class: two kinds of answer never reach the ASGI app, so the app's middleware
(:class:`~calculet.server.app.RequestContext`) cannot give them a request id or a log line:

* **a half-sent request.** uvicorn times out only *idle* keep-alive connections
  (``timeout_keep_alive``); a client that sends half a request line or half its headers and then
  waits holds a connection (and a slot of the accept backlog) for as long as it likes — the issue
  measured 40 s and counting. :class:`EdgeProtocol` arms a timer when a connection opens and
  whenever a new request's first byte arrives after a response, and disarms it once h11 has parsed
  the request line and headers; if it fires first, the client gets a ``408`` and the connection is
  closed. The timer is armed once per request, not once per byte, so a client trickling one byte
  at a time gains nothing.
* **bytes that are not HTTP/1.1.** A malformed request line, an invalid header, a bad
  ``Content-Length``, a transfer coding other than chunked, headers past ``server.max_header_bytes``
  while they arrive, a broken chunk inside a body: h11 refuses them and uvicorn answers a bare
  ``400 Invalid HTTP request received.`` in plain text, without an id, and logs only that sentence.

Both are answered here in the service's error shape (:mod:`calculet.server.errors`) with a
server-generated ``x-request-id``, and one ``http`` log line with the same fields as the app's
(``request_id``, ``status``, ``code``, ``reason`` — h11's own words — and the client address), so
"every 4xx and 5xx response carries x-request-id, and its log line says why" (issue #14) holds for
them too. Never a 5xx for the client's bytes: h11 hints 501 for a transfer coding it does not
implement; that is the client's request, answered 400 (issue #14: 0 responses ≥ 500 from input).

A chunked body cut into very small pieces is refused too (:data:`MIN_CHUNK_AVERAGE`): h11's cost is
per piece, and it parses a whole socket read before the loop runs anything else.

Request line and headers that arrive whole in one read are past h11's limit (it bounds only what is
still incomplete): :meth:`EdgeProtocol.handle_events` measures them and has the app refuse 431.

A broken chunk inside a body belongs to a request the app has (or is about to start): its answer
carries the request's id (``request_id`` in its scope state, which the app's middleware adopts)
and notes the status and reason there (``protocol_error``), so the request's one log line (written
when the body gate sees the connection closed, :mod:`calculet.server.body_gate`) says why instead
of a second line here.

:func:`uvicorn_config` is the one place that turns ``server.*`` of ``calculet-scheduler/v1`` into
uvicorn options (``python -m calculet.run`` and the service tests both use it).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import h11
import uvicorn
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from calculet.config.service import ServerConfig
from calculet.server.edge_answers import FREE_CHUNKS, MIN_CHUNK_AVERAGE, EdgeGuard, error_response, new_request_id

try:
    from calculet.server.http_fast import fast_protocol_class
except ImportError:  # httptools is not installed: the h11 protocol below serves
    fast_protocol_class = None  # type: ignore[assignment]


_ANSWERABLE = (h11.IDLE, h11.SEND_RESPONSE)
"""Our side's h11 states in which no byte of a response to the current request has been written."""


class _ChunksTooSmall(h11.RemoteProtocolError):
    """A chunked body cut into pieces too small to parse at a bounded cost (:data:`MIN_CHUNK_AVERAGE`)."""


class _Connection(h11.Connection):
    """h11's server connection, keeping the error that made it refuse the client's bytes (uvicorn's
    handler catches it and keeps only the sentence "Invalid HTTP request received."), and counting
    the pieces of a chunked body (:data:`MIN_CHUNK_AVERAGE`)."""

    last_error: h11.RemoteProtocolError | None = None
    _chunked = False
    _pieces = 0
    _payload = 0

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise
        if isinstance(event, h11.Request):  # h11 accepts no transfer coding but chunked
            self._chunked = any(name.lower() == b"transfer-encoding" for name, _ in event.headers)
            self._pieces = self._payload = 0
        elif isinstance(event, h11.Data) and self._chunked:
            self._pieces += 1
            self._payload += len(event.data)
            if self._pieces > FREE_CHUNKS and self._payload < self._pieces * MIN_CHUNK_AVERAGE:
                self.last_error = _ChunksTooSmall(
                    f"the chunked body came in {self._pieces} pieces averaging {self._payload / self._pieces:.0f} "
                    f"bytes; past {FREE_CHUNKS} pieces they must average at least {MIN_CHUNK_AVERAGE} bytes")
                raise self.last_error
        return event


def _status_and_code(error: h11.RemoteProtocolError | None) -> tuple[int, str]:
    hint = error.error_status_hint if error is not None else 400
    if hint == 431:
        return 431, "headers_too_large"
    if hint == 501:
        return 400, "unsupported_transfer_encoding"
    return 400, "malformed_request"


class EdgeProtocol(EdgeGuard, H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request's line and headers, and its own
    answers (and log lines) carrying a request id (:class:`~calculet.server.edge_answers.EdgeGuard`)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.conn = _Connection(h11.SERVER, config.h11_max_incomplete_event_size
                                if config.h11_max_incomplete_event_size is not None
                                else DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm_header_timer()
        elif self.conn.their_state is h11.IDLE:
            if self._head_deadline is None:
                self._arm_header_timer()  # the first byte of a request after a keep-alive pause
        else:
            self._disarm_header_timer()  # h11 has the request line and headers

    def handle_events(self) -> None:
        """uvicorn's, then the header limit on a request h11 parsed whole: h11 enforces its maximum only on
        headers still incomplete, so request line and headers that arrive in one read may be any size the
        socket read holds (256 KiB). Such a request is refused 431 through the app (body gate), which gives
        it its id and log line; its body is never read."""
        before = self.scope
        super().handle_events()
        scope = self.scope
        if scope is None or scope is before:
            return
        size = len(scope["method"]) + len(scope["raw_path"]) + len(scope["query_string"]) + 12 + sum(
            len(name) + len(value) + 4 for name, value in scope["headers"])
        limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        if size > limit:
            scope["state"]["protocol_error"] = (
                431, "headers_too_large", f"the request line and headers are {size} bytes, over the limit of "
                                          f"{limit} (server.max_header_bytes)")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes h11 refused, as the service's: the status h11 hints, h11's reason, an id."""
        error = self.conn.last_error
        if isinstance(error, _ChunksTooSmall):
            self._refuse(400, "chunks_too_small", str(error))
            return
        status, code = _status_and_code(error)
        if status == 431:
            limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
            self._refuse(status, code, f"the request line and headers exceed {limit} bytes (server.max_header_bytes)")
            return
        detail = str(error) if error is not None and str(error) else msg
        self._refuse(status, code, f"the request is not valid HTTP/1.1: {detail}")

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE  # no earlier response going out

    def _app_has_request(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and self.scope is not None

    def _answerable(self, app_has_request: bool) -> bool:
        return self.conn.our_state in _ANSWERABLE


def _not_uvicorns_sentence(record: logging.LogRecord) -> bool:
    """uvicorn's "Invalid HTTP request received." warning: :class:`EdgeProtocol`'s line says the same with the reason."""
    return record.msg != "Invalid HTTP request received."


def protocol_class(header_timeout_s: float) -> type[EdgeProtocol]:
    """An :class:`EdgeProtocol` with its timeout set (uvicorn instantiates the class itself)."""
    return type("EdgeProtocol", (EdgeProtocol,), {"header_timeout_s": header_timeout_s})


HTTP_ENV = "CALCULET_HTTP"
"""The environment variable that picks the HTTP/1.1 implementation: ``httptools`` (the default when installed:
:mod:`calculet.server.http_fast`) or ``h11`` (:class:`EdgeProtocol`; benchmarks compare both in one run)."""


def edge_protocol(header_timeout_s: float, implementation: str | None = None) -> type[asyncio.Protocol]:
    """The edge's protocol class: on httptools when it is installed (its parser is C: the event loop's CPU per
    request, issue #13), else — or when ``implementation`` (default: ``$CALCULET_HTTP``) says ``h11`` — on h11."""
    chosen = implementation or os.environ.get(HTTP_ENV, "httptools")
    if chosen not in ("httptools", "h11"):
        raise ValueError(f"{HTTP_ENV} must be 'httptools' or 'h11', not {chosen!r}")
    if chosen == "httptools" and fast_protocol_class is not None:
        return fast_protocol_class(header_timeout_s)
    return protocol_class(header_timeout_s)  # asked for, or httptools missing: h11, which uvicorn always has


def uvicorn_config(app: Any, server: ServerConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` under ``server``'s limits; ``options`` pass through. The event loop is
    uvicorn's choice (``auto``: uvloop when installed, a dependency of the service)."""
    logging.getLogger("uvicorn.error").addFilter(_not_uvicorns_sentence)  # idempotent: one filter object
    return uvicorn.Config(app, http=edge_protocol(server.header_timeout_s),  # type: ignore[arg-type]
                          h11_max_incomplete_event_size=server.max_header_bytes,
                          timeout_keep_alive=server.keep_alive_timeout_s,  # type: ignore[arg-type]
                          log_config=None, access_log=False, lifespan="off", **options)


__all__ = ["EdgeProtocol", "FREE_CHUNKS", "HTTP_ENV", "edge_protocol", "MIN_CHUNK_AVERAGE", "error_response", "new_request_id", "protocol_class",
           "uvicorn_config"]
