"""The actor/mailbox (§4 single-threaded actor): one owner, one-shot replies."""

from __future__ import annotations

import threading

import pytest

from calculet.errors import DefinitionError
from calculet.runtime.actor import Mailbox, PromiseAlreadySatisfied, Reply


@pytest.mark.req("R4.7", "R17.3.4")
def test_a_reply_is_set_once():
    reply: Reply[int] = Reply()
    reply.set(1)
    with pytest.raises(PromiseAlreadySatisfied):
        reply.set(2)
    with pytest.raises(PromiseAlreadySatisfied):
        reply.fail(RuntimeError("late"))
    assert reply.wait(0) == 1


def test_messages_run_in_order_on_the_owner_and_errors_reach_the_poster():
    box = Mailbox()
    seen: list[int] = []
    replies = [box.post(lambda i=i: seen.append(i) or i) for i in range(5)]
    bad = box.post(lambda: 1 / 0)
    assert box.run_pending() == 6
    assert seen == [0, 1, 2, 3, 4] and [r.wait(0) for r in replies] == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError):
        bad.wait(0)
    stats = box.statistics()
    assert (stats.posted, stats.run, stats.failed, stats.pending) == (6, 6, 1, 0)


@pytest.mark.req("R4.2")
def test_only_the_owner_thread_runs_messages_and_others_call_through_it():
    box = Mailbox()
    box.run_pending()                       # this thread is the owner now
    errors: list[BaseException] = []
    results: list[int] = []

    def intruder() -> None:
        try:
            box.run_pending()
        except DefinitionError as exc:
            errors.append(exc)
        results.append(box.call(lambda: threading.get_ident(), timeout=5))

    thread = threading.Thread(target=intruder)
    thread.start()
    while thread.is_alive():
        box.run_until(0.01)
    thread.join()
    assert len(errors) == 1 and results == [threading.get_ident()]
    with pytest.raises(DefinitionError):
        box.call(lambda: 1)                 # the owner would wait on itself


def test_wait_times_out_without_a_value():
    with pytest.raises(TimeoutError):
        Reply().wait(0)


def test_a_turn_with_no_wait_runs_what_is_queued_and_returns_at_once_when_nothing_is():
    """``run_until(0)`` is the actor's turn while it keeps finding work (issue #20): everything already posted
    runs, in order, and an empty mailbox answers 0 without blocking; ``run_pending``'s limit still holds."""
    box = Mailbox()
    assert box.run_until(0) == 0
    seen: list[int] = []
    for i in range(3):
        box.post(lambda i=i: seen.append(i))
    assert box.run_until(0) == 3 and seen == [0, 1, 2]
    assert box.run_until(0) == 0 and box.statistics().pending == 0
    for i in range(3, 6):
        box.post(lambda i=i: seen.append(i))
    assert box.run_pending(limit=2) == 2 and seen == [0, 1, 2, 3, 4]
    assert box.run_pending() == 1 and seen[-1] == 5
    refused: list[BaseException] = []

    def not_the_owner() -> None:
        try:
            box.run_until(0)
        except DefinitionError as exc:
            refused.append(exc)

    other = threading.Thread(target=not_the_owner)
    other.start()
    other.join()
    assert len(refused) == 1  # even an empty turn is the owner's alone


def test_a_message_sent_without_a_reply_runs_in_order_and_its_failure_is_counted() -> None:
    """``send`` (issue #20: a fire-and-forget message builds no Reply): it runs in posting order among posted ones,
    and what it raises is counted as failed without stopping the owner."""
    box = Mailbox()
    seen: list[str] = []
    box.send(lambda: seen.append("sent"))
    reply = box.post(lambda: seen.append("posted") or 1)
    box.send(lambda: 1 / 0)
    box.send(lambda: seen.append("after"))
    assert box.run_pending() == 4
    assert seen == ["sent", "posted", "after"] and reply.wait(0) == 1
    stats = box.statistics()
    assert (stats.posted, stats.run, stats.failed, stats.pending) == (4, 4, 1, 0)
