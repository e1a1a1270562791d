"""Dispatch cost: ``fire`` against the generated dispatch it wraps and against python-statemachine.

A request's full life — bind, admit, prefill, 100 decode steps, finish — replayed on
``RequestMachine`` (205 events) in four forms, same run, CPU time (``time.thread_time``):

* the generated dispatch alone (``_dispatch_i(instance, args)``: guards and effects, nothing else —
  the floor ``fire`` is judged against, issue #20: ``fire`` ≤ 1.5× it);
* ``CompiledInstance.fire`` with monitors off, at the production default of ``monitoring`` (on,
  one event in ``sample_every`` = 256 checked), and with every event checked (every declared
  invariant and step property after each event, as in the tests);
* python-statemachine (the reference semantics).

Also instantiation (issue #20: ≤ 3 µs CPU). The production default of ``monitoring`` (on, 1 in
256) is chosen from these figures and ``bench/service.py``'s (see the README, "Monitors"); this
benchmark sets the monitor itself for each row. Figures, not a pass/fail test (DESIGN
principle 10).

    python bench/dispatch.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from calculet.machines import RequestMachine
from calculet.machines.monitor import MONITOR

PARAMS = dict(prompt_tokens=32, max_new_tokens=101, max_seq=512)
LIFE: list[tuple[str, dict[str, Any]]] = (
    [("bind", {"gen": 1}), ("admit", {}), ("submit_prefill", {"job": 1}),
     ("prefill_done", {"job": 1, "ok": True, "stop": False})]
    + [e for job in range(2, 102) for e in (("submit_decode", {"job": job}),
                                            ("decode_done", {"job": job, "ok": True, "stop": False}))]
    + [("close", {})])


def life_fire(create: Callable[..., Any]) -> int:
    """``fire`` with keyword arguments, as the runtime calls it."""
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
    return len(LIFE)


def life_dispatch(create: Callable[..., Any]) -> int:
    """The generated dispatch functions alone, on argument dicts built beforehand (the same events)."""
    r = create(**PARAMS)
    table = r._table
    for event, args in LIFE:
        table[r.state][event](r, args)
    assert r.state == "completed"
    return len(LIFE)


def cpu_us(run: Callable[[], int], repeat: int, rounds: int) -> float:
    """Median over rounds of CPU µs per unit ``run`` returns."""
    samples = []
    for _ in range(rounds):
        start = time.thread_time()
        units = sum(run() for _ in range(repeat))
        samples.append((time.thread_time() - start) / units * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    MONITOR.configure(enabled=False)

    def instances(create: Callable[..., Any], n: int) -> Callable[[], int]:
        def run() -> int:
            for _ in range(n):
                create(**PARAMS)
            return n
        return run

    from calculet.config import default_config
    production = default_config().monitoring

    def fire_sampled() -> float:
        MONITOR.configure(enabled=production.invariants, mode="count", sample_every=production.sample_every)
        try:
            return cpu_us(lambda: life_fire(RequestMachine.create), 200, 1)
        finally:
            MONITOR.configure(enabled=False)

    # dispatch and the two fires interleaved round by round, so load on the shared machine hits them
    # alike; each ratio is the median of the per-round ratios
    rounds = [(cpu_us(lambda: life_dispatch(RequestMachine.create), 200, 1),
               cpu_us(lambda: life_fire(RequestMachine.create), 200, 1), fire_sampled()) for _ in range(args.rounds)]
    dispatch = statistics.median(d for d, _, _ in rounds)
    fire = statistics.median(f for _, f, _ in rounds)
    ratio = statistics.median(f / d for d, f, _ in rounds)
    sampled = statistics.median(f for _, _, f in rounds)
    sampled_ratio = statistics.median(f / d for d, _, f in rounds)
    inst = cpu_us(instances(RequestMachine.create, 20000), 1, args.rounds)
    ref = cpu_us(lambda: life_fire(RequestMachine.reference), 3, args.rounds)
    ref_inst = cpu_us(instances(RequestMachine.reference, 200), 1, args.rounds)
    MONITOR.configure(enabled=True, mode="count", sample_every=1)
    monitored = cpu_us(lambda: life_fire(RequestMachine.create), 50, args.rounds)
    MONITOR.configure(enabled=False)
    print(f"RequestMachine, full life (bind, admit, prefill, 100 decode steps, finish): {len(LIFE)} events; "
          "CPU µs, medians of rounds")
    print(f"{'form':<34}{'µs/event':>10}{'× dispatch':>12}{'µs/instance':>13}")
    print(f"{'generated dispatch alone':<34}{dispatch:>10.3f}{1.0:>12.2f}{'':>13}")
    print(f"{'fire (monitors off)':<34}{fire:>10.3f}{ratio:>12.2f}{inst:>13.2f}")
    label = f"fire (monitors 1 in {production.sample_every}, default)"
    print(f"{label:<34}{sampled:>10.3f}{sampled_ratio:>12.2f}{'':>13}")
    print(f"{'fire (monitors on every event)':<34}{monitored:>10.3f}{monitored / dispatch:>12.2f}{'':>13}")
    print(f"{'python-statemachine':<34}{ref:>10.3f}{ref / dispatch:>12.2f}{ref_inst:>13.2f}")
    print("targets (#20): fire <= 1.5x the generated dispatch; instantiation <= 3 µs")


if __name__ == "__main__":
    main()
