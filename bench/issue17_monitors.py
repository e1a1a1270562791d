"""Cost of issue #17's two live monitors (a benchmark): the JobLaneSystem monitor and the admission budget monitor.

B16 on the simulated NPU in virtual time (``bench/engine.py``'s ``run``: numerics off, a saturating closed
batch), host CPU per decode step (process time) in five settings, interleaved round by round so the machine's
load falls on all of them alike:

* monitors off (the baseline);
* monitors at the production default (``monitoring.sample_every``, one event in 256) without and with the
  #17 monitors (job lanes: a check before one job event in 256; budget: one admission operation in 256);
* monitors on every event (the test suite's setting) without and with them.

"Without" detaches the hooks (the job lane monitor — the jobs table's observer and its step-boundary checks —,
the controller's budget check, and the budget counters' recount at the scheduler step and the engine tick);
everything else is the same run. Reported: medians of the per-round ratios to the baseline of the same round, and the #17
monitors' own share (with / without). Figures, not a pass/fail test (DESIGN principle 10).

    python bench/issue17_monitors.py [--rounds 3] [--new 120] [--waves 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import run  # noqa: E402  (bench/engine.py)

from calculet.adapters.sim import CostModel  # noqa: E402
from calculet.config import default_config  # noqa: E402
from calculet.machines.monitor import MONITOR  # noqa: E402
from calculet.runtime.engine import core  # noqa: E402
from calculet.runtime.scheduling import admission, scheduler  # noqa: E402

_ATTACH = scheduler.attach_job_lane_monitor
_CHECK = admission.check_budget_drawn  # admission draws inline and calls this (issue #20)
_COUNTS = scheduler.check_counts


class _Detached:
    """A job lane monitor that checks nothing (the scheduler and the engine still call its hooks)."""

    def observe(self, job: Any, event: str) -> None:
        return None

    def boundary(self, after: str) -> None:
        return None


def _hooks(on: bool) -> None:
    """Attach (the code as shipped) or detach the #17 monitors' hooks for the next runs."""
    scheduler.attach_job_lane_monitor = _ATTACH if on else (lambda jobs, kv: _Detached())  # type: ignore[assignment]
    admission.check_budget_drawn = _CHECK if on else (lambda *args: None)  # type: ignore[assignment]
    scheduler.check_counts = core.check_counts = _COUNTS if on else (lambda *args: None)  # type: ignore[assignment]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=120, help="tokens generated per request (prompt is 16)")
    parser.add_argument("--waves", type=int, default=2, help="requests per run = waves x 16")
    args = parser.parse_args(argv)
    cost = CostModel.tiny()
    every = default_config().monitoring.sample_every
    settings: list[tuple[str, bool, int, bool]] = [
        ("off", False, 1, False),
        (f"1 in {every}, without #17", True, every, False), (f"1 in {every}, with #17", True, every, True),
        ("every event, without #17", True, 1, False), ("every event, with #17", True, 1, True)]
    per: dict[str, list[float]] = {name: [] for name, *_ in settings}
    for _ in range(args.rounds):
        for name, enabled, sample, hooks in settings:
            _hooks(hooks)
            MONITOR.configure(enabled=enabled, mode="count", sample_every=sample)
            per[name].append(run(16, cost=cost, new=args.new, waves=args.waves).host_cpu_us_per_step)
    _hooks(True)
    MONITOR.configure(enabled=False)
    base = per["off"]
    print(f"B16, {args.waves * 16} requests x {args.new} tokens, numerics off: host CPU µs per decode step "
          f"(process time), medians of {args.rounds} interleaved rounds")
    ratios: dict[str, Any] = {}
    for name, *_ in settings:
        ratios[name] = statistics.median(v / b for v, b in zip(per[name], base))
        print(f"  monitors {name:<28} {statistics.median(per[name]):>9.1f} CPU µs/step  {ratios[name]:>6.3f}x off")
    for label in (f"1 in {every}", "every event"):
        share = statistics.median(w / wo for w, wo in zip(per[f"{label}, with #17"], per[f"{label}, without #17"]))
        print(f"  #17 monitors at {label}: {share:.3f}x the same setting without them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
