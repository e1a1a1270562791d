"""StreamWriter (§3, §4): a thread-safe request sink that HTTP handlers and asyncio loops consume.

The engine's actor delivers a request's tokens and its single terminal outcome to a
:class:`~calculet.runtime.request.RequestSink`. :class:`StreamWriter` is that sink as a
stream: the actor appends (never blocks), any number of consumers read —

* a thread (an HTTP handler) with :meth:`StreamWriter.next_event` / iteration /
  :meth:`StreamWriter.result`, each bounded by a timeout;
* an asyncio task with ``async for event in stream.aevents()`` — the actor wakes the loop with
  ``call_soon_threadsafe``, so the loop never blocks on the actor.

It closes exactly once with a finish reason — ``stop``, ``length``, ``cancelled``, ``error`` or
``deadline`` — and a second close is refused and counted (§4: "promise/stream close can be
triggered only once"). A token after the close is refused the same way.

What a client sees (``StreamEvent.tokens`` / ``text``) is the generated tokens minus what
ended the request: EOS, and a completed stop sequence. Tokens that might still turn out to
be the start of a stop sequence are held back until they cannot be; ``raw_tokens`` keeps
everything the model produced, in order. Stop *strings* (the API's ``stop``, issue #14) are matched
on the decoded text by :class:`StopTextMatcher`, as OpenAI and vLLM do, whatever the token boundaries:
the text shown ends right before the first one, text that may begin one is held back until it cannot
(or the request ends, when it is released), and ``tokens`` are those whose text is entirely shown. Text is decoded incrementally
(:class:`~calculet.runtime.streams.tokenizer.Detokenizer`): a multi-byte character split across
tokens appears once it is complete.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import AsyncIterator, Callable, Iterator, NamedTuple, Sequence

from calculet.machines.request import FinishReason
from calculet.runtime.request import RequestOutcome
from calculet.runtime.streams.tokenizer import ByteTokenizer, Detokenizer


class StreamFinish(str, enum.Enum):
    """The stream's finish reason (the API's ``finish_reason``)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"
    DEADLINE = "deadline"

    @classmethod
    def of(cls, reason: FinishReason) -> StreamFinish:
        """Admission rejections (400/429/503) are errors; the outcome keeps the HTTP status."""
        return _FINISH.get(reason, cls.ERROR)


_FINISH = {FinishReason.STOP: StreamFinish.STOP, FinishReason.LENGTH: StreamFinish.LENGTH,
           FinishReason.CANCELLED: StreamFinish.CANCELLED, FinishReason.DEADLINE: StreamFinish.DEADLINE,
           FinishReason.ERROR: StreamFinish.ERROR, FinishReason.REJECTED: StreamFinish.ERROR}


class StreamEvent(NamedTuple):
    """A chunk of visible output, or (``finished``) the final event carrying the outcome (immutable; a named
    tuple, which one step's events build at a third of a frozen dataclass's cost, issue #20)."""

    index: int
    tokens: tuple[int, ...]
    text: str
    finished: bool = False
    finish_reason: StreamFinish | None = None
    outcome: RequestOutcome | None = None
    generated: int = 0
    """Tokens the model had generated when this event was emitted (held-back ones included): the usage
    count a chunk of it reports (vLLM's ``continuous_usage_stats``), whenever the consumer reads it."""


@dataclass(frozen=True)
class StreamResult:
    """Everything a finished stream carried."""

    request_id: int
    raw_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    finish_reason: StreamFinish
    outcome: RequestOutcome


@dataclass(frozen=True)
class StreamStatistics:
    raw_tokens: int
    visible_tokens: int
    held_back: int
    events: int
    closed: bool
    refused_closes: int
    refused_tokens: int


class StopTextMatcher:
    """Stop strings matched on the decoded TEXT, not on token ids (issue #14; OpenAI and vLLM do so).

    A stop string may be generated across any token boundaries ("l" + "o w") or inside one longer
    token, so tokenising it once and matching ids misses it. The matcher is fed the text each token
    completes (an incremental detokeniser's output) and answers what may be shown: everything before
    the first stop string once one appears (the stop string itself is never shown, §9.2), else
    everything except the longest tail that is still the beginning of some stop string — that tail is
    held back until it is known not to be one, and released by :meth:`flush` at the end of
    generation. Memory is bounded by the longest stop string.
    """

    __slots__ = ("stops", "matched", "_pending")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        if any(not isinstance(s, str) or not s for s in self.stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stops)!r}")
        self.matched: str | None = None
        """The stop string that matched (vLLM's ``stop_reason``), once one has."""
        self._pending = ""

    def feed(self, text: str) -> str:
        """The text that may be shown now, after ``text`` more was decoded ("" once a stop matched)."""
        if self.matched is not None:
            return ""
        pending = self._pending + text
        first = -1
        for stop in self.stops:
            at = pending.find(stop)
            if at >= 0 and (first < 0 or at < first):
                first, self.matched = at, stop
        if first >= 0:
            self._pending = ""
            return pending[:first]
        keep = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(pending)), keep, -1):
                if pending.endswith(stop[:n]):
                    keep = n
                    break
        self._pending = pending[len(pending) - keep:] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self, text: str = "") -> str:
        """The end of generation: a held-back partial match is ordinary text after all."""
        released = self.feed(text)
        if self.matched is not None:
            return released
        released += self._pending
        self._pending = ""
        return released

    @property
    def held(self) -> int:
        """Characters held back as a possible start of a stop string."""
        return len(self._pending)


class StreamWriter:
    """A request's stream: a thread-safe :class:`RequestSink` with blocking and async readers."""

    def __init__(self, *, tokenizer: ByteTokenizer | None = None, stop: Sequence[Sequence[int]] = (),
                 eos: int | None = None, stop_text: Sequence[str] = ()) -> None:
        self._mutex = threading.Lock()
        """The lock of ``_lock``, entered directly on the per-token paths (a Condition's ``with`` is a Python-level
        call on top, issue #20); waiting and notifying go through ``_lock``."""
        self._lock = threading.Condition(self._mutex)
        self._detok: Detokenizer | None = tokenizer.detokenizer() if tokenizer is not None else None
        self._stops = tuple(tuple(s) for s in stop if s)
        self._matcher: StopTextMatcher | None = None
        self._ends: list[int] = []
        """For each held token, how many characters had been decoded once it was (text stops only)."""
        self._decoded = 0
        self._shown = 0
        self._stop_at: int | None = None
        self._eos = eos if eos is not None else (tokenizer.eos if tokenizer is not None else None)
        self._request_id = 0
        self._raw: list[int] = []
        self._visible: list[int] = []
        self._held: list[int] = []
        self._text: list[str] = []
        self._events: list[StreamEvent] = []
        self._outcome: RequestOutcome | None = None
        self._async_waiters: list[Waiter] = []
        self._refused_closes = 0
        self._refused_tokens = 0
        self._sleepers = 0
        """Threads blocked in :meth:`next_event`/:meth:`result`: an event notifies the condition only for them."""
        if stop_text:  # matched on the decoded text (issue #14); the sampler matches the same strings
            if self._detok is None:
                raise ValueError("stop strings need a tokenizer to decode the text they are matched on")
            if self._stops:
                raise ValueError("a stream matches token-id stop sequences or stop strings, not both")
            self._matcher = StopTextMatcher(stop_text)

    @property
    def stop_matched(self) -> str | None:
        """The stop string the text matched (vLLM's ``stop_reason``), or None."""
        with self._lock:
            return self._matcher.matched if self._matcher is not None else None

    # ------------------------------------------------------------------ the sink (actor side)

    def token(self, request_id: int, token: int) -> None:
        with self._mutex:
            if self._outcome is not None:
                self._refused_tokens += 1
                return
            self._request_id = request_id
            self._raw.append(token)
            if self._matcher is not None:
                self._text_token(token)
                waiters, self._async_waiters = self._async_waiters, []
                if waiters:
                    _wake(waiters)
                return
            held = self._held
            if not held and not self._stops and token != self._eos:
                # the common case: nothing held and nothing to hold, the token is shown at once: :meth:`_emit` of one
                # token that is not the last, here rather than in a function of its own (issue #20: a frame a token)
                detok = self._detok
                text = detok.push(token) if detok is not None else ""
                self._visible.append(token)
                if text:
                    self._text.append(text)
                events = self._events
                events.append(_new_event(StreamEvent, (len(events), (token,), text, False, None, None, len(self._raw))))
                if self._sleepers:
                    self._lock.notify_all()
                waiters, self._async_waiters = self._async_waiters, []
                if waiters:
                    _wake(waiters)
                return
            held.append(token)
            # without stop sequences only a trailing EOS is held (what _holdback finds then, without the call)
            keep = self._holdback() if self._stops else int(token == self._eos)
            if keep < len(held):
                release = held[: len(held) - keep]
                del held[: len(release)]
                self._emit(release, finished=False)
            waiters, self._async_waiters = self._async_waiters, []
        if waiters:
            _wake(waiters)

    def close(self, outcome: RequestOutcome) -> None:
        with self._mutex:
            if self._outcome is not None:
                self._refused_closes += 1
                return
            self._request_id = outcome.request_id
            held = self._held
            if self._matcher is not None:
                self._outcome = outcome
                self._text_close(outcome)
            elif outcome.finish_reason is FinishReason.STOP:
                if held and self._eos is not None and held[-1] == self._eos:
                    held.pop()
                else:
                    for seq in self._stops:
                        if len(held) >= len(seq) and tuple(held[-len(seq):]) == seq:
                            del held[-len(seq):]
                            break
            if self._matcher is None:
                self._outcome = outcome
                self._emit(list(held), finished=True)
                held.clear()
            waiters, self._async_waiters = self._async_waiters, []
        if waiters:
            _wake(waiters)

    # ------------------------------------------------------------------ consumers (any thread)

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._outcome is not None

    def next_event(self, index: int, timeout: float | None = None) -> StreamEvent:
        """Event number ``index`` (0-based), waiting up to ``timeout``; ``TimeoutError`` if none."""
        with self._lock:
            if len(self._events) <= index and not self._sleep(lambda: len(self._events) > index, timeout):
                raise TimeoutError(f"no stream event {index} within {timeout} s")
            return self._events[index]

    def events(self, timeout: float | None = None) -> Iterator[StreamEvent]:
        """Every event in order, ending with the final one; each wait is bounded by ``timeout``."""
        index = 0
        while True:
            event = self.next_event(index, timeout)
            yield event
            if event.finished:
                return
            index += 1

    def result(self, timeout: float | None = None) -> StreamResult:
        """Wait for the close and return everything the stream carried."""
        with self._lock:
            if self._outcome is None and not self._sleep(lambda: self._outcome is not None, timeout):
                raise TimeoutError(f"stream not closed within {timeout} s")
            outcome = self._outcome
            assert outcome is not None
            return StreamResult(outcome.request_id, tuple(self._raw), tuple(self._visible), "".join(self._text),
                                StreamFinish.of(outcome.finish_reason), outcome)

    async def aevents(self) -> AsyncIterator[StreamEvent]:
        """The events for an asyncio consumer, one by one; the actor wakes the loop thread-safely."""
        async for batch in self.abatches():
            for event in batch:
                yield event

    async def abatches(self) -> AsyncIterator[list[StreamEvent]]:
        """The events for an asyncio consumer, as many as are there at each wake-up (in order, the last
        batch ending with the final event): a consumer that writes them to a socket makes one write per
        wake-up, not one per token (issue #20: SSE frames of a step encoded and sent together)."""
        create_future = asyncio.get_running_loop().create_future
        index = 0
        while True:
            wake: asyncio.Future[None] = create_future()
            batch = self.events_since(index, wake)
            if not batch:
                await wake
                continue
            index += len(batch)
            yield batch
            if batch[-1].finished:
                return

    def events_since(self, index: int, wake: asyncio.Future[None] | Callable[[], None] | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> list[StreamEvent]:
        """The events from number ``index`` on ([] when there is none yet); with none and ``wake`` given, ``wake``
        is set (through its own loop, thread-safely) when the next one comes — or, a callable, called on ``loop``
        (required then) with the wake-ups it is handed over with. Why apart from :meth:`abatches`: a consumer that
        also waits for something else (the SSE response waits for the client going away too) sets ``wake`` itself,
        and reads the stream without an async generator between it and the events (#20); a callable lets it frame
        and write the events in the wake-up's own callback, a pass of the loop before a woken task would run."""
        with self._mutex:
            events = self._events
            if len(events) > index:
                return events[index:]
            if wake is not None:
                self._async_waiters.append(
                    (wake.get_loop() if isinstance(wake, asyncio.Future) else _loop_of(loop), wake))
            return []

    def statistics(self) -> StreamStatistics:
        with self._lock:
            return StreamStatistics(len(self._raw), len(self._visible), len(self._held), len(self._events),
                                    self._outcome is not None, self._refused_closes, self._refused_tokens)

    # ------------------------------------------------------------------ internals (lock held)

    def _sleep(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """``wait_for`` on the stream's condition, counted so that the actor notifies only when a thread waits."""
        self._sleepers += 1
        try:
            return self._lock.wait_for(predicate, timeout)
        finally:
            self._sleepers -= 1

    def _holdback(self) -> int:
        """How many trailing held tokens may still begin (or complete) a stop sequence."""
        held = self._held
        best = 0
        if self._eos is not None and held and held[-1] == self._eos:
            best = 1
        for seq in self._stops:
            for n in range(min(len(seq), len(held)), best, -1):
                if tuple(held[-n:]) == seq[:n]:
                    best = n
                    break
        return best

    def _text_token(self, token: int) -> None:
        """One token with stop strings: decode, let the matcher say what may be shown, release the tokens
        whose text is all shown (a trailing EOS is held for :meth:`close` to drop)."""
        detok, matcher = self._detok, self._matcher
        assert detok is not None and matcher is not None
        piece = detok.push(token)
        self._decoded += len(piece)
        self._held.append(token)
        self._ends.append(self._decoded)
        was = matcher.matched
        text = matcher.feed(piece)
        self._shown += len(text)
        if was is None and matcher.matched is not None:
            self._stop_at = self._shown
        release = self._releasable(self._shown, keep_eos=True)
        if release or text:
            self._emit(release, finished=False, text=text)

    def _text_close(self, outcome: RequestOutcome) -> None:
        """The close with stop strings: after a match nothing more is shown (the tokens of the stop string
        and after it stay hidden); otherwise a held-back partial match is released, since generation
        ended (by EOS, length, cancel...) before it could complete."""
        detok, matcher = self._detok, self._matcher
        assert detok is not None and matcher is not None
        text = matcher.flush(detok.flush())
        self._shown += len(text)
        if self._stop_at is not None:
            release = self._releasable(self._stop_at, keep_eos=False)
        else:
            release = self._releasable(self._decoded, keep_eos=False)
            if outcome.finish_reason is FinishReason.STOP and release and release[-1] == self._eos:
                release.pop()
        self._held.clear()
        self._ends.clear()
        self._emit(release, finished=True, text=text)

    def _releasable(self, shown: int, *, keep_eos: bool) -> list[int]:
        """Take the leading held tokens whose text ends within the first ``shown`` characters."""
        held, ends = self._held, self._ends
        n = 0
        while n < len(held) and ends[n] <= shown:
            n += 1
        if keep_eos and n and n == len(held) and held[n - 1] == self._eos:
            n -= 1
        release = held[:n]
        del held[:n]
        del ends[:n]
        return release

    def _emit(self, tokens: list[int], *, finished: bool, text: str | None = None) -> None:
        """Append one event; ``text`` given (stop strings) or decoded here from ``tokens``."""
        if text is None:
            text = ""
            detok = self._detok
            if detok is not None:
                text = detok.push(tokens[0]) if len(tokens) == 1 else "".join(map(detok.push, tokens))
                if finished:
                    text += detok.flush()
        self._visible.extend(tokens)
        if text:
            self._text.append(text)
        outcome = self._outcome if finished else None
        reason = StreamFinish.of(outcome.finish_reason) if outcome is not None else None
        self._events.append(StreamEvent(len(self._events), tuple(tokens), text, finished, reason, outcome,
                                        len(self._raw)))
        if self._sleepers:
            self._lock.notify_all()



_new_event = tuple.__new__
"""Builds a :class:`StreamEvent` from all its fields without the named tuple's Python-level ``__new__``."""
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None] | Callable[[], None]"]
"""A consumer loop and what to do on it: a stream's wake-up future to set, or a callback (:func:`call_soon_held`)."""
_batch = threading.local()


@contextmanager
def batched_wakeups() -> Iterator[None]:
    """Within this block (on one thread), stream wake-ups are collected and each consumer loop is
    woken once at the end for all of them: the engine's actor wraps the application of one
    device result in it, so a decode step of B lanes is one hop to the HTTP loop, not B (issue
    #20). Nested blocks join the outermost."""
    if getattr(_batch, "pending", None) is not None:
        yield
        return
    pending: list[Waiter] = []
    _batch.pending = pending
    try:
        yield
    finally:
        _batch.pending = None
        if pending:
            _wake_now(pending)


def hold_wakeups() -> None:
    """From now on (on this thread) stream wake-ups are collected until :func:`flush_wakeups`: the engine's
    actor holds them across its turns while it keeps finding work, and flushes them before it sleeps or once
    they have waited ``EngineOptions.wake_coalesce_s`` — a device that completes steps faster than a consumer
    loop can usefully wake (the null device) then costs one wake-up of that loop per window, not per step
    (issue #20). :func:`batched_wakeups` blocks inside join it."""
    if getattr(_batch, "pending", None) is None:
        _batch.pending = []


def held_wakeups() -> int:
    """How many wake-ups this thread holds (0 when none, or not holding)."""
    pending: list[Waiter] | None = getattr(_batch, "pending", None)
    return len(pending) if pending else 0


def flush_wakeups(*, release: bool = False) -> None:
    """Wake every consumer loop this thread holds wake-ups for (each once); ``release``: stop holding."""
    pending: list[Waiter] | None = getattr(_batch, "pending", None)
    if pending is None:
        return
    _batch.pending = None if release else []
    if pending:
        _wake_now(pending)


def call_soon_held(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` with the stream wake-ups this thread holds (:func:`hold_wakeups`): one hand-off
    to that loop for both, at the flush; at once (``call_soon_threadsafe``) on a thread that holds none.

    Why (issue #20): the HTTP service's submit answer (``submit_then``'s ``done``) woke the event loop by itself,
    and the request's first tokens woke it again at the next flush, within the same millisecond; each wake-up of the
    loop beside a busy actor is an interpreter-lock hand-over, which costs both threads far more CPU than the
    callback. An answer that can wait for the flush (an admitted request's, nobody else waiting on it) rides with
    the wake-ups instead."""
    pending: list[Waiter] | None = getattr(_batch, "pending", None)
    if pending is not None:
        pending.append((loop, callback))
    else:
        _call_soon(loop, callback)


def _wake(waiters: list[Waiter]) -> None:
    pending: list[Waiter] | None = getattr(_batch, "pending", None)
    if pending is not None:
        pending.extend(waiters)
    else:
        _wake_now(waiters)


def _wake_now(waiters: list[Waiter]) -> None:
    if len(waiters) == 1:
        loop, wake = waiters[0]
        _call_soon(loop, partial(_set, wake))
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None] | Callable[[], None]]] = {}
    for loop, wake in waiters:
        by_loop.setdefault(loop, []).append(wake)
    for loop, wakes in by_loop.items():
        _call_soon(loop, partial(_set_all, wakes))


def _set(wake: asyncio.Future[None] | Callable[[], None]) -> None:
    if not isinstance(wake, asyncio.Future):
        _run_held(wake)
    elif not wake.done():  # a consumer that went away cancelled its future
        wake.set_result(None)


def _set_all(wakes: list[asyncio.Future[None] | Callable[[], None]]) -> None:
    for wake in wakes:
        if not isinstance(wake, asyncio.Future):
            _run_held(wake)
        elif not wake.done():
            wake.set_result(None)


def _run_held(callback: Callable[[], None]) -> None:
    """A held callback (:func:`call_soon_held`), reported as the loop reports a callback's error, never stopping
    the wake-ups handed over with it."""
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 - as the loop's own handle would
        asyncio.get_running_loop().call_exception_handler(
            {"message": "a held stream callback failed", "exception": exc, "callback": callback})


def _loop_of(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
    if loop is None:
        raise ValueError("a callable wake-up needs the loop it is to be called on")
    return loop


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
        pass
