"""A declared invariant judged over the parts of a check restricted to what moved (#17, #20).

Why a module of its own: the monitors that check only what moved — the requests × lanes joint
check (:mod:`.joint_checks`), the KV pool check (:mod:`.kv_checks`) and the jobs × lanes check
(:mod:`.job_lane_monitor`) — split the live system into unlinked parts and judge each declared
invariant as the conjunction of its predicate over the parts' views; each module proves with z3
(or argues, invariant by invariant) that this equals the predicate on the whole. The wrapper
keeps the invariant's name and R-id, so a violation is reported exactly as the declaration
names it. A monitor whose parts have another shape overrides :meth:`AcrossParts.predicate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class AcrossParts:
    """A declared invariant (pool or system) over parts: true when its predicate holds on each part's view."""

    invariant: Any

    @property
    def name(self) -> str:
        return self.invariant.name

    @property
    def rid(self) -> str:
        return self.invariant.rid

    def predicate(self, parts: Any) -> bool:
        views: Iterable[Any] = (p.view for p in parts)
        return all(self.invariant.predicate(view) for view in views)
