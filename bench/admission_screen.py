"""The on_time screen's share of an admitted ``submit()``, measured in one process (issue #20).

``bench/scheduler.py`` reports ``submit→Admit (screen)``, the whole admitted submit's median CPU. On this
shared 2-core machine that median moved between 27 and 42 µs for the same tree from one run to the next
(load 4-13), so a change to the screen alone, a fifth of it, cannot be read from two runs. This measures the
screen as a *difference in the same process*: blocks of admitted submits on the production case of
``bench/scheduler.py`` (measured step and prefill timers, every request with a deadline it meets, so the
screen places it at the tail of the cached EDF lane schedule), alternating with blocks of the same submits
whose ``OnTimePolicy.screen`` is replaced by one answering "admit" at once. The screen's cost is the median
over rounds of (median CPU with it − median CPU without it); its share, that over the submit's median.
Run it from each tree being compared (``PYTHONPATH=<tree>``) and compare the shares.

*Between steps* (the second line): the same, with one decode step measured by the step timer before each
submit (outside the timed region), as on a serving device, where the engine measures a step between two
arrivals: the submit then pays for the device model built afresh from the timers (the nominal one, and
admission's margin-slowed one), which the first line's submits, all at one instant, share.

    PYTHONPATH=. python bench/admission_screen.py [--rounds 10] [--block 2000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from scheduler import B, FAR_DEADLINE_MS, NEW, PROMPT, STEP_S, config, measured, scheduler  # bench/scheduler.py

from calculet.runtime.request import InferenceRequest, NullSink
from calculet.runtime.scheduling.scheduler import Scheduler


def block(s: Scheduler, count: int, stepped: bool = False) -> float:
    """Median CPU µs of ``count`` admitted submits (the requests built outside the timed region); ``stepped``: a
    decode step measured before each (outside it too)."""
    clock = time.thread_time_ns
    sink = NullSink()
    requests = [InferenceRequest(PROMPT, NEW, f"t{i % 8}", deadline_ms=FAR_DEADLINE_MS) for i in range(count)]
    step_times = s.step_times
    at = 1.0
    samples = []
    for i, request in enumerate(requests):
        if stepped:
            at += STEP_S
            step_times.observe(STEP_S * (1 + (i % 5) / 100), lanes=B, compiled=B, decoding=B, now=at)
        t0 = clock()
        out = s.submit(request, sink)
        samples.append((clock() - t0) / 1000)
        assert out.outcome.decision.value == "admit", out.outcome
    return statistics.median(samples)


def fresh(count: int, screened: bool) -> Scheduler:
    """A production-case scheduler with room for ``count`` sequences; without the screen when not ``screened``."""
    s = measured(scheduler(config(0, count + 1), count + 1)[0])
    if not screened:
        assert s.on_time is not None
        s.on_time.screen = lambda rec, now: None  # type: ignore[method-assign]
    gc.collect()
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=2000)
    args = parser.parse_args()
    for stepped, title in ((False, "submit→Admit (screen)"), (True, "... between steps")):
        with_screen, without = [], []
        for _ in range(args.rounds):
            with_screen.append(block(fresh(args.block, True), args.block, stepped))
            without.append(block(fresh(args.block, False), args.block, stepped))
        costs = [a - b for a, b in zip(with_screen, without)]
        print(f"{title} median CPU {statistics.median(with_screen):.1f} µs, without the screen "
              f"{statistics.median(without):.1f} µs; the screen {statistics.median(costs):.2f} µs, "
              f"{statistics.median([c / a for c, a in zip(costs, with_screen)]):.1%} of the submit "
              f"({args.rounds} rounds of {args.block})")


if __name__ == "__main__":
    main()
