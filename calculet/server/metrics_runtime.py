"""The process's own series and the /metrics exposition format (§16; what every Prometheus target offers).

Why: an operator's first questions about a serving process — is it leaking memory, how much CPU
does it burn, which Python runs it, is the garbage collector busy — are answered by the
``process_*`` and ``python_*`` series of prometheus-client's default collectors, which every
existing dashboard reads; they are added to the app's private registry (tests run several
services in one process, so the global registry is never used). And a scraper that asks for
OpenMetrics (``Accept: application/openmetrics-text``, Prometheus' default since 2.5) gets it,
with its ``# EOF`` and unit metadata; any other client gets text format 0.0.4.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder


def add_process_collectors(registry: CollectorRegistry) -> None:
    """``process_*`` (CPU, memory, file descriptors, start time), ``python_info`` and ``python_gc_*``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The scrape body and its content type, negotiated on the ``Accept`` header."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


__all__ = ["add_process_collectors", "exposition"]
