"""The ``on_time`` planner's slow admission path and its refusals (issue #13, §5.2).

Why this module exists: :meth:`.OnTimePlanner.admit` answers most ``submit()`` calls from its cache; what the
cache cannot place comes here — a refusal the caches can tell without a replan (:func:`fast_refusal`), else
the full check against the kept set (:func:`fit_afresh`) — and every refusal is counted and placed here
(:func:`refuse`): a ``Retry-After`` in the retry slots, or "never" when the request is late even on an idle
device (:func:`.on_time_retry.retry_placement`, the rule the HTTP front's snapshot shares). Moved out of the
planner for the size limits; these read and write the planner's caches as its own methods did.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S, DeviceModel, Fit, PendingJob, fits
from calculet.runtime.scheduling.on_time_cache import _EdfCache, _Refusal
from calculet.runtime.scheduling.on_time_device import MeasuredDevice
from calculet.runtime.scheduling.on_time_kept import KeptJobs
from calculet.runtime.scheduling.on_time_retry import RetrySlots, retry_placement
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["fast_refusal", "fit_afresh", "lane_free_bet", "refuse"]


class OnTimePlanner(Protocol):
    """What these read and write of :class:`.on_time_planner.OnTimePlanner` (typed here: it imports this module)."""

    dirty: bool
    retry_slots: RetrySlots
    _cache: _EdfCache | None
    _kept: KeptJobs
    _refusal: _Refusal | None
    _version: int
    _unfit: int
    _planned_at: float
    bets: set[int]
    bets_made: int
    bet_lanes: int
    devices: MeasuredDevice
    best_token_s: Callable[[int], float]

    @property
    def kept_count(self) -> int: ...
    def refusal_cache(self) -> _EdfCache | None: ...
    def admitting_alone(self) -> DeviceModel | None: ...
    def replan(self, records: Iterable[RequestRecord], now: float, model: DeviceModel | None) -> object: ...


def fast_refusal(planner: OnTimePlanner, job: PendingJob, now: float, model: DeviceModel) -> Fit | None:
    """The refusal of ``job`` without a replan, when the caches can tell (None: they cannot). Nothing kept: none
    (the device would serve it alone, :func:`fit_afresh` judges it so)."""
    cache = planner.refusal_cache()
    if cache is None or job.deadline is None or not planner.kept_count:
        return None
    late = cache.tail_finish(job, now, model)
    if late is not None and late > job.deadline + ON_TIME_EPS_S:
        return Fit(False, now, None)  # behind every kept job: the retry slots place it (or "never": refuse)
    last = planner._refusal
    if last is not None and last.covers(job, planner._version, model):
        return Fit(False, last.retry_at, None)
    return None


def refuse(planner: OnTimePlanner, rec: RequestRecord, job: PendingJob, fit: Fit, now: float,
           model: DeviceModel) -> Fit:
    """Count the refusal; place its retry behind the kept work and the earlier refusals' slots, or answer
    "never" when it is late even alone (:func:`.on_time_retry.retry_placement`)."""
    planner._unfit += 1
    cache, alone = planner._cache, planner.admitting_alone()
    if job.deadline is None or cache is None or alone is None:
        return fit
    cache = cache.built()
    relative = job.deadline - now
    place = retry_placement(cache.free, now, model.service_s(job.prefill_tokens, job.decode_steps),
                            alone.service_s(job.prefill_tokens, job.decode_steps), relative, fit.retry_at)
    if place is None:
        return Fit(False, None, None)
    retry = planner.retry_slots.reserve(cache.free, (planner._version, model), now, place.length, relative,
                                        place.lower, rec.tenant, place.drained)
    return Fit(False, retry, None)


def fit_afresh(planner: OnTimePlanner, rec: RequestRecord, job: PendingJob, cache: _EdfCache | None, now: float,
               model: DeviceModel, records: Callable[[], Iterable[RequestRecord]]) -> Fit:
    """:meth:`OnTimePlanner.admit`'s slow path, where the cache cannot place ``job``: a fast refusal, else the
    full check against the kept set (replanned first unless the plan is this instant's and nothing moved since);
    an accepted ``job`` joins the kept set and the cache is rebuilt with it. Counts and places a refusal."""
    refused = fast_refusal(planner, job, now, model)
    if refused is not None:
        return refuse(planner, rec, job, refused, now, model)  # never with a lane free for a bet (refusal_cache)
    if planner.dirty or planner._planned_at != now or cache is None:
        # sheds found here are applied at the next tick. On admission's slowed model, the cache is
        # slowed twice until then; kept: planning on `nominal` cost B16 tight 0.5x 246 -> 243 (#13)
        planner.replan((r for r in records() if r is not rec), now, model)
        planner.dirty = True
    kept = planner._kept.jobs()
    # nothing kept: the device would serve it alone, so it is judged as it would run (issue #13: on the per-token
    # time measured under the load just gone, an idle B16 refused what its smallest profile serves in time)
    alone = planner.admitting_alone()
    fit = fits(job, kept, now, model if kept or alone is None else alone)
    if not fit.ok:
        if job.deadline is not None:
            planner._refusal = _Refusal(planner._version, model, job.deadline, job.prefill_tokens,
                                        job.decode_steps, fit.retry_at)
        return lane_free_bet(planner, job, now, model) or refuse(planner, rec, job, fit, now, model)
    kept.append(job)
    planner._cache = _EdfCache(kept, now, model)
    return fit


def lane_free_bet(planner: OnTimePlanner, job: PendingJob, now: float, model: DeviceModel) -> Fit | None:
    """Admit ``job``, which the estimate refuses, as a *bet* when a KV lane is free now beside the kept work and it
    finishes by its deadline at the best per-token time its decode set can give it: the measured step of the §8
    profile the kept jobs and it select, with their rotation if they outnumber its batch
    (``planner.best_token_s``; 0: not measured, no bet). None: no bet, refuse it.

    Why (issue #13 session 18, §5.2 at light load): on B>1 the estimate's per-token time is the long window's
    (:attr:`.DeviceModel.lane_step_s`, slowed by the margin), set by the profile and the prefills of the load just
    gone; a long request (107-140 tokens for a 10 s deadline) arriving while the device is half empty was refused at
    8.5-11 s of service and finished in 7.5-9.6 s under ``at_risk`` (per-token 61-81 ms against 74-92 estimated; the
    7 refusals of the goodput comparison's B16 tight 0.5x over seeds 11-15). A lane free now is its own in every
    lane schedule (each kept job keeps its lane), so no kept job's planned finish moves: the only question is its
    own, which no input known at submit tells (``docs/estimator.md``), hence a bet on the best case. Its outcome is
    not scored by the margin (:meth:`.OnTimePlanner.ended`): the margin corrects the estimate admission trusts, and
    a lost bet scored raised it for a few hundred admissions the estimate had right (tight 1x over seeds 11-15:
    1 945 -> 1 938 on time scored, 1 948 unscored, in a prototype on the cost model's steps). Bets are made only on
    ``planner.bet_lanes`` (set by the policy): not on one lane (B1: the lane is shared), not under ping/pong (two steps
    overlap, the bound would not hold), not with a single profile (its best case is the step the window measures).
    While a lane is free there, no refusal is read from the caches (``OnTimePlanner.refusal_cache``), so the HTTP
    front never refuses what a bet would admit."""
    deadline = job.deadline
    kept = planner._kept.jobs()
    sequences = len(kept) + 1
    if deadline is None or sequences > planner.bet_lanes or model.token_s <= 0:
        return None
    best = planner.best_token_s(sequences)
    if best <= 0:
        return None
    nominal = planner.devices.admitting_of or model  # the prefill as measured, not slowed by the margin
    bound = now + nominal.prefill_s(job.prefill_tokens) + job.decode_steps * best
    if bound > deadline + ON_TIME_EPS_S:
        return None
    kept.append(job)
    planner._cache = _EdfCache(kept, now, model)
    planner.bets.add(job.id)
    planner.bets_made += 1
    # on admission's slowed scale, as fits() answers (the planner takes the margin back out of it)
    return Fit(True, None, now + (bound - now) * (1.0 + planner.devices.admitting_margin))
