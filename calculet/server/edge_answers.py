"""What both edge protocols (h11: :mod:`calculet.server.http_server`, httptools: :mod:`calculet.server.http_fast`)
answer with: the server-generated request id, the whole error response they write themselves, and the limits of
a chunked body's pieces (issue #14), the request-head deadline and refusal both give (:class:`EdgeGuard`), and the
refusal lane's 429 (:class:`AnswerBytes`, :mod:`calculet.server.refusal_lane`; issue #13).
Apart so that neither protocol module imports the other."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
from abc import ABCMeta, abstractmethod
from http import HTTPStatus
from typing import Any

from calculet.runtime.engine.early_refusal import FIT_IN_REASON, NEVER_REASON
from calculet.server.errors import RETRY_AFTER_S, admission_error

log = logging.getLogger("calculet.server")


_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A server-generated request id, 32 hex digits: 64 random bits drawn once per process, then a 64-bit count.

    Unique within the process and, with the random prefix, across processes and restarts; a correlation id for
    logs and traces, not a secret (nothing is authorised by knowing one). Why not 128 fresh random bits per
    request: ``os.urandom`` is a system call that releases the interpreter lock, and under a burst the event loop
    then waited for a busy engine thread to hand it back (a wall-clock profile of a 300-request burst: 0.8 ms per
    id, issue #13); a ``uuid4`` object cost several times more to build than either."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def error_response(status: int, code: str, message: str, request_id: str) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response in the service's error shape, as bytes."""
    phrase = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}.get(status, b"")
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                 "param": None}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\nx-request-id: %s\r\n"
            b"content-length: %d\r\n\r\n" % (status, phrase, request_id.encode(), len(body)) + body)


FREE_CHUNKS = 1024
"""Pieces of a chunked body taken whatever their size; past them the average must reach :data:`MIN_CHUNK_AVERAGE`."""
MIN_CHUNK_AVERAGE = 256
"""Smallest average payload (bytes) of a chunked body's pieces past :data:`FREE_CHUNKS`.

Why: h11 spends about 10 µs of event-loop CPU per chunk, whatever its size, and parses everything one
socket read holds before the loop runs anything else: one 256 KiB read of 1-byte chunks (43 690 of
them) held the loop for 445 ms of CPU here, and a body within ``server.max_body_bytes`` (which counts
payload, not the 5 bytes of framing around each byte) could take about 190 such reads. Past 1024
pieces, a body averaging under 256 bytes a piece is refused 400 ``chunks_too_small`` — at most about
10 ms of the loop's CPU spent on it."""


class EdgeGuard(metaclass=ABCMeta):
    """The deadline on a request's line and headers, and the refusal that closes a connection, for either edge
    protocol (mixed in before uvicorn's protocol class, whose ``loop``, ``transport``, ``client``, ``cycle`` and
    ``scope`` it uses). The protocol says what only its parser knows: whether a request head is awaited now
    (:meth:`_awaiting_head`), whether the app already has the request being refused (:meth:`_app_has_request`),
    and whether an answer can still be written (:meth:`_answerable`)."""

    header_timeout_s: float = 10.0
    """Set by the protocol's class factory from ``server.header_timeout_s``."""

    _header_timer: asyncio.TimerHandle | None = None
    """The connection's one timer for the head deadline, pending or None (see :meth:`_arm_header_timer`)."""
    _head_deadline: float | None = None
    """When the current request's line and headers are due (loop time); None: no head is being timed."""
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None
    cycle: Any
    scope: Any

    @abstractmethod
    def _awaiting_head(self) -> bool:
        """A request's line and headers are due now (the deadline applies), and no response is going out."""

    @abstractmethod
    def _app_has_request(self) -> bool:
        """The request being refused has reached the app (it answers, and logs, for it)."""

    @abstractmethod
    def _answerable(self, app_has_request: bool) -> bool:
        """No response has begun on the connection, so the refusal can still be written."""

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._header_timer is not None:  # the closed connection is not kept until its timer would fire
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)  # type: ignore[misc]  # uvicorn's protocol, after this class in the MRO

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm_header_timer()  # idle now: uvicorn's keep-alive timeout applies until the next byte

    def _arm_header_timer(self) -> None:
        """The current request's head is due ``header_timeout_s`` from now. Why a deadline and one timer per connection,
        not a timer per request (issue #13): a kept-alive connection times one head per request, and a timer armed
        and cancelled for each cost ~1.5-2 µs of the event loop's CPU (uvloop ``call_later`` + ``cancel``), of a
        burst's ~100 µs a refusal. The pending timer, armed for an earlier head, fires no later than this deadline
        and waits again for the rest (:meth:`_header_due`)."""
        self._head_deadline = self.loop.time() + self.header_timeout_s
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(self._head_deadline, self._header_due)

    def _disarm_header_timer(self) -> None:
        """No head is being timed (the pending timer, if any, finds no deadline when it fires)."""
        self._head_deadline = None

    def _header_due(self) -> None:
        """(the connection's timer) The head's deadline passed: 408; not yet (re-armed since): wait for it."""
        self._header_timer = None
        deadline = self._head_deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:
            self._header_timer = self.loop.call_at(deadline, self._header_due)
            return
        self._header_timeout()

    def _header_timeout(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        self._refuse(408, "header_timeout", f"the request line and headers did not arrive within the header "
                                            f"timeout of {self.header_timeout_s:g} s (server.header_timeout_s)")

    def _refuse(self, status: int, code: str, reason: str) -> None:
        """Log why, answer ``status`` (if no response has begun), close the connection. One id and one log line
        per request: for a request the app has (or is about to start: its task is created, not yet run) the
        app's, which adopts this id and reads the reason (``RequestContext``, then the body gate); the line is
        written before the answer, so a client that has the answer also finds its line."""
        self._disarm_header_timer()
        app_has = self._app_has_request()
        answerable = self._answerable(app_has)
        if app_has:
            state = self.scope["state"]
            request_id = str(state.setdefault("request_id", new_request_id()))
            state["protocol_error"] = (status, code, reason)
            cycle = self.cycle
            cycle.disconnected = True  # the app's receive() answers http.disconnect, its send() writes nothing
            cycle.message_event.set()
        else:
            request_id = new_request_id()
            client = self.client
            log.info("http", extra={"request_id": request_id, "method": "OTHER", "route": "unparsed",
                                    "status": status, "code": code, "reason": reason,
                                    "client": f"{client[0]}:{client[1]}" if client else None})
        if answerable and not self.transport.is_closing():
            self.transport.write(error_response(status, code, reason, request_id))
        self.transport.close()


_STATUS_LINE = b"HTTP/1.1 429 " + HTTPStatus(429).phrase.encode() + b"\r\n"
"""uvicorn's status line for 429 (``HTTP/1.1 <code> <phrase>``)."""


class AnswerBytes:
    """The lane's 429 response, encoded once per message (issue #13: the answer was over half a refusal's CPU on the
    event loop). A refusal's answer varies only in its ``Retry-After``, its request ids, whether the connection stays
    open, uvicorn's default headers (its date, once a second) and, in its body, the seconds until it would fit: the
    body is kept as the two pieces around that number (encoded by the full path's
    :func:`~calculet.server.errors.admission_error`, so the bytes are its own), and the status line with the default
    headers as one piece while those headers are equal."""

    _HOLE = "@fit@"

    def __init__(self) -> None:
        never = admission_error(429, NEVER_REASON)
        self.code = never.code
        self._never = never.json_bytes()
        before, after = admission_error(429, FIT_IN_REASON.replace("{:.1f}", self._HOLE)).json_bytes().split(
            self._HOLE.encode())
        self._fit = (before, after)
        self._headers: list[tuple[bytes, bytes]] | None = None
        self._head = b""

    def response(self, default_headers: list[tuple[bytes, bytes]], fit_in_s: float | None,
                 retry_after_s: float | None, request_id: str, client_id: str | None, keep_alive: bool) -> bytes:
        """The whole 429: as :func:`~calculet.server.errors.admission_error` answers ``refusal_reason(fit_in_s)``
        with ``retry_after_s``, written as uvicorn writes it (see the module)."""
        if default_headers != self._headers:
            self._headers = list(default_headers)
            self._head = _STATUS_LINE + b"".join(b"%s: %s\r\n" % pair for pair in default_headers)
        if fit_in_s is None:
            body = self._never
        else:
            before, after = self._fit
            body = b"%s%.1f%s" % (before, fit_in_s, after)
        retry = RETRY_AFTER_S if retry_after_s is None else max(RETRY_AFTER_S, math.ceil(retry_after_s))
        tail = b"" if client_id is None else b"x-client-request-id: %s\r\n" % client_id.encode()
        if not keep_alive:
            tail += b"connection: close\r\n"
        return (b"%sretry-after: %d\r\ncontent-length: %d\r\ncontent-type: application/json\r\nx-request-id: %s\r\n"
                b"%s\r\n%s" % (self._head, retry, len(body), request_id.encode(), tail, body))


__all__ = ["AnswerBytes", "EdgeGuard", "FREE_CHUNKS", "MIN_CHUNK_AVERAGE", "error_response", "new_request_id"]
