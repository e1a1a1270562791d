"""A declared invariant judged over the parts of a check restricted to what moved (#17, #20).

Why a module of its own: the monitors that check only what moved — the requests × lanes joint
check (:mod:`.joint_checks`), the KV pool check (:mod:`.kv_checks`) and the jobs × lanes check
(:mod:`.job_lane_monitor`) — split the live system into unlinked parts and judge each declared
invariant as the conjunction of its predicate over the parts' views; each module proves with z3
(or argues, invariant by invariant) that this equals the predicate on the whole. The wrapper
keeps the invariant's name and R-id, so a violation is reported exactly as the declaration
names it. A part may carry its verdict already (``broken``: the invariants a check generated from the
declared predicates found false on it, issue #20), else the declared predicate is evaluated on its view.
A monitor whose parts have another shape overrides :meth:`AcrossParts.predicate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AcrossParts:
    """A declared invariant (pool or system) over parts: true when no part breaks it — by the part's generated
    verdict (``part.broken``) where it has one, else by the predicate on the part's view."""

    invariant: Any

    @property
    def name(self) -> str:
        return self.invariant.name

    @property
    def rid(self) -> str:
        return self.invariant.rid

    def predicate(self, parts: Any) -> bool:
        name, declared = self.invariant.name, self.invariant.predicate
        for part in parts:
            if part.broken is None:
                if not declared(part.view):
                    return False
            elif name in part.broken:
                return False
        return True
