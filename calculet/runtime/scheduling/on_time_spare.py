"""Which requests the ``on_time`` overload selection sheds only to make room (issue #13, §7.2).

Why this module exists: the selection (:func:`.finish_estimate.on_time_selection`) drops requests until
the rest are on time by the nominal estimate; :func:`spare_harmless` takes back the ones whose shed
would free nothing anybody kept needs. The planner (:mod:`.on_time_planner`) applies it at each replan,
and then asks which kept requests must run by deadline (:func:`at_risk_prefix`) and how much slower the
device may get before its plan could decide otherwise (:func:`slack_ratio`); both moved here from the
planner for its size limit (#20).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterable, Mapping

from calculet.runtime.scheduling.finish_estimate import (ON_TIME_EPS_S, DeviceModel, PendingJob, edf_finish,
                                                         fair_share_finish)


def _deadline(job: PendingJob) -> float:
    return math.inf if job.deadline is None else job.deadline


def spare_harmless(jobs: list[PendingJob], shed: Iterable[int], holding: Callable[[int], bool], now: float,
                   model: DeviceModel) -> tuple[int, ...]:
    """Ids of the ``shed`` jobs that keep their sequence: each one that ``holding`` (it holds a KV sequence)
    and whose remaining work, run at the head of a lane from now, leaves every job kept so far on time —
    at the head, not in its EDF place: its sequence decodes from now whatever the plan says (on B1 it
    shares the one lane; an EDF place behind equal deadlines would call it harmless there).

    Why (issue #13): the overload selection sheds to make room for the others (§7.2); a request that
    holds its lane and delays nobody the selection keeps costs them nothing, and shedding it only turns
    a late *estimate* into a certain miss. The estimate errs both ways by a quarter or more at its P10
    and P90 on B16 (later arrivals' prefills, the §8 profile growing and shrinking with the streams),
    and the selection judges it at the nominal estimate: requests 1-2 tokens from their end were shed.
    Measured on the goodput comparison's B16 tight arm (6 request seeds at 0.5× and 1×, and the
    committed trace at 0.5-4×): admitted then late 34 -> 21, on time +20 in all (6 578 -> 6 598), the
    committed 4× point's 6/511 late -> 4/513 (its 1× point: 405 -> 398 on time, 2 -> 4 late). A spared request still ends at its deadline if it is
    late (the deadline expiry), and admission may take its lane back: :func:`.finish_estimate.fits`
    selects over the kept set again, which drops it when a candidate needs the room.
    Jobs still waiting for a sequence are never spared (they hold nothing; admission refused them room).
    """
    dropped = set(shed)
    kept = [j for j in jobs if j.id not in dropped]
    spared: list[PendingJob] = []
    for job in jobs:
        if job.id not in dropped or not holding(job.id):
            continue
        first = replace(job, deadline=-math.inf)  # EDF takes it before every kept job
        finish = edf_finish([*kept, *spared, first], now, model)
        if all(finish[k.id] <= _deadline(k) + ON_TIME_EPS_S for k in kept):
            spared.append(first)
    return tuple(j.id for j in spared)


def slack_ratio(finish: Mapping[int, float], jobs: Iterable[PendingJob], now: float) -> float:
    """The least ``(deadline - finish) / (finish - now)`` over ``jobs`` that are on time (inf: none): how much
    slower every device time may get before one of them is late (a finish from ``now`` scales at most by it)."""
    least = math.inf
    for job in jobs:  # once or twice per replan over every kept job: no call per job (#20)
        end = finish[job.id]
        deadline = job.deadline
        if deadline is None:
            deadline = math.inf
        if now < end <= deadline + ON_TIME_EPS_S:
            ratio = (deadline - end) / (end - now)
            if ratio < least:
                least = ratio
    return least


PLAN_SLACK_AT_RISK = 0.1
"""A kept job whose slack in the plan (deadline - planned finish) is under this share of the time from now to its
planned finish is at risk too."""


def near_deadline(kept: Iterable[PendingJob], finish: Mapping[int, float], now: float) -> list[int]:
    """Ids of the ``kept`` jobs the EDF plan (``finish``: the overload selection's, the lane schedule admission
    proved) finishes with a slack under :data:`PLAN_SLACK_AT_RISK` times the time to that finish: at risk whatever their
    fair-share finish says.

    Why (issue #13 session 14): :func:`at_risk_prefix` judges by processor sharing, which finishes short jobs
    first, so a short request the plan puts at the edge of its deadline is "not at risk" and its prefill keeps the
    §6 WFQ order within its class, where later, cheaper prompts go first. On the goodput comparison's B16 tight 4x
    about half the admitted-then-late requests held a KV slot in PrefillReady until their deadline that way (seed 12,
    arrival 50.41 s: a slot at +2.3 s, no prefill by +10 s). Marked at risk, the prefill goes by deadline
    (:meth:`.PrefillScheduler.prioritise`). Measured (seeds 11-15, ``calculet-b16`` cells): tight 4x admitted then
    late 29/2520 -> 17/2523, on time 2 491 -> 2 506; tight 1x-2x -2 in all; every loose point and B1 identical
    (``docs/estimator.md``)."""
    result = []
    for job in kept:
        end = finish.get(job.id)
        if job.deadline is not None and end is not None and now < end and \
                job.deadline - end < PLAN_SLACK_AT_RISK * (end - now):
            result.append(job.id)
    return result


def at_risk_prefix(kept: list[PendingJob], now: float, model: DeviceModel) -> tuple[list[int], float]:
    """Ids of the EDF prefix of ``kept`` that must run by deadline so the rest may rotate on time, and the
    :func:`slack_ratio` of every job found on time on the way (the same prefix for a device that slow)."""
    deadlines = [math.inf if job.deadline is None else job.deadline for job in kept]  # _deadline, no call per job
    order = [kept[i] for i in sorted(range(len(kept)), key=deadlines.__getitem__)]  # stable, as sorted(kept, key=...)
    step, lanes = model.lane_step_s, model.lanes
    k, prefix_s, slack = 0, 0.0, math.inf
    while k < len(order):
        rest = order[k:]
        finish = fair_share_finish(rest, now + prefix_s / lanes, model)
        late = [i for i, job in enumerate(rest)
                if job.deadline is not None and finish[job.id] > job.deadline + ON_TIME_EPS_S]
        slack = min(slack, slack_ratio(finish, rest, now))
        if not late:
            break
        grown = k + late[-1] + 1
        prefix_s += sum(model.prefill_s(j.prefill_tokens) + j.decode_steps * step for j in order[k:grown])
        k = grown
    return [job.id for job in order[:k]], slack
