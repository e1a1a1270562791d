"""§16 durations as histograms: batch wait, KV free latency, host time per tick, recovery time.

Why: an average and a maximum cannot answer "what share of batches waited over 50 ms" or give a
p99 to alert on; the runtime components keep each measured duration in a
:class:`~calculet.runtime.distribution.Distribution` (buckets chosen per duration, see that
module) and this module exports the snapshots their ``statistics()`` carry as Prometheus
histograms. The ``*_avg_seconds`` / ``*_max_seconds`` gauges stay beside them (same numbers,
for dashboards that already read them). The request-phase histograms (queue time, prefill
time, decode time per token) are measured by the service as requests move through their §2
states: :class:`~calculet.server.request_metrics.RequestPhases`.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from calculet.runtime.distribution import BATCH_WAIT_BOUNDS, FREE_LATENCY_BOUNDS, HOST_TICK_BOUNDS, RECOVERY_BOUNDS
from calculet.runtime.engine.types import EngineStatistics
from calculet.server.metrics_families import histogram


def runtime_histograms(s: EngineStatistics) -> list[Metric]:
    """The four runtime distributions (an empty histogram until the first value)."""
    return [
        histogram("calculet_batch_wait_seconds", "Wait of each decode batch's oldest lane in Ready before "
                  "dispatch (§16 batch wait).", s.scheduler.decode.batch_wait, BATCH_WAIT_BOUNDS),
        histogram("calculet_kv_free_latency_seconds", "Release → confirmed-free latency of each KV lane "
                  "(§16 KV free latency).", s.scheduler.kv.free_latency, FREE_LATENCY_BOUNDS),
        histogram("calculet_engine_tick_host_seconds", "Host time of each actor tick (§16 executor; above a "
                  "device step the host is the bottleneck).", s.host_tick, HOST_TICK_BOUNDS),
        histogram("calculet_recovery_time_seconds", "Fault to serving again, per successful reset or restart "
                  "(§16 recovery time).", s.recovery.recovery_time, RECOVERY_BOUNDS),
    ]


__all__ = ["runtime_histograms"]
