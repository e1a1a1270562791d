"""When a KV lane frees: the one arithmetic of every lane schedule (issue #13 item 2, "one estimator"; DESIGN: declare
once and derive).

Why this module exists: a job's finish on a lane was written four times — the planner's EDF list schedule
(:func:`~.finish_estimate.edf_schedule` and the overload selection), the admission cache's tail placement
(:meth:`~.on_time_cache._EdfCache.place`), its fast refusal (:meth:`~.on_time_cache._EdfCache.tail_finish`) and the
HTTP front's copy of the placement (:mod:`calculet.runtime.engine.admission_snapshot`) — as equal sums in different
orders: ``free + service + steps × handover``, ``free + steps × (step + handover) + prefill``,
``free + (service + steps × handover)``. Equal on paper, they differ in the last bit, and a ``Retry-After`` is a
ceiling: the front's differed from the engine's by 1 s in 27 of 24 000 random runs of the lagging-engine property
test's body (``tests/unit/runtime/engine/test_admission_snapshot.py``), in none of the same runs since. The cache
and the front call :func:`lane_finish`, so the front's lanes are the engine's by construction; the list schedule
sums as it does (a test holds them equal: ``tests/unit/runtime/scheduling/test_lane_time.py``).

The sum is the list schedule's (the planner's full plan, which decides whom to keep and shed): taking it kept the
planner's decisions as they were, bit for bit; only the cache's tail placement moved, to agree with the plan it
appends to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # for the type only: the list schedule's module may call lane_finish without an import cycle
    from calculet.runtime.scheduling.finish_estimate import DeviceModel

__all__ = ["LaneCost", "lane_finish"]


def lane_finish(free: float, now: float, length: float, turnover: float = 0.0) -> float:
    """The finish of a job appended at ``now`` to a lane free at ``free``: it holds the lane ``length`` seconds
    (its service: :meth:`~.finish_estimate.DeviceModel.service_s` where its prefill runs on its lane, its decode
    steps alone where the prefill backlog runs first), plus ``turnover`` (its decode steps ×
    :attr:`~.finish_estimate.DeviceModel.handover_s`) when another job holds the lane until then. A lane free by
    ``now`` starts it at ``now``, with no turnover."""
    return now + length if free <= now else free + (length + turnover)


class LaneCost(NamedTuple):
    """A job's two lane lengths on one device model, for placing it many times (the HTTP front's forwards, whose
    lanes are rebuilt at every snapshot). Ordered by ``length`` first."""

    length: float
    """Seconds it holds a lane free now (:meth:`~.finish_estimate.DeviceModel.service_s`) ..."""
    turnover: float
    """... and the extra when it starts on a lane another job holds (:func:`lane_finish`)."""

    @classmethod
    def of(cls, model: DeviceModel, prefill_tokens: int, decode_steps: int) -> LaneCost:
        """The lengths of a job whose prefill runs on its lane (``model.prefill_on_lane``)."""
        return cls(model.service_s(prefill_tokens, decode_steps), decode_steps * model.handover_s)

    def finish(self, free: float, now: float) -> float:
        """Its finish appended at ``now`` to the lane free at ``free`` (:func:`lane_finish`)."""
        return lane_finish(free, now, self.length, self.turnover)
