"""How well the learned law of arrivals forecasts the next H seconds, against the true law (issue #13).

Why this script exists: session 19 (``docs/estimator.md``) showed that a rollout of the scheduler over futures
from the law of arrivals meets issue #13's 25 % on every B>1 row only if it knows the law's phase (bursty b16:
17.0 % with it, 34.5 % with a stationary law). :class:`calculet.runtime.scheduling.arrival_law.ArrivalLaw` learns
that law from the submits alone; this measures its forecast where the estimator will read it: at every arrival
instant ``t`` of the bench's own traces (the loadsim generator, the presets' seeds and durations, the bench's
loads), after the law has seen that arrival, the forecast's expected count over ``(t, t + H]`` for H in
5/10/20/40 s, scored against

* the **oracle**: the preset's own law, ``Λ(t + H) - Λ(t)`` from its rate function at that load (the rates scale
  with the load, the on/off durations do not: ``OnOffArrivals.times``);
* the **realised** count in the trace (its error includes the Poisson noise no forecast removes; the oracle's own
  error against it is printed as that floor).

Beside it, in the same run, the forecasts tried before (sessions 12-13): a **trailing rate**, an EWMA of the arrivals
with a 30 s time constant, normalised over the time observed, times H. Printed per preset, load and H: mean absolute
and P90 absolute error against the oracle (arrivals), mean absolute error against the realised count, for both; then
bursty split by the arrival's phase (first 5 s of a burst, the rest of it, off) and by cycle (the first 60 s, where
nothing is learned yet, against the later ones); steady split the same way by its first 60 s. Last, the law's
statistics at each trace's end (regime changes: 0 expected on steady).

    .venv/bin/python bench/arrival_forecast.py [--presets steady,bursty] [--tau 30]

Measured with the law of the commit that adds this paragraph (2 s of CPU for all), mean absolute error against the
oracle in arrivals, law / trailing rate, after the first cycle (60 s): bursty over H = 10 s at 0.5x 2.30 / 3.58, 1x
1.93 / 7.08, 2x 3.20 / 14.29 (oracle means 5.5, 10.9, 22.3); over 40 s 3.59 / 8.11, 2.99 / 16.10, 4.62 / 29.33; in a
burst's first 5 s over 10 s 3.47 / 5.24, 1.99 / 10.95, 3.68 / 22.28. Steady over 10 s at 0.5-4x 0.58 / 0.59, 0.71 /
0.71, 0.50 / 0.96, 0.81 / 1.87 (0 regime changes at every load). In the first cycle, where nothing is learned, the
law is one rate like the baseline: bursty within 10 % of it either way; steady 1.1-1.4x its error (the four steady
loads replay one realisation compressed in time, whose first 30 s are slow: the EWMA forgets them, the law's mean
over the run so far does not). The law's first version (5d2aa09, remembered rates counted from the change point, no
rate window) was better on bursty 0.5x (1.75 over 10 s, 1.74 over 40 s) but invented a phase on a long steady stream
(arrival_law's docstring).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from typing import Callable, Sequence

import numpy as np

from calculet.loadsim.workload import OnOffArrivals, PoissonArrivals, SimRequest, Workload, generate_requests, load_preset
from calculet.runtime.scheduling.arrival_law import ArrivalLaw, RatePiece

LOADS = {"steady": (0.5, 1.0, 2.0, 4.0), "bursty": (0.5, 1.0, 2.0)}
"""The bench's loads per preset (``calculet.bench`` PRESET_LOADS)."""
HORIZONS = (5.0, 10.0, 20.0, 40.0)


def cumulative_rate(workload: Workload, load: float) -> Callable[[float], float]:
    """The preset's ``Λ(t)`` at ``load`` (as ``loadsim.arrivals`` draws it: rates scaled, durations not)."""
    arrivals = workload.arrivals
    if isinstance(arrivals, PoissonArrivals):
        rate = arrivals.rate_per_s * load
        return lambda t: rate * t
    assert isinstance(arrivals, OnOffArrivals)
    on, off = arrivals.on_rate_per_s * load, arrivals.off_rate_per_s * load
    on_s, off_s = arrivals.on_s, arrivals.off_s
    period, per_period = on_s + off_s, on * on_s + off * off_s

    def cumulative(t: float) -> float:
        k, rem = divmod(t, period)
        return k * per_period + (on * rem if rem < on_s else on * on_s + off * (rem - on_s))

    return cumulative


def expected(pieces: Sequence[RatePiece], start: float, end: float) -> float:
    """The pieces' expected count over ``[start, end)``."""
    return sum(p.rate_per_s * (min(p.end, end) - max(p.start, start)) for p in pieces if p.end > start and p.start < end)


class TrailingRate:
    """The baseline: an EWMA of arrivals (time constant ``tau``) over the time observed since ``origin`` (the law's too)."""

    def __init__(self, tau: float, origin: float = 0.0) -> None:
        self.tau, self.mass, self.at, self.first = tau, 0.0, origin, origin

    def arrived(self, now: float) -> None:
        self.mass = self.mass * math.exp(-(now - self.at) / self.tau) + 1.0
        self.at = now

    def rate(self, now: float) -> float:
        seen = now - self.first
        if not seen > 0:
            return 0.0
        return self.mass * math.exp(-(now - self.at) / self.tau) / (self.tau * (1.0 - math.exp(-seen / self.tau)))


def phase_of(workload: Workload, t: float) -> str:
    """The arrival's place in the law: bursty by the on/off cycle, steady all one phase."""
    arrivals = workload.arrivals
    if not isinstance(arrivals, OnOffArrivals):
        return "all"
    rem = t % (arrivals.on_s + arrivals.off_s)
    return "burst 0-5 s" if rem < 5.0 else "burst 5 s+" if rem < arrivals.on_s else "off"


def measure(workload: Workload, load: float, tau: float) -> tuple[list[dict[str, object]], ArrivalLaw]:
    """Every (arrival, H) of one trace: the oracle's, the realised, the law's and the baseline's counts."""
    requests: tuple[SimRequest, ...] = generate_requests(workload, workload.duration_s, load)
    times = np.asarray([r.arrival_s for r in requests])
    big_lambda = cumulative_rate(workload, load)
    law, trailing = ArrivalLaw(origin=0.0), TrailingRate(tau, origin=0.0)
    cycle = (workload.arrivals.on_s + workload.arrivals.off_s
             if isinstance(workload.arrivals, OnOffArrivals) else 60.0)
    rows: list[dict[str, object]] = []
    for r in requests:
        t = r.arrival_s
        law.arrived(t, r.prompt_tokens, r.max_new_tokens)
        trailing.arrived(t)
        pieces = law.forecast(t, max(HORIZONS))
        base = trailing.rate(t)
        for h in HORIZONS:
            if t + h > workload.duration_s:
                continue
            realised = int(np.searchsorted(times, t + h, side="right") - np.searchsorted(times, t, side="right"))
            rows.append({"h": h, "oracle": big_lambda(t + h) - big_lambda(t), "realised": realised,
                         "law": expected(pieces, t, t + h), "trailing": base * h, "phase": phase_of(workload, t),
                         "cycle": "first cycle" if t < cycle else "later cycles"})
    return rows, law


def _summary(rows: list[dict[str, object]]) -> str:
    oracle = np.asarray([r["oracle"] for r in rows], dtype=float)
    realised = np.asarray([r["realised"] for r in rows], dtype=float)
    parts = [f"n {len(rows):4d}  oracle mean {oracle.mean():6.2f}  floor {np.abs(oracle - realised).mean():5.2f}"]
    for name in ("law", "trailing"):
        f = np.asarray([r[name] for r in rows], dtype=float)
        err = np.abs(f - oracle)
        parts.append(f"{name}: mae {err.mean():5.2f} p90 {np.quantile(err, 0.9):5.2f} vs-real {np.abs(f - realised).mean():5.2f}")
    return " | ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="steady,bursty")
    parser.add_argument("--tau", type=float, default=30.0, help="the trailing rate's time constant (s)")
    args = parser.parse_args(argv)
    print("absolute errors in arrivals over (t, t+H]; floor = the oracle's own error against the realised count")
    for name in args.presets.split(","):
        workload = load_preset(name)
        for load in LOADS[name]:
            rows, law = measure(workload, load, args.tau)
            s = law.statistics()
            print(f"\n## {name} load {load:g}: law at the end: {s.regime_changes} changes, {s.rate_restarts} rate restarts, "
                  f"phased {s.phased}, high {s.high_rate_per_s:.3f}/s x {s.high_mean_duration_s:.1f} s, "
                  f"low {s.low_rate_per_s:.3f}/s x {s.low_mean_duration_s:.1f} s, now {s.regime} {s.rate_per_s:.3f}/s")
            groups: dict[tuple[float, str, str], list[dict[str, object]]] = defaultdict(list)
            for r in rows:
                for phase in ("all", r["phase"]):
                    for cycle in ("all", r["cycle"]):
                        groups[(float(r["h"]), str(phase), str(cycle))].append(r)  # type: ignore[arg-type]
            for key in sorted(groups, key=lambda k: (k[0], k[1] != "all", k[1], k[2] != "all", k[2])):
                h, phase, cycle = key
                print(f"H {h:4.0f} {phase:12s} {cycle:13s} {_summary(groups[key])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
