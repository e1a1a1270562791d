"""When will each admitted request finish, and which ones can finish on time (issue #13, §5.2, §7.2)?

Why this module exists: the §5.2 prospect check and the ``at_risk`` test of §7.2 used to
estimate a request's finish from *its own* remaining tokens × the step time. On B1 the device
is shared: N admitted sequences each get 1/N of the decode steps, so every estimate was N
times too optimistic and fair rotation then made all of them finish late together. This is
the one estimator admission, decode ordering and ``Retry-After`` are meant to share. It is
sans-io and pure: plain frozen dataclasses in, plain values out, no runtime imports, so the
scheduler, the load simulator and tests all call the same functions.

The device model (:class:`DeviceModel`) is deliberately small:

* a decode step serves up to ``lanes = compiled_batch × engines`` sequences (one token each)
  and takes ``decode_step_s`` — the *submission-to-completion* time of one decode job, which
  is what :class:`~calculet.runtime.scheduling.estimates.StepTimer` measures; with ping/pong
  (``engines=2``) two jobs are in flight, each taking that long;
* a prefill is device-exclusive: ``prefill_s(tokens)`` seconds (per chunk fixed cost when
  chunked prefill is on; chunking changes interleaving, not the total device time);
* on B>1, once measured, a lane's step is ``token_s``: the wall time per token a decoding
  sequence sees (Little's law over a long window, :class:`~.estimates.StepTimer`), which holds
  what the step time does not — later arrivals' prefills run between steps, the §8 profile
  grows with the streams, a smaller profile rotates them — and each job's prefill is then
  charged on its own lane rather than the whole backlog before every lane (the backlog is
  interleaved with the decodes, and ``token_s`` already counts it). Until measured (and in the
  step-simulation tests) the backlog runs first, as before. Issue #13 measured the B16
  estimate's median error from 26-28 % to 18-20 % on the steady and bursty presets.

Three policy shapes are estimated:

``fair_share_finish`` — today's policy: fair rotation (WFQ decode tags, R7.2.3) is processor
  sharing of the lanes. Pending prefills run first (the §6 WRR serves prefill queues ahead of a
  long decode), then each sequence progresses at rate ``min(1, lanes·w/W)`` tokens per step.
  The fluid finish is an upper bound of round-robin on B1 (a sequence finishes somewhere in
  its last round; the fluid model puts it at the end) and is off by under one rotation
  (⌈n/lanes⌉ steps) on B>1.
``edf_finish`` — earliest deadline first on the lanes, each job holding its lane until done
  (list scheduling). On B1 a job's prefill runs right before its decode (a job is one unit of
  work), which is exact; on B>1 the prefill backlog runs first and the lanes decode after it.
``on_time_selection`` — overload. EDF alone has the *domino effect*: once the set is
  infeasible, EDF serves the job that is already doomed first and every later one misses too
  (Locke 1986; Buttazzo's "Hard Real-Time Computing Systems" §9). The maximum number of
  on-time jobs on one machine with common release is Moore–Hodgson (1968): take jobs in EDF
  order, and whenever the newest misses drop the longest kept job (possibly the newest).
  For ``lanes > 1`` the same rule runs on an EDF list schedule of ``lanes`` identical lanes,
  rebuilt after each drop: removing a job from a list schedule can make later jobs *later*
  (Graham's anomalies), so the kept prefix is re-checked under the schedule the device will
  run and the longest is dropped until it is on time. That extension is a heuristic
  (P||ΣU_j is NP-hard) but every kept set it returns *is* feasible under :func:`edf_finish`
  (an earlier version checked a lane assignment EDF would not make, and kept sets a B2
  replay finished up to a second late). Shedding the rest early,
  before spending device time on them, is what turns overload into goodput. With tenant
  weights the dropped job is the one with the largest work per weight (weighted ΣU_j is
  NP-hard; with equal weights this is exact Moore–Hodgson on B1).

``fits`` answers admission's question (§5.2): does the candidate and every job the selection
would keep finish on time under EDF, and if not, from when would it fit (``Retry-After``; a
retry gets a new deadline, so the candidate's relative deadline is kept).

Every call is O(n log n) (plus O(n·lanes) for the lane scan); a job with no deadline is never
shed and never constrains the others (it runs after them).

The lane schedules on B>1 hand a freed lane to the next job at the KV slot's measured per-token time
(:attr:`DeviceModel.handover_s`, issue #13 session 14): a freed slot's next request first waits for its
prefill behind the other newcomers', so a queue drains slower than its sequences decode. Admission (``fits``
and its cache) and the overload selection plan with it; the reported admission-order estimate does not (with
it, the steady/bursty rows got worse: ``docs/estimator.md``).

What was measured and tried on this estimator and not kept — counting later arrivals, per-size per-token
times, the admission plan's own finish as the reported estimate, and the rest — with the figures, is in
``docs/estimator.md`` ("The estimator's earlier measurements"); read it before trying a variant.
"""

from __future__ import annotations

import heapq
import math
from itertools import accumulate
from operator import le
from dataclasses import dataclass
from typing import Mapping, Sequence

from calculet.records import quick_init


@dataclass(frozen=True)
class PendingJob:
    """One admitted (or candidate) request as the estimator sees it.

    ``decode_steps`` is the number of decode steps still to run (the prefill yields the first
    token, so a request not yet prefilled needs ``max_new_tokens - 1`` steps). ``deadline`` is
    absolute, in the scheduler's clock seconds; ``None`` means none.
    """

    id: int
    prefill_tokens: int
    decode_steps: int
    deadline: float | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.prefill_tokens < 0 or self.decode_steps < 0:
            raise ValueError("a pending job needs prefill_tokens >= 0 and decode_steps >= 0")
        if not self.weight > 0:
            raise ValueError("a pending job's weight must be > 0")

    @classmethod
    def trusted(cls, id: int, prefill_tokens: int, decode_steps: int, deadline: float | None,
                weight: float) -> PendingJob:
        """A job from values checked where they entered the runtime, built without re-checking them.

        Why: admission builds one per ``submit()`` from the request machine's own bounded variables
        (``prompt_tokens`` ≥ 1 and ``generated_tokens`` ≤ ``max_new_tokens``, declared and proved in
        ``calculet/machines``) and a configured tenant weight (> 0, the config schema); the frozen
        dataclass's ``__init__`` and ``__post_init__`` cost about three times this (issue #20). Equal,
        with an equal hash, to ``PendingJob(...)`` of the same values."""
        job = object.__new__(cls)
        fields = job.__dict__
        fields["id"] = id
        fields["prefill_tokens"] = prefill_tokens
        fields["decode_steps"] = decode_steps
        fields["deadline"] = deadline
        fields["weight"] = weight
        return job


@quick_init  # built at each decode step measured wherever a model is read after it (on_time_device, #20)
@dataclass(frozen=True)
class DeviceModel:
    """How long device work takes: one profile, as the scheduler measures or the cost model states."""

    decode_step_s: float
    compiled_batch: int = 1
    engines: int = 1
    """2 with ping/pong: two decode jobs in flight, each taking ``decode_step_s``."""
    prefill_fixed_s: float = 0.0
    prefill_per_token_s: float = 0.0
    prefill_chunk_tokens: int | None = None
    """Chunked prefill: the fixed cost is paid per chunk."""
    token_s: float = 0.0
    """Measured wall seconds per token of a decoding sequence over a long window
    (:attr:`~.estimates.StepTimer.token_s`; 0: not measured): the step, the prefills of later
    arrivals run between steps, the profile growing with the streams and rotation below the
    largest profile. On B>1 the lane step of the estimates (:attr:`lane_step_s`)."""

    step_period_s: float = 0.0
    """Measured completion-to-completion time of back-to-back decode steps at its tail (the step and
    the host's time between steps, mean plus four deviations: :attr:`~.estimates.StepTimer.period_high_s`;
    0: not measured): the latency SLO's rotation is sized on it, since ITL is judged at its P99."""
    slot_token_s: float = 0.0
    """Measured wall seconds a KV slot is held per token it yields (:attr:`~.estimates.StepTimer.slot_token_s`;
    0: not measured). On B>1 a job that takes a lane another job held decodes at it (:attr:`handover_s`)."""

    def __post_init__(self) -> None:
        if min(self.decode_step_s, self.prefill_fixed_s, self.prefill_per_token_s, self.token_s,
               self.step_period_s, self.slot_token_s) < 0:
            raise ValueError("device model times must be >= 0")
        if self.compiled_batch < 1 or self.engines not in (1, 2):
            raise ValueError("a device model needs compiled_batch >= 1 and engines in (1, 2)")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError("prefill_chunk_tokens must be >= 1")

    @property
    def lanes(self) -> int:
        """Sequences that progress by one token per ``decode_step_s``."""
        return self.compiled_batch * self.engines

    @property
    def prefill_on_lane(self) -> bool:
        """Whether a job's prefill is charged on its own lane, just before its decode (B1; and B>1 once
        :attr:`token_s` is measured: it already holds the prefills run between steps), rather than
        the whole prefill backlog before every lane (B>1 until measured)."""
        return self.compiled_batch * self.engines == 1 or self.token_s > 0

    @property
    def lane_step_s(self) -> float:
        """Wall seconds per decode step of one lane in the estimates: on B>1 the measured step
        stretched by the prefills interleaved with it; on B1 the step itself (each job's prefill is
        charged where it runs, next to its decode)."""
        if self.compiled_batch * self.engines == 1 or self.token_s <= 0:
            return self.decode_step_s
        return max(self.token_s, self.decode_step_s)

    @property
    def handover_s(self) -> float:
        """Seconds more per decode step for a job that takes a lane after another job held it, in the lane
        schedules (:func:`edf_schedule`, the selection, the admission-order estimate; 0 on one lane or until
        measured). Why (issue #13): a lane freed on B>1 does not decode its next job at once — the newcomer holds
        its slot while it waits for its prefill behind the other newcomers' — so a queue drains at the slot's
        per-token time, not the decoding sequence's. Measured on the goodput comparison's B16 tight 4x runs: the
        slot's 1.3x the sequence's, and requests planned to start 4 s out started at 6.3 s; ``docs/estimator.md``
        has the figures. Jobs that start on a lane free now (a device not full) keep the sequence's time."""
        if self.compiled_batch * self.engines == 1 or self.token_s <= 0:
            return 0.0
        return max(0.0, self.slot_token_s - self.lane_step_s)

    def slowed(self, factor: float) -> DeviceModel:
        """This device with every time multiplied by ``factor`` (≥ 1): admission's margin for the
        estimator's measured error (:mod:`.estimate_error`). Finish times from ``now`` scale by it."""
        if factor == 1.0:
            return self
        # the constructor, not dataclasses.replace: admission builds one per change of the model or margin (#20)
        return DeviceModel(self.decode_step_s * factor, self.compiled_batch, self.engines,
                           self.prefill_fixed_s * factor, self.prefill_per_token_s * factor, self.prefill_chunk_tokens,
                           self.token_s * factor, self.step_period_s * factor, self.slot_token_s * factor)

    def prefill_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        chunks = 1 if self.prefill_chunk_tokens is None else -(-tokens // self.prefill_chunk_tokens)
        return chunks * self.prefill_fixed_s + self.prefill_per_token_s * tokens

    def service_s(self, prefill_tokens: int, decode_steps: int) -> float:
        """Seconds one job holds a lane alone: its prefill, then its decode steps. The length the
        planner's refusals, its retry slots and the HTTP front's snapshot all place (one formula)."""
        return self.prefill_s(prefill_tokens) + decode_steps * self.lane_step_s

    def itl_s(self, streams: int) -> float:
        """Inter-token latency of each of ``streams`` rotating sequences (one rotation)."""
        return -(-max(streams, 1) // self.lanes) * self.decode_step_s

    def max_streams_for_itl(self, itl_target_s: float, prefill_s: float = 0.0) -> int:
        """The largest decode set whose rotation keeps every stream within ``itl_target_s`` (≥ 0),
        leaving ``prefill_s`` of headroom: the prefill of the request that takes a freed stream
        slot runs between two steps, so one token of every stream waits a rotation plus it."""
        step = max(self.decode_step_s, self.step_period_s)
        if step <= 0:
            return 2**31 - 1
        return self.lanes * max(0, math.floor((itl_target_s - prefill_s) / step + 1e-9))


@dataclass(frozen=True)
class Selection:
    """Who to finish and who to shed now, with the kept jobs' planned EDF finish times."""

    keep: tuple[int, ...]
    shed: tuple[int, ...]
    finish: dict[int, float]


@quick_init  # one per admitted submit() (#20): the fields written without object.__setattr__ each
@dataclass(frozen=True)
class Fit:
    """Admission's answer: ``ok``; if not, ``retry_at`` is when it would fit (None: never)."""

    ok: bool
    retry_at: float | None
    finish: float | None
    """The candidate's planned finish when ``ok``."""


_INF = math.inf
ON_TIME_EPS_S = 1e-12
"""A finish this close past its deadline is on time: the sums of step and prefill seconds here and in
a step-by-step replay (the device, a test's simulation) differ only by float accumulation, about
1e-15 s per addition. Kept far below anything a clock resolves, and below the 1e-9 s a replay's
check allows, so a set the estimator keeps is never late in a replay by a rounding error."""


def _deadline(job: PendingJob) -> float:
    return _INF if job.deadline is None else job.deadline


def _prefills(jobs: Sequence[PendingJob], model: DeviceModel) -> list[float]:
    """``model.prefill_s`` of every job, inlined (this runs on the admission path)."""
    fixed, per, chunk = model.prefill_fixed_s, model.prefill_per_token_s, model.prefill_chunk_tokens
    if chunk is None:
        return [fixed + per * t if (t := j.prefill_tokens) else 0.0 for j in jobs]
    return [-(-t // chunk) * fixed + per * t if (t := j.prefill_tokens) else 0.0 for j in jobs]


def _plan(jobs: Sequence[PendingJob], model: DeviceModel) -> tuple[float, list[float], list[float] | None]:
    """(device time before the lanes start, per-job lane length, per-job extra length on a lane another job held
    — None when there is none, :attr:`DeviceModel.handover_s`): the EDF work model."""
    step, prefills, handover = model.lane_step_s, _prefills(jobs, model), model.handover_s
    extra = [j.decode_steps * handover for j in jobs] if handover > 0 else None
    if model.prefill_on_lane:
        return 0.0, [p + j.decode_steps * step for p, j in zip(prefills, jobs)], extra
    return sum(prefills), [j.decode_steps * step for j in jobs], extra


def _edf_order(jobs: Sequence[PendingJob]) -> list[int]:
    """Indices by deadline (none last); ties keep the given order (``sorted`` is stable)."""
    deadlines = [_INF if j.deadline is None else j.deadline for j in jobs]
    return sorted(range(len(jobs)), key=deadlines.__getitem__)


def _list_schedule(order: Sequence[int], lengths: Sequence[float], lanes: int, start: float,
                   extra: Sequence[float] | None = None) -> tuple[dict[int, float], list[float]]:
    """Each job in ``order`` takes the earliest free lane and holds it ``lengths[i]``, plus ``extra[i]`` when
    another job held that lane before it (:attr:`DeviceModel.handover_s`): (finish per index, the lanes' free
    times as a heap)."""
    free = [start] * lanes
    finish: dict[int, float] = {}
    for i in order:
        end = heapq.heappop(free)
        end += lengths[i] if extra is None or end <= start else lengths[i] + extra[i]
        finish[i] = end
        heapq.heappush(free, end)
    return finish, free


def fair_share_finish(jobs: Sequence[PendingJob], now: float, model: DeviceModel) -> dict[int, float]:
    """Expected finish of every job under fair rotation (processor sharing of the lanes).

    Pending prefills (in the given order) run first; a job with no decode step left finishes
    with its prefill. The others then share the lanes: with ``W`` the alive jobs' total weight
    each progresses at ``w · min(lanes/W, 1/w_max)`` tokens per step (never above one token per
    step), so they finish in order of ``decode_steps / weight``.

    Read at every on_time replan over every kept job (:func:`.on_time_spare.at_risk_prefix`): the prefills are
    :func:`_prefills` (``model.prefill_s`` inlined), each job's ``decode_steps / weight`` is computed once and the
    lanes read once — no call per job (#20, session 26); the same operations in the same order, so the same floats
    (``tests/unit/runtime/scheduling/test_fair_share_same.py`` holds it to the per-job form).
    """
    clock: float = now
    result: dict[int, float] = {}
    decoding: list[PendingJob] = []
    for job, prefill in zip(jobs, _prefills(jobs, model)):
        clock += prefill
        if job.decode_steps == 0:
            result[job.id] = clock
        else:
            decoding.append(job)
    keys = [j.decode_steps / j.weight for j in decoding]
    ranked = sorted(range(len(decoding)), key=keys.__getitem__)  # stable: ties keep the given order
    order = [decoding[i] for i in ranked]
    count = len(order)
    wmax_suffix = [0.0] * (count + 1)
    wmax = 0.0
    for k in range(count - 1, -1, -1):
        weight = order[k].weight
        if weight > wmax:  # max(wmax, weight): the same value
            wmax = weight
        wmax_suffix[k] = wmax
    total_w = sum([j.weight for j in order])
    lanes, step = model.lanes, model.lane_step_s
    steps = virtual = 0.0
    for k, i in enumerate(ranked):
        job = decoding[i]
        target = keys[i]
        share, cap = lanes / total_w, 1.0 / wmax_suffix[k]
        steps += (target - virtual) / (cap if cap < share else share)  # min(share, cap)
        virtual = target
        total_w -= job.weight
        result[job.id] = clock + steps * step
    return result


def edf_finish(jobs: Sequence[PendingJob], now: float, model: DeviceModel) -> dict[int, float]:
    """Finish of every job when all are served earliest-deadline-first on the lanes (no shedding)."""
    return edf_schedule(jobs, now, model)[0]


def edf_schedule(jobs: Sequence[PendingJob], now: float,
                 model: DeviceModel) -> tuple[dict[int, float], list[float]]:
    """:func:`edf_finish`, and the lanes' free times after it as a heap: a lane no job holds is free when the
    prefill backlog ends (``now`` where prefills run on their own lanes), not at ``now``."""
    base, lengths, extra = _plan(jobs, model)
    finish, free = _list_schedule(_edf_order(jobs), lengths, model.lanes, now + base, extra)
    return {jobs[i].id: t for i, t in finish.items()}, free


def _select(order: Sequence[int], lengths: Sequence[float], deadlines: Sequence[float],
            weights: Sequence[float], lanes: int, start: float,
            extra: Sequence[float] | None = None) -> tuple[list[int], dict[int, float]]:
    """Moore–Hodgson on an EDF list schedule of ``lanes`` lanes: (shed indices, kept finish)."""
    if lanes > 1:
        return _select_lanes(order, lengths, deadlines, weights, lanes, start, extra)
    ends = list(accumulate([lengths[i] for i in order], initial=start))[1:]
    if all(map(le, ends, [deadlines[i] + ON_TIME_EPS_S for i in order])):
        return [], dict(zip(order, ends))
    clock = start
    finish: dict[int, float] = {}
    longest: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    shed: list[int] = []
    for i in order:
        clock += lengths[i]
        finish[i] = clock
        if deadlines[i] == _INF:
            continue
        push(longest, (-lengths[i] / weights[i], -i))
        while clock > deadlines[i] + ON_TIME_EPS_S:  # one drop unless weights make a shorter job the victim
            victim = -pop(longest)[1]
            shed.append(victim)
            clock -= lengths[victim]
            del finish[victim]
            if victim == i:
                break
            finish[i] = clock
    return shed, finish


def _select_lanes(order: Sequence[int], lengths: Sequence[float], deadlines: Sequence[float],
                  weights: Sequence[float], lanes: int, start: float,
                  extra: Sequence[float] | None = None) -> tuple[list[int], dict[int, float]]:
    """The ``lanes > 1`` extension: the kept prefix is always on time under its *own* EDF list schedule.

    Removing a job from a list schedule can delay the jobs after it (Graham's anomalies, 1969:
    the freed lane is taken by an earlier-deadline job and a later one lands behind it), so
    after a drop the kept prefix is scheduled again, as the device will run it, and the
    longest job is dropped until every kept job is on time. Jobs before the newest one are
    unaffected by appending it, so the returned set is feasible under :func:`edf_finish`.
    """
    free = [start] * lanes
    kept: list[int] = []
    finish: dict[int, float] = {}
    longest: list[tuple[float, int]] = []
    shed: list[int] = []
    for i in order:
        end = heapq.heappop(free)
        end += lengths[i] if extra is None or end <= start else lengths[i] + extra[i]
        heapq.heappush(free, end)
        kept.append(i)
        finish[i] = end
        if deadlines[i] == _INF:
            continue
        heapq.heappush(longest, (-lengths[i] / weights[i], -i))
        if end <= deadlines[i] + ON_TIME_EPS_S:
            continue
        while True:
            victim = -heapq.heappop(longest)[1]
            shed.append(victim)
            kept.remove(victim)
            finish, free = _list_schedule(kept, lengths, lanes, start, extra)
            if all(finish[k] <= deadlines[k] + ON_TIME_EPS_S for k in kept):
                break
    return shed, finish


def moore_hodgson(lengths: Sequence[float], deadlines: Sequence[float | None], *, lanes: int = 1,
                  start: float = 0.0, weights: Sequence[float] | None = None) -> tuple[list[int], list[int]]:
    """(kept, shed) indices of jobs all present at ``start`` with these lengths and absolute deadlines.

    The plain-number form of :func:`on_time_selection` (the offline bound uses it on device
    seconds). Exact maximum on-time count for ``lanes == 1`` and equal weights.
    """
    ds = [_INF if d is None else d for d in deadlines]
    order = sorted(range(len(ds)), key=ds.__getitem__)
    shed, _ = _select(order, lengths, ds, weights or [1.0] * len(ds), lanes, start)
    dropped = set(shed)
    return [i for i in order if i not in dropped], sorted(shed)


def on_time_selection(jobs: Sequence[PendingJob], now: float, model: DeviceModel) -> Selection:
    """The jobs to keep so that the most of them finish by their deadlines, and the ones to shed.

    Exact (Moore–Hodgson) on one lane with equal weights; on several lanes the documented
    EDF-list-schedule extension. Kept finish times are those of the EDF lane schedule built
    (a kept job's finish may only have moved earlier after a later drop, so it is an upper bound).
    On B>1 the prefill backlog of *all* jobs is charged before the lanes start (conservative:
    shedding a job also removes its prefill).
    """
    base, lengths, extra = _plan(jobs, model)
    deadlines = [_INF if j.deadline is None else j.deadline for j in jobs]
    order = sorted(range(len(jobs)), key=deadlines.__getitem__)
    shed, finish = _select(order, lengths, deadlines, [j.weight for j in jobs], model.lanes, now + base, extra)
    if not shed:  # the usual replan: every job kept, in EDF order (#20: no set, no test per job)
        return Selection(keep=tuple([jobs[i].id for i in order]), shed=(),
                         finish={jobs[i].id: t for i, t in finish.items()})
    dropped = set(shed)
    return Selection(keep=tuple(jobs[i].id for i in order if i not in dropped),
                     shed=tuple(jobs[i].id for i in order if i in dropped),
                     finish={jobs[i].id: t for i, t in finish.items()})


def _all_on_time(jobs: Sequence[PendingJob], now: float, model: DeviceModel) -> dict[int, float] | None:
    finish = edf_finish(jobs, now, model)
    return finish if all(finish[j.id] <= _deadline(j) + ON_TIME_EPS_S for j in jobs) else None


def _remaining_at(kept: Sequence[PendingJob], plan: dict[int, float], now: float, t: float,
                  model: DeviceModel) -> list[PendingJob]:
    """The kept jobs as they would stand at ``t`` had they run by their EDF plan from ``now``.

    Conservative: a job whose prefill is not finished by ``t`` is kept whole, and decode
    progress is rounded down to whole steps, so remaining work is never under-stated.
    """
    step = model.lane_step_s
    prefills_done = model.prefill_on_lane or t >= now + _plan(kept, model)[0]
    out = []
    for job in kept:
        end = plan[job.id]
        if end <= t:
            continue
        decode = job.decode_steps * step
        if not prefills_done or end - t > decode or step <= 0:
            out.append(job)
        else:
            steps = min(job.decode_steps, math.ceil((end - t) / step - 1e-9))
            out.append(PendingJob(job.id, 0, steps, job.deadline, job.weight))
    return out


def fits(candidate: PendingJob, admitted: Sequence[PendingJob], now: float, model: DeviceModel) -> Fit:
    """§5.2: would admitting ``candidate`` keep it and every job the selection keeps on time?

    Jobs the selection of ``admitted`` already sheds do not count against the candidate (they
    are to be shed anyway). When it does not fit now, ``retry_at`` is the earliest instant
    among the kept jobs' planned finishes at which the same request (same *relative*
    deadline, the kept jobs progressed by their EDF plan) would fit; it is found by a binary
    search over those instants and verified, so it always fits but may be later than the
    true earliest. ``None``: it cannot fit even on an idle device.
    """
    kept_ids = set(on_time_selection(admitted, now, model).keep)
    kept = [j for j in admitted if j.id in kept_ids]
    finish = _all_on_time([*kept, candidate], now, model)
    if finish is not None:
        return Fit(True, None, finish[candidate.id])
    if candidate.deadline is None:
        return Fit(True, None, edf_finish([*kept, candidate], now, model)[candidate.id])
    relative = candidate.deadline - now
    plan = edf_finish(kept, now, model)
    instants = sorted({t for t in plan.values() if t > now})

    def fits_at(t: float) -> bool:
        moved = PendingJob(candidate.id, candidate.prefill_tokens, candidate.decode_steps, t + relative,
                           candidate.weight)
        return _all_on_time([*_remaining_at(kept, plan, now, t, model), moved], t, model) is not None

    if not instants or not fits_at(instants[-1]):
        return Fit(False, None, None)
    lo, hi = 0, len(instants) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_at(instants[mid]):
            hi = mid
        else:
            lo = mid + 1
    return Fit(False, instants[lo], None)


def admission_order_finish(candidate: PendingJob, tenant: str, admitted: Sequence[PendingJob],
                           queued: Mapping[str, Sequence[PendingJob]], weights: Mapping[str, float], now: float,
                           model: DeviceModel, *, tags: Mapping[int, float] | None = None) -> float:
    """Expected finish of ``candidate`` when the order that binds is the admission queue's (§5.3 WFQ).

    When no more sequences may hold KV than the device decodes in one step (B16 with 16
    sequences), every admitted sequence is in every batch, so who finishes when is decided by
    the order the waiting requests are *admitted* in — weighted fair queuing across tenants,
    arrival order within one — not by deadlines. ``edf_finish`` then plans the wrong order:
    issue #13 measured a candidate at 4× load overtaking 39 of 63 requests of a more backlogged
    tenant, and the EDF estimate about twice the actual finish. Here the candidate, last of the
    ``q`` requests its tenant has waiting, is admitted after its own tenant's and, of each other
    tenant ``t``, the first ``⌈(q + 1) · w_t / w⌉`` waiting (their fair share of the admissions
    before it; all of them if fewer wait). ``admitted`` hold their lanes now and run first;
    the rest take lanes in that order (``queued`` lists each tenant's waiting jobs in arrival
    order; the candidate is not among them).

    ``tags``: where each waiting job and the candidate stand in the order of admission (by id, smaller
    first: the rank :func:`.wfq_order.admission_ranks` replays from the queue's own tags). With them
    the jobs ahead are exactly those keyed before the candidate, of every tenant (its own tenant's
    long flow may come after it), taking lanes in that order — WFQ orders by *cost*, and issue #13
    measured the count rule's estimates on one KV lane up to 2.3× the actual finish for a tenant of
    short requests beside one of long ones (which it served first) and 30 % early for the other.
    """
    ahead: list[PendingJob] = list(admitted)
    if tags is not None:
        mine_tag = tags.get(candidate.id, math.inf)
        before = [j for jobs in queued.values() for j in jobs if tags.get(j.id, math.inf) < mine_tag]
        ahead.extend(sorted(before, key=lambda j: tags[j.id]))
    else:
        own_w = weights.get(tenant, 1.0)
        mine = len(queued.get(tenant, ()))
        for name, jobs in queued.items():
            ahead.extend(jobs if name == tenant else jobs[:math.ceil((mine + 1) * weights.get(name, 1.0) / own_w)])
    jobs = [*ahead, candidate]
    base, lengths, _ = _plan(jobs, model)  # no handover: the reported estimate keeps the long window (module doc)
    finish, _ = _list_schedule(range(len(jobs)), lengths, model.lanes, now + base)
    return finish[len(jobs) - 1]
