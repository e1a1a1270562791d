"""The decode-set rollout as the reported finish estimate, against today's estimate in the same runs (issue #13).

Why this script exists: session 20 reports, on B>1, a forward model of the decode set's evolution
(``calculet/runtime/scheduling/decode_rollout.py``) from the engine's present and a law of arrivals. Its
fidelity is judged apart from learning the law: the same bench runs (``python -m calculet.bench run``'s
requests, policy, cost model; monitors off as the sweep runs them) with the planner's law of arrivals set to

* ``oracle``: the preset's true intensity (the on/off phase included, scaled by the load, none after the
  trace's end) and the mean prompt / output of its distributions;
* ``trailing``: a stand-in learned from the past — the submits of the last ``--window`` seconds as a constant
  rate, the means of the prompts submitted and the outputs finished;
* ``learned``: the law the runtime learns from the submits (``calculet/runtime/scheduling/arrival_law.py``), as the
  ``on_time`` policy wires it on B>1 (what the bench's own runs report);
* ``known``: the trace's own later arrivals with their lengths in place of any law's path (the oracle law stands
  behind it): what is left is the model's own error (session 22: bursty b16-pingpong 18.3 % before the overlap was
  played, 8.1 % after);
* ``none``: no law (the planner's estimate is reported: the rollout needs one).

Each admission's two estimates are read at the planner's ``admit``: today's (the planner's own, which the
margin scores and every decision reads) and the rollout's (the one reported). No decision moves, and the
script checks it: every request's outcome, token count and finish instant must be the same in every law's run
(each law's run is the same requests through the same decisions). Printed per policy: the P90, median and
signed median of the relative error ``(estimate - finish) / (finish - arrival)`` over the completed requests
of every load pooled (the report's definition) and the P90 per load, for today's estimate and the rollout, and the
CPU the rollout took per submit (``time.thread_time``).

    nice -n 15 python bench/estimate_rollout.py --preset bursty --loads 0.5,1,2 --laws oracle,trailing \\
        --policies calculet-b16,calculet-b8
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.policies import parse_policies, run_policy
from calculet.loadsim.workload import OnOffArrivals, Workload, generate_requests, load_preset
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling import on_time, on_time_planner
from calculet.runtime.scheduling.arrival_law import RatePiece


class OracleLaw:
    """The preset's own law of arrivals at ``load``: what a law learned perfectly would forecast."""

    def __init__(self, workload: Workload, load: float) -> None:
        self.arrivals = workload.arrivals
        self.load = load
        self.duration = float(workload.duration_s)
        sample = generate_requests(workload, 20_000.0, 1.0, seed=987_654)
        self.mean_prompt_tokens = float(np.mean([r.prompt_tokens for r in sample]))
        self.mean_output_tokens = float(np.mean([r.max_new_tokens for r in sample]))
        self._lengths = (tuple(r.prompt_tokens for r in sample[:512]), tuple(r.max_new_tokens for r in sample[:512]))

    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The preset's lengths: a fixed sample of its distributions (the mean path's arrivals take theirs from it)."""
        return self._lengths

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        """The oracle knows the law already."""

    def finished(self, generated_tokens: int) -> None:
        """The oracle knows the law already."""

    def forecast(self, now: float, horizon_s: float) -> tuple[RatePiece, ...]:
        end = min(now + horizon_s, self.duration)
        if end <= now:
            return (RatePiece(now, now + horizon_s, 0.0),)
        arrivals = self.arrivals
        if not isinstance(arrivals, OnOffArrivals):
            return (RatePiece(now, end, arrivals.mean_rate() * self.load), RatePiece(end, now + horizon_s, 0.0))
        pieces: list[RatePiece] = []
        period = arrivals.on_s + arrivals.off_s
        cycle = (now // period) * period
        while cycle < end:
            for lo, hi, rate in ((cycle, cycle + arrivals.on_s, arrivals.on_rate_per_s),
                                 (cycle + arrivals.on_s, cycle + period, arrivals.off_rate_per_s)):
                lo, hi = max(lo, now), min(hi, end)
                if hi > lo:
                    pieces.append(RatePiece(lo, hi, rate * self.load))
            cycle += period
        if end < now + horizon_s:
            pieces.append(RatePiece(end, now + horizon_s, 0.0))
        return tuple(pieces)


class TrailingLaw:
    """A stand-in learned from the past: the last ``window_s`` of submits as a constant rate."""

    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self.times: deque[float] = deque()
        self.prompts = self.outputs = 0.0
        self.submits = self.ends = 0
        self.mean_prompt_tokens = 300.0
        self.mean_output_tokens = 128.0

    def arrived(self, now: float, prompt_tokens: int, max_new_tokens: int) -> None:
        self.times.append(now)
        self.submits += 1
        self.prompts += prompt_tokens
        self.mean_prompt_tokens = self.prompts / self.submits

    def finished(self, generated_tokens: int) -> None:
        self.ends += 1
        self.outputs += generated_tokens
        self.mean_output_tokens = self.outputs / self.ends

    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The means only: the stand-in keeps no sample (the mean path's arrivals then take the means)."""
        return (round(self.mean_prompt_tokens),), (round(self.mean_output_tokens),)

    def forecast(self, now: float, horizon_s: float) -> tuple[RatePiece, ...]:
        times = self.times
        while times and times[0] < now - self.window_s:
            times.popleft()
        span = min(self.window_s, max(now, 1e-9))
        return (RatePiece(now, now + horizon_s, len(times) / span),)


@dataclass
class Capture:
    """Per admitted request's arrival: (today's estimate, the rollout's)."""

    law: Callable[[], Any] | None | str
    """A law's factory (set on the planner at its first admission), None (no law), or "shipped" (the policy's own)."""
    seen: dict[float, tuple[float, float]]
    cpu_s: float = 0.0
    calls: int = 0
    future: list[tuple[float, int, int]] | None = None
    """The ``known`` law's trace: every arrival (instant, prompt, output) of the run, in order (None: the law's path)."""


def install(capture: Capture) -> None:
    """Wrap the planner's admission (read both estimates), the policy's rollout (its CPU) and, for the ``known`` law,
    the model's call (the trace's later arrivals passed as its explicit future)."""
    admit = on_time_planner.OnTimePlanner.admit
    rollout = on_time.OnTimePolicy._rollout_finish
    model = on_time.rollout_finish

    def known_future(*args: Any, **kwargs: Any) -> Any:
        if capture.future is not None:
            now = args[3]
            kwargs["future"] = [arrival for arrival in capture.future if arrival[0] > now + 1e-9]
        return model(*args, **kwargs)

    def wrapped_admit(self: Any, rec: Any, now: float, model: Any, records: Any) -> Any:
        law = capture.law
        if callable(law) and getattr(self, "_bench_law", None) is None:
            self._bench_law = self.report.arrivals = law()
        elif law is None:
            self.report.arrivals = None
        fit = admit(self, rec, now, model, records)
        if fit.ok and rec.estimated_finish is not None:
            capture.seen[rec.arrival] = (self.report.planned_finish(rec), rec.estimated_finish)
        return fit

    def timed_rollout(self: Any, rec: Any, now: float, records: Any, admitted: float | None = None) -> Any:
        start = time.thread_time()
        result = rollout(self, rec, now, records, admitted)
        capture.cpu_s += time.thread_time() - start
        capture.calls += 1
        return result

    on_time_planner.OnTimePlanner.admit = wrapped_admit  # type: ignore[method-assign]
    on_time.OnTimePolicy._rollout_finish = timed_rollout  # type: ignore[method-assign]
    on_time.rollout_finish = known_future  # type: ignore[assignment]


def _row(errors: list[float]) -> str:
    if not errors:
        return "n=0"
    a = np.abs(errors)
    return (f"P90 {np.percentile(a, 90) * 100:5.1f} %  median {np.median(a) * 100:4.1f} %  "
            f"signed {np.median(errors) * 100:+5.1f} %")


def _pooled(by_load: dict[float, list[float]]) -> list[float]:
    return [e for errors in by_load.values() for e in errors]


def _per_load(by_load: dict[float, list[float]]) -> str:
    return " ".join(f"{load:g}x {np.percentile(np.abs(e), 90) * 100:.1f}" for load, e in by_load.items() if e)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="bursty")
    parser.add_argument("--policies", default="calculet-b16")
    parser.add_argument("--loads", default="0.5,1,2")
    parser.add_argument("--laws", default="oracle", help="oracle, trailing, learned, known, none (comma-separated)")
    parser.add_argument("--window", type=float, default=20.0, help="the trailing stand-in's window (s)")
    args = parser.parse_args()
    MONITOR.configure(enabled=False)  # as the sweep runs (calculet.bench.sweep)
    workload = load_preset(args.preset)
    cost = CostModel.reference()
    loads = [float(x) for x in args.loads.split(",")]
    capture = Capture(None, {})
    install(capture)
    for policy in parse_policies(args.policies):
        today: dict[float, list[float]] = {load: [] for load in loads}
        by_law: dict[str, dict[float, list[float]]] = {}
        cpu: dict[str, tuple[float, int]] = {}
        for law_name in args.laws.split(","):
            rollout: dict[float, list[float]] = {load: [] for load in loads}
            first = not by_law
            outcomes: list[tuple[Any, ...]] = []
            capture.cpu_s, capture.calls = 0.0, 0
            for load in loads:
                requests = generate_requests(workload, workload.duration_s, load)
                capture.law = {"oracle": lambda: OracleLaw(workload, load), "known": lambda: OracleLaw(workload, load),
                               "trailing": lambda: TrailingLaw(args.window), "learned": "shipped", "none": None}[law_name]
                capture.future = (sorted((r.arrival_s, r.prompt_tokens, r.max_new_tokens) for r in requests)
                                  if law_name == "known" else None)
                capture.seen = {}
                run = run_policy(policy, requests, workload, cost)
                for r in run.requests:
                    outcomes.append((r.finish_reason, r.generated_tokens, r.finish_s))
                    if (r.finish_s is None or r.finish_reason not in ("stop", "length") or r.finish_s <= r.arrival_s
                            or r.arrival_s not in capture.seen):
                        continue
                    own, reported = capture.seen[r.arrival_s]
                    latency = r.finish_s - r.arrival_s
                    if first:
                        today[load].append((own - r.finish_s) / latency)
                    rollout[load].append((reported - r.finish_s) / latency)
            if first:
                reference = outcomes
            elif outcomes != reference:
                print(f"  !! {policy.name} law {law_name}: a decision moved (outcomes differ from the first law's run)")
            by_law[law_name] = rollout
            cpu[law_name] = (capture.cpu_s, capture.calls)
        print(f"{args.preset} {policy.name} (loads {args.loads} pooled, n={sum(map(len, today.values()))})")
        print(f"  today's estimate         {_row(_pooled(today))}   | per load P90 {_per_load(today)}")
        for law_name, rollout in by_law.items():
            seconds, calls = cpu[law_name]
            per = seconds / calls * 1e6 if calls else 0.0
            print(f"  rollout, law {law_name:9s}  {_row(_pooled(rollout))}   | per load P90 {_per_load(rollout)}"
                  f" | CPU {per:.0f} us per submit ({calls} calls)")
        print(flush=True)


if __name__ == "__main__":
    main()
