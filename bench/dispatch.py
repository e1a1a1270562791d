"""Dispatch cost: the compiled table against the python-statemachine engine, same run, same life.

A request's full life — bind, admit, prefill, 100 decode steps, finish — fired on
``RequestMachine`` in both forms. Reported: median µs per event and per instantiation, and
the ratio. Figures, not a pass/fail test (DESIGN principle 10). Monitors are off, as in
production by default.

    python bench/dispatch.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from calculet.machines.monitor import MONITOR
from calculet.machines import RequestMachine

PARAMS = dict(prompt_tokens=32, max_new_tokens=101, max_seq=512)


def life(create: Callable[..., Any]) -> int:
    r = create(**PARAMS)
    r.fire("bind", gen=1)
    r.fire("admit")
    r.fire("submit_prefill", job=1)
    r.fire("prefill_done", job=1, ok=True, stop=False)
    for job in range(2, 102):
        r.fire("submit_decode", job=job)
        r.fire("decode_done", job=job, ok=True, stop=False)
    r.fire("close")
    assert r.state == "completed"
    return 205


def per_event(create: Callable[..., Any], lives: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        events = sum(life(create) for _ in range(lives))
        samples.append((time.perf_counter() - start) / events * 1e6)
    return statistics.median(samples)


def per_instance(create: Callable[..., Any], count: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            create(**PARAMS)
        samples.append((time.perf_counter() - start) / count * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    MONITOR.configure(enabled=False)
    rows = [
        ("compiled table", per_event(RequestMachine.create, 200, args.rounds),
         per_instance(RequestMachine.create, 20000, args.rounds)),
        ("python-statemachine", per_event(RequestMachine.reference, 3, args.rounds),
         per_instance(RequestMachine.reference, 200, args.rounds)),
    ]
    MONITOR.configure(enabled=True, mode="count")
    monitored = per_event(RequestMachine.create, 50, args.rounds)
    print("RequestMachine, full life (bind, admit, prefill, 100 decode steps, finish): 205 events")
    print(f"{'engine':<24}{'µs/event (median)':>20}{'µs/instance (median)':>24}")
    for name, ev, inst in rows:
        print(f"{name:<24}{ev:>20.2f}{inst:>24.2f}")
    print(f"{'compiled + monitors':<24}{monitored:>20.2f}{'':>24}")
    print(f"speed-up per event: {rows[1][1] / rows[0][1]:.0f}x; per instance: {rows[1][2] / rows[0][2]:.0f}x")


if __name__ == "__main__":
    main()
