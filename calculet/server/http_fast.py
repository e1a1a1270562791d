"""The edge's protocol on httptools (llhttp, in C) instead of h11: the same answers, a fraction of the parsing cost
(issues #13 and #20).

Why: under a burst the event loop's CPU per request bounds how soon the last request is answered (it answers
them one after another), and h11 — pure Python — parses each request and frames each response: a bare uvicorn
app measured 0.38 ms of loop CPU per request with h11 against 0.15-0.18 ms with httptools here
(``bench/overload_http.py --part bare``), and a streamed token pays h11's framing once per chunk. uvicorn ships
both; this module gives the httptools one every guarantee :class:`~calculet.server.http_server.EdgeProtocol`
gives the h11 one (issue #14), with the same codes, reasons and log lines:

* a deadline for each request's line and headers (``server.header_timeout_s``: 408 ``header_timeout``), armed
  once per request, not per byte;
* request line and headers over ``server.max_header_bytes``: 431 ``headers_too_large`` — refused here while
  they are still incomplete, through the app (which gives it its id and line) when they arrived whole. llhttp
  has no such limit of its own: the bytes are counted here;
* bytes that are not HTTP/1.1 — a bad method or target, a request line without a version (llhttp takes it for
  HTTP/0.9), a malformed header line, an HTTP/1.1 request without ``Host`` (llhttp does not require it), a bad
  or doubled ``Content-Length``, a transfer coding other than chunked (400 ``unsupported_transfer_encoding``,
  refused before the app starts), a broken chunk: 400 ``malformed_request`` in the service's error shape with a
  server-generated ``x-request-id``, and one ``http`` log line saying where (request line, header line) and
  llhttp's reason; a broken chunk of a request the app has is answered with that request's id and line;
* a chunked body in pieces averaging under :data:`~calculet.server.edge_answers.MIN_CHUNK_AVERAGE` bytes past
  :data:`~calculet.server.edge_answers.FREE_CHUNKS` pieces: 400 ``chunks_too_small``.

A generation POST that arrives whole in one read is first offered to the app's refusal lane
(:mod:`calculet.server.refusal_lane`): a 429 it decides from the admission snapshot is written here as whole bytes,
and no ASGI task is started for it; anything else starts as uvicorn starts it.

uvicorn's keep-alive timeout holds as uvicorn applies it (an idle connection closed that long after its last
response), kept as a deadline on one timer per connection like the head's, not a timer armed at every response
(:meth:`FastEdgeProtocol.on_response_complete`).

:func:`calculet.server.http_server.uvicorn_config` chooses this protocol when httptools is installed (a
dependency of the service) unless ``CALCULET_HTTP=h11`` says otherwise (benchmarks compare both in one run).
"""

from __future__ import annotations

import asyncio
import re
import time
from functools import partial
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import (HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, HttpToolsProtocol,
                                                    RequestResponseCycle)

from calculet.server.body_gate import BODY_ARRIVED
from calculet.server.edge_answers import FREE_CHUNKS, MIN_CHUNK_AVERAGE, EdgeGuard
from calculet.server.sse import DIRECT_BODY

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
"""h11's default limit, kept when uvicorn's configuration names none."""


_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [!-~]+ HTTP/1\.[01]\r?")
"""A well-formed HTTP/1.x request line (RFC 9112 §3: method token, target of visible ASCII, version)."""


class _Refused(Exception):
    """A request this protocol refuses from its parser's callbacks (status, code, reason)."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.code, self.reason = status, code, reason


class FastEdgeProtocol(EdgeGuard, HttpToolsProtocol):
    """uvicorn's httptools protocol with the edge's deadline, limits and answers (see the module's docstring;
    the deadline and the refusal are :class:`~calculet.server.edge_answers.EdgeGuard`'s)."""
    _in_head = False
    """Between a request's first byte and its last header: its head is being read (and timed, and counted)."""
    _head_bytes = 0
    _head_text = b""
    """The head's bytes so far, up to its first line end (to say where a parse error is)."""
    _reading = False
    """Between a request's first byte and its end (llhttp's message begin and complete)."""
    _pieces = 0
    _payload = 0
    _chunk_bytes = 0

    _feeding = False
    """Inside :meth:`data_received`'s parse: a generation request complete by its end may go to the refusal lane."""
    _deferred: tuple[Any, Any, float] | None = None
    """The request kept for the refusal lane (its cycle, app and arrival), its ASGI task not started yet."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.max_header_bytes = config.h11_max_incomplete_event_size or DEFAULT_MAX_HEADER_BYTES
        self.lane = refusal_lane_of(config)

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._begin_head()

    def _begin_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._head_text = b""
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        self._feeding = True
        try:
            self._parse(data)
        finally:
            self._feeding = False
            deferred = self._deferred
            if deferred is not None:
                self._deferred = None
                self.lane.arrive(self, *deferred)

    def _parse(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if not self._in_head and not self._reading:
            self._begin_head()  # the first byte of a request after a keep-alive pause
        if self._in_head:
            self._head_bytes += len(data)
            if b"\n" not in self._head_text:
                self._head_text += data[:256]
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # as uvicorn's
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else None
            if isinstance(cause, _Refused):
                self._refuse(cause.status, cause.code, cause.reason)
            else:
                self._refuse(400, "malformed_request", f"the request is not valid HTTP/1.1: {self._where()}{exc}")
            return
        if self._in_head and self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._refuse(431, "headers_too_large", f"the request line and headers exceed {self.max_header_bytes} "
                                                   "bytes (server.max_header_bytes)")

    def _where(self) -> str:
        """Which part of the request llhttp refused: its request line unless that line is whole and well formed."""
        if not self._in_head:
            return "body: "
        line, newline, _ = self._head_text.partition(b"\n")
        return "header line: " if newline and _REQUEST_LINE.fullmatch(line) else "request line: "

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._reading = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        """The head's rules (version, ``Host``, transfer coding), then uvicorn's, then the head's size.

        The size is the request line and headers as the limit counts them (method, target, each header's name and
        value, their separators). Its exact sum is skipped when the bytes read since this head began bound it: a head
        timed from its first byte (:meth:`_begin_head`) is at most :attr:`_head_bytes` on the wire, and the counted
        size exceeds the wire's by at most 1 a header (``Name:value``, llhttp takes CRLF only); the bound allows 2 a
        header and 1 for the line, what a bare ``LF`` would add too (``tests/unit/server/test_head_size.py``). Why
        (issue #13, session 22): a burst's every request paid the sum over its headers, none near the limit; a
        pipelined request's head (not timed from its first byte) is still summed."""
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise _Refused(400, "malformed_request", "the request is not valid HTTP/1.1: request line: no HTTP "
                                                     f"version (read as HTTP/{version})")
        headers = self.headers
        host = False
        codings: list[bytes] | None = None
        for name, value in headers:  # one pass over the headers for both rules (issue #13: a burst's every request)
            if name == b"host":
                host = True
            elif name == b"transfer-encoding":
                codings = [*(codings or ()), value.strip().lower()]
        if version == "1.1" and not host:
            raise _Refused(400, "malformed_request", "the request is not valid HTTP/1.1: missing the Host header "
                                                     "an HTTP/1.1 request must carry")
        if codings and codings != [b"chunked"]:
            raise _Refused(400, "unsupported_transfer_encoding", "the request is not valid HTTP/1.1: "
                           f"Transfer-Encoding {b', '.join(codings).decode('latin-1')!r}: only chunked is accepted")
        counted = self._in_head and self._head_bytes + 2 * len(headers) + 1 <= self.max_header_bytes
        self._pieces = self._payload = 0
        self._in_head = False
        self._disarm_header_timer()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade: the cycle of this request
            self.scope.setdefault("extensions", {})[DIRECT_BODY] = partial(write_body_part, cycle)  # type: ignore
            if type(cycle) is RequestResponseCycle:
                cycle.__class__ = HeadCycle  # its task has not run yet: its sends go through HeadCycle.send
        if counted:
            return  # within the limit by the bytes read since the head began (see the docstring)
        scope = self.scope
        size = len(scope["method"]) + len(self.url) + 12 + sum(len(name) + len(value) + 4 for name, value in headers)
        if size > self.max_header_bytes:  # arrived whole in one read: refused through the app (its id, its line)
            scope["state"]["protocol_error"] = (
                431, "headers_too_large", f"the request line and headers are {size} bytes, over the limit of "
                                          f"{self.max_header_bytes} (server.max_header_bytes)")

    def on_chunk_header(self) -> None:
        self._chunk_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._payload += len(body)
        self._chunk_bytes += len(body)
        super().on_body(body)

    def on_chunk_complete(self) -> None:
        if not self._chunk_bytes:  # the last, empty chunk
            return
        self._pieces += 1
        if self._pieces > FREE_CHUNKS and self._payload < self._pieces * MIN_CHUNK_AVERAGE:
            raise _Refused(400, "chunks_too_small", f"the chunked body came in {self._pieces} pieces averaging "
                                                    f"{self._payload / self._pieces:.0f} bytes; past {FREE_CHUNKS} "
                                                    f"pieces they must average at least {MIN_CHUNK_AVERAGE} bytes")

    def on_message_complete(self) -> None:
        self._reading = False
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and not cycle.more_body:  # the body is whole: the gate's receive will not wait (#20)
            cycle.scope["state"][BODY_ARRIVED] = True

    # ------------------------------------------------------------------ the refusal lane

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, except for a generation request met while parsing a read: kept until the read is parsed, then
        given to the refusal lane (:meth:`RefusalLane.arrive`), which settles it (:meth:`settle`) in its turn's
        batch."""
        lane = self.lane
        if self._feeding and lane is not None and self._deferred is None and lane.candidate(cycle.scope):
            self._deferred = (cycle, app, time.perf_counter())
            return
        super()._start_asgi_task(cycle, app)

    def lane_body(self, cycle: Any) -> bytes | None:
        """The kept request's body for the lane to decide on, or None: it is started as uvicorn would have — its body
        is still on its way, the connection was refused or closed meanwhile, a pipelined request followed it in the
        same read, or the client waits for "100 Continue" (the app's receive() writes it before its answer)."""
        if (cycle.more_body or cycle.disconnected or cycle is not self.cycle or self.transport.is_closing()
                or cycle.waiting_for_100_continue):
            return None
        return bytes(cycle.body)

    def settle(self, cycle: Any, app: Any, started: float,
               answers: list[tuple[Any, Any, bytes]] | None = None) -> None:
        """The kept request answered by the lane (a 429), held for the engine's next answer, or started as uvicorn
        would have (:meth:`lane_body`, or the lane declines). With ``answers``, a 429 is appended there for the caller
        to write (:meth:`write_answer`) instead of written at once (the lane's turn writes its answers together)."""
        lane = self.lane
        body = self.lane_body(cycle)
        if body is None:
            super()._start_asgi_task(cycle, app)
            return
        answer = lane.decide(cycle.scope, body, default_headers=self.server_state.default_headers,
                             keep_alive=cycle.keep_alive, started=started, hold=True, patient=lane.holding())
        if answer is None:
            super()._start_asgi_task(cycle, app)
        elif not isinstance(answer, bytes):  # the lane's HELD: decided after the engine's next answer
            lane.hold(self, cycle, app, body, started)
        elif answers is not None:
            answers.append((self, cycle, answer))
        else:
            self.write_answer(cycle, answer)

    # what the lane calls back for a held request
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers  # type: ignore[no-any-return]

    def start_app(self, cycle: Any, app: Any) -> None:
        """The request's ASGI task, as uvicorn starts it."""
        super()._start_asgi_task(cycle, app)

    def write_answer(self, cycle: Any, answer: bytes) -> None:
        """The lane's whole response written as uvicorn's cycle ends one (its ``send`` of the last body part)."""
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        self.transport.write(answer)
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()

    # ------------------------------------------------------------------ timers and refusals

    _idle_deadline: float | None = None
    """When the kept-alive connection, idle since its last response, is closed (loop time); None: not idle."""
    _idle_timer: asyncio.TimerHandle | None = None
    """The connection's one timer for that deadline, pending or None."""

    def on_response_complete(self) -> None:
        """uvicorn's (the request counted, reading resumed, a pipelined request started, else the keep-alive timeout),
        the keep-alive timeout kept as a deadline on one timer per connection, as the head's
        (:meth:`~calculet.server.edge_answers.EdgeGuard._arm_header_timer`). Why (issue #13): uvicorn armed a timer at
        every response and cancelled it at the next request's first byte, ~2-3 µs of the event loop's CPU per
        request (uvloop ``call_later`` + ``cancel``, measured alone), paid by every refusal of a burst on its
        kept-alive connection. The pending timer, armed for an earlier response, fires no later than this deadline
        and waits again for the rest (:meth:`_idle_due`)."""
        self._disarm_header_timer()  # idle now: the keep-alive timeout applies until the next byte (EdgeGuard's)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_deadline = deadline = self.loop.time() + self.timeout_keep_alive
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(deadline, self._idle_due)

    def _unset_keepalive_if_required(self) -> None:
        self._idle_deadline = None  # a byte came (or the connection ends): the pending timer finds no deadline
        if self.timeout_keep_alive_task is not None:  # uvicorn's timer: never armed by this protocol's
            super()._unset_keepalive_if_required()  # on_response_complete (#20: a call fewer per read and response)

    def _idle_due(self) -> None:
        """(the connection's idle timer) The keep-alive timeout passed: closed as uvicorn closes it; not yet (another
        response since): wait for the rest."""
        self._idle_timer = None
        deadline = self._idle_deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:
            self._idle_timer = self.loop.call_at(deadline, self._idle_due)
            return
        self._idle_deadline = None
        self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle_timer is not None:  # the closed connection is not kept until its timer would fire
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        cycle = self.cycle
        return self._in_head and (cycle is None or cycle.response_complete)  # no earlier response going out

    def _app_has_request(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not self._in_head and self.scope is not None

    def _answerable(self, app_has_request: bool) -> bool:
        cycle = self.cycle
        return not cycle.response_started if app_has_request else cycle is None or cycle.response_complete


_NO_LANE = object()


class HeadCycle(RequestResponseCycle):
    """uvicorn's request-response cycle whose response head, in the common case, is checked and written in a few
    calls: every header name in one search of uvicorn's pattern over all of them joined, every value likewise (a
    pattern of single characters finds a character in the joined bytes exactly when it is in one of them), the
    names lowered in one pass. Any other head — a ``content-length``, ``transfer-encoding`` or ``connection``
    header, a name or value uvicorn refuses, writes paused, the client gone, an access log — goes through
    uvicorn's ``send``, which writes (or refuses) it as before. The bytes are uvicorn's
    (``tests/unit/server/test_head_cycle.py`` compares).

    Why (issue #20): uvicorn's head took two pattern searches, a ``lower`` and an ``extend`` for each header
    (about 35 calls a response, the head of every streamed request on the event loop); here about 23."""

    async def send(self, message: Any) -> None:
        if (message["type"] != "http.response.start" or self.response_started or self.disconnected
                or self.flow.write_paused or self.access_log or not self._write_head(message)):
            await RequestResponseCycle.send(self, message)

    def _write_head(self, message: Any) -> bool:
        """The head of ``message`` written (True), or nothing done (False: uvicorn's ``send`` writes it)."""
        headers = [*self.default_headers, *message.get("headers", ())]
        names = [name for name, _ in headers]
        if HEADER_RE.search(b"".join(names)) or HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
            return False  # uvicorn's send raises its error
        lowered = b":".join(names).lower().split(b":")  # ":" is never in a name the search let through
        if b"content-length" in lowered or b"transfer-encoding" in lowered or b"connection" in lowered:
            return False
        status = message["status"]
        content = [STATUS_LINE[status]]
        content += [b"%b: %b\r\n" % (name, value) for name, (_, value) in zip(lowered, headers)]
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        if self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.response_started = True
        self.waiting_for_100_continue = False
        self.transport.write(b"".join(content))
        return True


def write_body_part(cycle: Any, body: bytes) -> bool:
    """A streamed response's body part written as uvicorn's ``send`` of ``{"more_body": True}`` writes it (chunked
    coding), at once, from any callback on the loop (:data:`calculet.server.sse.DIRECT_BODY`); False — nothing
    written — when it must go through ``send``: writes paused (``send`` waits for the drain: backpressure), the
    client gone, the response not started or already complete, or not chunked (a HEAD, a length given).

    Why (issue #20, session 26): an SSE body part went through a task's step and the ASGI send chain (a coroutine
    per layer) a pass of the loop after its wake-up; written from the wake-up's own callback it is one call."""
    if (cycle.flow.write_paused or cycle.disconnected or not cycle.response_started or cycle.response_complete
            or not cycle.chunked_encoding):
        return False
    if body:
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
    return True


def refusal_lane_of(config: uvicorn.Config) -> Any:
    """The refusal lane of the app ``config`` serves (:attr:`ServiceApp.refusal_lane`, under uvicorn's wrappers), or
    None; looked up once per configuration."""
    lane = config.__dict__.get("_calculet_refusal_lane", _NO_LANE)
    if lane is _NO_LANE:
        app, lane = getattr(config, "loaded_app", None), None
        for _ in range(8):  # uvicorn's wrappers (proxy headers, message logger) each hold the next as ``app``
            if app is None:
                break
            lane = getattr(app, "refusal_lane", None)
            if lane is not None:
                break
            app = getattr(app, "app", None)
        config.__dict__["_calculet_refusal_lane"] = lane
    return lane


def fast_protocol_class(header_timeout_s: float) -> type[FastEdgeProtocol]:
    """A :class:`FastEdgeProtocol` with its timeout set (uvicorn instantiates the class itself)."""
    return type("FastEdgeProtocol", (FastEdgeProtocol,), {"header_timeout_s": header_timeout_s})


__all__ = ["FastEdgeProtocol", "fast_protocol_class", "refusal_lane_of"]
