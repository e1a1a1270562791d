"""The admission-order estimate of a queued submit, extended in O(log lanes) along a burst (issue #20).

Why this module exists: where every sequence that holds KV is in every decode step (B16 with
``admission.max_sequences`` ≤ lanes) the finish reported for an accepted request is its place in
the admission queue's order (:meth:`.OnTimePlanner._admission_order_estimate`,
:func:`.finish_estimate.admission_order_finish`): the kept requests already admitted hold their
lanes, the waiting ones ahead of it take lanes in the order the queue admits them, and it follows.
Computed afresh, that walks, sorts and list-schedules every waiting request — issue #20 measured
150-400 µs per queued submit at 128 waiting and 13-15 ms at 4 096 (``bench/scheduler.py``). It feeds
the reported estimate, not the decision.

In a burst of one flow (one tenant's requests of one prefill class, §5.3: a flow is admitted first
in, first out) nothing else moves between two submits, and the requests ahead of a candidate are
exactly those ahead of the previous candidate, then the previous candidate: the lanes' free times
after them are the previous ones with the previous candidate placed on the earliest lane. The chain
(:class:`AdmissionOrderChain`) keeps those free times, so such a submit costs one heap replacement.

The chain extends only while that is exactly so, and otherwise the planner computes the estimate
afresh (and seeds a new chain when one flow waits):

* no event changed the plan since (a replan, a request admitted from the queue or ended, a reset:
  the planner's ``epoch``), and the device model is the same object;
* the kept set grew by the candidate alone, right after the previous candidate, which is still
  queued (``waiting_admission``);
* every waiting request of the kept set is of the candidate's flow. With several flows waiting,
  the requests ahead of the next candidate include requests of other flows that the queue admits
  *before* the previous candidate (their tags, §5.3), and a list schedule has no cheap update for
  a job inserted before others (its lane free times depend on the order): those submits keep the
  O(waiting) walk.

A Hypothesis test holds every chained value to the afresh computation on random bursts, ticks,
admissions and ends (``tests/unit/runtime/scheduling/test_on_time_order.py``). Values agree to
float rounding: the chain adds lane lengths before the start instant, the afresh schedule after it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from calculet.runtime.scheduling.finish_estimate import DeviceModel, PendingJob
from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["AdmissionOrderChain", "OrderChainStatistics"]

QUEUED = "waiting_admission"
"""The state of a request in the §5.3 queue: the only waiting state a chain's requests may be in."""


@dataclass(frozen=True)
class OrderChainStatistics:
    """How often a queued submit's estimate was extended along the chain rather than computed afresh."""

    extended: int
    seeded: int


def _flow(rec: RequestRecord) -> tuple[str, str]:
    """The §5.3 flow ``rec`` is queued in: its tenant and its prefill class (first in, first out within it)."""
    return rec.tenant, rec.prefill_class


class AdmissionOrderChain:
    """Lane free times behind the last estimated candidate of a one-flow burst (module doc)."""

    __slots__ = ("_epoch", "_model", "_flow", "_last", "_last_job", "_kept_len", "_lanes", "_prefills",
                 "_extended", "_seeded")

    def __init__(self) -> None:
        self._epoch = -1
        self._model: DeviceModel | None = None
        self._flow: tuple[str, str] | None = None
        self._last: RequestRecord | None = None
        self._last_job: PendingJob | None = None
        self._kept_len = 0
        self._lanes: list[float] = []
        """A heap of the lanes' free times, as offsets from the schedule's start, after the jobs ahead of
        the last candidate (the last candidate not placed yet: it may never queue)."""
        self._prefills = 0.0
        """Prefill seconds of those jobs, charged before the lanes when a prefill is not on its lane."""
        self._extended = self._seeded = 0

    def clear(self) -> None:
        self._last = self._last_job = self._model = None

    def extend(self, rec: RequestRecord, job: PendingJob, now: float, model: DeviceModel,
               kept: Sequence[PendingJob], epoch: int) -> float | None:
        """``rec``'s admission-order finish if the chain holds for it (module doc), else None (compute afresh).
        ``kept``: the planner's kept jobs, ``job`` (``rec``'s) appended last."""
        last, last_job = self._last, self._last_job
        if (last is None or epoch != self._epoch or model is not self._model or _flow(rec) != self._flow
                or len(kept) != self._kept_len + 1 or kept[-1] is not job or kept[-2] is not last_job
                or last.state != QUEUED):
            self.clear()
            return None
        assert last_job is not None
        lanes = self._lanes
        if model.prefill_on_lane:
            heapq.heapreplace(lanes, lanes[0] + model.service_s(last_job.prefill_tokens, last_job.decode_steps))
        else:
            heapq.heapreplace(lanes, lanes[0] + last_job.decode_steps * model.lane_step_s)
            self._prefills += model.prefill_s(last_job.prefill_tokens)
        self._last, self._last_job, self._kept_len = rec, job, len(kept)
        self._extended += 1
        return self._finish(job, now, model)

    def seed(self, rec: RequestRecord, job: PendingJob, model: DeviceModel, kept: Sequence[PendingJob],
             waiting: Sequence[RequestRecord], epoch: int) -> None:
        """Start a chain at ``rec`` after an afresh estimate, when every one of ``waiting`` (the kept waiting
        requests, in arrival order, ``rec`` not among them) is queued in ``rec``'s flow; else none.
        O(kept · log lanes), once per chain."""
        self.clear()
        flow = _flow(rec)
        if not waiting or any(r.state != QUEUED or _flow(r) != flow for r in waiting):
            return
        by_id = {j.id: j for j in kept}
        queued = [by_id[r.request_id] for r in waiting]
        skip = {r.request_id for r in waiting}
        skip.add(job.id)
        ahead = [j for j in kept if j.id not in skip]
        ahead.extend(queued)
        lanes = [0.0] * model.lanes
        prefills = 0.0
        on_lane, step = model.prefill_on_lane, model.lane_step_s
        for j in ahead:
            if on_lane:
                length = model.service_s(j.prefill_tokens, j.decode_steps)
            else:
                length = j.decode_steps * step
                prefills += model.prefill_s(j.prefill_tokens)
            heapq.heapreplace(lanes, lanes[0] + length)
        self._epoch, self._model, self._flow = epoch, model, flow
        self._last, self._last_job, self._kept_len = rec, job, len(kept)
        self._lanes, self._prefills = lanes, prefills
        self._seeded += 1

    def _finish(self, job: PendingJob, now: float, model: DeviceModel) -> float:
        """``job`` on the earliest lane after the jobs ahead, from ``now`` (and their prefills, when not on lanes)."""
        if model.prefill_on_lane:
            return now + (self._lanes[0] + model.service_s(job.prefill_tokens, job.decode_steps))
        start = now + (self._prefills + model.prefill_s(job.prefill_tokens))
        return start + (self._lanes[0] + job.decode_steps * model.lane_step_s)

    def statistics(self) -> OrderChainStatistics:
        return OrderChainStatistics(self._extended, self._seeded)
