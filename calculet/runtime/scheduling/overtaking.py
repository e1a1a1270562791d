"""How much later work will be admitted ahead of a waiting request (issue #13, the finish estimate, §5.3, §7.2).

Why this module exists: where the admission queue's order decides who finishes when (one KV lane on B1,
B16 with 16 sequences: :func:`.finish_estimate.admission_order_finish`), a request that waits is
estimated behind the requests waiting *now*. The §5.3 queue then admits ahead of it every later arrival
of another tenant tagged before it: a tenant with little waiting tags a newcomer from global virtual time,
while the waiting request's tag carries its own tenant's backlog. Issue #13 measured the backlogged
tenant's estimates early by a signed median of 11-19 % (steady at 2x, one KV lane, B8, B16) and the other
tenant's unbiased, and an oracle crediting each request with the later arrivals that did start before it
took calculet-b1's P90 from 23 / 33 % to 21 / 18 % (steady / bursty).

Two things bound that work, and the estimate uses both:

* **the tag window** (§5.3): another tenant ``f`` gets ahead of the candidate only with tags below the
  candidate's ``F``, so at most ``(F - S_f) · w_f`` of cost, ``S_f`` the tag of ``f``'s last waiting request
  (or its virtual start when none waits); within it, at the rate ``f``'s requests are accepted (exponentially
  weighted over :data:`RATE_WINDOW_S`), for as long as the candidate waits — the fixed point ``W = W0 +
  Σ_f min(a_f · W, b_f)``, each tenant's cost turned into lane seconds at the candidate's own
  seconds per cost unit and spread over the lanes;
* **its slack** (§7.2): a request pushed towards its deadline becomes at risk and is served by deadline
  (:func:`.on_time_planner.at_risk_prefix`; the prefill queue takes it first), so overtaking ends before
  the deadline. How far before, the estimate does not know: the later arrivals' work varies request by
  request far more than its mean (a mean-rate term alone moved calculet-b1 steady from 23 to 67 % at load 1).
  It takes :data:`SLACK_SHARE` of the slack left after its queue-order finish: the middle of the interval
  the finish falls in, between no overtaking and overtaking up to the deadline.

Measured (issue #13 session 10, the bench's error, every load of steady / bursty pooled, on-time counts and
every decision unchanged: the estimate is reported and scored, admission decides by the EDF plan): one KV
lane (calculet-b1) P90 23.2 -> 18.9 % and 32.6 -> 21.3 %, signed median -0.9 -> +2.1 and -2.0 -> +0.7 %;
with all of the slack instead of half, 25.2 and 24.7 %. Applied on one lane only
(:func:`.on_time_planner._overtaken`): there the service is the B1 step and the wait's bias is the error.
With lanes the lanes free at the per-token time, which varies request by request far more: calculet-b4
steady at 1x went 32 -> 42 %, and with the window from the candidate's own start 27 -> 246 % at 2x; on two
lanes of B1 (calculet-b1-pingpong) steady at 0.5x 24 -> 42 %.
Pure: plain values in, plain values out, and one small state, the rates.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

RATE_WINDOW_S = 60.0
"""Time constant of the accepted-cost rates: about a request's wait under the presets' 120 s deadlines."""
SLACK_SHARE = 0.5
"""Share of the slack the overtakers are expected to take (module doc): the middle of the interval. Against all of
it on calculet-b1: P90 steady 25.2 % with all, 18.9 % with half; bursty 24.7 / 21.3 % (every load pooled)."""
_ITERATIONS = 64


class Overtaking:
    """Accepted cost per tenant over time, and the delay it predicts for a waiting candidate (module doc)."""

    __slots__ = ("_rates",)

    def __init__(self) -> None:
        self._rates: dict[str, tuple[float, float]] = {}
        """Per tenant: (accepted §5.3 cost, exponentially decayed, at the instant it was last updated)."""

    def accepted(self, tenant: str, cost: float, now: float) -> None:
        """A request of ``tenant`` with WFQ ``cost`` was accepted at ``now``."""
        total, when = self._rates.get(tenant, (0.0, now))
        self._rates[tenant] = (total * math.exp(-(now - when) / RATE_WINDOW_S) + cost, now)

    def rate(self, tenant: str, now: float) -> float:
        """``tenant``'s accepted cost per second around ``now`` (0: none accepted)."""
        total, when = self._rates.get(tenant, (0.0, now))
        return total * math.exp(-(now - when) / RATE_WINDOW_S) / RATE_WINDOW_S

    def delay(self, tenant: str, tag: float, wait: float, lane_s_per_cost: float, slack: float, now: float,
              others: Iterable[tuple[str, float, float]]) -> float:
        """Seconds later a candidate of ``tenant`` finishes than its queue-order estimate.

        ``tag``: its admitted tag (cost per weight); ``wait``: how long the estimate has it wait for a lane;
        ``lane_s_per_cost``: lane seconds per cost unit, over the lanes; ``slack``: deadline minus the estimate;
        ``others``: (tenant, its window's start ``S_f``, its weight) for every other tenant."""
        if wait <= 0 or slack <= 0:
            return 0.0
        terms = []
        for name, start, weight in others:
            if name == tenant or start >= tag:
                continue
            rate = self.rate(name, now)
            if rate > 0:
                terms.append((rate * lane_s_per_cost, (tag - start) * weight * lane_s_per_cost))
        return min(SLACK_SHARE * slack, fixed_point_wait(wait, terms) - wait)


def fixed_point_wait(wait: float, terms: Iterable[tuple[float, float]]) -> float:
    """The least ``W ≥ wait`` with ``W = wait + Σ min(a · W, b)`` over ``terms`` (a, b ≥ 0): each term is work
    arriving at ``a`` seconds per second of waiting, up to ``b`` seconds. Iterated from ``wait`` upwards (the map
    is monotone and bounded by ``wait + Σ b``), to within a millisecond."""
    terms = list(terms)
    w = wait
    for _ in range(_ITERATIONS):
        nxt = wait + sum(min(a * w, b) for a, b in terms)
        if nxt - w < 1e-3:
            return nxt
        w = nxt
    return w


def window_starts(tenants: Mapping[str, float], last_tags: Mapping[str, float],
                  virtual_start: Callable[[str], float]) -> list[tuple[str, float, float]]:
    """(tenant, window start, weight) per configured tenant: its last waiting request's tag, else its virtual start."""
    return [(name, last_tags[name] if name in last_tags else virtual_start(name), weight)
            for name, weight in tenants.items()]
