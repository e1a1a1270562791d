"""A trace's past joined to another trace's future (issue #13: the estimate's information bound).

Why this exists: the question "how well could *any* estimate made at a request's submit predict
its finish?" needs samples of the finish given only the present. The presets' arrivals are
(inhomogeneous) Poisson with a known intensity, and each request's attributes are drawn per
request, independently of the arrival times (:func:`calculet.loadsim.workload.generate_requests`:
one stream for the times, one for the tenants, one per tenant and attribute). By Poisson's
independent increments, the requests another seed's trace offers after ``cut_s`` have the
conditional law of this trace's future given its past; the simulation is deterministic given the
trace, so running the spliced trace draws one finish from that law.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from calculet.errors import DefinitionError
from calculet.loadsim.workload import SimRequest

__all__ = ["splice_future"]


def splice_future(actual: Sequence[SimRequest], future: Sequence[SimRequest], cut_s: float,
                  horizon_s: float = math.inf) -> tuple[SimRequest, ...]:
    """``actual``'s requests arriving at or before ``cut_s``, then ``future``'s arriving in ``(cut_s, horizon_s)``.

    The prefix keeps its order and positions (the runner's ``request_id`` is the input index, so a
    request of the past has the same id in every splice); the suffix follows in arrival order. Both
    inputs must be sorted by arrival, as :func:`~calculet.loadsim.runner.run_engine` requires.
    ``horizon_s`` drops arrivals that cannot matter to the request studied (it has ended by then).
    """
    for name, trace in (("actual", actual), ("future", future)):
        if any(b.arrival_s < a.arrival_s for a, b in zip(trace, trace[1:])):
            raise DefinitionError(f"the {name} trace must be sorted by arrival_s")
    if not (math.isfinite(cut_s) and horizon_s >= cut_s):
        raise DefinitionError(f"need a finite cut and horizon >= cut, got cut {cut_s}, horizon {horizon_s}")
    prefix = tuple(r for r in actual if r.arrival_s <= cut_s)
    suffix = tuple(r for r in future if cut_s < r.arrival_s < horizon_s)
    return prefix + suffix
