"""The goodput comparison of issue #13 item 7: B1 and B16, 0.5×–4× capacity, tight and loose deadlines.

Why a sweep of its own: one load scale means a different overload on each device (a B16 device
serves about 8.5× the requests of a B1 device on the ``overload`` preset), so comparing the decode
orders "at 2× overload" on both needs each device's own loads. An *arm* is one device under one
deadline setting: the same requests (the ``overload`` preset, generated once per load) run under

* ``b1-serial-fcfs`` — FCFS, one request at a time on B1 (the llama.cpp-style serial baseline);
* the device's engine policy under ``strict`` EDF and ``at_risk`` and the shipped default
  (``on_time``): ``calculet-b1-shared`` (B1 as the service ships it, many streams rotating on one
  device) and ``calculet-b16``,

each beside the offline bound of the same requests on that device
(:mod:`calculet.loadsim.bound`). The loads are multiples of the device's *capacity* for the
trace: the request rate at which its device work — each prefill once, every decode step full
(``decode_s(B) / B`` per token) — equals the time it arrives in (:func:`capacity_load`).

The acceptance checks (:mod:`calculet.bench.comparison_checks`) are computed from these cells;
this module only runs the arms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console

from calculet.adapters.sim.cost import CostModel
from calculet.bench.sweep import SweepResult, run_sweep
from calculet.loadsim.policies import GOODPUT_DEVICES, POLICIES, PolicySpec, deadline_orders, parse_policies
from calculet.loadsim.workload import SimRequest, Workload, generate_requests

__all__ = [
    "CAPACITY_MULTIPLES", "COMPARISON_PRESET", "DEADLINE_SETTINGS", "Arm", "Comparison", "arm_policies",
    "capacity_load", "run_comparison",
]

COMPARISON_PRESET = "overload"
CAPACITY_MULTIPLES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
"""Offered load as multiples of the device's capacity for the trace (issue #13 item 7)."""
DEADLINE_SETTINGS: tuple[tuple[str, float], ...] = (("tight", 1.0), ("loose", 4.0))
"""(label, deadline scale): the preset's 10 s deadline (≈ 5× a request's B1 service time) and 40 s."""


@dataclass(frozen=True)
class Arm:
    """One device under one deadline setting: its sweep, and the capacity multiple of each load."""

    device: str
    """The engine policy that names the device (``calculet-b1-shared``, ``calculet-b16``)."""
    deadline: str
    deadline_scale: float
    capacity_load: float
    """The load scale that offers exactly the device's capacity (1×)."""
    multiples: tuple[float, ...]
    result: SweepResult

    @property
    def label(self) -> str:
        return f"B{POLICIES[self.device].max_profile} {self.deadline}"

    def load_of(self, multiple: float) -> float:
        return self.result.loads[self.multiples.index(multiple)]


@dataclass(frozen=True)
class Comparison:
    """Every arm of the comparison, in (device, deadline) order."""

    workload: Workload
    cost: CostModel
    arms: tuple[Arm, ...]
    wall_s: float


def arm_policies(device: str) -> tuple[PolicySpec, ...]:
    """FCFS, then ``device`` under every non-default §7.2 order, then ``device`` (the default) last."""
    default, values = deadline_orders()
    names = ["b1-serial-fcfs", *(f"{device}@{v}" for v in values if v != default), device]
    return parse_policies(names)


def device_seconds(requests: Sequence[SimRequest], cost: CostModel, batch: int) -> float:
    """Device work of ``requests`` on a device whose largest profile is ``batch``: each prefill once
    (its first token), every further token a ``1/batch`` share of a full step."""
    step = cost.decode_s(batch) / batch
    return sum(cost.prefill_s(r.prompt_tokens) + max(0, r.max_new_tokens - 1) * step for r in requests)


def capacity_load(workload: Workload, cost: CostModel, batch: int, *, duration_s: float | None = None,
                  seed: int | None = None) -> float:
    """The load scale at which the trace's device work on ``batch`` lanes equals its arrival span.

    Load scales compress the same requests in time (:mod:`calculet.loadsim.arrivals`), so at scale
    ``L`` the arrivals span ``duration / L``; the device keeps up exactly when that equals the work.
    """
    duration = workload.duration_s if duration_s is None else duration_s
    work = device_seconds(generate_requests(workload, duration, 1.0, seed=seed), cost, batch)
    return duration / work if work > 0 else 1.0


def run_comparison(workload: Workload, cost: CostModel, *, multiples: Sequence[float] = CAPACITY_MULTIPLES,
                   deadlines: Sequence[tuple[str, float]] = DEADLINE_SETTINGS,
                   devices: Sequence[str] = GOODPUT_DEVICES, duration_s: float | None = None,
                   seed: int | None = None, console: Console | None = None, quiet: bool = True) -> Comparison:
    """Every arm: each device's policies at its capacity multiples, under each deadline setting."""
    arms: list[Arm] = []
    wall = 0.0
    for device in devices:
        unit = capacity_load(workload, cost, POLICIES[device].max_profile, duration_s=duration_s, seed=seed)
        loads = tuple(round(m * unit, 4) for m in multiples)
        for label, scale in deadlines:
            result = run_sweep(workload, arm_policies(device), loads, cost=cost, duration_s=duration_s, seed=seed,
                               reference=False, deadline_scale=scale, console=console, quiet=quiet)
            wall += result.wall_s
            arms.append(Arm(device, label, scale, unit, tuple(multiples), result))
    return Comparison(workload, cost, tuple(arms), wall)
