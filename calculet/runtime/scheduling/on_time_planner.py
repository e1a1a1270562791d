"""The ``on_time`` policy's decisions over the live requests: admit, shed, prioritise, cap (issue #13).

Why this module exists: :mod:`.finish_estimate` answers questions about plain jobs; this is
where the scheduler's requests become those jobs and the answers become decisions (DESIGN
"Goodput before throughput"):

* **admission (§5.2)** — a request is accepted only when it and every request the selection
  keeps still finish by their deadlines under EDF on the shared device (``fits``); otherwise
  429 with ``Retry-After`` from the same estimate. The answer is cached: a candidate whose
  deadline is the latest (every request with the default deadline, in arrival order) is
  placed at the end of the cached EDF lane schedule in O(lanes), without disturbing anyone;
  only an earlier deadline pays the O(n log n) check;
* **fast refusal** — a refusal is answered from the same cache: a latest-deadline candidate that
  the cached lane schedule finishes late is refused in O(lanes), and while the kept set and the
  device model are unchanged (``_version``) a candidate with a deadline no later than the last
  refused one's and no less work is refused in O(1) — EDF feasibility only gets harder with an
  earlier deadline or more work (tested against the full computation). Only the rest pay the
  replan and the retry search: under a burst the engine thread answers 429 at once;
* **retry slots** — a refusal leaves a trace (:class:`RetrySlots`): the candidate's work is
  reserved on the lanes from its ``Retry-After`` on (a *ghost*), and the next refusal's
  ``Retry-After`` is computed behind the ghosts, so refused clients come back spread over the
  time the device frees instead of all at once (issue #13 measured 9 % of retries admitted
  when every refusal got the same 1-2 s). Ghosts only place ``Retry-After``; admission checks the
  kept set alone (a ghost is a forecast, not a commitment);
* **overload (§7.2)** — when the admitted set cannot all finish on time (a burst, a slower
  device, a fault and reset), Moore–Hodgson keeps the most that can and the rest are shed at
  once, before device time is spent on them. EDF alone would serve the doomed first (the
  domino effect) and fair rotation would make everyone late together. Shedding is for making
  room: a request that already holds a sequence and that the selection drops is kept when
  keeping it leaves every request the selection keeps on time (:func:`spare_harmless`) — its
  shed would free device time nobody kept needs and only forfeit its chance to finish; it ends
  at its deadline if it is late after all;
* **ordering (§7.2 item 2)** — where more sequences hold KV than a step decodes (B1) and no
  latency target is set, the decode order is the plan's: every kept request by earliest
  deadline (R7.2.2; ties by virtual finish, R7.2.3), the EDF schedule admission proved
  feasible, so the finish it estimated is the finish the device gives
  (:meth:`OnTimePlanner.decode_order_binds`, ``DecodeScheduler.deadline_first``). Issue #13
  measured fair rotation of the requests not at risk instead: on B1 every later arrival shares
  the device with an admitted request, so its admission-time estimate was off by a P90 of
  35-60 % with the same on-time count; served in the plan's order the P90 is 5-10 % (`steady`
  and `bursty`, loads 0.5-4). Where every sequence is in every step (B16 with 16 sequences) the
  admission queue's WFQ order decides who finishes when, and the estimate follows it
  (:func:`.finish_estimate.admission_order_finish`). There, and with an ITL target (the capped
  decode set rotates: the cap is sized for a rotation), only the *at-risk* requests go by
  deadline: a sequence is at risk when its fair-share finish (processor sharing of the lanes)
  is past its deadline; the at-risk set is closed into an EDF prefix of the kept requests
  (every kept request with an earlier deadline joins it), and the requests after it are
  re-estimated as rotating *after* that prefix, until none of them is late: the prefix then
  runs as EDF, which the selection proved feasible, and the rest keep fair rotation (R7.2.3)
  and tenant weights (§5.3) among themselves;
* **latency SLOs** — with an ITL target only as many streams hold a sequence as one rotation
  *plus one prefill of a typical prompt* serves within it (``DeviceModel.max_streams_for_itl``:
  when a stream ends, the request taking its slot is prefilled between two decode steps, and
  every other stream's token waits for it; the typical prompt is a smoothed mean of the
  prompts seen at admission, its cost the measured prefill cost; one rotation's worth,
  ``lanes``, until the step time and a prefill are measured). The cap leaves room for *one*
  prefill per rotation; the prefill gate (``OnTimePolicy.prefill_fits_itl``) keeps it to one
  when several streams end within a rotation. A request that would wait past its TTFT target
  is refused.

Replanning happens on events — admission into prefill, a request ending, a shed, a device
reset, the measured step time slower than the last plan's slack allows (:meth:`OnTimePlanner.drifted`;
by more than 10 % either way while requests are spared or TTFT targets are set) — at the next tick,
never per tick.
Nothing is decided before a decode step has been measured: with no step time there is no
estimate (``estimated_finish`` stays None) and nothing is shed for want of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from calculet.machines.request import FinishReason
from calculet.runtime.scheduling.arrival_law import ArrivalLawStatistics
from calculet.runtime.scheduling.estimate_error import EstimateErrors, EstimateErrorStatistics
from calculet.runtime.scheduling.estimates import OverlapStatistics, PrefillTimer, StepTimer
from calculet.runtime.scheduling.finish_estimate import (DeviceModel, Fit, PendingJob,
                                                         admission_order_finish, fair_share_finish,
                                                         on_time_selection)
from calculet.runtime.scheduling.on_time_cache import _EdfCache, _Refusal
from calculet.runtime.scheduling.on_time_device import MeasuredDevice
from calculet.runtime.scheduling.on_time_kept import (DECODING_STATES, KeptJobs, job_values, pending_job,
                                                      planned_jobs)
from calculet.runtime.scheduling.on_time_order import AdmissionOrderIndex
from calculet.runtime.scheduling.on_time_refusal import fit_afresh
from calculet.runtime.scheduling.on_time_report import ReportedEstimate
from calculet.runtime.scheduling.on_time_retry import MAX_RETRY_SLOTS, RETRY_GRACE_S, RetrySlots
from calculet.runtime.scheduling.on_time_spare import at_risk_prefix, near_deadline, slack_ratio, spare_harmless
from calculet.runtime.scheduling.overtaking import Overtaking
from calculet.runtime.scheduling.registry import WAITING_STATES, RequestRecord
from calculet.runtime.scheduling.wfq_order import QueuedRequest, admission_ranks

REPLAN_DRIFT = 0.10
"""Replan when the measured step time moved by more than this fraction since the last plan."""
REPLAN_DRIFT_INTERVAL_S = 0.05
"""... at most once in this many seconds (issue #20). Events (an admission, an end, a reset) still replan at
the next step. A step measured on the host's clock jitters with the host's load: on the null device at 16
streams it swung between 0.2 and 10 ms (GIL waits included), so the 10 % rule replanned at two steps in
three (22 % of the engine's CPU) for estimates that were noise; a plan at most 50 ms older than the
latest smoothed step changes no finish estimate by more than the drift it would correct."""
_NOT_QUEUED = 1 << 62
"""The queue age given to a waiting request not in the §5.3 queue yet (the candidate): after every entry."""
PROMPT_SMOOTHING = 1 / 8
"""Weight of the newest admitted prompt in the typical prompt length (as the timers smooth)."""


@dataclass(frozen=True)
class OnTimeStatistics:
    """§16-style counters of the ``on_time`` policy."""

    replans: int
    unfit: int
    """Requests refused at admission (429) because they could not finish by their deadline."""
    ttft_refused: int
    """Requests refused (429) because they would wait past their TTFT target."""
    shed_waiting: int
    """Accepted requests rejected (429) while still waiting, by the overload selection."""
    shed_admitted: int
    """Admitted requests ended early (DEADLINE) by the overload selection."""
    at_risk: int
    decode_cap: int | None
    estimate: EstimateErrorStatistics | None = None
    """The finish estimate's measured error and the admission margin it sets."""
    bets: int = 0
    """Requests the estimate refused that were admitted as lane-free bets (:func:`.on_time_refusal.lane_free_bet`)."""
    bets_missed: int = 0
    """Of those ended, the ones that missed their deadline (not scored by the margin: counted here)."""
    rollouts: int = 0
    """Admissions whose reported estimate is the decode set's rollout (B>1, :mod:`.on_time_report`)."""
    rollouts_skipped: int = 0
    """B>1 admissions that kept the planner's estimate: the rollouts allowed since the last device completion were made
    (:data:`.on_time_report.ROLLOUTS_PER_COMPLETION`)."""
    arrivals: ArrivalLawStatistics | None = None
    """The learned law of arrivals the rollout forecasts from (B>1; None: no law, as on B1)."""
    overlap: OverlapStatistics | None = None
    """Ping/pong's measured overlap the rollout plays (:class:`.estimates.OverlapTimer`; None where no rollout runs on two
    engines)."""


@dataclass(frozen=True)
class Replan:
    shed: tuple[RequestRecord, ...]
    at_risk: tuple[RequestRecord, ...]


class OnTimePlanner:
    """Estimates, the overload selection and the latency-SLO cap for the ``on_time`` policy."""

    calm_low, calm_high = -math.inf, 0.0
    """The decode step times at which the last plan stands against drift (:meth:`drifted` False), worked out once
    per plan (:meth:`_calm_band`) rather than per tick: the tick reads them without a call (issue #20). Before
    any plan: none but a step not measured yet (0)."""

    def __init__(self, *, step_times: StepTimer, prefill_times: PrefillTimer, weights: Mapping[str, float],
                 ttft_s: Mapping[str, float | None], itl_s: Mapping[str, float | None],
                 errors: EstimateErrors | None = None, sequences: int | None = None) -> None:
        """``sequences``: the most that may hold KV at once (``admission.max_sequences``); when the
        device decodes them all in one step the admission queue's order binds the estimates
        (:func:`.finish_estimate.admission_order_finish`)."""
        self.step_times = step_times
        self.prefill_times = prefill_times
        self.weights = dict(weights)
        self.ttft_s = dict(ttft_s)
        self.itl_s = dict(itl_s)
        self.any_itl = any(t is not None for t in self.itl_s.values())
        self.any_ttft = any(t is not None for t in self.ttft_s.values())
        self.sequences = sequences
        self.dirty = True
        self.stale = True
        """Work left the kept set since the last plan: the caches may not refuse (they would over-state)."""
        self._planned_step = 0.0
        self._kept = KeptJobs()
        self._cache: _EdfCache | None = None
        self._planned_at = -math.inf
        self._tolerance = 0.0
        """How much slower the step may get before the last plan could decide otherwise (:func:`slack_ratio`
        of its kept and not-at-risk requests; 0: replan on any :data:`REPLAN_DRIFT`)."""
        self._slots: list[float] = []
        """Fair-share finishes of the decoding requests at the last plan (when a stream slot frees)."""
        self._replans = self._unfit = self._ttft_refused = self._shed_waiting = self._shed_admitted = self._at_risk = 0
        self._cap: int | None = None
        self._version = 0
        """Bumped whenever the kept set changes (a replan, an admission): keys the refusal caches."""
        self._refusal: _Refusal | None = None
        self.retry_slots = RetrySlots()
        self.epoch = 0
        """Bumped by every event that may change the admission order of the waiting requests (a replan, a
        request admitted from the queue or ended, a reset: :meth:`changed`); keys :attr:`order_index`."""
        self.order_index = AdmissionOrderIndex()
        self.errors = errors or EstimateErrors()
        """The estimate's measured error, and the margin admission plans with."""
        self._prompt_tokens = 0.0
        """Smoothed prompt length of the requests seen at admission: the prefill the ITL cap leaves room for."""
        self.virtual_start: Callable[[str], float] | None = None
        """A tenant's §5.3 virtual start (``max(tenant virtual time, global virtual time)``), set by the
        policy from the admission queue's clock: the admission-order estimate orders by cost with it."""
        self.head_tag: Callable[[RequestRecord], float | None] = lambda rec: None
        """The virtual finish a waiting request already holds as its flow's head (None: not tagged yet),
        set by the policy from the admission queue: a head keeps its tag (:mod:`.wfq_order`)."""
        self.wfq_cost: Callable[[RequestRecord], float] = lambda rec: rec.cost
        """A request's §5.3 cost, set by the policy: a candidate is estimated before the queue sets ``rec.cost``."""
        self.overtaking = Overtaking(self.weights)  # accepted work per tenant: later arrivals ahead of a waiting one
        self.devices = MeasuredDevice(step_times, prefill_times, self.errors)
        """The device models admission and the plan read, built once per measurement (:mod:`.on_time_device`)."""
        self.best_token_s: Callable[[int], float] = lambda sequences: 0.0
        """The least per-token time ``sequences`` decoding together could see (0: not known), set by the policy from the
        profile set and the step measured per profile: the bound a lane-free bet is judged on (:mod:`.on_time_refusal`)."""
        self.bet_lanes = 0
        """Lanes on which a lane-free bet may be made (0: none: one lane, ping/pong, one profile), set by the policy."""
        self.bets: set[int] = set()
        """Live requests admitted as lane-free bets (:func:`.on_time_refusal.lane_free_bet`): their outcome is not scored."""
        self.bets_made = self._bets_missed = 0
        self.report = ReportedEstimate(lambda: (step_times.samples, prefill_times.samples))  # B>1 (.on_time_report)

    # ------------------------------------------------------------------ the device

    def device(self, compiled_batch: int, engines: int, chunk: int | None) -> DeviceModel | None:
        """The measured device, built now, or None until a decode step has been measured (:mod:`.on_time_device`;
        ``OnTimePolicy.model`` keys it)."""
        return self.devices.device(compiled_batch, engines, chunk)

    def admitting_model(self, model: DeviceModel) -> DeviceModel:
        """:meth:`.MeasuredDevice.admission_model` of ``model`` (slowed by the estimator's measured error), kept while
        it and the margin are (#20: not per ``submit()``)."""
        return self.devices.admitting_model(model)

    def alone_model(self, model: DeviceModel) -> DeviceModel:
        """``model`` serving one request alone: one lane at the fastest decode step measured, no other prefill
        between its steps. Why (issue #13): ``model``'s per-token time is measured under the load (on B16 ~91 ms
        with 13 decoding); alone a request runs in the smallest profile (§8; 42.5 ms on the reference cost).
        "Never" is judged on it (:func:`.on_time_retry.retry_placement`), and so is a candidate the device would
        serve alone (:func:`.on_time_refusal.fit_afresh`). The fastest step: the smoothed step's least value at a
        model built since the device last started afresh (:meth:`restart`: a device reset, a new generation; a
        device serves a lone request first). One that slowed since keeps it: a retry refused again, never a
        "never" that lies; admission's margin slows it with the rest."""
        return self.devices.alone_model(model)

    def admitting_alone(self) -> DeviceModel | None:
        """:meth:`alone_model` of the device :meth:`admitting_model` last built, slowed by the same margin."""
        return self.devices.admitting_alone()

    def restart(self) -> None:
        """The device starts afresh (a device reset, a new generation's profile set): see
        :meth:`.MeasuredDevice.restart`."""
        self.devices.restart()

    def drifted(self, now: float) -> bool:
        """The step time moved enough since the last plan that a new one may decide otherwise (and the plan is
        not recent): slower by more than the plan's :attr:`_tolerance` (someone it kept on time, or left out
        of the at-risk set, could now be late), or by more than :data:`REPLAN_DRIFT` either way when the plan
        has no tolerance to offer. Faster needs no replan: nobody new is late, and admission reads the cache only where
        the drift keeps it safe (:meth:`cache_drift`)."""
        step = self.step_times.decode_step_s
        if step <= 0 or self.calm_low <= step <= self.calm_high:
            return False
        return self._planned_step <= 0 or now - self._planned_at >= REPLAN_DRIFT_INTERVAL_S

    def _calm_band(self) -> None:
        """:attr:`calm_low`, :attr:`calm_high` for the plan just made: a plan that never measured a step stands
        only while none is measured; one with a tolerance stands until the step is slower by more than it (or by
        :data:`REPLAN_DRIFT`); else until the step moves by more than :data:`REPLAN_DRIFT` either way."""
        planned, tolerance = self._planned_step, self._tolerance
        if planned <= 0:
            self.calm_low, self.calm_high = -math.inf, 0.0
        elif tolerance > 0:
            self.calm_low, self.calm_high = -math.inf, planned * (1.0 + max(REPLAN_DRIFT, tolerance))
        else:
            self.calm_low, self.calm_high = planned - REPLAN_DRIFT * planned, planned + REPLAN_DRIFT * planned

    def cache_drift(self) -> int:
        """+1 (-1) when the step is slower (faster) by more than :data:`REPLAN_DRIFT` than at the cached plan,
        else 0. Slower, the cache's lane free times are early: it may not accept (admission replans
        first). Faster, they are late: it may not refuse, and what it accepts fits all the more."""
        step, planned = self.step_times.decode_step_s, self._planned_step
        if step > planned * (1.0 + REPLAN_DRIFT):
            return 1
        return -1 if step < planned * (1.0 - REPLAN_DRIFT) else 0

    def changed(self, ended: bool) -> None:
        """An event changed the admitted set (an admission from the queue, an end, a reset): replan at the
        next tick. ``ended``: work left the set, so the cache may not refuse until then (:attr:`stale`)."""
        self.dirty = True
        self.epoch += 1
        if ended:
            self.stale = True

    def job(self, rec: RequestRecord) -> PendingJob | None:
        return pending_job(rec, self.weights.get(rec.tenant, 1.0))

    # ------------------------------------------------------------------ replanning (events)

    def replan(self, records: Iterable[RequestRecord], now: float, model: DeviceModel | None) -> Replan:
        """Select whom to keep, whom to shed and who is at risk; rebuild the admission cache."""
        self.dirty = self.stale = False
        self.epoch += 1
        if model is None:
            self._kept, self._cache, self._slots = KeptJobs(), None, []
            return Replan((), ())
        self._replans += 1
        self._version += 1
        self._planned_step = self.step_times.decode_step_s  # the measured step, not admission's slowed copy
        live, jobs = planned_jobs(records, self.weights)
        selection = on_time_selection(jobs, now, model)
        spared: frozenset[int] = frozenset()
        if selection.shed:
            spared = frozenset(spare_harmless(jobs, selection.shed, lambda i: live[i].state not in WAITING_STATES,
                                              now, model))
        shed = tuple(live[i] for i in selection.shed if i not in spared)
        if shed or spared:
            kept_ids = set(selection.keep) | spared
            kept = [j for j in jobs if j.id in kept_ids]
        else:  # every job kept (the usual replan): the list itself, no copy (#20)
            kept = jobs
        self._kept = KeptJobs(kept)
        self._cache = _EdfCache.deferred(kept, now, self.devices.admission_model(model), spared)
        self._planned_at = now
        if self.any_ttft:  # the slots are read by ttft_refusal alone: no TTFT target, none built (#20)
            decoding = [j for j in kept if live[j.id].state in DECODING_STATES]
            self._slots = sorted(fair_share_finish(decoding, now, model).values())
        prefix, slack = at_risk_prefix(kept, now, model)
        risky = [live[i] for i in dict.fromkeys([*prefix, *near_deadline(kept, selection.finish, now)])]
        if spared or self.any_ttft:
            self._tolerance = 0.0  # spared jobs and TTFT slots: replan on any 10 % drift, as before
        else:
            self._tolerance = min(slack, slack_ratio(selection.finish, kept, now))
        self._calm_band()
        fresh = tuple(rec for rec in risky if not rec.at_risk)
        for rec in fresh:
            rec.at_risk = True
        self._at_risk += len(fresh)
        return Replan(shed, fresh)

    def shed_counted(self, waiting: bool) -> None:
        if waiting:
            self._shed_waiting += 1
        else:
            self._shed_admitted += 1

    # ------------------------------------------------------------------ admission (§5.2)

    def admit(self, rec: RequestRecord, now: float, model: DeviceModel | None,
              records: Callable[[], Iterable[RequestRecord]]) -> Fit:
        """Would ``rec`` finish on time with every kept request? Sets ``rec.estimated_finish`` if so.

        ``model``: the device as measured now (:meth:`.OnTimePolicy.model`, rebuilt at each step measured), so
        its step is the step timer's. ``records`` lists the live requests; it is called only on the slow path.
        Once per ``submit()`` (#20): :meth:`admitting_model` and :meth:`cache_drift` are read without their calls
        while their inputs hold, and a job placed at the cache's tail is kept as its values (:mod:`.on_time_kept`)."""
        if self.any_itl:  # the typical prompt is read by the ITL cap alone (decode_cap): else not kept (#20)
            smoothed = self._prompt_tokens  # the first prompt seen sets it
            self._prompt_tokens = smoothed + (PROMPT_SMOOTHING if smoothed else 1.0) * (rec.prompt_tokens - smoothed)
        if model is None:
            return Fit(True, None, None)
        values = job_values(rec, self.weights.get(rec.tenant, 1.0))
        if values is None:
            return Fit(True, None, None)
        nominal, margin = model, self.errors.margin
        devices = self.devices
        model = devices.admitting if (model is devices.admitting_of and devices.admitting is not None
                                      and margin == devices.admitting_margin) else devices.admitting_model(model)
        cache = self._cache  # None if cache_drift() > 0: the step slower than at the plan, lane free times early
        if cache is not None and nominal.decode_step_s > self._planned_step * (1.0 + REPLAN_DRIFT):
            cache = None
        finish = cache.built().place(values[1], values[2], values[3], now, model) if cache is not None else None
        lanes, sequences = nominal.compiled_batch * nominal.engines, self.sequences
        in_order = sequences is not None and sequences <= lanes  # the queue's order binds the estimate (below)
        job: PendingJob | None = None
        if finish is None:
            job = PendingJob.trusted(*values)
            fit = fit_afresh(self, rec, job, cache, now, model, records)
            if not fit.ok:
                return fit
            finish = fit.finish
        elif in_order:  # the order's index reads the candidate's job in the kept list
            job = PendingJob.trusted(*values)
            self._kept.jobs().append(job)
        else:
            self._kept.admitted(values)
        self._version += 1
        cost = service = 0.0
        if in_order:  # the rates feed the queue-order estimate only (_overtaken): else no call per submit (#20)
            # its §5.3 cost and service, read once for the rates, index, overtaking and start (#20: were three each)
            cost, service = self.wfq_cost(rec), nominal.service_s(values[1], values[2])
            self.overtaking.accepted(rec.tenant, cost, service, now)
        if self.retry_slots:  # a refused client's slot it may take (none held: no call per submit, #20; len is O(1))
            self.retry_slots.admitted(rec.tenant, now)
        start: float | None = None
        if finish is not None:  # the expected finish: the margin's slowdown taken back out
            finish = now + (finish - now) / (1.0 + margin)
            if in_order:  # only where every sequence is in each step: else no call
                assert job is not None
                estimate = self._admission_order_estimate(rec, job, now, nominal, records, cost)
                if estimate is not None:  # it waits: its expected admission, the queue-order finish less its service
                    finish = estimate + _overtaken(self, rec, job, now, nominal, estimate, cost, service)
                    start = finish - service
        rec.estimated_finish = finish
        if finish is not None and self.report.arrivals is not None:  # B>1: the rollout's reported (.on_time_report)
            self.report.admitted(rec, now, finish, records, start)
        self.dirty = True
        return Fit(True, None, finish)

    def decode_order_binds(self, lanes: int) -> bool:
        """Whether the kept requests decode by deadline (the plan's order, §7.2 item 2) rather than in
        fair rotation: when more sequences may hold KV than ``lanes`` decodes per step, who finishes
        when is decided by the decode order, and serving it by deadline is what makes the EDF plan's
        estimates hold (B1: issue #13 measured the P90 error 35-60 % -> 5-10 %, on-time counts equal).
        Not with an ITL target (the capped set rotates: the cap is sized for a rotation), and not
        when every sequence fits one step (B16 with 16 sequences): there the admission queue's order
        binds (:meth:`_admission_order_estimate`), and issue #13 measured deadline-first decoding,
        whose batches §8 sizes by the ready count, leaving 1.7-3.5 % of admitted requests late at
        2-4× load where rotation left 0.8-1.2 %."""
        return not self.any_itl and (self.sequences is None or self.sequences > lanes)

    def _admission_order_estimate(self, rec: RequestRecord, job: PendingJob, now: float, model: DeviceModel,
                                  records: Callable[[], Iterable[RequestRecord]], cost: float | None = None
                                  ) -> float | None:
        """``rec``'s expected finish in the admission queue's order, or None where that order does not
        bind (more sequences than the device decodes per step: then the decode order, by deadline,
        does) or nobody waits. Admission still decides by the EDF plan (feasibility); this is the
        estimate reported and scored. Only for an accepted request with requests waiting for
        admission: from the order kept since the last submit (:mod:`.on_time_order`, #20) while nothing else
        moved, else :meth:`admission_order_afresh`. ``cost``: ``rec``'s §5.3 cost if the caller has read it
        (None: read here); per weight, its :meth:`order_cost` (``job.weight`` is its tenant's)."""
        if self.sequences is None or self.sequences > model.lanes:
            return None
        start = self.virtual_start
        if start is not None:
            own = self.order_cost(rec) if cost is None else cost / job.weight
            kept = self.order_index.estimate(rec, job, now, model, self._kept.jobs(), self.epoch, start(rec.tenant),
                                             self.order_cost, self.head_tag, own)
            if kept is not None:
                return kept
        return self.admission_order_afresh(rec, job, now, model, records, seed=True)

    def admission_order_afresh(self, rec: RequestRecord, job: PendingJob, now: float, model: DeviceModel,
                               records: Callable[[], Iterable[RequestRecord]], seed: bool = False) -> float | None:
        """The admission-order estimate from the live requests, O(live requests): the index's reference.
        ``seed``: start an index at ``rec`` (:meth:`.AdmissionOrderIndex.seed`)."""
        kept = {j.id: j for j in self._kept.jobs()}
        waiting = sorted((r for r in records() if r.state in WAITING_STATES and r is not rec
                          and r.request_id in kept), key=lambda r: r.arrival)
        if not waiting:
            return None
        queued: dict[str, list[PendingJob]] = {}
        for r in waiting:
            queued.setdefault(r.tenant, []).append(kept.pop(r.request_id))
        kept.pop(job.id, None)
        admitted: dict[int, float] = {}
        tags = None if self.virtual_start is None else virtual_tags(self, [*waiting, rec], admitted)
        if seed and tags is not None:
            assert self.virtual_start is not None
            self.order_index.seed(rec, job, model, self._kept.jobs(), waiting, admitted, self.epoch,
                                  self.virtual_start(rec.tenant), self.order_cost)
        return admission_order_finish(job, rec.tenant, list(kept.values()), queued, self.weights, now, model,
                                      tags=tags)

    def order_cost(self, rec: RequestRecord) -> float:
        """``rec``'s §5.3 cost per weight, as the admission order's replay and index tag it."""
        return self.wfq_cost(rec) / self.weights.get(rec.tenant, 1.0)

    def ended(self, rec: RequestRecord, now: float) -> None:
        """``rec`` reached its outcome: score the estimate it was admitted with (a bet's is not: admitted against it)."""
        estimate = self.report.ended(rec)  # the planner's own (the rollout's may be reported), the law told
        if estimate is None:
            return
        reason = rec.machine.finish_reason
        if self.bets and rec.request_id in self.bets:  # counted apart, not scored
            self.bets.discard(rec.request_id)
            late = reason not in (FinishReason.STOP, FinishReason.LENGTH) or (rec.deadline is not None and now > rec.deadline)
            self._bets_missed += late
            return
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.errors.finished(rec.arrival, estimate, rec.deadline, now)
        elif reason == FinishReason.DEADLINE:
            self.errors.missed()

    def refusal_cache(self) -> _EdfCache | None:
        """The admission cache when a refusal may be read from it, else None: none built, stale, the step faster
        than at the plan (its lanes free late), or a lane free where a refused candidate may be a bet. The one rule
        :func:`.on_time_refusal.fast_refusal` and the HTTP front's admission snapshot
        (:func:`calculet.runtime.engine.admission_snapshot.take_snapshot`) share."""
        cache = self._cache
        if cache is None or self.stale or self.cache_drift() < 0 or len(self._kept) < self.bet_lanes:
            return None  # with a lane free a refusal may still be a bet (.on_time_refusal.lane_free_bet): no shortcut
        return cache.built()

    @property
    def kept_count(self) -> int:
        """Requests the last plan keeps (admitted and on time), with those admitted since."""
        return len(self._kept)

    def keeps(self, request_id: int) -> bool:
        """Whether the request's work is in the kept set (O(kept): read when a request ends)."""
        return self._kept.holds(request_id)

    def ttft_refusal(self, rec: RequestRecord, now: float, waiting_ahead: int) -> float | None:
        """When ``rec`` could start within its TTFT target (None: it can, or no estimate) — else the
        instant a stream slot is expected to free for it (its Retry-After)."""
        target = self.ttft_s.get(rec.tenant)
        cap = self._cap
        if target is None or cap is None or not self._slots:
            return None
        slots = self._slots
        free_now = max(0, cap - len(slots))
        ahead = waiting_ahead - free_now
        if ahead < 0:
            return None
        if ahead >= len(slots):
            return None  # further out than one generation of streams: the wait timer decides
        start = slots[ahead]
        if start <= rec.arrival + target:
            return None
        self._ttft_refused += 1
        return start

    def ttft_deadline(self, rec: RequestRecord) -> float | None:
        target = self.ttft_s.get(rec.tenant)
        return None if target is None else rec.arrival + target

    # ------------------------------------------------------------------ ITL cap (latency SLO)

    def decode_cap(self, model: DeviceModel | None, lanes: int, tenants: Iterable[str]) -> int | None:
        """How many streams may hold a sequence: the smallest ITL target among ``tenants``."""
        if not self.any_itl:
            return None
        targets = [t for name in tenants if (t := self.itl_s.get(name)) is not None]
        if not targets:
            return None
        if model is None or not self.prefill_times.samples:
            # one rotation's worth until both the step and a prefill are measured: a cap sized with no
            # room for the newcomers' prefills admits a stream too many, and the streams it admits keep
            # their sequences (issue #13: 4 where 3 fit, a worst stream ITL P99 of 217 ms under 200 ms)
            self._cap = lanes
            return lanes
        prefill = model.prefill_s(round(self._prompt_tokens))
        self._cap = max(1, model.max_streams_for_itl(min(targets), prefill))
        return self._cap

    def statistics(self) -> OnTimeStatistics:
        return OnTimeStatistics(self._replans, self._unfit, self._ttft_refused, self._shed_waiting,
                                 self._shed_admitted, self._at_risk, self._cap, self.errors.statistics(), self.bets_made,
                                 self._bets_missed, self.report.rolled, self.report.skipped,
                                 self.report.law_statistics(),
                                 None if self.step_times.overlap is None else self.step_times.overlap.statistics())


def virtual_tags(planner: OnTimePlanner, waiting: Iterable[RequestRecord],
                 admitted: dict[int, float] | None = None) -> dict[int, float]:
    """The rank each of ``waiting`` (in arrival order, the candidate last) is expected to be admitted at by the §5.3
    queue (R5.3.2, R5.3.3): its own rule replayed (:func:`.wfq_order.admission_ranks`) with ``planner``'s costs and
    head tags. Arrivals still to come are not known: one tagged before a request ranked here is the estimate's
    error."""
    start = planner.virtual_start
    assert start is not None
    queued = []
    for k, r in enumerate(waiting):
        entry = r.entry
        seq = entry[1] if entry is not None and len(entry) == 3 and entry[2] is r else _NOT_QUEUED + k
        queued.append(QueuedRequest(r.request_id, (r.tenant, r.prefill_class == "long"), seq,
                                    planner.order_cost(r), planner.head_tag(r)))
    ranks = admission_ranks(queued, start(queued[-1].flow[0]) if queued else 0.0, admitted)
    return {i: float(rank) for i, rank in ranks.items()}


def _overtaken(planner: OnTimePlanner, rec: RequestRecord, job: PendingJob, now: float, model: DeviceModel,
               finish: float, cost: float, service: float) -> float:
    """How much later than its queue-order ``finish`` a waiting candidate is expected to finish, overtaken by
    later arrivals of other tenants (:mod:`.overtaking`), their work in their own lane seconds spread over the
    lanes (issue #13 session 11: on every lane count; the measurements are in the module's docstring).
    ``cost``: its §5.3 cost; ``service``: ``model.service_s`` of its job (both read once by the caller)."""
    tags = planner.order_index.order_tags()  # the index holds the candidate's tag after either path seeded it
    start = planner.virtual_start
    if tags is None or start is None or job.deadline is None or cost <= 0:
        return 0.0
    tag, last = tags
    return planner.overtaking.delay(rec.tenant, tag, finish - now - service, model.lanes,
                                    job.deadline - finish, now, last, start)

