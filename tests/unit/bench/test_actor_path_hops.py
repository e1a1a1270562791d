"""bench/actor_path.py --hops (issue #20 item 2): what it counts as a thread hop, and that it leaves nothing behind."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import actor_path  # noqa: E402  (bench/ is a directory of scripts, not a package)

from calculet.runtime import actor  # noqa: E402
from calculet.runtime.streams import writer  # noqa: E402
from calculet.runtime.streams.writer import StreamWriter  # noqa: E402


def test_posts_blocking_waits_and_loop_wake_ups_are_counted_and_the_wrapped_calls_restored() -> None:
    originals = (actor.Mailbox.post, actor.Mailbox.run_until, writer._call_soon)
    counter = actor_path.HopCounter(threads=frozenset({threading.get_ident()}))  # not other engines of this process
    counter.install()
    try:
        mailbox = actor.Mailbox()
        mailbox.post(lambda: None)
        mailbox.post(lambda: None)
        assert mailbox.run_until(0.0) == 2  # a turn that finds work does not block: not a wait
        assert mailbox.run_until(0.001) == 0  # nothing queued: the actor blocks for one, a wait

        async def consume() -> int:
            stream = StreamWriter()
            seen = 0

            async def read() -> None:
                nonlocal seen
                async for batch in stream.abatches():
                    seen += len(batch)

            task = asyncio.create_task(read())
            await asyncio.sleep(0)  # the reader waits on its future
            stream.token(1, 65)  # wakes the loop: one call_soon_threadsafe
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            task.cancel()
            return seen

        assert asyncio.run(consume()) == 1
    finally:
        counter.remove()
    assert (counter.posts, counter.sleeps, counter.wakes) == (2, 1, 1)
    assert (actor.Mailbox.post, actor.Mailbox.run_until, writer._call_soon) == originals


def test_calls_on_other_threads_are_left_out_when_the_counter_is_kept_to_some() -> None:
    """The CI failure this guards against: a session server's idle actor, blocking in its own ``run_until`` on its
    own thread, was counted as this test's wait."""
    kept = actor_path.HopCounter(threads=frozenset({threading.get_ident()}))
    every = actor_path.HopCounter()
    kept.install()
    every.install()  # wraps the kept counter's wrappers: both see each call
    try:
        other = threading.Thread(target=lambda: actor.Mailbox().run_until(0.001))
        other.start()
        other.join()
    finally:
        every.remove()
        kept.remove()
    assert (kept.posts, kept.sleeps, kept.wakes) == (0, 0, 0)
    # at least the other thread's wait: a session server's idle actor in this xdist worker may block in its own
    # run_until meanwhile, and the counter kept to no thread counts that too (it did, in a full local run)
    assert every.sleeps >= 1
