"""The sink of one HTTP request: a stream writer that also times its tokens (§4, §16 latencies).

Why apart from the routes: the :class:`~calculet.server.service.Service` opens one per request
and keeps the open-stream count and the latency histograms from its callbacks, and the
inference routes read tokens from it; both import it from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.tokenizer import ByteTokenizer
from calculet.runtime.streams.writer import StreamWriter
from calculet.server.jsonenc import dumps_text


_perf_counter = time.perf_counter
_writer_token = StreamWriter.token


class TimedStream(StreamWriter):
    """A StreamWriter that records when each token arrives and reports its close once.

    ``token``/``close`` run on the engine's actor thread: they only append a timestamp and,
    at the first token and at the close, call the service's bookkeeping (a few µs).
    """

    def __init__(self, *, tokenizer: ByteTokenizer, stop: tuple[tuple[int, ...], ...], tenant: str, arrival: float,
                 on_first_token: Callable[[TimedStream], None], on_close: Callable[[TimedStream], None],
                 stop_text: tuple[str, ...] = ()) -> None:
        super().__init__(tokenizer=tokenizer, stop=stop, stop_text=stop_text)
        self.tenant = tenant
        self.arrival = arrival
        self.token_times: list[float] = []
        self.closed_at: float | None = None
        self.final: RequestOutcome | None = None
        self._on_first_token = on_first_token
        self._on_close = on_close
        self._released = False

    def token(self, request_id: int, token: int) -> None:
        times = self.token_times
        times.append(_perf_counter())
        if len(times) == 1:
            self._on_first_token(self)
        _writer_token(self, request_id, token)  # StreamWriter.token without super()'s lookup, once a token (#20)

    def close(self, outcome: RequestOutcome) -> None:
        first = self.closed_at is None
        if first:
            self.closed_at = time.perf_counter()
            self.final = outcome
        super().close(outcome)
        if first:
            self.release()

    def release(self) -> None:
        """Report the end of this stream exactly once (also when the engine never saw it)."""
        if not self._released:
            self._released = True
            self._on_close(self)


class TextFrames:
    """The SSE frame of a text chunk, encoded once per stream: the part that never changes (id,
    created, model, fingerprint, object, the choice's fixed fields) is serialised here, and a
    token's frame is that prefix + the JSON string of its text + the suffix (issue #20: the same
    bytes ``json.dumps`` of the whole chunk gives, without building and encoding it per token).

    ``payload`` is the whole chunk with the text field set to :attr:`SLOT`."""

    SLOT = "\x00"

    def __init__(self, payload: dict[str, Any]) -> None:
        encoded = _dumps(payload)
        slot = _dumps(self.SLOT)
        if encoded.count(slot) != 1:
            raise ValueError("the chunk must hold the text slot exactly once")
        self._prefix, self._suffix = encoded.split(slot)
        self._prefix = "data: " + self._prefix
        self._suffix += "\n\n"

    def frame(self, text: str) -> str:
        return self._prefix + _dumps(text) + self._suffix


_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_json(value: Any) -> str:
    """``value`` as the JSON of one SSE ``data:`` line. Characters that ``str.splitlines`` takes for line breaks
    (NEL, U+2028, U+2029; JSON already escapes the control ones) are written as escapes: clients that split a
    stream with it (httpx's ``iter_lines``, GuideLLM) otherwise cut a chunk in two (#14). Encoded by
    :mod:`calculet.server.jsonenc` (orjson: a token's text is encoded once per token on the event loop, #20);
    an all-ASCII result has none of those characters and skips the translation."""
    text = dumps_text(value)
    return text if text.isascii() else text.translate(_LINE_BREAKS)


_dumps = sse_json


__all__ = ["TextFrames", "TimedStream", "sse_json"]
