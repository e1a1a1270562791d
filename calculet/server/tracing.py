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

Why spans are plain tuples until they are exported (:data:`PlainSpan`), not the SDK's span objects:
the observer runs on the engine's actor thread, between the steps it would otherwise spend
scheduling, and at B1 it ends a span per generated token. Built in place on that thread, an SDK
``ReadableSpan`` (with its ``SpanContext``, ``Link`` and ``Status`` objects, the batching
processor's hand-off with its pid check, and the sampler's ``SamplingResult`` and context lookup)
measured 0.77 ms of the actor's CPU per 16-token completion inside the running service, 2.5× what
the same calls took replayed in a tight loop (cold caches between engine steps, and every object
it allocates is traced by the garbage collector until the export), and the encoding of those
objects 0.62 ms more on the export thread, a new HTTP connection per post included (per-thread
CPU from ``/proc``, issue #19). Now the actor appends one tuple of final values per span (ids,
instants, attributes, links as id pairs, an error text or None) to the service's batcher, a deque
(:class:`~calculet.server.tracing_otlp.PlainSpanBatcher`); its thread wakes every 5 s and writes
the OTLP bytes straight from the tuples, posting on a kept-alive connection: measured the same
way, 0.40–0.43 ms on the actor and 0.21–0.31 ms on the export thread per completion
(``bench/tracing_overhead.py --threads``). A span
processor of the SDK's (the in-memory exporter in tests, any other) still gets ``ReadableSpan`` objects:
:func:`to_readable` builds the same span from the same tuple, and a test checks that the OTLP bytes
written from the tuples decode to the message the library builds from those spans.

The sampling decision is taken once per request, at its arrival: the trace-id ratio rule of the
SDK's ``TraceIdRatioBased`` (the low 64 bits of the trace id below ``sample_ratio`` × 2⁶⁴), so a
request the sampler drops costs one dict lookup per transition and no span, and a batch gets a
span only when it carries a sampled request (no link points nowhere).

Spans are built at the server/engine boundary from what the engine already reports: the
request's §2 transitions (the engine's request observer, on the actor thread) and the scheduler's
record of each planned job (``engine.job(job_id)``); the runtime knows nothing of tracing. Span
times are the engine clock's instants mapped onto the wall clock once, so a FakeClock gives
exact durations in tests. No prompt or completion text is ever an attribute, only counts.

Off by default: without ``monitoring.tracing.otlp_endpoint`` no pipeline exists and the observer is
not installed (no cost per transition). With one, span tuples go to the batcher and from it to an
OTLP/HTTP exporter (:mod:`calculet.server.tracing_otlp`: the library's messages, written in the
protobuf wire format). Tests pass their own pipeline (the SDK's in-memory exporter behind a simple
processor, or a sink keeping the tuples).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from calculet.clock import Clock
from calculet.config.tracing import TracingConfig
from calculet.machines.request import TERMINAL, WAITING
from calculet.server.tracing_otlp import SCOPE, PlainSpan, PlainSpanBatcher, to_readable

log = logging.getLogger("calculet.server.tracing")

__all__ = ["PlainSpanSink", "RequestTracer", "SpanPipeline", "otlp_pipeline"]

_DECIDING = WAITING  # not admitted yet: the admission decision is pending (RequestMachine's "waiting" group)
_ENDED = TERMINAL  # the states flagged terminal in the declaration (#17: never a parallel tuple)
_DECODE_OK = frozenset({"decode_ready", "finishing"})
"""Where a lane goes when its decode batch produced its token (anything else: the batch failed it)."""
_BATCH_FAILED = "the decode batch did not produce its lanes' tokens"
_getrandbits = random.getrandbits  # the SDK's RandomIdGenerator draws its ids the same way


def _new_id(bits: int) -> int:
    """A random trace (128-bit) or span (64-bit) id; never 0, the invalid id."""
    while True:
        found = _getrandbits(bits)
        if found:
            return found


class PlainSpanSink(Protocol):
    """Takes finished spans as :data:`~calculet.server.tracing_otlp.PlainSpan` tuples (the service's
    :class:`~calculet.server.tracing_otlp.PlainSpanBatcher`; a list in a test)."""

    def add(self, span: PlainSpan) -> None: ...

    def shutdown(self) -> None: ...


class _Resource(Resource):
    """A resource whose hash is computed once (the SDK's re-serialises every attribute per call,
    and the library's OTLP encoder hashes the resource of every span it groups)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(dict(resource.attributes), resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


@dataclass(frozen=True)
class SpanPipeline:
    """Where finished spans go: the service's tuple batcher (OTLP export), or a span processor of the
    SDK's (a simple processor with the in-memory exporter in tests: it gets ``ReadableSpan`` objects), the
    traces' resource and the sampled share."""

    processor: PlainSpanSink | SpanProcessor
    resource: Resource = field(default_factory=lambda: Resource.create({"service.name": "calculet"}))
    sample_ratio: float = 1.0


def otlp_pipeline(config: TracingConfig) -> SpanPipeline | None:
    """The pipeline exporting to ``config.otlp_endpoint`` with OTLP/HTTP; None when tracing is off.

    The batcher's thread wakes every 5 s (the SDK's default ``OTEL_BSP_SCHEDULE_DELAY``) and posts
    what is queued in posts of up to 2048 spans, on one kept-alive connection: the HTTP post's own
    CPU (~1-2 ms with a new connection each time) is paid per few thousand spans, not per few
    dozen. The queue holds 8192 spans (a B1 engine at full speed on ``--sim-cost instant`` ends
    ~600 spans a second); from half full the thread is woken early, so nothing is dropped unless
    the collector cannot keep up."""
    if config.otlp_endpoint is None:
        return None
    from calculet.server.tracing_otlp import OtlpHttpSpanExporter

    resource = _Resource(Resource.create({"service.name": config.service_name}))
    batcher = PlainSpanBatcher(OtlpHttpSpanExporter(config.otlp_endpoint), resource, max_queue_size=8192,
                               schedule_delay_s=5.0, max_export_batch_size=2048)
    log.info("request tracing on", extra={"otlp_endpoint": config.otlp_endpoint,
                                          "sample_ratio": config.sample_ratio})
    return SpanPipeline(batcher, resource, config.sample_ratio)


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
        self.links: list[tuple[int, int]] = []
        """One per decode batch it rode in: that batch span's (trace id, span id)."""
        self.decode_start = 0
        self.decode_end = 0
        self.failed = False
        self.open_at = 0
        self.open_name = ""
        self.open_attrs: dict[str, Any] = {}


class _Batch:
    """A decode batch carrying at least one sampled request: its span's values until it ends."""

    __slots__ = ("start", "job_id", "profile", "lanes", "riders", "trace_id", "span_id")

    def __init__(self, start: int, job_id: int, profile: int, lanes: int) -> None:
        self.start = start
        self.job_id = job_id
        self.profile = profile
        self.lanes = lanes
        self.riders = 0
        """Sampled requests still in it (the record goes when the last leaves)."""
        self.trace_id = 0
        self.span_id = 0
        """Its span's ids once the span is ended (when its first lane left it); 0 before."""


class RequestTracer:
    """Turns a request's §2 transitions into its span tree (the engine's request observer).

    ``job(job_id)`` is the scheduler's record of a planned job (``ThreadedEngine.job``), read on the
    actor thread while the observer runs; ``alias`` names the served model in every root span.
    """

    def __init__(self, pipeline: SpanPipeline, clock: Clock, *,
                 job: Callable[[int], Any] | None = None, alias: str = "") -> None:
        processor = pipeline.processor
        self._processor = processor
        resource = pipeline.resource if isinstance(pipeline.resource, _Resource) else _Resource(pipeline.resource)
        if isinstance(processor, SpanProcessor):  # the SDK's: a ReadableSpan per span, built here
            def end(span: PlainSpan) -> None:
                processor.on_end(to_readable(span, resource, SCOPE))
            self._end: Callable[[PlainSpan], None] = end
        else:
            self._end = processor.add
        self._bound = TraceIdRatioBased.get_bound_for_rate(pipeline.sample_ratio)
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
        tr: Any = self._open.get(request_id, self)
        if tr is self:  # its first transition: the sampling decision (TraceIdRatioBased's rule)
            trace_id = _new_id(128)
            tr = self._open[request_id] = (_Trace(trace_id, self._ns(rec.arrival))
                                           if trace_id & _TRACE_ID_LIMIT < self._bound else None)
        if tr is None:  # the sampler dropped it: nothing recorded
            if target in _ENDED:
                del self._open[request_id]
            return
        now = self._offset_ns + int(self._clock.now() * 1e9)
        if target == "decode_running":  # the per-token path first: at B1 two of every three transitions
            self._board(tr, rec.job_id, now)
            return
        if source == "decode_running":
            self._alight(tr, target, now)
            if target not in _ENDED:
                return
        elif source in _DECIDING and target not in _DECIDING:
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
            batch = self._batches[job_id] = _Batch(now, job_id, int(job.machine.lanes) if job is not None else 0,
                                                   len(active) if active is not None else 0)
        batch.riders += 1
        tr.batch = job_id
        if not tr.decode_start:
            tr.decode_start = now

    def _alight(self, tr: _Trace, target: str, now: int) -> None:
        """The request's lane left its decode batch (the batch completed or failed): the batch's span
        is ended when its first lane leaves (all of a batch's lanes leave at one instant)."""
        tr.decode_end = now
        ok = target in _DECODE_OK
        if not ok:
            tr.failed = True
        batch = self._batches.get(tr.batch)
        if batch is None:  # boarded before this tracer was installed
            return
        if not batch.span_id:
            batch.trace_id, batch.span_id = _getrandbits(128) or _new_id(128), _getrandbits(64) or _new_id(64)
            self._end(("calculet.decode_batch", batch.trace_id, batch.span_id, 0, batch.start, now,
                       {"calculet.batch.id": batch.job_id, "calculet.batch.profile": batch.profile,
                        "calculet.batch.lanes": batch.lanes}, (), None if ok else _BATCH_FAILED))
        tr.links.append((batch.trace_id, batch.span_id))
        batch.riders -= 1
        if not batch.riders:
            del self._batches[tr.batch]

    # ------------------------------------------------------------------ the spans, once

    def _emit(self, rec: Any, tr: _Trace, target: str, now: int) -> None:
        trace_id, root, end = tr.trace_id, _new_id(64), self._end
        end(("calculet.admission", trace_id, _new_id(64), root, tr.start, tr.admitted or now,
             {"calculet.decision": tr.decision or target}, (), None))
        for name, start, stop, attributes in tr.phases:
            end((name, trace_id, _new_id(64), root, start, stop, attributes, (), None))
        if tr.links:
            end(("calculet.decode", trace_id, _new_id(64), root, tr.decode_start, tr.decode_end or now,
                 {"calculet.decode.steps": len(tr.links), "calculet.decode.ok": not tr.failed}, tuple(tr.links),
                 None))
        error = ((rec.detail[:200] if rec.detail else "failed") if target == "failed" else None)
        end(("calculet.request", trace_id, root, 0, tr.start, now, {
            "calculet.request.id": rec.request_id, "calculet.tenant": rec.tenant, "calculet.model": self._alias,
            "calculet.prompt_tokens": rec.prompt_tokens, "calculet.max_new_tokens": rec.max_new_tokens,
            "calculet.outcome": target, "calculet.generation": rec.generation,
            "calculet.generated_tokens": rec.machine.generated_tokens}, (), error))


_TRACE_ID_LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT
