"""The actor's CPU per streamed token on the null device, without HTTP (issue #20: the actor side of the host path).

``bench/host_path.py`` judges the whole server against a bare SSE server; this isolates the part behind the
HTTP loop — scheduler, null device, engine, execution and streams — so a change there is measured without the
event loop's noise. The engine is brought up as ``python -m calculet.run --sim-cost null`` brings it up
(bundled package, the §15 default config, monitors at their production default, ``calculet.run``'s switch
interval); ``streams`` asyncio consumers on one loop thread read their :class:`StreamWriter` in batches as the
service's routes do. Reported per streamed token: the actor thread's CPU (``calculet-engine``, from /proc), the
whole process's CPU, and with ``--calls`` the Python calls the actor makes (a profile hook on that thread only).
Figures, not a pass/fail test (DESIGN principle 10).

With ``--hops`` it also counts the thread hops per token (mailbox posts, the actor's blocking waits, wake-ups of
the consumers' loop) and reports the wall time per token, which at 1 stream is a stream's latency per token.

    python bench/actor_path.py [--streams 1,16,64] [--tokens 64] [--per-stream 4] [--rounds 3] [--calls] [--hops]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calculet.adapters.sim import CostModel, SimConfig, TimeMode
from calculet.config import default_config
from calculet.run import SWITCH_INTERVAL_MS, switch_interval
from calculet.runtime.engine.types import EngineOptions, GenerateRequest
from calculet.runtime.execution.sampler import SamplingParams
from calculet.runtime.streams.writer import StreamWriter
from calculet.server.bringup import BroughtUp, bring_up

PROMPT = "Calculet NPU benchmark prompt"


def thread_cpu_s(thread: threading.Thread | None) -> float:
    """CPU seconds (user + system) ``thread`` has used so far (/proc of its native id)."""
    if thread is None or thread.native_id is None:
        return 0.0
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class HopCounter:
    """The thread hops of the actor path (issue #20, at 1 stream latency-bound): messages posted to the actor's
    mailbox (a submit, a completion thread's results), the actor's blocking waits for one (it had nothing to
    do), and wake-ups of a consumer's event loop (``call_soon_threadsafe`` from the actor). Counted by wrapping
    those three calls for the whole run; the wrappers' cost stays out of the CPU figures (a round of its own).

    The wrappers replace class attributes, so they see every engine of the process. ``threads``, when given, keeps
    the count to calls made on those threads: a test shares its process with other engines (the service tests'
    session servers, whose idle actors block in ``run_until`` at their own pace)."""

    def __init__(self, threads: frozenset[int] | None = None) -> None:
        self.posts = self.sleeps = self.wakes = 0
        self._threads = threads
        self._saved: list[tuple[object, str, object]] = []

    def _mine(self) -> bool:
        return self._threads is None or threading.get_ident() in self._threads

    def install(self) -> None:
        from calculet.runtime import actor
        from calculet.runtime.streams import writer

        post, run_until, call_soon = actor.Mailbox.post, actor.Mailbox.run_until, writer._call_soon

        def counted_post(mailbox: actor.Mailbox, message: object) -> object:
            self.posts += self._mine()
            return post(mailbox, message)  # type: ignore[arg-type]

        def counted_run_until(mailbox: actor.Mailbox, timeout: float) -> int:
            if timeout > 0:
                self.sleeps += self._mine()
            return run_until(mailbox, timeout)

        def counted_call_soon(loop: asyncio.AbstractEventLoop, fn: object) -> None:
            self.wakes += self._mine()
            call_soon(loop, fn)  # type: ignore[arg-type]

        self._saved = [(actor.Mailbox, "post", post), (actor.Mailbox, "run_until", run_until),
                       (writer, "_call_soon", call_soon)]
        actor.Mailbox.post = counted_post  # type: ignore[method-assign]
        actor.Mailbox.run_until = counted_run_until  # type: ignore[method-assign]
        writer._call_soon = counted_call_soon  # type: ignore[assignment]

    def remove(self) -> None:
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)
        self._saved = []


@dataclass(frozen=True)
class Round:
    streams: int
    tokens: int
    actor_cpu_s: float
    process_cpu_s: float
    wall_s: float
    calls: int

    @property
    def actor_us_per_token(self) -> float:
        return self.actor_cpu_s / self.tokens * 1e6

    @property
    def process_us_per_token(self) -> float:
        return self.process_cpu_s / self.tokens * 1e6

    @property
    def wall_us_per_token(self) -> float:
        """Wall time per token of the round: at 1 stream, one stream's time per token (its latency)."""
        return self.wall_s / self.tokens * 1e6


class CallCounter:
    """Counts the calls (Python functions and builtins) one thread makes: its hook is installed with
    ``sys.setprofile`` from a message the actor runs, so only the actor thread is counted."""

    def __init__(self) -> None:
        self.calls = 0

    def hook(self, _frame: object, event: str, _arg: object) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1


def one_round(brought: BroughtUp, streams: int, per_stream: int, tokens: int, counter: CallCounter | None) -> Round:
    engine = brought.engine
    tokenizer = engine.tokenizer
    prompt = tuple(tokenizer.encode(PROMPT)) if hasattr(tokenizer, "encode") else tuple(range(1, 8))
    seen = [0]

    async def consumer() -> None:
        for _ in range(per_stream):
            stream = StreamWriter(tokenizer=tokenizer)
            request = GenerateRequest(prompt, tokens, sampling=SamplingParams(ignore_eos=True))
            await asyncio.to_thread(engine.submit, request, stream)
            async for batch in stream.abatches():
                seen[0] += sum(len(e.tokens) for e in batch)

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(consumer() for _ in range(streams)))
        return time.perf_counter() - started

    if counter is not None:
        engine._mailbox.call(lambda: sys.setprofile(counter.hook), 30)  # noqa: SLF001 - the actor thread only
    actor = engine._actor  # noqa: SLF001 - the actor thread's own CPU
    actor0, proc0 = thread_cpu_s(actor), time.process_time()
    wall = asyncio.run(run())
    actor1, proc1 = thread_cpu_s(actor), time.process_time()
    calls = 0
    if counter is not None:
        engine._mailbox.call(lambda: sys.setprofile(None), 30)  # noqa: SLF001
        calls, counter.calls = counter.calls, 0
    return Round(streams, seen[0], actor1 - actor0, proc1 - proc0, wall, calls)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--per-stream", type=int, default=0,
                        help="completions per stream (default: 48 / streams, at least 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", action="store_true", help="also count the actor's Python calls per token")
    parser.add_argument("--hops", action="store_true",
                        help="also count thread hops per token: mailbox posts, actor waits, event-loop wake-ups")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile (thread CPU time) of the actor, one round")
    args = parser.parse_args(argv)
    cost = CostModel.null()
    brought = bring_up(default_config(), sim=SimConfig(time_mode=TimeMode.REAL, cost=cost),
                       options=EngineOptions(verify_golden=cost.numerics))
    interval = float(os.environ.get("CALCULET_SWITCH_INTERVAL_MS", SWITCH_INTERVAL_MS)) / 1000
    try:
        with switch_interval(interval):
            brought.engine.start()
            one_round(brought, 4, 1, args.tokens, None)  # warm-up
            if args.profile is not None:
                import cProfile
                profile = cProfile.Profile(time.thread_time)
                brought.engine._mailbox.call(profile.enable, 30)  # noqa: SLF001
                one_round(brought, 16, 3, args.tokens, None)
                brought.engine._mailbox.call(profile.disable, 30)  # noqa: SLF001
                profile.dump_stats(str(args.profile))
            print(f"actor CPU per streamed token, null device, no HTTP; {args.tokens}-token streams")
            print(f"{'streams':>7} {'actor us/tok':>12} {'process us/tok':>14} {'calls/tok':>9} {'tok/s':>9} "
                  f"{'wall us/tok':>11} {'posts/tok':>9} {'waits/tok':>9} {'wakes/tok':>9}")
            for streams in (int(s) for s in args.streams.split(",")):
                per = args.per_stream or max(2, 48 // streams)
                rounds = [one_round(brought, streams, per, args.tokens, None) for _ in range(args.rounds)]
                actor = float(np.median([r.actor_us_per_token for r in rounds]))
                proc = float(np.median([r.process_us_per_token for r in rounds]))
                calls = float("nan")
                if args.calls:  # a round of its own: the hook's cost stays out of the CPU figures
                    counted = one_round(brought, streams, per, args.tokens, CallCounter())
                    calls = counted.calls / counted.tokens
                rate = float(np.median([r.tokens / r.wall_s for r in rounds]))
                wall = float(np.median([r.wall_us_per_token for r in rounds]))
                hops = (float("nan"),) * 3
                if args.hops:
                    counter = HopCounter()
                    counter.install()
                    try:
                        counted = one_round(brought, streams, per, args.tokens, None)
                    finally:
                        counter.remove()
                    hops = tuple(n / counted.tokens for n in (counter.posts, counter.sleeps, counter.wakes))
                print(f"{streams:>7} {actor:>12.1f} {proc:>14.1f} {calls:>9.0f} {rate:>9.0f} {wall:>11.1f} "
                      f"{hops[0]:>9.3f} {hops[1]:>9.3f} {hops[2]:>9.3f}")
    finally:
        brought.engine.stop(5)
        brought.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
