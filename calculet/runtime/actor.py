"""The actor that owns the scheduling core (§4: "a single-threaded actor"; DESIGN principle 2).

The core is not thread-safe by design. HTTP handlers, the device completion thread and the
samplers never call it; they *post* a message — a callable — to the owner's mailbox. One
thread, the owner, runs the messages one at a time, so every state change happens on it.

* :meth:`Mailbox.post` returns a :class:`Reply` (a one-shot promise) the poster may wait on;
  a reply is set exactly once — a second set raises, so a double completion cannot hide.
* :meth:`Mailbox.run_pending` / :meth:`Mailbox.run_until` are called by the owner only; the
  first thread to run messages becomes the owner and any other thread is refused.
* Waiting is optional, Trio-style: ``post`` (fire and forget or wait later) and ``call``
  (post and wait).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from calculet.errors import DefinitionError

T = TypeVar("T")

_UNSET: Any = object()


class PromiseAlreadySatisfied(DefinitionError):
    """A reply was set twice: a double completion (R17.3.4)."""

    code = "promise_already_satisfied"


class Reply(Generic[T]):
    """A one-shot promise: set once (value or exception), waited on by any thread."""

    __slots__ = ("_event", "_value", "_error", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def set(self, value: T) -> None:
        self._settle(value, None)

    def fail(self, error: BaseException) -> None:
        self._settle(_UNSET, error)

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> T:
        """The value (or the exception the message raised); ``TimeoutError`` if none in time."""
        if not self._event.wait(timeout):
            raise TimeoutError("reply not set in time")
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def _settle(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._event.is_set():
                raise PromiseAlreadySatisfied("reply already set")
            self._value = value
            self._error = error
            self._event.set()


@dataclass(frozen=True)
class MailboxStatistics:
    posted: int
    run: int
    failed: int
    pending: int


class Mailbox:
    """A thread-safe FIFO of messages run by one owner thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Reply[Any] | None]] = queue.SimpleQueue()
        self._owner: int | None = None
        self._lock = threading.Lock()
        self._posted = 0
        self._run = 0
        self._failed = 0

    def post(self, message: Callable[[], T]) -> Reply[T]:
        """Queue ``message`` for the owner; any thread may post."""
        reply: Reply[T] = Reply()
        with self._lock:
            self._posted += 1
        self._queue.put((message, reply))
        return reply

    def send(self, message: Callable[[], Any]) -> None:
        """Queue ``message`` with no reply: its poster learns the outcome from the message itself (a callback it
        carries, as ``ThreadedEngine.submit_then``'s ``done``); what it raises is counted as failed, as any message's.
        Why (issue #20): a :class:`Reply` is an ``Event`` (a condition and two locks), built by the poster and set by
        the owner, per request, for nobody to read."""
        with self._lock:
            self._posted += 1
        self._queue.put((message, None))

    def call(self, message: Callable[[], T], timeout: float | None = None) -> T:
        """Post and wait for the result (from a thread that is not the owner)."""
        if self._owner == threading.get_ident():
            raise DefinitionError("the owner thread cannot wait on its own mailbox")
        return self.post(message).wait(timeout)

    def run_pending(self, limit: int | None = None) -> int:
        """Run the messages already queued (at most ``limit``); owner thread only."""
        self._claim()
        ran = 0
        pending = self._queue
        # empty() first: only the owner takes messages, so a queue that is not empty stays so until it does, and
        # the actor's every turn asks once with nothing there (an exception per turn avoided, issue #20)
        while (limit is None or ran < limit) and not pending.empty():
            message, reply = pending.get_nowait()
            self._execute(message, reply)
            ran += 1
        return ran

    def run_until(self, timeout: float) -> int:
        """Block up to ``timeout`` seconds for one message, then run everything queued."""
        if timeout <= 0:
            return self.run_pending()
        self._claim()
        try:
            message, reply = self._queue.get(timeout=timeout)
        except queue.Empty:
            return 0
        self._execute(message, reply)
        return 1 + self.run_pending()

    def statistics(self) -> MailboxStatistics:
        with self._lock:
            return MailboxStatistics(self._posted, self._run, self._failed, self._queue.qsize())

    def _claim(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise DefinitionError("mailbox messages run only on the owner thread")

    def _execute(self, message: Callable[[], Any], reply: Reply[Any] | None) -> None:
        try:
            value = message()
        except Exception as exc:  # delivered to the poster (if it asked for a reply); the owner keeps running
            with self._lock:
                self._run += 1
                self._failed += 1
            if reply is not None:
                reply.fail(exc)
            return
        with self._lock:
            self._run += 1
        if reply is not None:
            reply.set(value)
