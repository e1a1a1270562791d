"""The body gate: authenticate before reading, count the body while reading it (issue #14, §5.2).

Why an ASGI layer of its own: FastAPI reads a request body whole, whatever its size, before any
route or dependency runs, and the service's limit was checked only against a declared
``Content-Length`` — a 40 MB chunked body was read into memory (RSS +436 MB) and parsed before
its 400, and a body without any API key was read and parsed before its 401. This gate runs
before routing:

1. a route that needs credentials (``/v1/...``, ``/admin/...``) has them checked from the headers
   alone; a refusal (401/403) is answered at once and the connection closed, the body unread;
2. a declared ``Content-Length`` above ``server.max_body_bytes`` is 413 at once;
3. otherwise the body is read here, chunk by chunk, counting (past its first MiB at a pace shared
   by all bodies, :class:`BulkPacer`, so bulk uploads cannot fill the event loop): past the limit the answer is 413
   and the connection closes (the rest is never read, so memory stays bounded by the limit);
   a pause longer than ``server.body_timeout_s`` between two chunks is 408, also closed, and so is a
   body that, after the grace of one such pause, arrives slower on average than
   ``server.body_min_rate_bytes_s`` (a body trickled a byte at a time, each pause just under the
   limit, would otherwise hold its connection for as long as the client likes);
4. a connection that closes before its body ends is recorded as such (``_unanswered``); a request
   the server's protocol refused (a broken chunk it already answered; headers over
   ``server.max_header_bytes``, answered here) is recorded with the protocol's status and reason;
5. the app then receives the body as one message, already read and bounded (the generation
   routes take it from ``scope["state"]["body"]`` without a copy and parse it off the event
   loop, :mod:`calculet.server.request_parsing`).

Refusals close the connection (``Connection: close``) because the rest of the body may still be
on its way; keeping the connection would mean reading it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.server.errors import APIError

Authorize = Callable[[Scope], "APIError | None"]
"""Checks a request's credentials from its scope (headers and path) alone; the refusal, or None."""

_CLOSE = {"Connection": "close"}

BODY_ARRIVED = "body_arrived"
"""The scope ``state``'s key a protocol sets once a request's body has arrived whole (its ``receive`` then returns at
once: :class:`calculet.server.http_fast.FastEdgeProtocol` sets it at llhttp's message end)."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return _header(scope, b"transfer-encoding") is not None


def _refusal(exc: APIError, scope: Scope) -> APIError:
    """``exc`` answered with ``Connection: close`` and noted for the request's log line."""
    scope.setdefault("state", {})["error"] = (exc.code, exc.message)
    return APIError(exc.status, exc.message, code=exc.code, param=exc.param, type=exc.type,
                    headers={**exc.headers, **_CLOSE})


BULK_AFTER = 1024 * 1024
"""Bytes of each body read at the socket's pace; what follows is bulk, paced by :class:`BulkPacer`."""


BULK_RATE_BYTES_S = 32 * 1024 * 1024
"""The pace of bulk body bytes, all bodies together (32 MiB/s: about a sixth of a core of event-loop time
here; an 8 MiB body takes at least 0.22 s). Measured in-process at load average 12-13 on 2 cores, four 7.5 MB
bodies x 4 rounds beside probes from another process, unpaced vs paced in the same session: /health/live
P99 88-140 ms vs 65-76 ms, 1-token completion P99 340-364 ms vs 132-135 ms (P50 15-115 vs 8-11 ms), the
uploads' span 2.9-4.0 s vs 4.0-5.6 s."""


class BulkPacer:
    """One token bucket for the bulk of every large body: at most ``rate`` bytes a second in all.

    Why: reading a body costs the event loop about 5 ms of CPU per MB here (37 ms per 7.5 MB body, probes
    included), and the loop also answers every other client. Four 7.5 MB bodies read as fast as they came
    kept the loop's queue full of their pieces, so a health check or a small completion waited behind them.
    Pacing what follows each body's first MiB bounds the share of the loop bulk reading can take; while the
    gate waits, uvicorn has paused reading that socket, so TCP flow control holds the client back (nothing
    is buffered here). The wait is the server's, not the client's: it counts against neither timeout's pause.
    """

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate = rate_bytes_s
        self._free_at = 0.0

    async def take(self, size: int) -> float:
        """Wait until ``size`` more bulk bytes fit the rate; how long that was (seconds)."""
        now = anyio.current_time()
        start = max(now, self._free_at)
        self._free_at = start + size / self.rate
        if start > now:
            await anyio.sleep(start - now)
        return start - now


class BodyGate:
    """Pure ASGI middleware: credentials before the body, the body counted while it is read."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float, authorize: Authorize,
                 body_min_rate_bytes_s: float = 1024.0,
                 bulk_rate_bytes_s: float | None = BULK_RATE_BYTES_S, pacer: BulkPacer | None = None) -> None:
        """``pacer``: the bulk pacer to share with the app's other gates (one rate for every body of the process);
        by default one of its own at ``bulk_rate_bytes_s`` (None or 0: bulk is not paced)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.body_min_rate_bytes_s = body_min_rate_bytes_s
        self.pacer = pacer if pacer is not None else BulkPacer(bulk_rate_bytes_s) if bulk_rate_bytes_s else None
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused_by_server = scope.get("state", {}).get("protocol_error")
        if refused_by_server is not None:  # the server refused the body's framing or the headers' size
            status, code, reason = refused_by_server
            await _refusal(APIError(status, reason, code=code), scope)(scope, receive, send)  # dropped if it answered
            return
        has_body = _has_body(scope)  # asked once (#20: every request's headers scanned once for it, not twice)
        refused = self.authorize(scope) if has_body else None
        if refused is not None:
            await _refusal(refused, scope)(scope, receive, send)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_body_bytes:
            await _refusal(self._too_large(f"the declared body of {int(declared)} bytes"), scope)(scope, receive, send)
            return
        body, problem = await self._read(receive, scope.setdefault("state", {}))
        if problem is not None:
            await _refusal(problem, scope)(scope, receive, send)
            return
        if body is None:  # the connection closed while the body was on its way: nobody to answer
            await _unanswered(scope, receive, send)
            return
        scope.setdefault("state", {})["body"] = body  # read by the generation routes as it is: no copy
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive, state: dict[str, Any]) -> tuple[bytes | None, APIError | None]:
        """The whole body (None if the client disconnected), or the refusal that ends the reading.

        Once the protocol says the body has arrived whole (``state[BODY_ARRIVED]``), ``receive`` returns without
        waiting: no deadline is armed for it (issue #20: a timer set and cancelled, and asyncio's timeout context, on
        the event loop for every request whose body came in its first read — nearly all).

        The pieces are kept as they come and joined once at the end: appending each to one growing
        ``bytearray`` re-copied the buffer on most reallocations (CPython grows a large bytearray by
        an eighth): the largest item of a profile of the event loop while 7.5 MB bodies uploaded. The loop
        thread's CPU for 8 such bodies went from 270–280 ms to 220–240 ms (a plain asyncio protocol that
        only receives and joins the same bytes: 130–150 ms)."""
        pieces: list[bytes] = []
        size = 0
        # asyncio's own clock and timeout (the ASGI server's loop): anyio's cancel scope and backend lookup cost
        # the loop several times more, once per body piece — every request with a body (issue #13)
        now = asyncio.get_running_loop().time
        started = now()
        while True:
            # the next piece is due within the pause limit, and early enough to keep the minimum average rate
            # after the grace of one pause (by t: (t - body_timeout_s) x rate bytes; mod_reqtimeout's MinRate)
            if state.get(BODY_ARRIVED):
                message = await receive()  # there already: nothing to time
            else:
                pause = self.body_timeout_s
                rate = started + self.body_timeout_s + size / self.body_min_rate_bytes_s - now()
                try:
                    async with asyncio.timeout(max(0.0, min(pause, rate))):
                        message = await receive()
                except TimeoutError:
                    if rate < pause:
                        took = now() - started
                        return None, APIError(408, "the request body arrived slower than "
                                                   f"{self.body_min_rate_bytes_s:g} bytes/s on average ({size} bytes "
                                                   f"in {took:.1f} s; server.body_min_rate_bytes_s)",
                                              code="body_too_slow")
                    return None, APIError(408, f"the request body paused for more than {self.body_timeout_s:g} s "
                                               f"after {size} bytes", code="body_timeout")
            if message["type"] == "http.disconnect":
                return None, None
            piece = message.get("body", b"")
            if piece:
                pieces.append(piece)
                size += len(piece)
            if size > self.max_body_bytes:
                return None, self._too_large(f"the body (more than {self.max_body_bytes} bytes read)")
            if not message.get("more_body", False):
                return b"".join(pieces), None
            if self.pacer is not None and size > BULK_AFTER:
                started += await self.pacer.take(min(len(piece), size - BULK_AFTER))  # the server's wait, not
                # the client's: it moves the minimum-rate deadline

    def _too_large(self, what: str) -> APIError:
        return APIError(413, f"{what} exceeds the limit of {self.max_body_bytes} bytes (server.max_body_bytes)",
                        code="body_too_large")


async def _unanswered(scope: Scope, receive: Receive, send: Send) -> None:
    """The request's end when its connection closed before its body did: no client reads an answer, but the
    request's one log line and its status in the HTTP metrics say what happened — the protocol's refusal
    if h11 refused the body's framing (a broken chunk: the 400 the client got, noted in the scope by
    :class:`calculet.server.http_server.EdgeProtocol`), else 499 (the client closed), not the 500 a request
    that never answered counts as."""
    state = scope.setdefault("state", {})
    status, code, reason = state.get("protocol_error") or (
        499, "client_closed_request", "the client closed the connection while sending the body")
    state["error"] = (code, reason)
    try:
        await APIError(status, reason, code=code)(scope, receive, send)  # the server drops it: the connection is gone
    except OSError:  # an ASGI server may raise on a send after the disconnect (ASGI 2.4) instead of dropping it
        pass


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then waits on the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: Any = await receive()
        return message  # type: ignore[no-any-return]

    return replay


__all__ = ["Authorize", "BODY_ARRIVED", "BULK_AFTER", "BULK_RATE_BYTES_S", "BodyGate", "BulkPacer"]
