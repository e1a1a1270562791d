"""The HTTP front's early refusals as Prometheus families (issue #13: time to 429 under a burst).

Why a collector of its own: a request the event loop refuses from the actor's admission snapshot
(:mod:`calculet.runtime.engine.admission_snapshot`) never reaches the engine, so the engine's ``no_prospect``
and ``calculet_scheduler_on_time_refused`` do not count it; these series do, beside them. The forward reasons
are a bounded set (:data:`FORWARD_REASONS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from calculet.runtime.engine.admission_snapshot import FORWARD_REASONS, EarlyAdmissionStatistics
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


__all__ = ["FrontCollector", "front_families"]
