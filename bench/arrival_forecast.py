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
    .venv/bin/python bench/arrival_forecast.py --cycles          # bursty, per on/off cycle (session 22)
    nice -n 15 .venv/bin/python bench/arrival_forecast.py --rollout calculet-b16-pingpong,calculet-b16-chunked

``--cycles`` (session 22): the law as the runtime wires it (no origin), on the bursty traces, per on/off cycle:
when each change was detected (its alarm, found by asking the law every 0.1 s, which learns nothing from being
asked) and where the law put it, against the true edges; at each arrival the forecast's rate of the current
piece against the true rate, the forecast's time to its next change against the true time, and the expected count
over 10 and 20 s against the oracle's. ``--rollout`` (session 22): what the law's departures cost the B>1 estimate
(``bench/estimate_rollout.py``'s runs, learned and oracle laws, same decisions): the P90 of the relative error,
loads pooled, and the P90 if the requests of one cycle (or one phase of the first) took the oracle law's error:
where the learned law loses against the oracle.

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


def _cycle_of(arrivals: OnOffArrivals, t: float) -> tuple[int, float]:
    period = arrivals.on_s + arrivals.off_s
    k, into = divmod(t, period)
    return int(k), into


def cycles(load: float) -> None:
    """The bursty trace at ``load``, per on/off cycle (``--cycles``)."""
    workload = load_preset("bursty")
    arrivals = workload.arrivals
    assert isinstance(arrivals, OnOffArrivals)
    period = arrivals.on_s + arrivals.off_s
    big_lambda = cumulative_rate(workload, load)
    law = ArrivalLaw()  # as on_time wires it: no origin
    changes: list[tuple[float, str, float]] = []
    seen, probe = 0, 0.0
    rows: dict[tuple[int, bool], list[tuple[float, float, float, float]]] = defaultdict(list)

    def note(t: float) -> None:
        nonlocal seen
        s = law.statistics()
        if s.regime_changes != seen:
            seen = s.regime_changes
            changes.append((t, s.regime, t - s.regime_age_s))

    for r in generate_requests(workload, workload.duration_s, load):
        t = r.arrival_s
        while law.statistics().arrivals and probe < t:  # the alarm instant, to 0.1 s
            law.forecast(probe, 0.0)
            note(probe)
            probe += 0.1
        probe = max(probe, t)
        law.arrived(t, r.prompt_tokens, r.max_new_tokens)
        note(t)
        pieces = law.forecast(t, 40.0)
        k, into = _cycle_of(arrivals, t)
        on = into < arrivals.on_s
        true_rate = (arrivals.on_rate_per_s if on else arrivals.off_rate_per_s) * load
        true_left = (arrivals.on_s if on else period) - into
        left = pieces[0].end - t if len(pieces) > 1 else math.inf
        rows[(k, on)].append((pieces[0].rate_per_s / true_rate, left - true_left,
                              expected(pieces, t, t + 10.0) - (big_lambda(t + 10.0) - big_lambda(t)),
                              expected(pieces, t, t + 20.0) - (big_lambda(t + 20.0) - big_lambda(t))))
    print(f"\n## bursty load {load:g}: changes as alarm instant -> regime, estimated edge (error against the true edge)")
    for at, regime, edge in changes:
        k, into = _cycle_of(arrivals, edge + period / 2)  # the nearest true edge of that direction
        true_edge = k * period + (0.0 if regime == "high" else arrivals.on_s)
        if regime == "low" and abs(edge - true_edge) > abs(edge - true_edge + period):
            true_edge -= period
        print(f"  {regime:4s} alarm {at:6.1f} s ({at - true_edge:+5.1f} after the true edge {true_edge:5.0f}), "
              f"edge put at {edge:6.1f} ({edge - true_edge:+5.1f})")
    for (k, on), v in sorted(rows.items()):
        a = np.asarray(v)
        finite = a[np.isfinite(a[:, 1]), 1]
        left = f"{np.median(finite):+6.1f} s" if len(finite) else "  none  "
        print(f"  cycle {k} {'burst' if on else 'off  '} n {len(a):3d}: rate / true (median) {np.median(a[:, 0]):5.2f}, "
              f"next change - true (median) {left} ({len(a) - len(finite)} with no phase), "
              f"count - oracle: 10 s {a[:, 2].mean():+6.2f}, 20 s {a[:, 3].mean():+6.2f} (mae {np.abs(a[:, 3]).mean():5.2f})")


def rollout(policies: str, loads: Sequence[float]) -> None:
    """Where the learned law loses against the oracle in the B>1 estimate (``--rollout``)."""
    import estimate_rollout as er  # the sibling bench script: its runs, capture and oracle law
    from calculet.adapters.sim.cost import CostModel
    from calculet.loadsim.policies import parse_policies, run_policy
    from calculet.machines.monitor import MONITOR

    MONITOR.configure(enabled=False)
    workload = load_preset("bursty")
    arrivals = workload.arrivals
    assert isinstance(arrivals, OnOffArrivals)
    cost = CostModel.reference()
    capture = er.Capture(None, {})
    er.install(capture)
    for policy in parse_policies(policies):
        errors: dict[str, dict[tuple[float, float], float]] = {"learned": {}, "oracle": {}}
        for law_name in errors:
            for load in loads:
                capture.law = (lambda load=load: er.OracleLaw(workload, load)) if law_name == "oracle" else "shipped"
                capture.seen = {}
                run = run_policy(policy, generate_requests(workload, workload.duration_s, load), workload, cost)
                for r in run.requests:
                    if (r.finish_s is None or r.finish_reason not in ("stop", "length") or r.finish_s <= r.arrival_s
                            or r.arrival_s not in capture.seen):
                        continue
                    reported = capture.seen[r.arrival_s][1]
                    errors[law_name][(load, r.arrival_s)] = (reported - r.finish_s) / (r.finish_s - r.arrival_s)
        learned, oracle = errors["learned"], errors["oracle"]

        def p90(swap: Callable[[float], bool]) -> float:
            e = [oracle[key] if swap(key[1]) else err for key, err in learned.items()]
            return float(np.percentile(np.abs(e), 90) * 100)

        def phase(t: float) -> str:
            into = _cycle_of(arrivals, t)[1]
            return "0-5 s" if into < 5 else "5-15 s" if into < 15 else "15-20 s" if into < arrivals.on_s else "off"

        cycles_seen = sorted({_cycle_of(arrivals, t)[0] for _, t in learned})
        print(f"{policy.name}: P90 learned {p90(lambda t: False):.1f} %, oracle {p90(lambda t: True):.1f} %; "
              "with the oracle's error on one cycle: "
              + ", ".join(f"{k} {p90(lambda t, k=k: _cycle_of(arrivals, t)[0] == k):.1f}" for k in cycles_seen)
              + "; on the first cycle's "
              + ", ".join(f"{ph} {p90(lambda t, ph=ph: _cycle_of(arrivals, t)[0] == 0 and phase(t) == ph):.1f}"
                          for ph in ("0-5 s", "5-15 s", "15-20 s", "off")), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="steady,bursty")
    parser.add_argument("--tau", type=float, default=30.0, help="the trailing rate's time constant (s)")
    parser.add_argument("--cycles", action="store_true", help="bursty, per on/off cycle, at the bench's loads")
    parser.add_argument("--rollout", default="", help="policies: the B>1 estimate's P90 with one cycle's oracle error")
    args = parser.parse_args(argv)
    if args.cycles:
        for load in LOADS["bursty"]:
            cycles(load)
        return 0
    if args.rollout:
        rollout(args.rollout, LOADS["bursty"])
        return 0
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
