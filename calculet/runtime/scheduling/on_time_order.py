"""The admission-order estimate of a queued submit, kept between submits instead of recomputed (issue #20).

Why this module exists: where every sequence that holds KV is in every decode step (B16 with
``admission.max_sequences`` ≤ lanes, and one KV lane on B1) the finish reported for an accepted
request is its place in the admission queue's order
(:meth:`.OnTimePlanner.admission_order_afresh`, :func:`.finish_estimate.admission_order_finish`):
the kept requests already admitted hold their lanes, the waiting ones the §5.3 queue admits before
it take lanes in that order (:func:`.wfq_order.admission_ranks` replays the queue), and it follows.
Computed afresh, that walks, sorts, replays and list-schedules every waiting request on each
accepted queued submit — issue #20 measured 150-400 µs at 128 waiting and 13-15 ms at 4 096
(``bench/scheduler.py``). It feeds the reported estimate, not the decision.

Between two submits of a burst nothing else moves, and the queue's order only gains the previous
candidate. :class:`AdmissionOrderIndex` keeps that order (σ) with the tag the replay admits each
request with, and the lanes' free times after each prefix of it:

* the replay admits in nondecreasing tag order (a flow's next head is tagged ``global + cost``,
  never below a tag already admitted), ties by age, so σ is sorted by tag, and a newcomer — the
  newest request of its flow — is tagged when the last request of its flow ``L`` is admitted:
  ``max(global, tag(L)) + cost / weight`` (``global + cost / weight`` if its flow waits empty),
  and admitted before the first request tagged later (it loses ties, being the youngest). Nothing
  before it changes, and nothing after it either: no head enters when it is admitted (its flow
  has nobody behind it) and the next admission moves global virtual time past its tag. So the
  order after a newcomer is the order before, with it inserted by bisection;
* the lanes' free times after a prefix of σ are kept per prefix; an insertion invalidates the
  prefixes past it (past the run of jobs of its own lengths it joins: inside one, the sequence of
  lengths is the same as with the job at the run's end), which are recomputed only when a later
  candidate needs them. A burst of one
  flow always inserts at the end: O(log waiting) per submit. Several flows insert anywhere, and a
  list schedule has no update for a job inserted before others (its free times depend on the
  order): a candidate then pays for the prefixes between the earliest invalidated one and its own
  place — amortised, about the waiting requests over the flows sending, in place of all of them
  replayed, sorted and scheduled. The price is memory: a lane heap per prefix, about
  ``waiting × (lanes + 10)`` words (4 096 waiting on 16 lanes: about 1 MB), bounded by
  ``admission.max_waiting_requests``.

The index holds only while that reasoning does; otherwise the planner computes the estimate afresh
and seeds a new index from it:

* no event changed the plan since (a replan, a request admitted from the queue or ended, a reset:
  the planner's ``epoch``), the device model is the same object and global virtual time the same;
* the kept set grew by the candidate alone, right after the previous candidate, which is now in
  the queue (``waiting_admission``) with the cost it was placed with and, if the queue tagged it
  as its flow's head, the tag it was placed with; every waiting request was in the queue at the
  seed.

A Hypothesis test holds every value the index gives to the afresh computation on random bursts of
several flows, device steps, admissions and ends (``tests/unit/runtime/scheduling/test_on_time_order.py``).
Values agree to float rounding: the index adds lane lengths before the start instant, the afresh
schedule after it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["AdmissionOrderIndex", "OrderIndexStatistics", "newcomer_tag", "wfq_flow"]

QUEUED = "waiting_admission"
"""The state of a request in the §5.3 queue: the only waiting state the index's requests may be in."""


@dataclass(frozen=True)
class OrderIndexStatistics:
    """How often a queued submit's estimate came from the index rather than afresh, and the prefixes scheduled."""

    indexed: int
    seeded: int
    scheduled: int
    """Prefix lane states computed by the index (after its seeds): its work beyond the bisections."""


def wfq_flow(rec: RequestRecord) -> Hashable:
    """The §5.3 flow ``rec`` waits in: its tenant's long prompts or the others (as the queue keys it)."""
    return rec.tenant, rec.prefill_class == "long"


def newcomer_tag(last: float | None, global_vt: float, cost: float) -> float:
    """The tag the §5.3 replay admits a newcomer with: ``cost`` (per weight) after the tag of its flow's last
    waiting request ``last``, or after global virtual time if that is later or its flow waits empty. It is
    admitted before the first request tagged later: at ``bisect_right`` of the tags in admission order."""
    return (global_vt if last is None or last < global_vt else last) + cost


@dataclass(slots=True)
class _Pending:
    """The last candidate, placed but not yet in σ: it joins at the next submit if it queued. Not frozen: one
    is built per queued ``submit()`` and never changed (a frozen dataclass's ``__init__`` costs ~1 µs, #20)."""

    rec: RequestRecord
    job: PendingJob
    tag: float
    cost: float
    flow: Hashable
    """Its §5.3 flow (:func:`wfq_flow`)."""
    lengths: tuple[float, float]
    """Its :func:`_lengths` on the index's model: computed for its own estimate, inserted with it (#20)."""


class AdmissionOrderIndex:
    """The queue's order with admitted tags, and lane states per prefix, between submits (module doc)."""

    __slots__ = ("_epoch", "_model", "_global", "_tags", "_lengths", "_flow_tag", "_tenant_tag", "_states", "_prefills",
                 "_valid", "_uniform", "_on_lane", "_step", "_pending", "_kept_len", "_indexed", "_seeded", "_scheduled")

    def __init__(self) -> None:
        self._epoch = -1
        self._model: DeviceModel | None = None
        self._global = 0.0
        self._tags: list[float] = []
        """σ's admitted tags, nondecreasing."""
        self._lengths: list[tuple[float, float]] = []
        """σ's jobs' :func:`_lengths` on the index's model, aligned with :attr:`_tags`."""
        self._flow_tag: dict[Hashable, float] = {}
        """Per flow, the tag of its newest request in σ."""
        self._tenant_tag: dict[str, float] = {}
        """Per tenant, the largest of its flows' :attr:`_flow_tag` (a flow's newest request has its largest tag:
        :func:`newcomer_tag` never goes below the flow's last), kept as σ grows: :meth:`order_tags` hands it out
        instead of building it from every flow on each queued submit (issue #20: O(flows) per submit)."""
        self._states: list[list[float]] = []
        """``_states[k]``: a heap of the lanes' free times (offsets from the schedule's start) after the kept
        admitted requests and ``σ[:k]``; valid for every ``k`` below :attr:`_valid`. The stale ones past it are
        kept and overwritten in place when recomputed: an insertion early in σ made hundreds stale at once,
        and freeing them was most of a queued submit's cost under several flows (#20: a median 13 µs)."""
        self._prefills: list[float] = []
        """Prefill seconds of the same jobs, charged before the lanes when a prefill is not on its lane."""
        self._on_lane, self._step = True, 0.0
        """The index's model's ``prefill_on_lane`` and ``lane_step_s``, read at the seed."""
        self._valid = 0
        """How many of :attr:`_states` and :attr:`_prefills` (from the first) are valid."""
        self._uniform = 0
        """How many of σ's first jobs have the (length, prefill) pair of the first: :meth:`_insert`."""
        self._pending: _Pending | None = None
        self._kept_len = 0
        self._indexed = self._seeded = self._scheduled = 0

    def clear(self) -> None:
        self._pending = self._model = None
        self._tags, self._lengths, self._states, self._prefills = [], [], [], []
        self._valid = self._uniform = 0
        self._flow_tag, self._tenant_tag = {}, {}

    def estimate(self, rec: RequestRecord, job: PendingJob, now: float, model: DeviceModel,
                 kept: Sequence[PendingJob], epoch: int, global_vt: float, cost: Callable[[RequestRecord], float],
                 head_tag: Callable[[RequestRecord], float | None], own: float | None = None) -> float | None:
        """``rec``'s admission-order finish if the index holds for it (module doc), else None (compute afresh).
        ``kept``: the planner's kept jobs, ``job`` (``rec``'s) appended last; ``cost``: a request's WFQ cost per
        weight; ``head_tag``: the tag the queue fixed for a flow head (None: none); ``own``: ``cost(rec)`` if the
        caller has it (None: asked here)."""
        last = self._pending
        if (last is None or epoch != self._epoch or model is not self._model or global_vt != self._global
                or len(kept) != self._kept_len + 1 or kept[-1] is not job or kept[-2] is not last.job
                or last.rec.state != QUEUED or cost(last.rec) != last.cost):
            self.clear()
            return None
        fixed = head_tag(last.rec)
        if fixed is not None and fixed != last.tag:
            self.clear()
            return None
        self._insert(last.tag, last.lengths, last.flow)
        if own is None:
            own = cost(rec)
        flow = wfq_flow(rec)
        tag = newcomer_tag(self._flow_tag.get(flow), global_vt, own)
        lengths = _lengths(job, model, self._on_lane, self._step)
        self._pending, self._kept_len = _Pending(rec, job, tag, own, flow, lengths), len(kept)
        self._indexed += 1
        return self._finish(bisect_right(self._tags, tag), lengths, now)

    def seed(self, rec: RequestRecord, job: PendingJob, model: DeviceModel, kept: Sequence[PendingJob],
             waiting: Sequence[RequestRecord], admitted: Mapping[int, float], epoch: int, global_vt: float,
             cost: Callable[[RequestRecord], float]) -> None:
        """Start an index at ``rec`` after an afresh estimate: ``waiting`` (the kept waiting requests, ``rec``
        not among them) with the tag the replay admitted each with (``admitted``, ``rec``'s too, in the order
        admitted: :func:`.wfq_order.admission_ranks`'s output). None is
        started unless every one of ``waiting`` is in the queue. O(kept · log lanes), once per index."""
        self.clear()
        if any(r.state != QUEUED for r in waiting):
            return
        skip = {r.request_id for r in waiting}
        skip.add(job.id)
        by_id = {j.id: j for j in kept}
        of = {r.request_id: r for r in waiting}
        order = [of[i] for i in admitted if i in of]  # ``admitted`` lists them in the order admitted
        self._tags = [admitted[r.request_id] for r in order]
        self._on_lane, self._step = on_lane, step = model.prefill_on_lane, model.lane_step_s
        self._lengths = pairs = [_lengths(by_id[r.request_id], model, on_lane, step) for r in order]
        self._uniform = next((i for i, pair in enumerate(pairs) if pair != pairs[0]), len(pairs))
        self._flow_tag = {wfq_flow(r): admitted[r.request_id] for r in order}
        last = self._tenant_tag
        for (tenant, _), tag in self._flow_tag.items():
            if tag > last.get(tenant, -math.inf):
                last[tenant] = tag
        lanes, prefills = [0.0] * model.lanes, 0.0
        for j in kept:
            if j.id not in skip:
                length, prefill = _lengths(j, model, on_lane, step)
                heapq.heapreplace(lanes, lanes[0] + length)
                prefills += prefill
        self._states, self._prefills, self._valid = [lanes], [prefills], 1
        self._epoch, self._model, self._global = epoch, model, global_vt
        own = _lengths(job, model, on_lane, step)
        self._pending = _Pending(rec, job, admitted[job.id], cost(rec), wfq_flow(rec), own)
        self._kept_len = len(kept)
        self._seeded += 1

    def _insert(self, tag: float, own: tuple[float, float], flow: Hashable) -> None:
        """A job of :func:`_lengths` ``own`` joins σ where the replay admits it; the lane states past it are
        stale — past σ's leading run of one (length, prefill) pair if it joins that run.

        A lane state depends only on the sequence of pairs before it, so a job inserted into a run of jobs of
        its own pair gives the same sequence as one appended to the run: the states up to the run's end are
        unchanged. Past it every one changes (the lanes' free times sum to the lengths scheduled, which grew
        by the job's): no narrower invalidation is exact. Only the leading run is tracked (O(1) per insert;
        finding the run around any place would cost a scan of it): a queue of one request shape, where a
        tenant of a larger weight inserts early in σ (bench/scheduler.py's screened queue, 8 tenants of
        weights 1..8), then recomputes one lane state per queued submit, where it recomputed every one after
        the insertion (#20: 110 per submit at 1 024 waiting, 278 at 4 096). Mixed shapes gain nothing."""
        at = bisect_right(self._tags, tag)
        self._tags.insert(at, tag)
        lengths = self._lengths
        uniform = self._uniform
        if at <= uniform and (not uniform or lengths[0] == own):  # it joins σ's leading run of one pair
            self._uniform = end = uniform + 1
        else:
            end = at + 1
            if at < uniform:  # it ends the leading run there (or starts a run of one at σ's head)
                self._uniform = at or 1
        lengths.insert(at, own)
        self._flow_tag[flow] = tag
        tenant = flow[0]  # type: ignore[index]  # wfq_flow's (tenant, long)
        if tag > self._tenant_tag.get(tenant, -math.inf):
            self._tenant_tag[tenant] = tag
        if self._valid > end:
            self._valid = end

    def _finish(self, at: int, own: tuple[float, float], now: float) -> float:
        """A job of :func:`_lengths` ``own`` on the earliest lane after the kept admitted requests and ``σ[:at]``,
        from ``now``."""
        states, prefills, lengths = self._states, self._prefills, self._lengths
        k = self._valid - 1
        if k < at:
            self._scheduled += at - k
            lanes, before = states[k], prefills[k]
            replace = heapq.heapreplace
            kept = len(states)  # entries below this exist (stale past k): overwritten in place
            i = k + 1
            for length, prefill in lengths[k:at]:
                before += prefill
                if i < kept:
                    nxt = states[i]
                    nxt[:] = lanes
                    prefills[i] = before
                else:
                    nxt = lanes.copy()
                    states.append(nxt)
                    prefills.append(before)
                replace(nxt, nxt[0] + length)
                lanes = nxt
                i += 1
            self._valid = at + 1
        lanes = states[at]
        length, prefill = own
        if self._on_lane:  # length: model.service_s, the prefill, then the decode steps
            return now + (lanes[0] + length)
        start = now + (prefills[at] + prefill)
        return start + (lanes[0] + length)

    def order_tags(self) -> tuple[float, Mapping[str, float]] | None:
        """The last candidate's admitted tag and, per tenant, the tag of its newest request waiting in σ: the
        §5.3 windows later arrivals overtake it in (:mod:`.overtaking`). None when no index holds. The mapping is
        the index's own (kept as σ grows, O(1) here): read it, do not keep or change it."""
        pending = self._pending
        if pending is None:
            return None
        return pending.tag, self._tenant_tag

    def statistics(self) -> OrderIndexStatistics:
        return OrderIndexStatistics(self._indexed, self._seeded, self._scheduled)


def _lengths(job: PendingJob, model: DeviceModel, on_lane: bool, step: float) -> tuple[float, float]:
    """(seconds ``job`` holds a lane, prefill seconds charged before the lanes): the EDF work model's split.
    ``on_lane`` and ``step``: ``model``'s ``prefill_on_lane`` and ``lane_step_s``, read once per index (#20);
    on a lane the length is ``model.service_s`` (the prefill, then the decode steps)."""
    prefill = model.prefill_s(job.prefill_tokens)
    if on_lane:
        return prefill + job.decode_steps * step, 0.0
    return job.decode_steps * step, prefill

