"""The ``on_time`` deadline order wired into the scheduler: what each decision *does* (issue #13).

Why this module exists: :mod:`.on_time_planner` decides from estimates; this applies the decisions to
the request machines without new states or events (the declarations in ``calculet/machines``
and their proofs are unchanged):

* a request refused at submit, or shed while it still waits (WaitingModel/WaitingAdmission),
  ends with the machine's ``reject`` — 429, FinishReason.REJECTED, counted as §5.2
  no-prospect — with ``Retry-After`` from the same estimate;
* an admitted request shed before or between its device jobs ends with ``expire`` at once
  (FinishReason.DEADLINE: it cannot make its deadline, and it holds no device time any more);
  one whose job is on the device gets the deadline flag and ends when that job drains;
* a request still waiting at its TTFT target (latency SLO) is refused the same way as a
  waiting request that is shed;
* under an ITL target a prefill runs only when every decoding stream still gets its next token
  within its target (:meth:`OnTimePolicy.prefill_fits_itl`, the prefill scheduler's gate): the cap
  leaves room for one prefill per rotation, and this keeps it to one — issue #13 measured the worst
  stream's ITL P99 at 209-217 ms under 200 ms when two streams ended within one rotation and both
  newcomers were prefilled in it.

The scheduler calls :meth:`OnTimePolicy.tick` once per ``step()``; replanning happens there
only when an event marked the plan dirty (see :mod:`.on_time_planner`).
"""

from __future__ import annotations

import heapq
import math
from functools import partial
from typing import Callable, Iterable

from calculet.config import SchedulerConfig
from calculet.runtime.scheduling.admission import AdmissionController, AdmissionOutcome
from calculet.runtime.scheduling.apply import end_for_deadline
from calculet.runtime.scheduling.arrival_law import ArrivalLaw
from calculet.runtime.scheduling.decode import DecodeScheduler
from calculet.runtime.scheduling.decode_rollout import DeviceShape, Present, measured_steps, rollout_finish
from calculet.runtime.scheduling.estimate_error import EstimateErrors
from calculet.runtime.scheduling.estimates import OverlapTimer, PrefillTimer, StepTimer
from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S, DeviceModel
from calculet.runtime.scheduling.on_time_kept import DECODING_STATES
from calculet.runtime.scheduling.on_time_planner import OnTimePlanner, OnTimeStatistics, virtual_tags
from calculet.runtime.scheduling.prefill import PrefillScheduler
from calculet.runtime.scheduling.profiles import ProfileSet
from calculet.runtime.scheduling.registry import PREFILL_STATES, WAITING_STATES, RequestRecord, RequestRegistry


def _targets_s(config: SchedulerConfig, field: str) -> dict[str, float | None]:
    default = getattr(config.admission, field)
    result: dict[str, float | None] = {}
    for tenant in config.tenants:
        ms = getattr(tenant, field)
        ms = default if ms is None else ms
        result[tenant.name] = None if ms is None else ms / 1000
    return result


class OnTimePolicy:
    """Admission, shedding, at-risk ordering and the ITL cap of ``batch.deadline_order: on_time``."""

    def __init__(self, config: SchedulerConfig, *, registry: RequestRegistry, admission: AdmissionController,
                 decode: DecodeScheduler, prefill: PrefillScheduler, step_times: StepTimer,
                 prefill_times: PrefillTimer, engines: Callable[[], int],
                 profiles: Callable[[], ProfileSet | None],
                 prefilled: Callable[[RequestRecord], int] | None = None) -> None:
        """``prefilled(rec)``: the prompt tokens a lane holder already has in KV (its lane's committed length; the
        scheduler's KV lanes answer it): a chunked prompt's progress, which the rollout's present carries (session
        22, E22c). None: none known (every prompt rolled out whole)."""
        self.registry = registry
        self._prefilled = prefilled
        self.admission = admission
        self.decode = decode
        self.prefill = prefill
        self._engines = engines
        self._profiles = profiles
        self.planner = OnTimePlanner(step_times=step_times, prefill_times=prefill_times,
                                      weights={t.name: float(t.weight) for t in config.tenants},
                                      ttft_s=_targets_s(config, "ttft_target_ms"),
                                      itl_s=_targets_s(config, "itl_target_ms"),
                                      errors=EstimateErrors(config.admission.miss_target,
                                                            config.admission.initial_margin),
                                      sequences=config.admission.max_sequences)
        self._ttft_due: list[tuple[float, int]] = []
        self._queues = config.queues
        self._wrr = tuple(config.queues.wrr_weights().items())  # §6's WRR as the rollout interleaves prefills
        self._long_quota = config.admission.long_prefill_quota.max_admitted  # R6.11, as the rollout admits (s. 22)
        wfq = admission.wfq
        # max(tenant virtual time, global virtual time) is wfq.tag(tenant, 0) in the queue's scaled integers; an
        # int / int division is correctly rounded, so these are float(Fraction(...)) without the Fractions (#20)
        self.planner.virtual_start = lambda tenant: wfq.tag(tenant, 0) / wfq.scale
        # the queue's own view of a waiting request for the admission-order estimate (#13, .wfq_order): a flow
        # head's fixed tag, and the cost of a candidate the queue has not costed yet
        self.planner.head_tag = lambda rec: (None if (e := rec.entry) is None or len(e) != 3 or e[0] is None
                                             or e[2] is not rec else e[0] / wfq.scale)
        self.planner.wfq_cost = lambda rec: rec.cost or wfq.cost(rec.prompt_tokens, rec.machine.max_new_tokens)
        step_times.holding = admission  # its active count, the KV slots held: the lanes' handover (estimates.py)
        self.planner.best_token_s = self._best_token_s
        if self.planner.any_itl:
            prefill.gate = self.prefill_fits_itl
        self.cap_reader: Callable[[], int | None] | None = self.decode_cap if self.planner.any_itl else None
        """:meth:`decode_cap`, or None where no tenant has an ITL target (``any_itl`` is fixed by the configuration): the
        admission pass then reads no cap, without a call (#20: a queued ``submit()`` asked twice for the None)."""

    _shape_of: ProfileSet | None = None
    """The profile set :attr:`_shape` was read from (a ``ProfileSet`` is fixed at construction)."""
    _shape: tuple[int, int | None] = (1, None)
    """Its largest compiled batch and prefill chunk: read once per profile set, not per ``submit()`` (#20)."""
    _model_key: tuple[object, ...] | None = None
    """The profile set, engines and both timers' sample counts :attr:`_model` was read for: a ``submit()`` with
    them unchanged takes the model without a call to the planner (#20)."""
    _model: DeviceModel | None = None

    def model(self) -> DeviceModel | None:
        """The measured device (None until a decode step is measured): built (:meth:`.OnTimePlanner.device`) only
        when a timer measured something or the profile set or the engines changed — the one key of it (#20)."""
        profiles = self._profiles()
        if profiles is None:
            return None
        planner = self.planner
        key = (profiles, self._engines(), planner.step_times.samples, planner.prefill_times.samples)
        if key == self._model_key:  # nothing the model is built from changed: the same model (#20)
            return self._model
        if profiles is not self._shape_of:
            if self._shape_of is not None:  # a new generation's profile set: the device starts afresh
                planner.restart()
            self._shape_of = profiles
            self._shape = (profiles.largest.compiled_batch, profiles.prefill_chunk_tokens)
            if self._shape[0] > 1 and planner.report.arrivals is None:
                # B>1: the law of arrivals the reported estimate's rollout forecasts from, learned from the submits
                # from now on (:mod:`.arrival_law`; told at :meth:`screen` and on each end). B1: no law, no cost.
                planner.report.arrivals = ArrivalLaw()
        batch, chunk = self._shape
        self._model = model = planner.device(batch, key[1], chunk)
        # a lane-free bet (.on_time_refusal) needs lanes of their own (not one lane; not ping/pong, whose steps overlap)
        # and a §8 choice of profiles: with one profile its best case is the step the window already measures
        bets = model is not None and model.lanes > 1 and model.engines == 1 and not profiles.fixed
        planner.bet_lanes = model.lanes if bets and model is not None else 0
        rollout = model is not None and model.compiled_batch > 1  # B>1 (not B1 ping/pong): the rollout reports (#13 s. 20)
        if rollout and model is not None:
            planner.step_times.measure_per_batch()  # the rollout's steps, and a bet's bound (bets are on B>1 only)
            if model.engines > 1 and planner.step_times.overlap is None:  # ping/pong: the rollout plays the overlap
                planner.step_times.overlap = OverlapTimer()
            self._rollout_shape = (profiles, model.engines, planner.sequences or model.lanes)
        planner.report.rollout = self._rollout_finish if rollout else None
        self._model_key = key
        return model

    _rollout_shape: tuple[ProfileSet, int, int] | None = None
    """The profile set, engines and KV lanes the rollout's :class:`.DeviceShape` is built from (:meth:`model`)."""

    def _rollout_finish(self, rec: RequestRecord, now: float, records: Callable[[], Iterable[RequestRecord]],
                        start: float | None = None) -> float | None:
        """``rec``'s finish by the decode set's rollout (:func:`.decode_rollout.rollout_finish`) from the live
        requests and the law of arrivals: the estimate reported on B>1 (issue #13 session 20). Reads the measured
        step per compiled batch (``StepTimer.step_at``; the long-window step where a batch is not measured yet) and
        the measured prefill cost; decides nothing. ``start``: where ``rec`` waits, its admission expected by the
        queue-order estimate: the finish is then the mean of the rollout joining there and of the rollout replaying
        the queue in the §5.3 order with later arrivals at its tail. The two bracket the wait: the replay misses the
        later arrivals the queue puts ahead (early), the start carries the long-window lane schedule's wait (late
        at light load); their mean took bursty b8 25.6 -> 20.3 %, b4 21.5 -> 16.6, steady b4 22.8 -> 18.6 with the
        learned law, no row worse (docs/estimator.md, session 20)."""
        shape_of = self._rollout_shape
        if shape_of is None:
            return None
        profiles, engines, lanes = shape_of
        planner = self.planner
        timer = planner.step_times
        fallback = timer.decode_step_s
        fixed, per_token = planner.prefill_times.cost()
        queues = self._queues
        by_ready = profiles.by_ready
        overlap = timer.overlap
        rate = 0.0 if overlap is None else overlap.rate
        if rate > 0 and overlap is not None:
            # ping/pong as the device runs it (session 22): a job's own time, the later of two slowed to the measured
            # rate while the earlier runs; own steps per compiled batch on one engine's line (§13.1)
            measured, affine = overlap.solo_steps(), True
            if overlap.prefill.samples:
                fixed, per_token = overlap.prefill.cost()
        else:
            keys = self._shape[0] * engines  # the largest key the step timer can see (the largest §8 profile's batch)
            measured = {k: v for k in range(1, keys + 1) if (v := timer.step_at(k)) > 0}
            affine, rate = engines == 1, 0.0
        shape = DeviceShape(lanes=lanes, engines=engines, profile_of=lambda n: by_ready[max(1, n)].compiled_batch,
                            step_s=measured_steps(measured, fallback, affine=affine),
                            prefill_s=lambda tokens: fixed + per_token * tokens,
                            chunk_tokens=profiles.prefill_chunk_tokens, short_max_tokens=queues.short_prefill_max_tokens,
                            medium_max_tokens=queues.medium_prefill_max_tokens, wrr=self._wrr,
                            overlap=rate if rate > 0 else None, long_admitted=self._long_quota)
        present = present_of(records(), rec, partial(virtual_tags, planner) if planner.virtual_start else None,
                             self._prefilled if profiles.prefill_chunk_tokens is not None else None)
        report = planner.report
        law, prompt, output = report.arrivals, rec.prompt_tokens, rec.machine.max_new_tokens
        lengths = None if law is None else law.lengths()  # the mean path's lengths: the sample's quantiles (s. 21)
        replayed = rollout_finish(present, prompt, output, now, shape, law, lengths=lengths)
        if start is None or replayed is None:
            return replayed
        joined = rollout_finish(present, prompt, output, now, shape, law, not_before=start, lengths=lengths)
        return replayed if joined is None else (replayed + joined) / 2

    def _best_token_s(self, sequences: int) -> float:
        """The least per-token time ``sequences`` decoding together could see (0: not known): the measured step of the
        §8 profile they select (``ProfileSet.by_ready``), times their rotation when they outnumber its batch — no
        prefill between steps, nobody joining. A lane-free bet is judged on it (:func:`.on_time_refusal.lane_free_bet`)."""
        profiles = self._profiles()
        if profiles is None:
            return 0.0
        batch = profiles.by_ready[sequences].compiled_batch
        return self.planner.step_times.step_at(batch) * max(1.0, sequences / batch)

    def lanes(self) -> int:
        profiles = self._profiles()
        batch = 1 if profiles is None else profiles.largest.compiled_batch
        return batch * self._engines()

    # ------------------------------------------------------------------ admission (§5.2)

    def screen(self, rec: RequestRecord, now: float) -> AdmissionOutcome | None:
        """The 429 of a request that cannot finish on time or would wait past its TTFT target."""
        planner = self.planner
        model = self.model()
        report = planner.report
        if report.arrivals is not None:  # the law learns from every submit screened (B>1 only: none on B1, no call there)
            report.arrived(now, rec.prompt_tokens, rec.machine.max_new_tokens)
        ttft = planner.ttft_s.get(rec.tenant) is not None  # a tenant with no TTFT target: neither TTFT test applies
        if ttft:
            ready = planner.ttft_refusal(rec, now, self.admission.waiting)
            if ready is not None:
                return self.admission.reject_unfit(
                    "no prospect of service within the time-to-first-token target: a stream slot is "
                    f"expected to free at {ready - now:.1f} s", _retry(ready, now))
        fit = planner.admit(rec, now, model, self.registry.live)
        if fit.ok:
            due = planner.ttft_deadline(rec) if ttft else None
            if due is not None:
                heapq.heappush(self._ttft_due, (due, rec.request_id))
            return None
        when = "never on this device" if fit.retry_at is None else f"in {fit.retry_at - now:.1f} s"
        return self.admission.reject_unfit(
            "no prospect of service before the deadline: with the work already admitted the "
            f"shared-device estimate finishes it late (it would fit {when})", _retry(fit.retry_at, now))

    def decode_cap(self) -> int | None:
        """Streams that may hold a sequence under the ITL targets of the tenants present (None: no cap)."""
        if not self.planner.any_itl:
            return None
        return self.planner.decode_cap(self.model(), self.lanes(), self.admission.tenants_present())

    def prefill_fits_itl(self, head: RequestRecord, tokens: int, now: float) -> bool:
        """May a prefill job of ``tokens`` run now without a decoding stream missing its ITL target?

        A prefill runs between two decode steps; every stream ready in the rotation waits for it,
        and for the newcomer it makes: a stream entering decode takes the decode virtual time as
        its tag, ahead of the streams already served in this round (counted first here, the
        conservative place). The stream ``k``-th in the rotation (the decode heap's order: its
        entry's key) then gets its next token ``prefill + ((k + 1) // lanes + 1)`` step periods
        from now, and last got one when it entered Ready (``ready_since``): held if that gap passes
        the stream's tenant's target.
        Held, it waits until the streams that waited for the previous prefill have had their token
        (about one rotation), or, for a prompt longer than the cap's typical one
        (:meth:`decode_cap`), until streams end and the rotation shrinks enough — at worst until no
        stream decodes, for a prefill that alone breaks the target. The wait always ends: while a
        head is held every prefill class is (:meth:`.PrefillScheduler.eligible`), so no stream
        enters the rotation, and the streams in it finish. The device keeps decoding meanwhile (on
        B1 a smaller rotation serves as many tokens per second).
        With no measured step, no stream or no target among the streams, nothing is held."""
        if not self.decode.total_ready():
            return True
        model = self.model()
        if model is None:
            return True
        targets = self.planner.itl_s
        ready = self.decode.ready_records()
        ready.sort(key=_rotation_key)
        step = max(model.decode_step_s, model.step_period_s)
        stall = model.prefill_s(tokens)
        lanes = model.lanes
        start = now + stall
        for k, rec in enumerate(ready):
            target = targets.get(rec.tenant)
            if target is not None and start + ((k + 1) // lanes + 1) * step - rec.ready_since > target + ON_TIME_EPS_S:
                return False
        return True

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float) -> None:
        """Refuse waiting requests past their TTFT target; replan on events; apply the plan."""
        due = self._ttft_due
        while due and due[0][0] <= now:
            _, request_id = heapq.heappop(due)
            rec = self.registry.get(request_id)
            if rec is not None and rec.state in WAITING_STATES:
                self._refuse_waiting(rec, "waited past its time-to-first-token target")
        planner = self.planner
        if not planner.dirty and (planner.calm_low <= planner.step_times.decode_step_s <= planner.calm_high
                                  or not planner.drifted(now)):  # the plan's calm band read without a call (#20)
            return
        model = self.model()
        if model is None:  # no measured step yet: nothing to estimate, nothing to shed
            return
        self.decode.order_by_deadline(planner.decode_order_binds(model.lanes))
        plan = planner.replan(self.registry.live(), now, model)
        for rec in plan.shed:
            self._shed(rec)
        for rec in plan.at_risk:
            self.decode.prioritise(rec)
            self.prefill.prioritise(rec)

    def transition(self, rec: RequestRecord, target: str, ends: bool, now: float) -> None:
        """``rec`` moved to ``target``; ``ends``: this is its first step into an ended state (its outcome)."""
        if target == "prefill_ready" or ends:
            # work leaves the kept schedule only if it was in it: a request refused at submit (or shed earlier)
            # never was, and marking the cache stale for it sent every later refusal of a burst down the slow
            # path (a replan each: issue #13, time to 429)
            self.planner.changed(ends and self.planner.keeps(rec.request_id))  # mark()
        if ends:
            self.planner.ended(rec, now)

    def mark(self, ended: bool = True) -> None:
        """A device reset ended every job (``Scheduler.device_reset``, its one caller): the admitted set changed,
        replan at the next tick; ``ended``: work left the set, so the cached schedule over-states what is ahead
        of a candidate and may not refuse one until the next plan. The device starts afresh: the fastest step
        measured before the reset no longer stands for it (:meth:`.OnTimePlanner.restart`)."""
        self.planner.restart()
        self.planner.changed(ended)

    def _shed(self, rec: RequestRecord) -> None:
        if rec.state in WAITING_STATES:
            self._refuse_waiting(rec, "shed under overload: the most requests that can finish on time were kept")
            return
        self.planner.shed_counted(waiting=False)
        if not rec.detail:
            rec.detail = "shed under overload: it could no longer finish by its deadline"
        end_for_deadline(self.registry, self.prefill, rec)

    def _refuse_waiting(self, rec: RequestRecord, why: str) -> None:
        self.planner.shed_counted(waiting=True)
        self.admission.shed_waiting()
        self.registry.reject(rec, 429, f"no prospect of service before the deadline: {why}")

    def statistics(self) -> OnTimeStatistics:
        return self.planner.statistics()


def present_of(records: Iterable[RequestRecord], candidate: RequestRecord,
               ranks: Callable[[list[RequestRecord]], dict[int, float]] | None = None,
               prefilled: Callable[[RequestRecord], int] | None = None) -> Present:
    """The engine's present as the rollout reads it (:class:`.decode_rollout.Present`): decoding sequences' remaining
    tokens, lane holders still to prefill (in arrival order) and requests waiting for a lane, ``candidate`` left out.
    ``ranks`` (the planner's :func:`.on_time_planner.virtual_tags`): the waiting requests, the candidate last, ranked
    by the §5.3 queue's own rule; the waiting are then in that order and the candidate at its place (else in
    arrival order, the candidate after them). ``prefilled``: a lane holder's prompt tokens already in KV (a chunked
    prompt's committed chunks, §6), so that only what is left is rolled out (None: none)."""
    decoding: list[int] = []
    prefilling: list[RequestRecord] = []
    waiting: list[RequestRecord] = []
    for rec in records:
        if rec is candidate:
            continue
        state = rec.machine.state
        if state in DECODING_STATES:
            machine = rec.machine
            decoding.append(machine.max_new_tokens - machine.generated_tokens)
        elif state in PREFILL_STATES:
            prefilling.append(rec)
        elif state in WAITING_STATES:
            waiting.append(rec)
    prefilling.sort(key=_by_arrival)
    waiting.sort(key=_by_arrival)
    place = None
    if waiting and ranks is not None:
        rank = ranks([*waiting, candidate])
        waiting.sort(key=lambda r: rank.get(r.request_id, math.inf))
        mine = rank.get(candidate.request_id, math.inf)
        place = sum(1 for r in waiting if rank.get(r.request_id, math.inf) < mine)
    return Present(tuple(decoding), tuple((r.prompt_tokens, r.machine.max_new_tokens) for r in prefilling),
                   tuple((r.prompt_tokens, r.machine.max_new_tokens) for r in waiting), place,
                   () if prefilled is None else tuple(prefilled(r) for r in prefilling))


def _by_arrival(rec: RequestRecord) -> float:
    return rec.arrival


def _rotation_key(rec: RequestRecord) -> tuple[float, int, float, int]:
    """A ready decode entry's place in the rotation: (priority, decode tag, virtual finish, seq), the
    order the decode scheduler's heaps serve (:mod:`.decode`)."""
    entry = rec.entry
    assert entry is not None
    return entry[0], entry[1], entry[2], entry[3]


def _retry(at: float | None, now: float) -> float | None:
    return None if at is None else max(0.0, math.ceil(at - now - 1e-9))
