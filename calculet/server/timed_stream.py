"""The sink of one HTTP request: a stream writer that also times its tokens (§4, §16 latencies).

Why apart from the routes: the :class:`~calculet.server.service.Service` opens one per request
and keeps the open-stream count and the latency histograms from its callbacks, and the
inference routes read tokens from it; both import it from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.tokenizer import ByteTokenizer
from calculet.runtime.streams.writer import StreamWriter


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


__all__ = ["TimedStream"]
