"""The HTTP front's early refusals as Prometheus families (issue #13: time to 429 under a burst).

Why a collector of its own: a request the event loop refuses from the actor's admission snapshot
(:mod:`calculet.runtime.engine.admission_snapshot`) never reaches the engine, so the engine's ``no_prospect``
and ``calculet_scheduler_on_time_refused`` do not count it; these series do, beside them. The forward reasons
are a bounded set (:data:`FORWARD_REASONS`).

The refusal lane (:mod:`calculet.server.refusal_lane`, the 429s the httptools protocol answers before any ASGI task)
has families of its own, ``calculet_front_lane_*`` (DESIGN.md: statistics() on every component, exported): its
refusals are a part of ``calculet_front_refused`` (it decides with the same snapshot call), so they say how much of
the front's work skipped the ASGI stack; its declines, holds and the ``prepare`` memo's hits say why the rest did
not. A service served without the lane (h11, or no app yet) exports the same series at zero (R16.9).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from calculet.runtime.engine.early_refusal import FORWARD_REASONS, EarlyAdmissionStatistics
from calculet.server.lane_statistics import RefusalLaneStatistics
from calculet.server.metrics_families import by, counter, gauge


def front_families(s: EarlyAdmissionStatistics) -> list[Metric]:
    """The front's counters: refusals (with or without a retry time), forwards by reason, the snapshot's age."""
    return [
        by(counter("calculet_front_refused", "Requests the HTTP front answered 429 from the actor's admission "
                   "snapshot, without the engine: no prospect of finishing by the deadline (§5.2), counted here and "
                   "not in calculet_scheduler_on_time_refused or calculet_admission_no_prospect; "
                   "'cannot_finish_ever': late even on an idle device (no Retry-After).", labels=["reason"]),
           {"cannot_finish": s.refused - s.refused_never, "cannot_finish_ever": s.refused_never},
           ("cannot_finish", "cannot_finish_ever")),
        by(counter("calculet_front_forwarded", "Requests the HTTP front handed to the engine, by why the admission "
                   "snapshot could not refuse them.", labels=["reason"]), s.forwarded, FORWARD_REASONS),
        counter("calculet_front_held", "Requests that found no admission snapshot while requests were on their way "
                "to the actor, and waited (at most 3 x 20 ms) for its next answer before being decided.", s.held),
        counter("calculet_front_refused_provisional", "Refusals of calculet_front_refused that counted requests the "
                "front had forwarded on the same admission snapshot and the engine had not decided yet (appended to its "
                "lanes as the engine appends them): the first 429s of a burst, before the engine answered.",
                s.provisional),
        gauge("calculet_front_refusal_snapshot_age_max_seconds", "The oldest admission snapshot a refusal was "
              "made from (seconds between the actor publishing it and the refusal).", s.max_refusal_age_s),
        gauge("calculet_front_forwarded_per_snapshot_max_requests", "The most requests forwarded on one snapshot "
              "before the actor replaced it (work the snapshot did not count; it can only make a refusal surer).",
              s.max_forwarded_since_snapshot),
        gauge("calculet_front_retry_slots", "Retry slots the front holds for the clients it refused (their "
              "Retry-After spreads their retries over the time the device frees).", s.retry_slots),
    ]


class FrontCollector(Collector):
    """Reads the front's statistics at scrape time."""

    def __init__(self, statistics: Callable[[], EarlyAdmissionStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterable[Metric]:
        return front_families(self._statistics())


def lane_families(s: RefusalLaneStatistics | None) -> list[Metric]:
    """The refusal lane's counters (its :meth:`~calculet.server.refusal_lane.RefusalLane.statistics`); ``None``: no
    lane (zeros, the same series)."""
    refused, declined, held, hits, entries = ((s.refused, s.declined, s.held, s.memo_hits, s.memo_entries)
                                              if s is not None else (0, 0, 0, 0, 0))
    return [
        counter("calculet_front_lane_refused", "Generation requests the refusal lane answered 429 in the HTTP "
                "protocol, before any ASGI task (a part of calculet_front_refused).", refused),
        counter("calculet_front_lane_declined", "Generation requests the refusal lane handed to the ASGI app: invalid "
                "(answered by the full path), not refused by the admission snapshot, or not decidable in the "
                "protocol.", declined),
        counter("calculet_front_lane_held", "Generation requests the refusal lane held for the engine's next answer "
                "before deciding them (each counted once).", held),
        counter("calculet_front_lane_memo_hits", "Generation bodies the refusal lane found parsed already (its memo "
                "of the route's prepare, per route and body bytes).", hits),
        gauge("calculet_front_lane_memo_entries", "Bodies in the refusal lane's memo of prepare (bounded).", entries),
    ]


class LaneCollector(Collector):
    """Reads the refusal lane's statistics at scrape time (``statistics`` returns None while no lane serves)."""

    def __init__(self, statistics: Callable[[], RefusalLaneStatistics | None]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterable[Metric]:
        return lane_families(self._statistics())


__all__ = ["FrontCollector", "LaneCollector", "front_families", "lane_families"]
