"""Request traces with OpenTelemetry (§16: request and job ids go to traces and logs, never to metric labels).

Why: a metric says the p99 queue time rose; a trace says which request waited, in which queue,
behind which prefill jobs, and in which decode batches (id, compiled profile, lanes) it then
ran. One trace per request, and one span per decode batch:

``calculet.request``            arrival → terminal state (request id, tenant, token counts, outcome)
  ``calculet.admission``        arrival → admitted or refused (§5.2; a Queue outcome waits inside it)
  ``calculet.queue_wait``       admitted → its prefill job on the device (prefill queue class)
  ``calculet.prefill``          one per prefill job or chunk (job id)
  ``calculet.decode``           first decode batch submitted → last one done (steps, ok); one span
                                **link** per decode batch it rode in, in order
``calculet.decode_batch``       one per decode batch, the root of a trace of its own (batch id,
                                compiled profile, active lanes; status ERROR when the batch failed
                                its lanes), submitted → done

Why a decode batch is one span of its own, linked, and not a child of each request: a batch is
shared — a B16 batch carries up to 16 requests — and it has one parent at most, while a request
rides one batch per generated token. A child span per request per token cost 20 % of the
service's CPU per request on ``--sim-cost instant`` (``bench/tracing_overhead.py``); one span per
batch costs one span per batch, and each request pays a link (two ids) per token. This is the
shape OpenTelemetry gives batch processing (a batch span linked with the traces it served); a
trace UI follows the link from a request's decode span to each batch and its lanes. A batch span
carries the three attributes the issue names and nothing else: at B1 every token is a batch span,
and each attribute costs ~6 µs of OTLP encoding per span here (``bench/tracing_overhead.py``).

Why spans are built from plain values, once, at the end (``ReadableSpan`` handed to the span
processor, not ``Tracer.start_span``): the SDK's live span takes a lock, validates and copies every
attribute and consults the sampler per span; here every span's values are final when it is built,
and the sampling decision is taken once per request, at its arrival (the trace-id ratio sampler,
``sample_ratio``), so a request the sampler drops costs one dict lookup per transition and no
span, and a batch gets a span only when it carries a sampled request (no link points nowhere).
During the request only plain values are recorded, on the actor thread; the OTLP encoding runs on
the batching processor's thread. The resource's hash is computed once (the OTLP encoder groups
spans by resource and the SDK's ``Resource.__hash__`` serialises every attribute to JSON each time).

Spans are built at the server/engine boundary from what the engine already reports: the
request's §2 transitions (the engine's request observer, on the actor thread) and the scheduler's
record of each planned job (``engine.job(job_id)``); the runtime knows nothing of tracing. Span
times are the engine clock's instants mapped onto the wall clock once, so a FakeClock gives
exact durations in tests. No prompt or completion text is ever an attribute, only counts.

Off by default: without ``monitoring.tracing.otlp_endpoint`` no pipeline exists and the observer is
not installed (no cost per transition). With one, spans go through the SDK's batching processor to
an OTLP/HTTP exporter (:mod:`calculet.server.tracing_otlp`: the library's messages, written in the
protobuf wire format at about a third of its CPU). Tests pass their own pipeline (the SDK's in-memory exporter behind a simple
processor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from calculet.clock import Clock
from calculet.config.tracing import TracingConfig
from calculet.machines.request import TERMINAL, WAITING

log = logging.getLogger("calculet.server.tracing")

__all__ = ["RequestTracer", "SpanPipeline", "otlp_pipeline"]

_DECIDING = WAITING  # not admitted yet: the admission decision is pending (RequestMachine's "waiting" group)
_ENDED = TERMINAL  # the states flagged terminal in the declaration (#17: never a parallel tuple)
_DECODE_OK = frozenset({"decode_ready", "finishing"})
"""Where a lane goes when its decode batch produced its token (anything else: the batch failed it)."""
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SCOPE = InstrumentationScope("calculet.server.tracing")
_OK = Status(StatusCode.UNSET)
_BATCH_FAILED = Status(StatusCode.ERROR, "the decode batch did not produce its lanes' tokens")


class _Resource(Resource):
    """A resource whose hash is computed once (the SDK's re-serialises every attribute per call,
    and the OTLP encoder hashes the resource of every span it groups)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(dict(resource.attributes), resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


@dataclass(frozen=True)
class SpanPipeline:
    """Where finished spans go: a span processor (batching to OTLP in the service; a simple
    processor with the in-memory exporter in tests), the traces' resource and the sampled share."""

    processor: SpanProcessor
    resource: Resource = field(default_factory=lambda: Resource.create({"service.name": "calculet"}))
    sample_ratio: float = 1.0


def otlp_pipeline(config: TracingConfig) -> SpanPipeline | None:
    """The pipeline exporting to ``config.otlp_endpoint`` with OTLP/HTTP; None when tracing is off.

    The batching processor's queue holds 8192 spans (a B16 engine at full speed ends a few hundred
    spans a second; a collector outage of a few seconds drops none) and exports every second in
    posts of up to 512 spans, so the encoding and the HTTP post are paid per batch of spans."""
    if config.otlp_endpoint is None:
        return None
    from calculet.server.tracing_otlp import OtlpHttpSpanExporter

    processor = BatchSpanProcessor(OtlpHttpSpanExporter(config.otlp_endpoint), max_queue_size=8192,
                                   schedule_delay_millis=1000, max_export_batch_size=512)
    log.info("request tracing on", extra={"otlp_endpoint": config.otlp_endpoint,
                                          "sample_ratio": config.sample_ratio})
    return SpanPipeline(processor, Resource.create({"service.name": config.service_name}), config.sample_ratio)


class _Trace:
    """What one sampled request did, as plain values until its end (instants in ns)."""

    __slots__ = ("trace_id", "start", "admitted", "decision", "phases", "batch", "links", "decode_start",
                 "decode_end", "failed", "open_at", "open_name", "open_attrs")

    def __init__(self, trace_id: int, start: int) -> None:
        self.trace_id = trace_id
        self.start = start
        self.admitted = 0
        self.decision = ""
        self.phases: list[tuple[str, int, int, dict[str, Any]]] = []
        """Ended queue-wait and prefill spans: (name, start, end, attributes)."""
        self.batch = 0
        """The decode batch its lane is in (while in decode_running)."""
        self.links: list[Link] = []
        """One per decode batch it rode in, to that batch's span."""
        self.decode_start = 0
        self.decode_end = 0
        self.failed = False
        self.open_at = 0
        self.open_name = ""
        self.open_attrs: dict[str, Any] = {}


class _Batch:
    """A decode batch carrying at least one sampled request: its span's values until it ends."""

    __slots__ = ("start", "attributes", "riders", "context")

    def __init__(self, start: int, attributes: dict[str, Any]) -> None:
        self.start = start
        self.attributes = attributes
        self.riders = 0
        """Sampled requests still in it (the record goes when the last leaves)."""
        self.context: SpanContext | None = None
        """Its span's context once the span is built (when its first lane left it)."""


class RequestTracer:
    """Turns a request's §2 transitions into its span tree (the engine's request observer).

    ``job(job_id)`` is the scheduler's record of a planned job (``ThreadedEngine.job``), read on the
    actor thread while the observer runs; ``alias`` names the served model in every root span.
    """

    def __init__(self, pipeline: SpanPipeline, clock: Clock, *,
                 job: Callable[[int], Any] | None = None, alias: str = "") -> None:
        self._processor = pipeline.processor
        self._resource = _Resource(pipeline.resource)
        self._sampler = TraceIdRatioBased(pipeline.sample_ratio)
        self._ids = RandomIdGenerator()
        self._clock = clock
        self._job = job
        self._alias = alias
        self._offset_ns = time.time_ns() - int(clock.now() * 1e9)
        self._open: dict[int, _Trace | None] = {}
        """Requests seen and not ended: their trace, or None when the sampler dropped them."""
        self._batches: dict[int, _Batch] = {}
        self._stopped = False

    def _ns(self, at: float) -> int:
        return self._offset_ns + int(at * 1e9)

    @property
    def open(self) -> int:
        """Requests and decode batches whose trace is still open (0 once every request ended)."""
        return len(self._open) + len(self._batches)

    def shutdown(self) -> None:
        """Export what the processor holds and stop it (the service's stop; idempotent)."""
        if not self._stopped:
            self._stopped = True
            self._processor.shutdown()

    def observe(self, rec: Any, source: str, target: str) -> None:
        """``observer(rec, source, target)`` of the engine (a ``RequestRecord``)."""
        if source == target:
            return
        request_id = rec.request_id
        if request_id in self._open:
            tr = self._open[request_id]
        else:
            trace_id = self._ids.generate_trace_id()
            sampled = self._sampler.should_sample(None, trace_id, "calculet.request").decision.is_sampled()
            tr = self._open[request_id] = _Trace(trace_id, self._ns(rec.arrival)) if sampled else None
        if tr is None:  # the sampler dropped it: nothing recorded
            if target in _ENDED:
                del self._open[request_id]
            return
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
            self._board(tr, rec.job_id, now)
        elif source == "decode_running":
            self._alight(tr, target, now)
        if target in _ENDED:
            del self._open[request_id]
            self._close_phase(tr, now)
            self._emit(rec, tr, target, now)

    # ------------------------------------------------------------------ recording

    @staticmethod
    def _open_phase(tr: _Trace, name: str, now: int, attributes: dict[str, Any]) -> None:
        tr.open_name, tr.open_at, tr.open_attrs = name, now, attributes

    @staticmethod
    def _close_phase(tr: _Trace, now: int) -> None:
        if tr.open_name:
            tr.phases.append((tr.open_name, tr.open_at, now, tr.open_attrs))
            tr.open_name = ""

    def _board(self, tr: _Trace, job_id: int, now: int) -> None:
        """The request's lane went into decode batch ``job_id`` (submitted now)."""
        batch = self._batches.get(job_id)
        if batch is None:
            job = self._job(job_id) if self._job is not None else None
            active = getattr(job.work, "active", None) if job is not None else None
            batch = self._batches[job_id] = _Batch(now, {
                "calculet.batch.id": job_id,
                "calculet.batch.profile": int(job.machine.lanes) if job is not None else 0,
                "calculet.batch.lanes": len(active) if active is not None else 0})
        batch.riders += 1
        tr.batch = job_id
        if not tr.decode_start:
            tr.decode_start = now

    def _alight(self, tr: _Trace, target: str, now: int) -> None:
        """The request's lane left its decode batch (the batch completed or failed): the batch's span
        is built when its first lane leaves (all of a batch's lanes leave at one instant)."""
        tr.decode_end = now
        ok = target in _DECODE_OK
        tr.failed = tr.failed or not ok
        batch = self._batches.get(tr.batch)
        if batch is None:  # boarded before this tracer was installed
            return
        if batch.context is None:
            batch.context = SpanContext(self._ids.generate_trace_id(), self._ids.generate_span_id(), False, _SAMPLED)
            self._end(ReadableSpan("calculet.decode_batch", batch.context, None, self._resource, batch.attributes,
                                   status=_OK if ok else _BATCH_FAILED, start_time=batch.start, end_time=now,
                                   instrumentation_scope=_SCOPE))
        tr.links.append(Link(batch.context))
        batch.riders -= 1
        if not batch.riders:
            del self._batches[tr.batch]

    # ------------------------------------------------------------------ the spans, once

    def _end(self, span: ReadableSpan) -> None:
        self._processor.on_end(span)

    def _emit(self, rec: Any, tr: _Trace, target: str, now: int) -> None:
        ids = self._ids
        root = SpanContext(tr.trace_id, ids.generate_span_id(), False, _SAMPLED)

        def child(name: str, start: int, end: int, attributes: dict[str, Any], links: list[Link] | tuple[()] = ()
                  ) -> None:
            context = SpanContext(tr.trace_id, ids.generate_span_id(), False, _SAMPLED)
            self._end(ReadableSpan(name, context, root, self._resource, attributes, links=links,
                                   start_time=start, end_time=end, instrumentation_scope=_SCOPE))

        child("calculet.admission", tr.start, tr.admitted or now, {"calculet.decision": tr.decision or target})
        for name, start, end, attributes in tr.phases:
            child(name, start, end, attributes)
        if tr.links:
            child("calculet.decode", tr.decode_start, tr.decode_end or now,
                  {"calculet.decode.steps": len(tr.links), "calculet.decode.ok": not tr.failed}, tr.links)
        status = (Status(StatusCode.ERROR, rec.detail[:200] if rec.detail else "failed") if target == "failed"
                  else _OK)
        self._end(ReadableSpan("calculet.request", root, None, self._resource, {
            "calculet.request.id": rec.request_id, "calculet.tenant": rec.tenant, "calculet.model": self._alias,
            "calculet.prompt_tokens": rec.prompt_tokens, "calculet.max_new_tokens": rec.max_new_tokens,
            "calculet.outcome": target, "calculet.generation": rec.generation,
            "calculet.generated_tokens": rec.machine.generated_tokens},
            status=status, start_time=tr.start, end_time=now, instrumentation_scope=_SCOPE))
