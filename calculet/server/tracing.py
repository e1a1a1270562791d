"""Request traces with OpenTelemetry (§16: request and job ids go to traces and logs, never to metric labels).

Why: a metric says the p99 queue time rose; a trace says which request waited, in which queue,
behind which prefill jobs, and in which decode batches (id, compiled profile, lanes) it then
ran. One trace per request:

``calculet.request``            arrival → terminal state (request id, tenant, token counts, outcome)
  ``calculet.admission``        arrival → admitted or refused (§5.2; a Queue outcome waits inside it)
  ``calculet.queue_wait``       admitted → its prefill job on the device (prefill queue class)
  ``calculet.prefill``          one per prefill job or chunk (job id)
  ``calculet.decode``           its decode batches, one span per run of batches of one compiled profile:
                                every batch's id, active lanes and engine (space-separated, in order), the step count

Why decode batches are attributes of one span and not a span each: a request has a decode batch
per generated token, and a span per token cost 20 % of the service's CPU per request on
``--sim-cost instant`` (``bench/tracing_overhead.py``); the lists keep every batch's id (shared
by the requests that rode in it; TraceQL ``=~`` finds them), lanes and engine, and a new span
starts when the profile changes. They are strings, not attribute arrays: the SDK validates and
the OTLP encoder wraps every array element one by one, which cost more than the span itself.
During the request only plain tuples are recorded (a few µs per transition on the actor thread);
the spans are built once, at its terminal state, each started and ended with its final
attributes — the SDK's per-span work is paid once per span, and a request the sampler drops
(``sample_ratio``) gets no span at all beyond the sampling decision.

Spans are built at the server/engine boundary from what the engine already reports: the
request's §2 transitions (the engine's request observer, on the actor thread) and the scheduler's
record of each planned job (``engine.job(job_id)``); the runtime knows nothing of tracing. Span
times are the engine clock's instants mapped onto the wall clock once, so a FakeClock gives
exact durations in tests. No prompt or completion text is ever an attribute, only counts.

Off by default: without ``monitoring.tracing.otlp_endpoint`` no tracer exists and the observer is
not installed (no cost per transition). With one, spans go through a batching processor to an
OTLP/HTTP exporter (``opentelemetry-exporter-otlp-proto-http``). Tests pass their own provider
(the SDK's in-memory exporter).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Status, StatusCode

from calculet.clock import Clock
from calculet.config.tracing import TracingConfig
from calculet.machines.request import TERMINAL, WAITING

log = logging.getLogger("calculet.server.tracing")

__all__ = ["RequestTracer", "otlp_provider"]

_DECIDING = WAITING  # not admitted yet: the admission decision is pending (RequestMachine's "waiting" group)
_ENDED = TERMINAL  # the states flagged terminal in the declaration (#17: never a parallel tuple)


def otlp_provider(config: TracingConfig) -> TracerProvider | None:
    """The provider exporting to ``config.otlp_endpoint`` with OTLP/HTTP; None when tracing is off."""
    if config.otlp_endpoint is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    log.info("request tracing on", extra={"otlp_endpoint": config.otlp_endpoint,
                                          "sample_ratio": config.sample_ratio})
    return provider


class _Trace:
    """What one request did, as plain values until its end (instants in ns)."""

    __slots__ = ("start", "admitted", "decision", "phases", "decodes", "profile", "ids", "lanes", "engines",
                 "decode_start", "decode_end", "failed", "open_at", "open_name", "open_attrs")

    def __init__(self, start: int) -> None:
        self.start = start
        self.admitted = 0
        self.decision = ""
        self.phases: list[tuple[str, int, int, dict[str, Any]]] = []
        """Ended queue-wait and prefill spans: (name, start, end, attributes)."""
        self.decodes: list[tuple[int, int, dict[str, Any]]] = []
        """Ended decode spans: (start, end, attributes)."""
        self.profile = 0
        self.ids: list[int] = []
        self.lanes: list[int] = []
        self.engines: list[str] = []
        self.decode_start = 0
        self.decode_end = 0
        self.failed = False
        self.open_at = 0
        self.open_name = ""
        self.open_attrs: dict[str, Any] = {}


class RequestTracer:
    """Turns a request's §2 transitions into its span tree (the engine's request observer).

    ``job(job_id)`` is the scheduler's record of a planned job (``ThreadedEngine.job``), read on the
    actor thread while the observer runs; ``alias`` names the served model in every root span.
    """

    def __init__(self, provider: trace.TracerProvider, clock: Clock, *,
                 job: Callable[[int], Any] | None = None, alias: str = "") -> None:
        self._tracer = provider.get_tracer("calculet.server.tracing")
        self._clock = clock
        self._job = job
        self._alias = alias
        self._offset_ns = time.time_ns() - int(clock.now() * 1e9)
        self._open: dict[int, _Trace] = {}

    def _ns(self, at: float) -> int:
        return self._offset_ns + int(at * 1e9)

    def observe(self, rec: Any, source: str, target: str) -> None:
        """``observer(rec, source, target)`` of the engine (a ``RequestRecord``)."""
        if source == target:
            return
        tr = self._open.get(rec.request_id)
        if tr is None:
            tr = self._open[rec.request_id] = _Trace(self._ns(rec.arrival))
        now = self._ns(self._clock.now())
        if source in _DECIDING and target not in _DECIDING:
            tr.admitted = now
            tr.decision = "admit" if target == "prefill_ready" else "reject" if rec.reject_status else target
            if target == "prefill_ready":
                self._open_phase(tr, "calculet.queue_wait", now, {"calculet.queue": rec.prefill_class})
        if target == "prefill_running":
            self._close_phase(tr, now)
            self._open_phase(tr, "calculet.prefill", now, {"calculet.batch.id": rec.job_id,
                                                           "calculet.queue": rec.prefill_class})
        elif source == "prefill_running":
            self._close_phase(tr, now)
            if target == "prefill_ready":  # the next chunk waits in its queue again
                self._open_phase(tr, "calculet.queue_wait", now, {"calculet.queue": rec.prefill_class})
        if target == "decode_running":
            self._decode_batch(tr, rec.job_id, now)
        elif source == "decode_running":
            tr.decode_end = now
            tr.failed = tr.failed or target not in ("decode_ready", "finishing")
        if target in _ENDED:
            del self._open[rec.request_id]
            self._close_phase(tr, now)
            self._close_decode(tr, now)
            self._emit(rec, tr, target, now)

    @property
    def open(self) -> int:
        """Requests whose trace is still open (0 once every request ended)."""
        return len(self._open)

    # ------------------------------------------------------------------ recording

    @staticmethod
    def _open_phase(tr: _Trace, name: str, now: int, attributes: dict[str, Any]) -> None:
        tr.open_name, tr.open_at, tr.open_attrs = name, now, attributes

    @staticmethod
    def _close_phase(tr: _Trace, now: int) -> None:
        if tr.open_name:
            tr.phases.append((tr.open_name, tr.open_at, now, tr.open_attrs))
            tr.open_name = ""

    def _decode_batch(self, tr: _Trace, job_id: int, now: int) -> None:
        """The request's lane went into decode batch ``job_id``: extend the decode run, or start one."""
        job = self._job(job_id) if self._job is not None else None
        profile = int(job.machine.lanes) if job is not None else 0
        if tr.ids and profile != tr.profile:
            self._close_decode(tr, tr.decode_end)
        if not tr.ids:
            tr.decode_start, tr.profile = now, profile
        tr.ids.append(job_id)
        active = getattr(job.work, "active", None) if job is not None else None
        tr.lanes.append(len(active) if active is not None else 0)
        tr.engines.append(job.engine.name.lower() if job is not None else "")

    @staticmethod
    def _close_decode(tr: _Trace, now: int) -> None:
        if not tr.ids:
            return
        tr.decodes.append((tr.decode_start, tr.decode_end or now, {
            "calculet.batch.profile": tr.profile, "calculet.batch.ids": " ".join(map(str, tr.ids)),
            "calculet.batch.lanes": " ".join(map(str, tr.lanes)), "calculet.batch.engines": " ".join(tr.engines),
            "calculet.decode.steps": len(tr.ids), "calculet.decode.ok": not tr.failed}))
        tr.ids, tr.lanes, tr.engines = [], [], []

    # ------------------------------------------------------------------ the spans, once

    def _emit(self, rec: Any, tr: _Trace, target: str, now: int) -> None:
        tracer = self._tracer
        root = tracer.start_span("calculet.request", start_time=tr.start, attributes={
            "calculet.request.id": rec.request_id, "calculet.tenant": rec.tenant, "calculet.model": self._alias,
            "calculet.prompt_tokens": rec.prompt_tokens, "calculet.max_new_tokens": rec.max_new_tokens,
            "calculet.outcome": target, "calculet.generation": rec.generation,
            "calculet.generated_tokens": rec.machine.generated_tokens})
        if not root.is_recording():
            return
        context = trace.set_span_in_context(root)
        tracer.start_span("calculet.admission", context=context, start_time=tr.start, attributes={
            "calculet.decision": tr.decision or target}).end(end_time=tr.admitted or now)
        for name, start, end, attributes in tr.phases:
            tracer.start_span(name, context=context, start_time=start, attributes=attributes).end(end_time=end)
        for start, end, attributes in tr.decodes:
            tracer.start_span("calculet.decode", context=context, start_time=start,
                              attributes=attributes).end(end_time=end)
        if target == "failed":
            root.set_status(Status(StatusCode.ERROR, rec.detail[:200] if rec.detail else "failed"))
        root.end(end_time=now)
