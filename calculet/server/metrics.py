"""Prometheus metrics (§16): a custom Collector reading ``Engine.statistics()`` at scrape time.

The latencies, HTTP counts, request phases and starvation events only the service layer can
see are recorded as requests pass, in :mod:`calculet.server.request_metrics`; the process's own
series and the exposition format are :mod:`calculet.server.metrics_runtime`; all share the
app's registry.

Naming: ``calculet_<component>_<what>_<unit>`` in base units (seconds, tokens, lanes, bytes);
counters end in ``_total``. Labels come only from bounded sets (§16, R16.9): tenant names
from the configuration, model aliases, queue names, machine states, admission decisions, fault
reasons, CalRT return-code names, route templates, status codes. Every bounded label value is
exported from the start (a zero is a fact too), so the set of series never depends on how many
requests were served. Request and job ids appear only in logs and traces (R16.10).

Where each row is built:

==========  ==================================================================================
admission   :mod:`~calculet.server.metrics_scheduling` (``AdmissionStatistics``)
queues      :mod:`~calculet.server.metrics_scheduling`: depth and oldest wait of decode/short/medium/long
batch       ``metrics_scheduling``; batch wait histogram in ``metrics_histograms``
KV          ``metrics_scheduling``; free latency histogram in ``metrics_histograms``
executor    :mod:`~calculet.server.metrics_device`; host tick histogram in :mod:`~calculet.server.metrics_histograms`
model       :mod:`~calculet.server.metrics_device` (ModelAdmin status, ModelManager statistics)
fairness    :mod:`~calculet.server.metrics_scheduling`; starvation events in :mod:`~calculet.server.request_metrics`
recovery    ``metrics_device``; recovery time histogram in ``metrics_histograms``
latency     TTFT, inter-token, end-to-end, queue, prefill, decode per token: :mod:`~calculet.server.request_metrics`
goodput     :mod:`~calculet.server.metrics_goodput` (issue #13)
==========  ==================================================================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from calculet.config import SchedulerConfig
from calculet.runtime.engine.types import EngineStatistics
from calculet.server import metrics_device, metrics_scheduling
from calculet.server.metrics_families import gauge
from calculet.server.metrics_goodput import goodput, on_time
from calculet.server.metrics_histograms import runtime_histograms
from calculet.server.metrics_scheduling import ServedModelFacts

log = logging.getLogger("calculet.server.metrics")


class EngineCollector(Collector):
    """Reads every component's statistics at scrape time and turns them into §16 families."""

    def __init__(self, *, statistics: Callable[[], EngineStatistics], models: Callable[[], list[dict[str, Any]]],
                 config: SchedulerConfig, facts: ServedModelFacts) -> None:
        self._statistics = statistics
        self._models = models
        self._config = config
        self._facts = facts
        self._tenants = tuple(t.name for t in config.tenants)

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        try:
            stats = self._statistics()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the engine is busy or gone
            log.exception("engine statistics unavailable for this scrape")
            stats = None
        families: list[Metric] = []
        if stats is not None:
            config, facts = self._config, self._facts
            families.extend(metrics_device.engine(stats))
            families.extend(metrics_scheduling.admission(stats, config, facts))
            families.extend(metrics_scheduling.queues(stats))
            families.extend(metrics_scheduling.batch(stats, facts))
            families.extend(metrics_scheduling.kv(stats, facts))
            families.extend(metrics_device.executor(stats))
            families.extend(metrics_scheduling.fairness(stats, config))
            families.extend(metrics_device.recovery(stats))
            families.extend(runtime_histograms(stats))
            families.extend(goodput(stats, self._tenants or ("default",)))
            families.extend(on_time(stats))
        families.extend(metrics_device.model(stats, self._models))
        families.extend(metrics_device.invariants())
        families.append(gauge("calculet_metrics_scrape_duration_seconds",
                              "Time spent reading the engine's statistics for this scrape (s).",
                              time.perf_counter() - started))
        return families


__all__ = ["EngineCollector", "ServedModelFacts"]
