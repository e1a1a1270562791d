"""The acceptance checks of the goodput comparison (issue #13 "What it must show"), from its figures.

Why a module of its own: the checks are the issue's words turned into arithmetic on a run's
figures, and must be testable on hand-written figures without running anything. Each is
computed, never asserted: the report prints every point's numbers with met or missed.

Per point (one device, one deadline setting, one capacity multiple), for the shipped default
order (``on_time``, the unsuffixed engine policy):

* **best** — its on-time completions ≥ those of every other policy at the point (FCFS, strict
  EDF, ``at_risk``). On-time *counts* are compared, not goodput per second: every policy ran the
  same offered requests, while each run's window ends at its own last event;
* **bound** — on time ≥ 0.8 × the offline bound of the same requests on the device, judged at
  2× capacity (the issue's overload point) and printed elsewhere;
* **expired** — at most 1 % of the admitted requests end ``deadline`` (``deadline_exceeded``);
* **wasted** — device time spent on requests that then ended ``deadline`` or ``error`` ≤ 5 % of
  the device time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calculet.bench.sweep import Cell

__all__ = [
    "BOUND_MULTIPLE", "TARGET_BOUND_RATIO", "TARGET_EXPIRED_SHARE", "TARGET_WASTED_SHARE", "Check", "PointFigures",
    "point_checks", "point_figures",
]

TARGET_BOUND_RATIO = 0.8
BOUND_MULTIPLE = 2.0
"""The capacity multiple at which the bound ratio is judged (the issue's "2× overload")."""
TARGET_EXPIRED_SHARE = 0.01
TARGET_WASTED_SHARE = 0.05


@dataclass(frozen=True)
class PointFigures:
    """One policy's figures at one point, as ``summary.json`` holds them."""

    policy: str
    offered: int
    on_time: int
    goodput_per_s: float
    admitted: int
    expired: int
    """Admitted requests that ended ``deadline``."""
    wasted_share: float
    bound: int | None = None
    bound_method: str | None = None
    device_s: float | None = None
    """Device seconds of the run (pools the wasted share over seeds); None in older summaries."""

    @property
    def on_time_fraction(self) -> float:
        return self.on_time / self.offered if self.offered else 0.0

    @property
    def bound_ratio(self) -> float | None:
        return self.on_time / self.bound if self.bound else None

    @property
    def expired_share(self) -> float:
        return self.expired / self.admitted if self.admitted else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "offered": self.offered, "on_time": self.on_time,
                "goodput_per_s": round(self.goodput_per_s, 6), "admitted": self.admitted, "expired": self.expired,
                "wasted_share": round(self.wasted_share, 6), "bound": self.bound, "bound_method": self.bound_method,
                "device_s": None if self.device_s is None else round(self.device_s, 4)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PointFigures:
        return cls(**{k: data[k] for k in ("policy", "offered", "on_time", "goodput_per_s", "admitted", "expired",
                                           "wasted_share", "bound", "bound_method")}, device_s=data.get("device_s"))


def point_figures(cell: Cell) -> PointFigures:
    """A sweep cell's figures (its goodput figures and offline bound must have been computed)."""
    g = cell.goodput
    if g is None:
        raise ValueError(f"{cell.policy.name} at load {cell.load:g} has no goodput figures")
    records = cell.run.requests
    admitted = [r for r in records if r.admitted]
    return PointFigures(cell.policy.name, g.offered, g.on_time, g.goodput_per_s, len(admitted),
                        sum(1 for r in admitted if r.finish_reason == "deadline"), g.wasted_share,
                        None if cell.bound is None else cell.bound.bound,
                        None if cell.bound is None else cell.bound.method, g.device_s)


@dataclass(frozen=True)
class Check:
    """One criterion at one point: its name, the figures behind it, and whether it was met (None:
    shown, not judged at this point)."""

    criterion: str
    value: str
    met: bool | None


def point_checks(figures: Sequence[PointFigures], default: str, multiple: float) -> list[Check]:
    """The four checks of ``default``'s figures against the other policies' at one point."""
    by_name = {f.policy: f for f in figures}
    mine = by_name[default]
    others = [f for f in figures if f.policy != default]
    checks: list[Check] = []
    if others:
        best = max(others, key=lambda f: f.on_time)
        checks.append(Check("on time ≥ best of the others", f"{mine.on_time} vs {best.on_time} ({best.policy})",
                            mine.on_time >= best.on_time))
    ratio = mine.bound_ratio
    judged = multiple == BOUND_MULTIPLE
    checks.append(Check(f"≥ {TARGET_BOUND_RATIO:g} × offline bound (judged at {BOUND_MULTIPLE:g}×)",
                        "no bound" if ratio is None else f"{mine.on_time}/{mine.bound} = {ratio:.2f}×",
                        (ratio is not None and ratio >= TARGET_BOUND_RATIO) if judged else None))
    checks.append(Check(f"admitted then deadline_exceeded ≤ {TARGET_EXPIRED_SHARE:.0%}",
                        f"{mine.expired}/{mine.admitted} = {mine.expired_share:.1%}",
                        mine.expired_share <= TARGET_EXPIRED_SHARE))
    checks.append(Check(f"wasted device time ≤ {TARGET_WASTED_SHARE:.0%}", f"{mine.wasted_share:.1%}",
                        mine.wasted_share <= TARGET_WASTED_SHARE))
    return checks
