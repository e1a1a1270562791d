"""The admission snapshot: the actor's kept schedule, published so that the HTTP event loop can refuse a request
that has no prospect without a round trip to the actor (issue #13: time to 429 under a burst).

Why: under a 300-request burst every refusal used to cross to the engine's actor and back — the message, the
§5.2 screen, the on_time planner's check and its retry slot, the wake-up of the event loop — and the actor's
CPU for it (about 0.6-0.8 ms a refusal on this machine) ran under the same interpreter lock as the loop that
answers HTTP, so the last 429 of the burst waited for both. The actor stays the one owner of admission state
(DESIGN principle 2): it *publishes* an immutable :class:`AdmissionSnapshot` after every step that could
change what it would admit, and the event loop only *reads* it. The loop never admits from it: a request the
snapshot cannot refuse goes to the engine, which still decides.

What the snapshot holds is exactly what the on_time planner's fast refusal reads (``_EdfCache.tail_finish``,
:mod:`calculet.runtime.scheduling.on_time_planner`): the kept set's EDF lane free times, the latest kept
deadline and the admission device model (the measured device slowed by the estimator's margin). A candidate
whose deadline is the latest (every request with the default deadline, in arrival order) finishes, appended
to that schedule, at ``max(free, now) + prefill + decode steps × lane step``
(:class:`~calculet.runtime.scheduling.finish_estimate.DeviceModel`'s own ``prefill_s`` and ``lane_step_s``);
past its deadline it is refused with the same ``Retry-After`` rule
(:class:`~calculet.runtime.scheduling.on_time_retry.RetrySlots`, placed by
:func:`~calculet.runtime.scheduling.on_time_retry.retry_placement`: "never" only when late even on an idle device).

**Soundness.** The front only refuses. A refusal from the snapshot is one the engine would make at the same
instant, because the snapshot is *current* whenever it is read:

* the actor withdraws it (sets it to None) before it runs any message or tick and publishes a new one after,
  so no state change of the actor is ever hidden from a reader (a reader that raced the withdrawal sees the
  state before the change: its decision is the one the engine would have made just before it);
* device results the completion thread has posted but the actor has not applied yet would end work the
  snapshot still counts: while any is pending the snapshot is not offered (:attr:`ThreadedEngine
  .admission_snapshot`);
* the actor's next timed wake-up (a deadline expiry, a Wait timeout) would change the set: the snapshot is
  valid only until then, and at most :data:`MAX_AGE_S` after it was taken;
* requests the front forwarded since the snapshot and the actor has not run yet can only *add* kept work,
  which makes every later finish later: a refusal stays a refusal (they are counted, not waited for);
* the planner's own conditions: no snapshot while the planner is stale (work left the kept set since its
  last plan: the cache over-states what is ahead), while the measured step is faster than the cached plan's by
  more than its drift tolerance (the cached lanes free late: the planner does not refuse from them either),
  while a lane is idle (fewer kept jobs than lanes), while
  the model is not Ready or the engine is stopping, or with no measured decode step; a candidate whose
  deadline is earlier than the latest kept one, or needing more KV than the budget (the engine's answer is
  400), is forwarded.

What remains is the lag every decision has: a device job that finished but whose result has not yet left
``WaitAny``. The front counts its refusals, its forwards by reason and the oldest snapshot it refused from
(:class:`EarlyAdmissionStatistics`). The tests drive the same scheduler state through both paths and require
that every front refusal is an engine refusal (``tests/unit/runtime/engine/test_admission_snapshot.py``).

Differences that remain by design: a request refused here takes no token from its tenant's QPS bucket and is
not counted in the engine's ``no_prospect`` (the service exports the front's count beside it), and its
``Retry-After`` comes from the front's own retry slots, placed on the snapshot's lanes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S, DeviceModel
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.scheduling.on_time_retry import RetrySlots, retry_placement
from calculet.runtime.scheduling.scheduler import Scheduler

MAX_AGE_S = 0.5
"""A snapshot is not used past this age even when the actor has no timed wake-up due (it publishes one after
every tick, so under load it is replaced every decode step)."""


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """What the actor would answer a latest-deadline candidate, as of ``taken_at`` (engine clock, seconds)."""

    generation: int
    """The actor's publication count (a new snapshot replaces the one before it)."""
    taken_at: float
    valid_until: float
    """The actor's next timed wake-up, or ``taken_at`` + :data:`MAX_AGE_S`, whichever is first."""
    free: tuple[float, ...]
    """The lanes' free times in the kept set's EDF schedule (the planner's admission cache)."""
    latest: float
    """The latest deadline among the kept requests: a candidate's must be no earlier to go to the tail."""
    model: DeviceModel
    """The device as admission plans it (measured, slowed by the estimator's margin)."""
    alone: DeviceModel
    """... serving one request alone (:meth:`OnTimePlanner.alone_model`, slowed alike): "never" is judged on it."""
    deadline_s: float
    """The relative deadline a request without its own gets (``admission.deadline_default_ms``)."""
    max_kv_tokens: int
    admitted: Mapping[str, int]
    """Requests the engine accepted so far, by tenant (each takes its tenant's earliest retry slot)."""


def take_snapshot(scheduler: Scheduler, *, accepting: bool, generation: int, now: float, wake: float | None,
                  admitted: Mapping[str, int]) -> AdmissionSnapshot | None:
    """(actor) The snapshot of ``scheduler``'s on_time admission, or None when the front may not refuse at all.

    ``admitted`` is shared with the snapshot, not copied: the caller replaces it, never changes it (one copy
    per admission rather than one per step).

    It reads the planner's admission cache under the rule its own fast refusal uses
    (:meth:`OnTimePlanner.refusal_cache`)."""
    policy = scheduler.on_time
    if policy is None or not accepting or scheduler.generations.availability is not ModelAvailability.READY:
        return None
    planner = policy.planner
    cache = planner.refusal_cache()
    if cache is None or not cache.on_lane:
        return None
    model = policy.model()
    if model is None or planner.kept_count < model.lanes:
        return None
    horizon = now + MAX_AGE_S
    admitting = planner.admitting_model(model)
    alone = planner.admitting_alone()
    assert alone is not None  # built with the admitting model
    return AdmissionSnapshot(generation, now, horizon if wake is None else min(wake, horizon), tuple(cache.free),
                             cache.latest, admitting, alone,
                             scheduler.config.admission.deadline_default_ms / 1000,
                             scheduler.admission.budget.max_kv_tokens, admitted)


@dataclass(frozen=True, slots=True)
class EarlyRefusal:
    """A 429 decided from the snapshot: ``retry_at`` (engine clock) when it would fit, None for never."""

    retry_at: float | None
    retry_after_s: float | None
    reason: str


@dataclass(frozen=True)
class EarlyAdmissionStatistics:
    """The front's refusals and forwards (§16-style counters; :mod:`calculet.server.metrics_front` exports them)."""

    refused: int
    """Requests answered 429 from a snapshot, without the engine."""
    refused_never: int
    """... of which late even on an idle device (no ``Retry-After``)."""
    forwarded: dict[str, int]
    """Requests handed to the engine, by why the snapshot could not refuse them."""
    max_refusal_age_s: float
    """The oldest snapshot a refusal was made from (engine clock seconds since it was taken)."""
    max_forwarded_since_snapshot: int
    """The most requests forwarded on one snapshot before the actor replaced it (work it did not count)."""
    retry_slots: int
    """Retry slots (ghosts) the front holds."""
    held: int = 0
    """Requests that waited for the engine's next answer (and its snapshot) before being decided
    (:meth:`EarlyAdmission.should_hold`)."""


FORWARD_REASONS = ("no_snapshot", "expired", "not_latest", "kv_budget", "fits", "raced")
"""Why the front handed a request to the engine (:meth:`EarlyAdmission.decide`): a bounded set."""

HELD = "held"
""":meth:`EarlyAdmission.decide`'s answer to a request that should wait for the engine's next answer (``hold``)."""

HOLD_IN_FLIGHT = 4
"""Requests on their way to the actor beyond which a request that finds no snapshot waits for its next answer."""

FRONT_RETRY_SLOTS = 4096
"""Retry slots the front holds at most. Why more than the planner's 512: past the limit every new slot drops the
oldest and the lane heap is rebuilt from all the slots (O(slots) per refusal); a burst's refusals each place
one, and on the event loop that rebuild would cost more than the rest of the refusal."""


def _front_slots() -> RetrySlots:
    return RetrySlots(limit=FRONT_RETRY_SLOTS)


@dataclass
class EarlyAdmission:
    """The event loop's refusals from the actor's snapshot (confined to the loop's thread)."""

    slots: RetrySlots = field(default_factory=_front_slots)
    _refused: int = 0
    _never: int = 0
    _forwarded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FORWARD_REASONS, 0))
    """Every reason present from the start: a scrape on another thread copies it while the loop counts."""
    _max_age: float = 0.0
    _generation: int = -1
    _pending: list[float] | None = None
    """The snapshot's lane free times (a heap) with the requests forwarded on it because they fit appended, as the
    engine would append them if it admits them (:meth:`decide`'s ``hold``); None until the first such forward."""
    _since: int = 0
    _max_since: int = 0
    _admitted: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    """Requests handed to the engine whose answer has not come back (:meth:`sent`, :meth:`answered`)."""
    unsent: int = 0
    """Requests the refusal lane forwarded whose ASGI task has not sent them to the engine yet (nor ended): the lane
    decides a whole socket read's requests before any task runs, so without them :attr:`in_flight` would stay 0
    through a burst's first read, and every request of it would be forwarded (:mod:`calculet.server.refusal_lane`)."""
    _held: int = 0
    _wakers: list[Callable[[], None]] = field(default_factory=list)

    def sent(self) -> None:
        """A request was posted to the engine."""
        self.in_flight += 1

    def answered(self) -> None:
        """The engine answered a request (the actor published its snapshot first): wake the held ones."""
        self.in_flight -= 1
        wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()

    def should_hold(self, snapshot: AdmissionSnapshot | None) -> bool:
        """Whether a request should wait for the engine's next answer before being decided: no snapshot now, and
        at least :data:`HOLD_IN_FLIGHT` requests already on their way to the actor (or to be sent: :attr:`unsent`).
        Why: at a burst's start the device is idle (no snapshot: every request fits) and the event loop
        forwards requests far faster than the actor answers them; the first ones fill the device and all the
        others would wait in the actor's mailbox for a 429 the next snapshot gives at once (issue #13 measured
        50 of 300 refusals of a burst answered by the engine, its 429 P99 at 400 ms against 0.4 ms P50).
        Bounded by the caller's wait."""
        return snapshot is None and self.in_flight + self.unsent >= HOLD_IN_FLIGHT

    def hold(self, wake: Callable[[], None] | None) -> None:
        """A request held (counted); ``wake`` is called at the engine's next answer (None: the caller's wait is
        already among the wakers, shared by several held requests)."""
        self._held += 1
        if wake is not None:
            self._wakers.append(wake)

    def decide(self, read: Callable[[], AdmissionSnapshot | None], *, prompt_tokens: int, max_new_tokens: int,
               tenant: str, now: float, hold: bool = False) -> EarlyRefusal | None | str:
        """The refusal of a request arriving ``now``, or None: forward it to the engine (counted by reason).

        ``read`` returns the actor's current snapshot; it is read again once the refusal is decided, and a
        snapshot replaced meanwhile (the actor began a step) forwards the request instead.

        ``hold``: a request the snapshot would forward because it fits, but which would not fit behind the requests
        already forwarded on this snapshot because they fit (each appended to the snapshot's lanes as the engine
        appends a latest-deadline candidate: :attr:`_pending`), or while requests forwarded before this snapshot are
        still on their way (not in it), is answered :data:`HELD` (not counted): its caller waits for the engine's
        next answer and asks again. Why: the refusal lane (:mod:`calculet.server.refusal_lane`)
        decides a whole socket read's requests before any of them reaches the engine, so the snapshot never changes
        between them; without this every request of a burst's first read "fits" the same free lane and goes to the
        actor, which refuses all but the first few (the full path met the actor between two requests: its forwards
        were in flight, and the next request found no snapshot and was held). Only a hold is decided from the lanes
        with the forwards in them, never a refusal: a forward the engine refuses would have made it unsound."""
        snapshot = read()
        if snapshot is None:
            return self._forward("no_snapshot")
        if snapshot.generation != self._generation:
            self._replaced(snapshot, now)
        if now >= snapshot.valid_until:
            return self._forward("expired")
        model = snapshot.model
        deadline = now + snapshot.deadline_s
        if deadline < snapshot.latest:
            return self._forward("not_latest")
        if prompt_tokens + max_new_tokens > snapshot.max_kv_tokens:
            return self._forward("kv_budget")
        length = model.service_s(prompt_tokens, max(0, max_new_tokens - 1))
        if max(min(snapshot.free), now) + length <= deadline + ON_TIME_EPS_S:
            pending = self._pending
            if pending is None:
                pending = self._pending = list(snapshot.free)
                heapq.heapify(pending)
            finish = max(pending[0], now) + length
            if hold and (self.in_flight + self.unsent > self._since or finish > deadline + ON_TIME_EPS_S):
                return HELD  # requests forwarded before this snapshot are not in it yet, or it would not fit
            heapq.heapreplace(pending, finish)
            return self._forward("fits")
        relative = snapshot.deadline_s
        place = retry_placement(snapshot.free, now, length,
                                snapshot.alone.service_s(prompt_tokens, max(0, max_new_tokens - 1)), relative, now)
        if place is None:
            refusal = EarlyRefusal(None, None, "no prospect of service before the deadline: it would finish late "
                                               "even on an idle device (it would fit never on this device)")
        else:
            # keyed by the lanes alone (not the model, which moves every step): rebuilt when the kept schedule changed
            retry = self.slots.reserve(list(snapshot.free), snapshot.free, now, place.length, relative, place.lower,
                                       tenant, place.drained)
            refusal = EarlyRefusal(retry, max(0.0, math.ceil(retry - now - 1e-9)),
                                   "no prospect of service before the deadline: with the work already admitted the "
                                   f"shared-device estimate finishes it late (it would fit in {retry - now:.1f} s)")
        if read() is not snapshot:  # the actor began a step meanwhile: its answer, not this one
            return self._forward("raced")
        self._refused += 1
        self._never += refusal.retry_at is None
        self._max_age = max(self._max_age, now - snapshot.taken_at)
        return refusal

    def engine_refused(self, read: Callable[[], AdmissionSnapshot | None], *, prompt_tokens: int,
                       max_new_tokens: int, tenant: str, now: float, retry_after_s: float) -> float:
        """The ``Retry-After`` of a no-prospect 429 the *engine* answered (a request the front forwarded): its retry
        slot placed among the front's, no earlier than the engine's own answer. Why: the front's slots and the
        planner's are two sets; the clients the engine refused came back into the slots the front had handed out
        (issue #13 measured 72 % of retries admitted with two sets, 99 % before the front refused). With no
        snapshot now, the engine's answer stands."""
        snapshot = read()
        if snapshot is None:
            return retry_after_s
        steps = max(0, max_new_tokens - 1)
        relative, lower = snapshot.deadline_s, now + retry_after_s
        place = retry_placement(snapshot.free, now, snapshot.model.service_s(prompt_tokens, steps),
                                snapshot.alone.service_s(prompt_tokens, steps), relative, lower)
        if place is None:
            return retry_after_s
        retry = self.slots.reserve(list(snapshot.free), snapshot.free, now, place.length, relative, place.lower, tenant,
                                   place.drained)
        return max(retry_after_s, float(math.ceil(retry - now - 1e-9)))

    def _forward(self, why: str) -> EarlyRefusal | None:
        """Count a request handed to the engine; None (no refusal)."""
        self._forwarded[why] += 1
        self._since += 1
        self._max_since = max(self._max_since, self._since)
        return None

    def _replaced(self, snapshot: AdmissionSnapshot, now: float) -> None:
        """A new snapshot: the tenants' new admissions take their retry slots (as the planner's ``admitted``)."""
        self._generation, self._since, self._pending = snapshot.generation, 0, None
        for tenant, count in snapshot.admitted.items():
            for _ in range(count - self._admitted.get(tenant, 0)):
                self.slots.admitted(tenant, now)
            self._admitted[tenant] = count

    def statistics(self) -> EarlyAdmissionStatistics:
        return EarlyAdmissionStatistics(self._refused, self._never, dict(self._forwarded), self._max_age,
                                        self._max_since, len(self.slots.ghosts), self._held)


__all__ = ["AdmissionSnapshot", "EarlyAdmission", "EarlyAdmissionStatistics", "EarlyRefusal", "FORWARD_REASONS",
           "FRONT_RETRY_SLOTS", "HELD", "HOLD_IN_FLIGHT",
           "MAX_AGE_S", "take_snapshot"]
