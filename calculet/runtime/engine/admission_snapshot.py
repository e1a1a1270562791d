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
to that schedule, at ``max(free, now) + prefill + decode steps × lane step``, plus a turnover per step on a lane
another job holds (:func:`~calculet.runtime.scheduling.lane_time.lane_finish`, the engine's one lane arithmetic);
past its deadline it is refused with the same ``Retry-After`` rule
(:class:`~calculet.runtime.scheduling.on_time_retry.RetrySlots`, placed by
:func:`~calculet.runtime.scheduling.on_time_retry.retry_placement`: "never" only when late even on an idle device).

**Soundness.** The front only refuses. A refusal from the snapshot is one the engine would make at the same
instant, because the snapshot is *current* whenever it is read:

* the actor withdraws it (sets it to None) before it runs any message or tick and publishes a new one after,
  so no state change of the actor is ever hidden from a reader (a reader that raced the withdrawal sees the
  state before the change: its decision is the one the engine would have made just before it); between turns
  chained back to back it publishes only once a reader has found none (issue #20: ``ThreadedEngine._turned``),
  the snapshot staying withdrawn meanwhile — a reader without one refuses nothing;
* device results the completion thread has posted but the actor has not applied yet would end work the
  snapshot still counts: while any is pending the snapshot is not offered (:attr:`ThreadedEngine
  .admission_snapshot`);
* the actor's next timed wake-up (a deadline expiry, a Wait timeout) would change the set: the snapshot is
  valid only until then, and at most :data:`MAX_AGE_S` after it was taken;
* requests the front forwarded that the actor has not decided yet can only *add* kept work, which makes every
  later finish later: a refusal stays a refusal. The front also counts them, appended to the snapshot's lanes as
  the engine appends them (:meth:`EarlyAdmission.decide`; on B>1 one that starts on a lane another job holds is
  charged the slot's turnover: the engine's own function, :func:`~calculet.runtime.scheduling.lane_time
  .lane_finish`, so the front's lanes are the engine's to the last bit), but only those the engine surely admits as
  appended (:class:`_Epoch`): the front knows which of them the snapshot holds (the engine's count of requests created,
  from a moment nothing was on its way), each fit the lanes it knew (a chain begun on an idle lane within the
  deadline of its first request: the engine starts it later), and nothing else the engine checks could refuse one
  (:func:`_room`); with a request of another kind on its way the front counts none, and holds or forwards what fits
  the snapshot;
* the planner's own conditions: no snapshot while the planner is stale (work left the kept set since its
  last plan: the cache over-states what is ahead), while the measured step is faster than the cached plan's by
  more than its drift tolerance (the cached lanes free late: the planner does not refuse from them either),
  while the model is not Ready or the engine is stopping, or with no measured decode step; a candidate whose
  deadline is earlier than the latest kept one, or needing more KV than the budget (the engine's answer is
  400), is forwarded. With nothing kept (an idle device, :attr:`AdmissionSnapshot.kept`) the engine judges a
  candidate that does not fit the lanes as the device would serve it alone: the front forwards it ("alone").
  Why a snapshot of an idle device at all (there was none while a lane was idle): a burst's first requests find
  the device idle, and with no snapshot the front could refuse nothing until the engine had admitted what fits.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from calculet.runtime.engine.early_refusal import FORWARD_REASONS, EarlyAdmissionStatistics, EarlyRefusal
from calculet.runtime.scheduling.finish_estimate import ON_TIME_EPS_S, DeviceModel
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.scheduling.lane_time import LaneCost
from calculet.runtime.scheduling.on_time_retry import RetrySlots, retry_placement
from calculet.runtime.scheduling.scheduler import Scheduler

MAX_AGE_S = 0.5
"""A snapshot is not used past this age even when the actor has no timed wake-up due (it publishes one after
every tick a reader asks for, so under load it is replaced every turn it is read) — unless nothing is kept (:func:`take_snapshot`)."""


class AdmissionSnapshot(NamedTuple):
    """What the actor would answer a latest-deadline candidate, as of ``taken_at`` (engine clock, seconds).

    A named tuple, not a frozen dataclass: the actor builds one per turn (issue #20), and a frozen dataclass sets
    each field through ``object.__setattr__`` (2.6 µs a snapshot against 1.1 µs measured, ``take_snapshot`` on a
    B1 harness with three kept)."""

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
    kept: int = 1
    """Requests the planner keeps. 0: the engine judges a candidate that does not fit these lanes alone
    (:func:`~calculet.runtime.scheduling.on_time_refusal.fit_afresh`), so the front refuses none from them."""
    room: int = 0
    """Further requests the engine surely admits as :meth:`EarlyAdmission.decide` appends them to these lanes,
    if they fit (:func:`_room`); 0: none, the front refuses nothing from its own forwards."""
    token_room: int = 0
    """... while their prompts together hold at most this many tokens (the §5.1 waiting budget's bound) ..."""
    long_prompt: int = 0
    """... and none is a long prefill (a prompt over this many tokens: its own waiting quota, §6)."""
    created: int = 0
    """Requests the engine has created (every ``submit`` it decided, bar one refused before its record): which of
    the front's forwards this snapshot holds (:class:`_Epoch`)."""


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
    if model is None:
        return None
    # nothing kept: nothing changes but by a message or a timed wake-up (each withdraws the snapshot), and an idle
    # actor publishes only at its idle timeout: aged out, a burst's first requests went to the engine (measured)
    horizon = now + MAX_AGE_S if planner.kept_count else math.inf
    admitting = planner.admitting_model(model)
    alone = planner.admitting_alone()
    assert alone is not None  # built with the admitting model
    room, token_room = _room(scheduler)
    return AdmissionSnapshot(generation, now, horizon if wake is None else min(wake, horizon), tuple(cache.free),
                             cache.latest, admitting, alone,
                             scheduler.config.admission.deadline_default_ms / 1000,
                             scheduler.admission.budget.max_kv_tokens, admitted, planner.kept_count, room, token_room,
                             scheduler.config.queues.medium_prefill_max_tokens, scheduler.registry.created)


_LIMITED: list[object] = [None, None, False]
"""The configuration and TTFT targets :func:`_limited` last read, and its answer (they are fixed for an engine: read
once, not per actor turn)."""


def _limited(config: object, ttft_s: Mapping[str, float | None]) -> bool:
    """Whether a tenant's QPS bucket, waiting tokens or TTFT target could refuse what fits (see :func:`_room`)."""
    if _LIMITED[0] is not config or _LIMITED[1] is not ttft_s:
        limited = any(t is not None for t in ttft_s.values()) or any(
            t.qps is not None or t.max_waiting_tokens is not None for t in config.tenants)  # type: ignore[attr-defined]
        _LIMITED[:] = [config, ttft_s, limited]
    return bool(_LIMITED[2])


def _room(scheduler: Scheduler) -> tuple[int, int]:
    """(requests, their prompt tokens) the engine surely admits, one after another, when each fits at the tail of
    the planner's cache — (0, 0) when that cannot be told from here. What else could refuse one (§5.2 order,
    :meth:`AdmissionController.screen`): the waiting budget (each may wait: one request and its prompt more; a
    waiting request holds at most ``max_seq`` prompt tokens, the long quota at most one slot each), a tenant's QPS
    bucket or waiting tokens, a TTFT target; and the planner itself when the step is slower than at its plan (its
    cache then accepts nothing: the full check replans on the slower step). Long prefills are not counted here
    (:attr:`AdmissionSnapshot.long_prompt`)."""
    planner = scheduler.on_time.planner  # type: ignore[union-attr]  # take_snapshot's caller checked it
    if planner.cache_drift() != 0 or _limited(scheduler.config, planner.ttft_s):
        return 0, 0
    admission = scheduler.admission
    waiting, budget = admission.waiting, admission.budget
    room = budget.max_waiting_requests - waiting
    tokens = budget.max_waiting_prompt_tokens - waiting * scheduler.generations.max_seq()
    return (room, tokens) if room > 0 and tokens > 0 else (0, 0)



HELD = "held"
""":meth:`EarlyAdmission.decide`'s answer to a request that should wait for the engine's next answer (``hold``)."""

HOLD_IN_FLIGHT = 4
"""Requests on their way to the actor beyond which a request that finds no snapshot waits for its next answer."""

FRONT_RETRY_SLOTS = 4096
"""Retry slots the front holds at most (up to an eighth more between two drops). Why more than the planner's 512:
a drop of the oldest rebuilds the lane heap from all the slots at the next refusal (O(slots)), and a burst's refusals
each place one; :meth:`RetrySlots.reserve` drops them in batches, one rebuild per ``limit // 8`` refusals."""


def _front_slots() -> RetrySlots:
    return RetrySlots(limit=FRONT_RETRY_SLOTS)


SHAPES_PER_SNAPSHOT = 64
"""Request shapes whose lengths :meth:`EarlyAdmission._shape` keeps for one snapshot at most (then it starts afresh)."""


class _Shape(NamedTuple):
    """A request's lane lengths on one snapshot (:meth:`EarlyAdmission._shape`): what :meth:`EarlyAdmission.decide`
    computes from the snapshot and the request's two token counts only, the same for every request of that shape."""

    length: float
    """Seconds it holds a lane on the snapshot's admission model (:meth:`DeviceModel.service_s`) ..."""
    alone: float
    """... on the device serving it alone (:attr:`AdmissionSnapshot.alone`) ..."""
    cost: LaneCost
    """... and placed on the lanes of the front's forwards (:meth:`LaneCost.of`)."""
    free_min: float
    """The snapshot's earliest free lane."""

    @classmethod
    def of(cls, snapshot: AdmissionSnapshot, prompt_tokens: int, max_new_tokens: int) -> _Shape:
        steps = max(0, max_new_tokens - 1)
        cost = LaneCost.of(snapshot.model, prompt_tokens, steps)
        return cls(cost.length, snapshot.alone.service_s(prompt_tokens, steps), cost, min(snapshot.free))


@dataclass(slots=True)
class _Epoch:
    """The requests the front forwarded (each because it fit) since a moment nothing was on its way to the engine.

    Which of them a snapshot holds is read from the engine's count of requests created
    (:attr:`AdmissionSnapshot.created`): ``base`` is that count less the front's sends at the epoch's start, so the
    ``created - base - sends`` first forwards are in the snapshot. A request created by anyone else makes the count
    run ahead: the front then takes more of its forwards for held than are, and counts fewer ahead of a candidate —
    a refusal only rarer. Which ones are held is not known when the engine receives them in another order than the
    front forwarded them (the refusal lane's forwards are sent by their tasks): the shortest are counted ahead."""

    base: int
    sends: int
    """The front's sends at the epoch's start."""
    lengths: list[LaneCost] = field(default_factory=list)
    """The forwards' service lengths (admission's model), in the order forwarded ..."""
    at: list[float] = field(default_factory=list)
    """... and the front's instant of each: appended at it (not at the instant a later decision reads them: the lanes,
    and the retry slots keyed by them, stay put between two snapshots)."""
    tokens: int = 0
    """Their prompt tokens."""
    anchor: float = math.inf
    """The front's instant of the first of them placed on a lane idle then (:meth:`EarlyAdmission._surely`)."""

    def ahead(self, created: int) -> list[tuple[LaneCost, float]]:
        """(length, instant) of the forwards a snapshot with ``created`` requests does not hold yet (when
        unsure which: the shortest, earliest — what puts the least ahead of a candidate)."""
        held = created - self.base - self.sends
        forwards = list(zip(self.lengths, self.at))
        if held <= 0:
            return forwards
        return sorted(forwards)[:len(forwards) - held] if held < len(forwards) else []


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
    _epoch: _Epoch | None = None
    """The requests forwarded since nothing was on its way to the engine, while the front knows which of them a
    snapshot holds (:meth:`_lanes`); None: it does not."""
    _sends: int = 0
    """Requests posted to the engine so far (:meth:`sent`)."""
    _ahead: int = 0
    """Forwards the snapshot :meth:`_lanes` last read does not hold yet ..."""
    _known: bool = True
    _made: tuple[AdmissionSnapshot, _Epoch, int, int, bool, tuple[float, ...]] | None = None
    """What :meth:`_lanes` last made: from this snapshot and this many forwards (a burst decides many requests on one
    snapshot, most of them refusals)."""
    """... known which (not only how many: forwards of one length, or all or none of them)."""
    _provisional: int = 0
    _admitted: dict[str, int] = field(default_factory=dict)
    _shapes: dict[tuple[int, int], _Shape] = field(default_factory=dict)
    """Request shapes (prompt tokens, new tokens) → their lengths on :attr:`_shapes_of` (:meth:`_shape`)."""
    _shapes_of: AdmissionSnapshot | None = None
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
        self._sends += 1

    def answered(self) -> None:
        """The engine answered a request (the actor published its snapshot first): wake the held ones."""
        self.in_flight -= 1
        wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()

    def unawaited(self) -> bool:
        """(any thread) Whether nothing but the one request being answered waits on the engine's answers: no held
        request's wake-up, nothing else on its way. The answer to an admitted request may then wait for the actor's
        next hand-over of stream wake-ups (``calculet.runtime.streams.writer.call_soon_held``, issue #20); otherwise
        it goes at once, since held requests are decided at each answer (issue #13: time to 429)."""
        return not self._wakers and self.in_flight + self.unsent <= 1

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

        The requests the front forwarded that the snapshot does not hold yet are appended to its lanes as the engine
        appends a latest-deadline candidate it admits (:meth:`_lanes`, when the front knows them): a request late
        behind them is refused at once, with the ``Retry-After`` the engine gives it once it has them — the engine,
        deciding the same requests in the same order at the same instant, refuses it too. Why (issue #13): at a
        burst's start the device is idle, and the front had nothing to refuse from until the engine had admitted
        what fits and published a snapshot: every request of the burst's first reads was held for the engine's
        answers (the first 429 37-59 ms after the first arrival). Otherwise, a request that fits the snapshot is
        forwarded or held (``hold``: answered :data:`HELD`, not counted; its caller waits for the engine's next
        answer and asks again) by :meth:`_fits_unknown`."""
        snapshot = read()
        if snapshot is None:
            return self._forward("no_snapshot")
        if snapshot.generation != self._generation:
            self._replaced(snapshot, now)
        if now >= snapshot.valid_until:
            return self._forward("expired")
        deadline = now + snapshot.deadline_s
        if deadline < snapshot.latest:
            return self._forward("not_latest")
        if prompt_tokens + max_new_tokens > snapshot.max_kv_tokens:
            return self._forward("kv_budget")
        shape = self._shape(snapshot, prompt_tokens, max_new_tokens)
        length = shape.length
        free: Sequence[float] = snapshot.free
        lanes = self._lanes(snapshot)
        if max(shape.free_min, now) + length <= deadline + ON_TIME_EPS_S:
            if lanes is None:
                return self._fits_unknown(snapshot, now, length, deadline, hold)
            start, cost = lanes[0], shape.cost
            finish = cost.finish(start, now)
            if finish <= deadline + ON_TIME_EPS_S:
                sure = self._surely(snapshot, start, now, finish)
                if hold and not sure:
                    return HELD  # the engine, later, may refuse it: not counted ahead of the next ones
                self._appended(snapshot, now, length)
                self._track(snapshot, cost, prompt_tokens, tenant, now if start <= now else None, sure, now)
                return self._forward("fits")
            free = lanes  # late behind the forwards the engine has not decided yet: refused as it will refuse it
        elif not snapshot.kept and not (lanes is not None and self._ahead):
            return self._forward("alone")  # nothing kept: the engine judges it as the device would serve it, alone
        elif lanes is not None:
            free = lanes  # the engine's lanes once it has the forwards: its Retry-After
        refusal = self._refusal(snapshot, free, now, length, shape.alone, tenant)
        if read() is not snapshot:  # the actor began a step meanwhile: its answer, not this one
            return self._forward("raced")
        refusal.known = lanes is not None and self._known
        self._refused += 1
        self._never += refusal.retry_at is None
        self._provisional += free is not snapshot.free and self._ahead > 0
        self._max_age = max(self._max_age, now - snapshot.taken_at)
        return refusal

    def _shape(self, snapshot: AdmissionSnapshot, prompt_tokens: int, max_new_tokens: int) -> _Shape:
        """A request's lane lengths on ``snapshot``'s device models (:class:`_Shape`), made once per snapshot and
        request shape. Why (issue #13, session 22): a burst is refused from a few snapshots, its requests of one or a
        few shapes (``bench/overload_http.py --distinct``: one token-length class); the lengths were computed afresh
        for every refusal (two ``service_s`` and the snapshot's lane minimum), the same figures each time."""
        shapes = self._shapes
        if self._shapes_of is not snapshot:
            shapes.clear()
            self._shapes_of = snapshot
        key = (prompt_tokens, max_new_tokens)
        shape = shapes.get(key)
        if shape is None:
            if len(shapes) >= SHAPES_PER_SNAPSHOT:
                shapes.clear()
            shape = shapes[key] = _Shape.of(snapshot, prompt_tokens, max_new_tokens)
        return shape

    def _refusal(self, snapshot: AdmissionSnapshot, free: Sequence[float], now: float, length: float, alone: float,
                 tenant: str) -> EarlyRefusal:
        """The 429 of a request of ``length`` (``alone``: served alone) late on the lanes ``free``: its retry slot
        placed by the engine's rule (:func:`~calculet.runtime.scheduling.on_time_retry.retry_placement`), or
        "never"."""
        relative = snapshot.deadline_s
        place = retry_placement(free, now, length, alone, relative, now)
        if place is None:
            return EarlyRefusal(None, None)
        # keyed by the lanes alone (not the model, which moves every step): rebuilt when the kept schedule changed.
        # ``free`` is the snapshot's tuple or :meth:`_lanes`' (kept while unchanged): its own key, no copy per refusal
        retry = self.slots.reserve(free, free, now, place.length, relative, place.lower, tenant, place.drained)
        return EarlyRefusal(retry, max(0.0, math.ceil(retry - now - 1e-9)), retry - now)

    def _fits_unknown(self, snapshot: AdmissionSnapshot, now: float, length: float, deadline: float,
                      hold: bool) -> str | None:
        """A request that fits ``snapshot`` when the front does not know what the engine holds beyond it: forwarded,
        or :data:`HELD` (``hold``) when requests forwarded before this snapshot are on their way, or it would not fit
        behind those forwarded on it because they fit (:attr:`_pending`). Why: the refusal lane
        (:mod:`calculet.server.refusal_lane`) decides a whole socket read's requests before any reaches the engine;
        without this every request of such a read "fits" the same free lane and goes to the actor, which refuses
        all but the first few. Only a hold is decided from these lanes, never a refusal."""
        pending = self._appended(snapshot, now, None)
        finish = max(pending[0], now) + length
        if hold and (self.in_flight + self.unsent > self._since or finish > deadline + ON_TIME_EPS_S):
            return HELD
        heapq.heapreplace(pending, finish)
        return self._forward("fits")

    def _appended(self, snapshot: AdmissionSnapshot, now: float, length: float | None) -> list[float]:
        """:attr:`_pending`, made from ``snapshot`` on first use, with a request of ``length`` appended (None: none)."""
        pending = self._pending
        if pending is None:
            pending = self._pending = list(snapshot.free)
            heapq.heapify(pending)
        if length is not None:
            heapq.heapreplace(pending, max(pending[0], now) + length)
        return pending

    def _lanes(self, snapshot: AdmissionSnapshot) -> tuple[float, ...] | None:
        """The lanes the engine will hold once it has decided every request on its way (a heap's order, the earliest
        first), or None when the
        front cannot tell. Known from a moment nothing was on its way (a new :class:`_Epoch` then, placed by the
        engine's count of requests created), while every request forwarded since was one that fit and is
        accounted for (:meth:`_track`); the ones ``snapshot`` does not hold yet are appended to its lanes, as the
        engine appends them. Over-stating what the snapshot holds only makes a refusal rarer (see :class:`_Epoch`)."""
        self._ahead, self._known = 0, True
        epoch = self._epoch
        if self.in_flight == 0 and self.unsent == 0:  # nothing on its way: the snapshot holds every forward
            base = snapshot.created - self._sends
            if epoch is None or epoch.lengths or epoch.base != base or epoch.sends != self._sends:
                self._epoch = epoch = _Epoch(base, self._sends)
        elif epoch is None:
            return None
        elif self._sends - epoch.sends + self.unsent != len(epoch.lengths):  # another forward, or one ended unsent
            self._epoch = None
            return None
        count = len(epoch.lengths)
        made = self._made
        if made is not None and made[0] is snapshot and made[1] is epoch and made[2] == count:  # as last read
            self._ahead, self._known = made[3], made[4]
            return made[5]
        ahead = epoch.ahead(snapshot.created)
        if len(ahead) > snapshot.room:
            return None
        self._ahead = len(ahead)
        self._known = len(ahead) in (0, count) or min(epoch.lengths) == max(epoch.lengths)
        heap = list(snapshot.free)
        heapq.heapify(heap)
        for cost, at in ahead:
            heapq.heapreplace(heap, cost.finish(heap[0], at))
        lanes = tuple(heap)  # the earliest first (a heap's order); immutable: the retry slots' key as it is
        self._made = (snapshot, epoch, count, self._ahead, self._known, lanes)
        return lanes

    def _surely(self, snapshot: AdmissionSnapshot, start: float, now: float, finish: float) -> bool:
        """Whether the engine admits a request that fits the lanes of :meth:`_lanes` at ``finish``, whenever it decides
        it: a lane idle when the front placed a request on it starts at the *engine's* later instant, which moves the
        whole chain behind it but not its first request's arrival, so a chain begun on an idle lane must fit the
        deadline counted from the front's first instant on it (:attr:`_Epoch.anchor`). Why: measured through HTTP,
        6 of a burst's forwards the front counted were refused by the engine, which received the first of them
        ~20 ms after the front decided it and the rest within a millisecond (their deadlines did not move with it)."""
        epoch = self._epoch
        anchor = min(epoch.anchor if epoch is not None else math.inf, now)
        return finish <= anchor + snapshot.deadline_s + ON_TIME_EPS_S

    def _track(self, snapshot: AdmissionSnapshot, length: LaneCost, prompt_tokens: int, tenant: str,
               idle: float | None, sure: bool, now: float) -> None:
        """A request forwarded because it fits the lanes of :meth:`_lanes`: accounted in the epoch when the engine
        surely admits it as appended (``sure``: :meth:`_surely`; the lanes known, not only an under-count; the
        snapshot's room, no long prefill; on several lanes only requests of one length, whose order of arrival at the
        engine does not change its lanes), else the epoch ends. ``idle``: the front's instant, when it starts on a
        lane idle then. Its admission takes its tenant's due retry slot now, as the engine's takes one of the
        planner's (so the next refusals' ``Retry-After`` are the engine's); a snapshot counting it later takes none
        again (:meth:`_replaced`)."""
        epoch = self._epoch
        assert epoch is not None  # _lanes gave lanes
        if (not sure or not self._known or len(epoch.lengths) >= snapshot.room or prompt_tokens > snapshot.long_prompt
                or epoch.tokens + prompt_tokens > snapshot.token_room
                or len(snapshot.free) > 1 and epoch.lengths and length != epoch.lengths[0]):
            self._epoch = None
            return
        epoch.lengths.append(length)
        epoch.at.append(now)
        epoch.tokens += prompt_tokens
        if idle is not None:
            epoch.anchor = min(epoch.anchor, idle)
        self.slots.admitted(tenant, now)
        self._admitted[tenant] = self._admitted.get(tenant, 0) + 1

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
        retry = self.slots.reserve(snapshot.free, snapshot.free, now, place.length, relative, place.lower, tenant,
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
            self._admitted[tenant] = max(count, self._admitted.get(tenant, 0))  # ahead by forwards it took (_track)

    def statistics(self) -> EarlyAdmissionStatistics:
        return EarlyAdmissionStatistics(self._refused, self._never, dict(self._forwarded), self._max_age,
                                        self._max_since, len(self.slots), self._held, self._provisional)


__all__ = ["AdmissionSnapshot", "EarlyAdmission", "FRONT_RETRY_SLOTS", "HELD", "HOLD_IN_FLIGHT", "MAX_AGE_S",
           "take_snapshot"]
