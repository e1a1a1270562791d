"""How much later work will be admitted ahead of a waiting request (issue #13, the finish estimate, §5.3, §7.2).

Why this module exists: where the admission queue's order decides who finishes when (one KV lane on B1,
B16 with 16 sequences, B1 ping/pong with two: :func:`.finish_estimate.admission_order_finish`), a request
that waits is estimated behind the requests waiting *now*. The §5.3 queue then admits ahead of it every later
arrival of another tenant tagged before it: a tenant with little waiting tags a newcomer from global virtual
time, while the waiting request's tag carries its own tenant's backlog. Issue #13 measured the backlogged
tenant's estimates early by a signed median of 11-19 % (steady at 2x, one KV lane, B8, B16) and the other
tenant's unbiased, and an oracle crediting each request with the later arrivals that did start before it
took calculet-b1's P90 from 23 / 33 % to 21 / 18 % (steady / bursty).

Two things bound that work, and the estimate uses both:

* **the tag window** (§5.3): another tenant ``f`` gets ahead of the candidate only with tags below the
  candidate's ``F``, so at most ``(F - S_f) · w_f`` of cost, ``S_f`` the tag of ``f``'s last waiting request
  (or its virtual start when none waits); within it, at the rate ``f``'s requests are accepted (exponentially
  weighted over :data:`RATE_WINDOW_S`), for as long as the candidate waits — the fixed point ``W = W0 +
  Σ_f min(a_f · W, b_f)``. Each tenant's work is counted in *its own* lane seconds (what its accepted
  requests hold a lane for, :meth:`.DeviceModel.service_s`), spread over the lanes: ``a_f`` is its accepted
  lane seconds per second over ``lanes``, ``b_f`` its window at its own lane seconds per cost unit;
* **its slack** (§7.2): a request pushed towards its deadline becomes at risk and is served by deadline
  (:func:`.on_time_planner.at_risk_prefix`; the prefill queue takes it first), so overtaking ends before
  the deadline. How far before, the estimate does not know: the later arrivals' work varies request by
  request far more than its mean (a mean-rate term alone moved calculet-b1 steady from 23 to 67 % at load 1).
  It takes at most :data:`SLACK_SHARE` of the slack left after its queue-order finish, and at most
  :data:`WAIT_SHARE` of the wait the queue's order gives it (session 15, below).

The two shares were chosen on the steady / bursty presets (issue #13 session 15: a quarter of the slack and half
the wait, against half the slack and no cap on the wait, met steady calculet-b4, P90 26.1 -> 24.8 %) and checked on
two seeds the choice did not see (101, 102: the same presets' rows, 13 of 20 better, 4 worse, bursty calculet-b8
of seed 102 25.4 -> 24.8 %, no verdict lost). They are a fit, not a model: where the overtakers' work lands
between no overtaking and the deadline, the estimate does not know; the figures are in ``docs/estimator.md``.

Measured effect on the estimate's error, and the variants tried and not kept: ``docs/estimator.md``
(the split per term comes from ``bench/estimate_components.py``).

Pure: plain values in, plain values out, and one small state, the rates.
"""

from __future__ import annotations

import math
from bisect import insort
from typing import Callable, Iterable, Mapping

RATE_WINDOW_S = 60.0
"""Time constant of the accepted-cost rates: about a request's wait under the presets' 120 s deadlines."""
SLACK_SHARE = 0.25
"""Most of the slack the overtakers are expected to take (module doc). Session 10 measured half against all of it on
calculet-b1 (P90 steady 25.2 % with all, 18.9 % with half; bursty 24.7 / 21.3 %); session 15 a quarter with the
:data:`WAIT_SHARE` cap against half with none (every row of steady / bursty, ``docs/estimator.md``)."""
WAIT_SHARE = 0.5
"""Most of the queue-order wait the overtakers' work may add (module doc): on one seed of steady calculet-b4 at 1x
the rates predicted, within the slack, later arrivals that never came (the estimate late by 25-63 %)."""
_ITERATIONS = 64


class Overtaking:
    """Accepted work per tenant over time, and the delay it predicts for a waiting candidate (module doc)."""

    __slots__ = ("_rates", "_rank", "_present")

    def __init__(self, weights: Mapping[str, float]) -> None:
        """``weights``: the configured tenants' weights, in the order the delay sums their terms (configuration
        order)."""
        self._rates: dict[str, tuple[float, float, float]] = {}
        """Per tenant: (accepted §5.3 cost, accepted lane seconds, both exponentially decayed, at the instant they
        were last updated)."""
        self._rank = {name: (i, float(weight)) for i, (name, weight) in enumerate(weights.items())}
        self._present: list[tuple[int, str, float]] = []
        """(rank, name, weight) of the configured tenants with accepted work (the only ones whose term can be
        non-zero), in configuration order: :meth:`delay` walks these, not every configured tenant (issue #20: a queued ``submit()`` with 1 000
        configured tenants and 8 sending walked 1 000 window starts, 0.4-0.6 ms). A tenant joins at its first
        acceptance (a bisection, once per tenant) and stays: its decayed rate is never exactly zero."""

    def accepted(self, tenant: str, cost: float, seconds: float, now: float) -> None:
        """A request of ``tenant`` with WFQ ``cost`` that holds a lane ``seconds`` alone was accepted at ``now``."""
        rates = self._rates
        prior = rates.get(tenant)
        if prior is None:
            known = self._rank.get(tenant)
            if known is not None:
                insort(self._present, (known[0], tenant, known[1]))
            rates[tenant] = (0.0 + cost, 0.0 + seconds, now)  # 0.0 · exp(0) + cost: nothing to decay
            return
        total, lane_s, when = prior
        keep = math.exp(-(now - when) / RATE_WINDOW_S)
        rates[tenant] = (total * keep + cost, lane_s * keep + seconds, now)

    def rate(self, tenant: str, now: float) -> float:
        """``tenant``'s accepted cost per second around ``now`` (0: none accepted)."""
        total, _, when = self._rates.get(tenant, (0.0, 0.0, now))
        return total * math.exp(-(now - when) / RATE_WINDOW_S) / RATE_WINDOW_S

    def lane_rate(self, tenant: str, now: float) -> float:
        """``tenant``'s accepted lane seconds per second around ``now`` (0: none accepted)."""
        _, lane_s, when = self._rates.get(tenant, (0.0, 0.0, now))
        return lane_s * math.exp(-(now - when) / RATE_WINDOW_S) / RATE_WINDOW_S

    def delay(self, tenant: str, tag: float, wait: float, lanes: int, slack: float, now: float,
              last_tags: Mapping[str, float], virtual_start: Callable[[str], float]) -> float:
        """Seconds later a candidate of ``tenant`` finishes than its queue-order estimate.

        ``tag``: its admitted tag (cost per weight); ``wait``: how long the estimate has it wait for a lane (the
        delay is at most :data:`WAIT_SHARE` of it);
        ``lanes``: the lanes the work spreads over; ``slack``: deadline minus the estimate. Every other configured
        tenant ``f`` with accepted work has a window from ``S_f`` (its last waiting request's tag in ``last_tags``, else
        its ``virtual_start``) to ``tag``, at its configured weight."""
        if wait <= 0 or slack <= 0:
            return 0.0
        terms = []
        rates, last = self._rates, last_tags.get
        exp = math.exp
        for _, name, weight in self._present:
            if name == tenant:
                continue
            start = last(name)
            if start is None:
                start = virtual_start(name)
            if start >= tag:
                continue
            total, lane_s, when = rates[name]
            if total > 0 and lane_s > 0:  # lane_rate(name, now) / lanes, its arithmetic inlined
                terms.append((lane_s * exp(-(now - when) / RATE_WINDOW_S) / RATE_WINDOW_S / lanes,
                              (tag - start) * weight * lane_s / total / lanes))
        return min(SLACK_SHARE * slack, WAIT_SHARE * wait, fixed_point_wait(wait, terms) - wait)


def fixed_point_wait(wait: float, terms: Iterable[tuple[float, float]]) -> float:
    """The least ``W ≥ wait`` with ``W = wait + Σ min(a · W, b)`` over ``terms`` (a, b ≥ 0): each term is work
    arriving at ``a`` seconds per second of waiting, up to ``b`` seconds. Iterated from ``wait`` upwards (the map
    is monotone and bounded by ``wait + Σ b``), to within a millisecond. The sum is ``sum(min(a * w, b) ...)``
    written out (the same additions in the same order, ``min``'s choice on ties; #20: a generator and a ``min``
    call per term and iteration were a tenth of a queued submit with 8 tenants sending)."""
    terms = list(terms)
    if not terms:  # wait + 0: the first iteration's answer
        return wait
    w = wait
    for _ in range(_ITERATIONS):
        total = 0
        for a, b in terms:
            x = a * w
            total += b if b < x else x  # min(x, b): x unless b is smaller
        nxt = wait + total
        if nxt - w < 1e-3:
            return nxt
        w = nxt
    return w

