"""What the finish estimate's error is made of, per row of the steady / bursty reports (issue #13).

Why this script exists: the reports (``python -m calculet.bench run``) give one figure per policy, the P90 of
``|estimate - actual| / (actual - arrival)`` pooled over the loads; to change the estimator one needs to know
which term of it is wrong. This runs the same requests through the same engine and, at each admission, reads
what the estimate was built from (the device model the ``on_time`` planner was handed: its lane step, the
candidate's prefill and decode steps), then splits each completed request's error in two:

* **wait**: the estimate's time to the first token (its finish less ``steps x lane step``) against the actual
  time to the first token;
* **decode**: ``steps x lane step`` against the actual time from the first token to the last.

Each part is scored over the request's whole latency, as the bench's error is, so the two add up to it. Printed
per policy and load: the P90 of the error, of the wait part alone and of the decode part alone, the signed
median of each part per tenant (a bias of one tenant is the §5.3 queue's overtaking, :mod:`.overtaking`), the
share of the latency spent waiting, and the actual per-token time over the estimate's (its spread is what no
estimate at submit knows: the later arrivals during the request's life). Instrumentation of a bench run only:
the planner's ``admit`` is wrapped to read its inputs, nothing is decided differently.

Then, per policy over the loads pooled (the report's row), the P90 of every arrival and of the arrivals after
the first ``--warmup`` seconds, and how many of the errors above the P90 arrived in those first seconds: a
run starts on an empty device whose per-token time the long window has not measured under the load yet
(issue #13 session 12: on steady B16, 37 of the 92 errors above the P90 arrived in the first 30 s of 300;
the P90 of the later arrivals is 23.3 % against 27.9 % for all). Last, the errors beyond 25 % split by sign and the
P90 were no request to finish after its estimate: the bound of a promise the schedule keeps (session 15).

    python bench/estimate_components.py --preset steady --policies calculet-b16,calculet-b4 --loads 0.5,1,2,4
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from calculet.adapters.sim.cost import CostModel
from calculet.loadsim.policies import parse_policies, run_policy
from calculet.loadsim.workload import generate_requests, load_preset
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling import on_time_planner


def _capture() -> dict[float, tuple[float, float]]:
    """Wrap the planner's admission: per admitted request's arrival, (admission instant, steps x lane step)."""
    seen: dict[float, tuple[float, float]] = {}
    admit = on_time_planner.OnTimePlanner.admit

    def wrapped(self: Any, rec: Any, now: float, model: Any, records: Any) -> Any:
        fit = admit(self, rec, now, model, records)
        if model is not None and fit.ok and rec.estimated_finish is not None:
            seen[rec.arrival] = (now, (rec.machine.max_new_tokens - 1) * model.lane_step_s)
        return fit

    on_time_planner.OnTimePlanner.admit = wrapped  # type: ignore[method-assign]
    return seen


def _p90(values: list[float]) -> float:
    return float(np.percentile(np.abs(values), 90)) * 100 if values else float("nan")


def split(records: Any, seen: dict[float, tuple[float, float]]) -> dict[str, Any]:
    """Per completed request with an estimate: its error, the wait and decode parts, per tenant."""
    total, wait, decode, waited, ratio, arrivals = [], [], [], [], [], []
    by_tenant: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        if (r.estimated_finish_s is None or r.finish_s is None or r.finish_reason not in ("stop", "length")
                or r.finish_s <= r.arrival_s or r.arrival_s not in seen or r.first_token_s is None):
            continue
        now, est_decode = seen[r.arrival_s]
        latency = r.finish_s - r.arrival_s
        est_wait = r.estimated_finish_s - now - est_decode
        act_wait, act_decode = r.first_token_s - r.arrival_s, r.finish_s - r.first_token_s
        total.append((r.estimated_finish_s - r.finish_s) / latency)
        arrivals.append(r.arrival_s)
        wait.append((est_wait - act_wait) / latency)
        decode.append((est_decode - act_decode) / latency)
        waited.append(act_wait / latency)
        if r.generated_tokens > 1 and est_decode > 0:
            ratio.append(act_decode / est_decode)
        by_tenant[r.tenant].append((wait[-1], decode[-1]))
    return {"n": len(total), "p90": _p90(total), "wait": _p90(wait), "decode": _p90(decode), "errors": total,
            "arrivals": arrivals,
            "waited": statistics.median(waited) if waited else float("nan"),
            "ratio": np.percentile(ratio, [10, 50, 90]) if ratio else [float("nan")] * 3,
            "tenants": {t: (statistics.median(w for w, _ in v) * 100, statistics.median(d for _, d in v) * 100)
                        for t, v in sorted(by_tenant.items())}}


def warmup_line(preset: str, policy: str, pooled: list[tuple[float, float]], warmup_s: float) -> str:
    """The row over every load (error, arrival) pooled: P90 of all, of the arrivals after ``warmup_s``, and how
    many of the errors above the P90 arrived before it."""
    if not pooled:
        return f"{preset} {policy} every load: no estimate"
    errors = np.abs([e for e, _ in pooled])
    threshold = float(np.percentile(errors, 90))
    late = [abs(e) for e, a in pooled if a >= warmup_s]
    early_above = sum(1 for e, a in pooled if a < warmup_s and abs(e) > threshold)
    above = int(np.sum(errors > threshold))
    return (f"{preset} {policy} every load: n={len(pooled)} P90 {threshold * 100:.1f} % | arrivals after"
            f" {warmup_s:g} s: n={len(late)} P90 {_p90(late):.1f} % | of the {above} errors above the P90,"
            f" {early_above} arrived in the first {warmup_s:g} s")


def promise_line(preset: str, policy: str, pooled: list[tuple[float, float]], bound: float = 0.25) -> str:
    """The row's errors beyond ``bound`` split by sign, and the P90 were no request to finish after its estimate
    (issue #13 session 15): the most a promise the schedule keeps could give, before what holding others back costs
    (``docs/estimator.md``, "A promise the schedule keeps"). A positive error is a request that finished early."""
    if not pooled:
        return f"{preset} {policy} every load: no estimate"
    errors = np.array([e for e, _ in pooled])
    early, late = int(np.sum(errors > bound)), int(np.sum(errors < -bound))
    n = len(errors)
    return (f"{preset} {policy} every load: beyond {bound:.0%} finished before the estimate {early} ({early / n:.1%}),"
            f" after it {late} ({late / n:.1%}) | P90 with no request after its estimate"
            f" {_p90(list(np.maximum(errors, 0.0))):.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="steady")
    parser.add_argument("--policies", default="calculet-b16")
    parser.add_argument("--loads", default="0.5,1,2,4")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of a run counted as its start")
    args = parser.parse_args()
    MONITOR.configure(enabled=False)  # as the sweep runs (calculet.bench.sweep)
    seen = _capture()
    workload = load_preset(args.preset)
    cost = CostModel.reference()
    for policy in parse_policies(args.policies):
        pooled: list[tuple[float, float]] = []
        for load in (float(x) for x in args.loads.split(",")):
            seen.clear()
            requests = generate_requests(workload, workload.duration_s, load)
            s = split(run_policy(policy, requests, workload, cost).requests, seen)
            lo, mid, hi = s["ratio"]
            tenants = " ".join(f"{t} wait {w:+.0f} decode {d:+.0f}" for t, (w, d) in s["tenants"].items())
            print(f"{args.preset} {policy.name} @ {load:g}: n={s['n']} P90 {s['p90']:.0f} % | wait part {s['wait']:.0f}"
                  f" decode part {s['decode']:.0f} | waited {s['waited']:.2f} of latency | actual/estimated per-token"
                  f" p10 {lo:.2f} p50 {mid:.2f} p90 {hi:.2f} | signed medians % {tenants}", flush=True)
            pooled.extend(zip(s["errors"], s["arrivals"]))
        print(warmup_line(args.preset, policy.name, pooled, args.warmup), flush=True)
        print(promise_line(args.preset, policy.name, pooled), flush=True)


if __name__ == "__main__":
    main()
