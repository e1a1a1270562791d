"""The server-sent events of one streamed generation (§4 streaming, R4.7), as a pure ASGI response (issue #20).

What the event loop does per streamed token is here, so it is kept to what a token needs:

* **frames from a template.** A text chunk differs from the next only in its text: the rest (id, created,
  model, fingerprint, object, the choice's fixed fields) is encoded once — the part after ``created`` once per
  (kind, model, fingerprint), derived from the chunk's own dict (:func:`chunk_payload`, the one place its shape
  is declared), the id and ``created`` once per response — and a token's frame is that prefix, the JSON string
  of its text (orjson, bytes) and the suffix, never a dict, never ``str`` → ``bytes``;
* **one pass and one write per wake-up.** Every event found at a wake-up is framed into one body and sent in
  one ASGI message (one pass through the send chain, one socket write); the last one carries the end of the
  response too (``more_body`` false: the chunked body's last chunk goes in the same write);
* **written from the wake-up itself** (session 26). Behind the httptools protocol (:data:`DIRECT_BODY`), the stream's
  wake-up is a plain callback that frames the new events and writes them through the protocol at once, with the
  bytes ``send`` would write; only the last body, or one the protocol cannot take at once (writes paused), goes
  through the coroutine's ``send``. A wake-up costs no future, no task step a pass of the loop later (each pass
  beside the engine thread is one more taking of the interpreter lock) and no coroutine per send layer. No
  middleware between the protocol and this response may rewrite body parts (none does: the service's own
  ``send`` wrapper only reads the head and the last part);
* **no framework around it.** Starlette's ``StreamingResponse`` ran each response in an anyio task group (a
  task spawned, cancel scopes entered and left, the cancellation delivered at the end, the task's ``repr``
  built for its message) and pulled the frames through two async generators; here the response's own
  coroutine reads the stream (:meth:`~calculet.runtime.streams.writer.StreamWriter.events_since`) and one small
  task watches for the client going away.

The bytes are those ``"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) + "\\n\\n"``
gives for each chunk (``tests/unit/server/test_sse_frames.py`` checks it over tricky texts), with the characters
``str.splitlines`` takes for line breaks written as escapes (:func:`sse_frame`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.writer import StreamEvent, StreamFinish, StreamWriter
from calculet.server.errors import APIError, admission_error
from calculet.server.jsonenc import dumps, encode_str

HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
           (b"content-type", b"text/event-stream; charset=utf-8")]
"""The response's headers, as Starlette's ``StreamingResponse(media_type="text/event-stream", headers={
"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})`` wrote them (the test compares)."""

DONE = b"data: [DONE]\n\n"
DIRECT_BODY = "calculet.direct_body"
"""The ASGI scope extension (``scope["extensions"][DIRECT_BODY]``) of a protocol that can write a streamed
response's body part at once, as its ``send`` of ``more_body`` would, from any callback on its loop: a callable
``(body) -> bool``, False when the part must go through ``send`` instead (writes paused, the client gone, the
response not streaming). :mod:`calculet.server.http_fast` provides it; without it every part goes through
``send``."""
_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def escape_breaks(data: bytes) -> bytes:
    """NEL, U+2028 and U+2029 (UTF-8) as JSON escapes: clients that split a stream with ``str.splitlines``
    (httpx's ``iter_lines``, GuideLLM) otherwise cut a chunk in two (#14). JSON escapes the control characters
    already, and these three can only be inside strings; in UTF-8 their bytes are never part of another
    character, so replacing bytes is replacing characters. All-ASCII data has none and is returned as is."""
    if data.isascii():
        return data
    for char, escape in _BREAKS:
        data = data.replace(char, escape)
    return data


def json_text(text: str) -> bytes:
    """``text`` as a JSON string with the line breaks of :func:`escape_breaks` escaped. Why its own function: a
    token's text is a few characters, and looking for the three characters in it (``str`` search, tens of ns)
    costs far less than searching the encoded bytes of a whole batch of frames (bytes search: microseconds for a
    body of non-ASCII text, a visible share of the loop's CPU per token on the null device's text)."""
    try:
        encoded = encode_str(text)  # the encoder :func:`dumps` tries first, without its frame: once per token (#20)
    except TypeError:  # a lone surrogate: the standard library's answer, as dumps gives it
        encoded = dumps(text)
    if text.isascii() or ("\x85" not in text and "\u2028" not in text and "\u2029" not in text):
        return encoded
    return escape_breaks(encoded)


def sse_frame(value: Any) -> bytes:
    """``value`` as one SSE ``data:`` event (its JSON on one line)."""
    return escape_breaks(b"data: " + dumps(value) + b"\n\n")


def chunk_payload(*, response_id: str, created: int, model: str, fingerprint: str, chat: bool, text: str | None,
                  finish: str | None, role: bool = False, why: str | None = None) -> dict[str, Any]:
    """One streamed chunk (OpenAI ``text_completion`` / ``chat.completion.chunk``, vLLM's ``stop_reason``):
    the one declaration of its shape, which the text template is derived from."""
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    choice["stop_reason"] = why
    return {"id": response_id, "created": created, "model": model, "system_fingerprint": fingerprint,
            "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


_SLOT = "\x00"
_HEAD = b'{"id":"","created":0,'


@lru_cache(maxsize=64)
def _text_template(chat: bool, model: str, fingerprint: str) -> tuple[bytes, bytes]:
    """A text chunk's encoding without its id, ``created`` and text: what follows ``created`` up to the text, and
    what follows the text (cached: a few models and generations per process, whatever the requests)."""
    encoded = dumps(chunk_payload(response_id="", created=0, model=model, fingerprint=fingerprint, chat=chat,
                                  text=_SLOT, finish=None))
    slot = dumps(_SLOT)
    if not encoded.startswith(_HEAD) or encoded.count(slot) != 1:
        raise ValueError("a text chunk must begin with its id and created and hold its text once")
    before, after = encoded[len(_HEAD):].split(slot)
    return escape_breaks(b"," + before), escape_breaks(after + b"\n\n")


class Frames:
    """The SSE frames of one response."""

    def __init__(self, *, response_id: str, created: int, model: str, fingerprint: str, chat: bool,
                 prompt_tokens: int, include_usage: bool, continuous_usage: bool) -> None:
        self.response_id, self.created, self.model, self.fingerprint = response_id, created, model, fingerprint
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        after_created, self._suffix = _text_template(chat, model, fingerprint)
        self._prefix = escape_breaks(b'data: {"id":' + dumps(response_id) + b',"created":' + b"%d" % created
                                     + after_created)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        n = self.prompt_tokens
        return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

    def chunk(self, text: str | None, finish: str | None, *, role: bool = False, why: str | None = None,
              generated: int = 0) -> bytes:
        """A chunk's frame built from its dict (the first, the last, and every one with continuous usage)."""
        payload = chunk_payload(response_id=self.response_id, created=self.created, model=self.model,
                                fingerprint=self.fingerprint, chat=self.chat, text=text, finish=finish, role=role,
                                why=why)
        if self.continuous_usage:  # vLLM's stream_options.continuous_usage_stats: the counts so far, every chunk
            payload["usage"] = self.usage(generated)
        return sse_frame(payload)

    def text(self, text: str) -> bytes:
        """A text chunk's frame."""
        return self._prefix + json_text(text) + self._suffix

    def batch(self, events: list[StreamEvent], why: Callable[[StreamEvent], str | None]) -> tuple[bytes, bool]:
        """The frames of ``events`` as one body, and whether it ends the response (``why``: the finished event's
        ``stop_reason``)."""
        parts: list[bytes] = []
        templated = not self.continuous_usage
        prefix, suffix = self._prefix, self._suffix
        for event in events:
            text = event.text
            if text:
                if templated:
                    # :func:`json_text` inlined (issue #20: its Python frame was a call per text on the event loop)
                    try:
                        encoded = encode_str(text)
                    except TypeError:  # a lone surrogate: json_text's answer, the standard library's
                        encoded = json_text(text)
                    else:
                        if not text.isascii() and ("\x85" in text or "\u2028" in text or "\u2029" in text):
                            encoded = escape_breaks(encoded)
                    parts += (prefix, encoded, suffix)
                else:
                    parts.append(self.chunk(text, None, generated=event.generated))
            if event.finished:
                parts += self._end(event, why)
                return b"".join(parts), True
        return b"".join(parts), False

    def _end(self, event: StreamEvent, why: Callable[[StreamEvent], str | None]) -> list[bytes]:
        outcome = event.outcome
        assert outcome is not None
        if outcome.state != "completed":
            return [sse_frame(outcome_error(outcome).body()), DONE]
        parts = [self.chunk(None if self.chat else "", finish_of(event.finish_reason), why=why(event),
                            generated=outcome.generated_tokens)]
        if self.include_usage:
            parts.append(sse_frame({"id": self.response_id, "created": self.created, "model": self.model,
                                    "system_fingerprint": self.fingerprint,
                                    "object": "chat.completion.chunk" if self.chat else "text_completion",
                                    "choices": [], "usage": self.usage(event.generated)}))
        parts.append(DONE)
        return parts


def finish_of(reason: StreamFinish | None) -> Literal["stop", "length"]:
    """The API's ``finish_reason`` of a completed stream."""
    return "length" if reason is StreamFinish.LENGTH else "stop"


def outcome_error(outcome: RequestOutcome, *, disconnected: bool = False) -> APIError:
    """The error of a request that ended without completing (not a §5.2 rejection): the body of a stream's last
    event, or the answer of a request that was not streamed."""
    reason = outcome.finish_reason
    detail = outcome.detail or reason.name.lower()
    if reason is FinishReason.REJECTED:
        return admission_error(outcome.http_status, outcome.detail)
    if reason is FinishReason.DEADLINE:
        return APIError(504, f"the request's deadline passed: {detail}", code="deadline_exceeded")
    if reason is FinishReason.CANCELLED:
        if disconnected:
            return APIError(499, "client closed the request", code="client_closed_request",
                            type="invalid_request_error")
        return APIError(503, f"the request was cancelled by the service (shutting down or draining): {detail}",
                        code="request_cancelled")
    status = outcome.http_status if 500 <= outcome.http_status < 600 else 500
    return APIError(status, f"generation failed: {detail}", code="generation_failed", type="server_error")


class SSEResponse(Response):
    """The SSE response of one stream (a Starlette ``Response`` only so that the front and FastAPI's routes pass it
    through as they pass any response; none of ``Response``'s own machinery runs).

    ``first``: a frame sent right after the head (a chat's role chunk, as OpenAI sends it before any token);
    ``why``: the ``stop_reason`` of the finished event; ``abandon``: called when the response ends before the
    stream did (the client went away, or the task was cancelled) — the request is to be cancelled; ``end``: called
    once with whether the client went away, before the response's last message (the request's log line)."""

    def __init__(self, stream: StreamWriter, frames: Frames, *, first: bytes | None,
                 why: Callable[[StreamEvent], str | None], abandon: Callable[[], None],
                 end: Callable[[bool], None]) -> None:
        self.status_code = 200
        self.raw_headers = list(HEADERS)
        self.background = None
        self._stream = stream
        self._frames = frames
        self._first = first
        self._why = why
        self._abandon = abandon
        self._end = end
        self._gone = False
        self._wake: asyncio.Future[None] | None = None
        self._index = 0
        """Events of the stream framed so far."""
        self._pending: tuple[bytes, bool] | None = None
        """A body :meth:`_ready` framed and left to the coroutine's ``send`` (the last, or one not written directly)."""
        self._direct: Callable[[bytes], bool] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._direct = scope.get("extensions", {}).get(DIRECT_BODY)
        # runs from the loop's next turn; the loop's create_task is what ensure_future ends in, without its checks
        watch = asyncio.get_running_loop().create_task(_disconnect(receive))
        watch.add_done_callback(self._client_gone)
        finished = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if self._first is not None:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            finished = await self._pump(send)
        finally:
            if not finished:
                watch.cancel()
                if not self._stream.closed:
                    self._abandon()
                self._end(True)
        if self.background is not None:
            await self.background()

    async def _pump(self, send: Send) -> bool:
        """Frame and send what the stream has at each wake-up until its last event (True) or the client goes away
        (False). With the protocol's direct writer (:data:`DIRECT_BODY`) the wake-ups frame and write in their own
        callback (:meth:`_ready`) and this coroutine sends only what they leave it: the last body, or one the
        protocol cannot take at once (its writes paused: backpressure)."""
        if self._direct is None:
            return await self._pump_each(send)
        create_future = asyncio.get_running_loop().create_future
        while not self._gone:
            wake = self._wake = create_future()
            self._ready()
            if not wake.done():
                await wake
            pending, self._pending = self._pending, None
            if pending is None:
                continue  # the client went away (the loop ends) or nothing was left to send
            if await self._send_part(send, *pending):
                return True
        return False

    def _ready(self) -> None:
        """(on the loop: from the pump, or as the stream's wake-up callback) Frame the stream's new events and write
        them through the protocol at once, as long as there are some and it takes them; otherwise leave the body
        to the pump (:attr:`_pending`) and wake it, or wait for the stream's next wake-up.

        Why (issue #20, session 26): a wake-up that set a future ran the pump a pass of the loop later, each pass a
        separate taking of the interpreter lock beside the turning engine thread, and every body went through the
        ASGI send chain (a coroutine per layer); written from the wake-up's own callback, a stream's frames cost one
        call and one socket write."""
        wake = self._wake
        if wake is None or wake.done() or self._gone:
            return  # a wake-up for a pump that has moved on (it reads the stream again itself) or ended
        stream, frames, direct = self._stream, self._frames, self._direct
        try:
            while True:
                batch = stream.events_since(self._index, self._ready, wake.get_loop())
                if not batch:
                    return  # this runs again at the stream's next wake-up
                self._index += len(batch)
                body, last = frames.batch(batch, self._why)
                if last or direct is None or not direct(body):
                    self._pending = (body, last)
                    wake.set_result(None)
                    return
        except Exception as exc:  # raised in the pump, as when it framed the events itself
            if not wake.done():
                wake.set_exception(exc)

    async def _pump_each(self, send: Send) -> bool:
        """:meth:`_pump` without a direct writer (h11, test clients): every body through ``send``."""
        stream, frames, why = self._stream, self._frames, self._why
        create_future = asyncio.get_running_loop().create_future
        index = 0
        while not self._gone:
            wake = self._wake = create_future()
            batch = stream.events_since(index, wake)
            if not batch:
                await wake
                continue
            index += len(batch)
            if await self._send_part(send, *frames.batch(batch, why)):
                return True
        return False

    async def _send_part(self, send: Send, body: bytes, last: bool) -> bool:
        """Send one framed part through ASGI; True when it was the last (the stream is then ended first)."""
        if last:
            self._end(False)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return True
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})
        return False

    def _client_gone(self, watch: asyncio.Future[None]) -> None:
        if watch.cancelled():
            return
        watch.exception()  # a receive that raised: the client is as gone (and the error is not reported unread)
        self._gone = True
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)


async def _disconnect(receive: Receive) -> None:
    """Returns when the client has gone (or the response has completed: the server then answers the same)."""
    message: Message = await receive()
    while message["type"] != "http.disconnect":
        message = await receive()
