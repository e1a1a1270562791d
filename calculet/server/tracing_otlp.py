"""OTLP/HTTP export of the service's spans: a protobuf wire-format writer and a plain POST (issue #19).

Why not ``opentelemetry-exporter-otlp-proto-http``'s ``OTLPSpanExporter``: its encoder builds a
protobuf message object per span, attribute and value (with type dispatch, flag and trace-state
helpers, and resource grouping by hashing), ~40 µs of CPU per span here, and at B1 every
generated token is a ``calculet.decode_batch`` span, so the export was three quarters of
tracing's cost per completion (``bench/tracing_overhead.py``). This module writes the same
``ExportTraceServiceRequest`` directly in the protocol-buffers wire format — bytes joined, the
encoded (key, value) pairs that repeat kept — from the SDK's spans (:func:`encode_spans`) or,
on the service's path, from the tracer's span tuples (:func:`encode_plain`, :class:`PlainSpanBatcher`):
~8–10 µs per span from the tuples, posting included, against ~60–70 µs for the library's exporter
with the SDK's spans (``bench/tracing_overhead.py`` part 2, 2026-12-02).
``tests/service/test_tracing.py`` parses its output and compares it, message for message, with
the library's for the tracer's spans and for every field kind a span can carry (events, arrays,
remote parents, trace state, links with attributes, dropped counts, status messages), and the
bytes written from span tuples with the library's for the same spans, so it writes what the
library writes. The wire format is OTLP/HTTP binary protobuf (``POST
<endpoint>``, ``Content-Type: application/x-protobuf``), which every OTLP collector accepts.

The export runs on the span batcher's thread (:class:`PlainSpanBatcher`), never on the engine's
actor; its HTTP connection is kept open between posts. A post
that fails with a connection error, 429 or 502-504 is retried twice (0.5 s, then 1 s later); then
the batch is dropped with one warning line — traces are best-effort, and the processor's queue
is bounded so a collector outage never holds the service's memory.
"""

from __future__ import annotations

import collections
import http.client
import logging
import struct
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

log = logging.getLogger("calculet.server.tracing")

__all__ = ["SCOPE", "OtlpHttpSpanExporter", "PlainSpan", "PlainSpanBatcher", "encode_plain", "encode_spans",
           "to_readable"]

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
"""opentelemetry.proto.trace.v1.Span.SpanKind (SPAN_KIND_INTERNAL = 1, ...)."""
_HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: "is the parent remote" is known
_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_RETRY_AFTER_S = (0.5, 1.0)
_RETRIED_STATUSES = frozenset({429, 502, 503, 504})
_U64 = (1 << 64) - 1
_CACHED_ATTRIBUTES = 4096
"""Encoded (key, value) pairs kept: tenant, queue, profile, lanes, decision... repeat in every batch."""
_UNCACHED_INT = 1 << 10
"""Ints from here up are ids or large counts, not worth a cache entry (profiles, lanes and steps are below)."""

SCOPE = InstrumentationScope("calculet.server.tracing")
"""The instrumentation scope of every span calculet writes."""

PlainSpan = tuple[str, int, int, int, int, int, dict[str, Any], tuple[tuple[int, int], ...], str | None]
"""A finished span as plain values, what the tracer hands on (:mod:`calculet.server.tracing`):
``(name, trace_id, span_id, parent_span_id or 0, start_ns, end_ns, attributes, links, error)``;
``links`` are (trace id, span id) pairs of spans in this process, ``error`` None for an UNSET
status or the ERROR status's description. Its kind is INTERNAL, its parent (when it has one) is
in the same trace and not remote, it is sampled, and it carries no events: the shapes the tracer
builds, and all :func:`to_readable` and :meth:`_Encoder.plain_span` need to write."""
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


def to_readable(span: PlainSpan, resource: Resource, scope: InstrumentationScope | None = SCOPE) -> ReadableSpan:
    """The SDK's ``ReadableSpan`` for ``span`` (for a span processor of the SDK's, and for tests that
    compare the bytes written from tuples with the library's bytes for the same spans)."""
    name, trace_id, span_id, parent_id, start, end, attributes, links, error = span
    return ReadableSpan(
        name, SpanContext(trace_id, span_id, False, _SAMPLED),
        SpanContext(trace_id, parent_id, False, _SAMPLED) if parent_id else None, resource, attributes,
        links=[Link(SpanContext(t, s, False, _SAMPLED)) for t, s in links],
        status=_UNSET if error is None else Status(StatusCode.ERROR, error),
        start_time=start, end_time=end, instrumentation_scope=scope)

# Protocol-buffers wire format (https://protobuf.dev/programming-guides/encoding/), the OTLP fields
# by number (opentelemetry/proto/trace/v1/trace.proto, common/v1/common.proto): a tag is
# field_number << 3 | wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit).


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(n) for n in range(1 << 14)]
_U64LE = struct.Struct("<Q").pack
_LINK_HEAD = b"\x6a\x21\x0a\x10"
"""A link of a :data:`PlainSpan`: field 13, 33 bytes (trace id 18, span id 10, flags 5), then its trace id's tag."""
_LINK_TAIL = b"\x35" + struct.pack("<I", _HAS_IS_REMOTE)  # Link.flags: "is remote" known, not remote
_STATUS_UNSET = b"\x7a\x00"  # Status with neither message nor code (UNSET), present as the library writes it
_SPAN_FLAGS = b"\x85\x01" + struct.pack("<I", _HAS_IS_REMOTE)  # Span.flags: the parent (if any) known not remote


def _len(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint(n)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + _len(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` (its oneof is present even when it holds the type's zero)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):  # before int: a bool is an int
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & _U64)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if value is None:
        return b""
    if isinstance(value, Sequence):  # array_value (5): ArrayValue.values (1)
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    return _field(b"\x0a", str(value).encode())


class _Encoder:
    """Writes ``ExportTraceServiceRequest`` bytes; keeps the encoded attributes that repeat."""

    def __init__(self) -> None:
        self._attributes: dict[tuple[str, type, Any], bytes] = {}
        self._keys: dict[str, bytes] = {}
        """An attribute key's field, per key (for the values not cached whole)."""
        self._heads: dict[str, bytes] = {}
        """A span name's field with the kind's after it (INTERNAL), per name."""
        self._headers: dict[tuple[int, int], tuple[Resource, InstrumentationScope | None, bytes]] = {}
        """The encoded scope per (resource, scope), the objects kept so their ids stay theirs."""

    def key_value(self, tag: bytes, key: str, value: Any) -> bytes:
        """The field ``tag`` holding ``KeyValue{key (1), value (2)}``.

        A non-negative int from ``_UNCACHED_INT`` up (a batch or request id: a new value per span) is
        written from its key's cached field, not cached itself: caching every id would fill the cache
        and clear the pairs that do repeat every few thousand spans."""
        if type(value) is int and value >= _UNCACHED_INT:
            key_field = self._keys.get(key)
            if key_field is None:
                key_field = self._keys[key] = _field(b"\x0a", key.encode())
            number = _varint(value & _U64)
            body = key_field + b"\x12" + _SMALL[len(number) + 1] + b"\x18" + number
            return tag + _len(len(body)) + body
        cache_key = (key, type(value), value) if isinstance(value, (str, bool, int, float)) else None
        if cache_key is not None:
            found = self._attributes.get(cache_key)
            if found is not None:
                return tag + found
        body = _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))
        encoded = _len(len(body)) + body
        if cache_key is not None:
            if len(self._attributes) >= _CACHED_ATTRIBUTES:
                self._attributes.clear()
            self._attributes[cache_key] = encoded
        return tag + encoded

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        return b"".join(self.key_value(tag, k, v) for k, v in (attributes or {}).items())

    def span(self, span: ReadableSpan) -> bytes:
        """``Span``: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6, start 7,
        end 8, attributes 9, dropped_attributes_count 10, events 11, dropped_events_count 12, links 13,
        dropped_links_count 14, status 15, flags 16."""
        context = span.context
        parent = span.parent
        out = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
        if context.trace_state:
            out.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in context.trace_state.items()).encode()))
        if parent is not None:
            out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        out.append(_field(b"\x2a", span.name.encode()))
        out += (b"\x30", _SMALL[_KINDS[span.kind]])
        if span.start_time:
            out += (b"\x39", struct.pack("<Q", span.start_time))
        if span.end_time:
            out += (b"\x41", struct.pack("<Q", span.end_time))
        out.append(self.attributes(b"\x4a", span.attributes))
        if span.dropped_attributes:
            out += (b"\x50", _varint(span.dropped_attributes))
        for event in span.events:  # Event: time 1 (64-bit), name 2, attributes 3, dropped 4
            body = (b"\x09" + struct.pack("<Q", event.timestamp) if event.timestamp else b"") + \
                _field(b"\x12", event.name.encode()) + self.attributes(b"\x1a", event.attributes)
            if event.dropped_attributes:
                body += b"\x20" + _varint(event.dropped_attributes)
            out.append(_field(b"\x5a", body))
        if span.dropped_events:
            out += (b"\x60", _varint(span.dropped_events))
        for link in span.links:  # Link: trace_id 1, span_id 2, attributes 4, dropped 5, flags 6 (32-bit)
            linked = link.context
            body = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big") + b"\x12\x08" + \
                linked.span_id.to_bytes(8, "big") + self.attributes(b"\x22", link.attributes)
            if link.dropped_attributes:
                body += b"\x28" + _varint(link.dropped_attributes)
            body += b"\x35" + struct.pack("<I", _HAS_IS_REMOTE | (_IS_REMOTE if linked.is_remote else 0))
            out.append(_field(b"\x6a", body))
        if span.dropped_links:
            out += (b"\x70", _varint(span.dropped_links))
        status = span.status  # Status: message 2, code 3 (always present, as the library writes it)
        body = (_field(b"\x12", status.description.encode()) if status.description else b"") + \
            (b"\x18" + _SMALL[status.status_code.value] if status.status_code.value else b"")
        out.append(_field(b"\x7a", body))
        out += (b"\x85\x01", struct.pack("<I", _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote
                                                                     else 0)))
        return b"".join(out)

    def plain_span(self, span: PlainSpan) -> bytes:
        """``Span`` for a :data:`PlainSpan`, the same bytes :meth:`span` writes for its ``to_readable``;
        the parts that repeat (name and kind; the flags; a link's flags) are constants here."""
        name, trace_id, span_id, parent_id, start, end, attributes, links, error = span
        head = self._heads.get(name)
        if head is None:
            head = self._heads[name] = _field(b"\x2a", name.encode()) + b"\x30" + _SMALL[_KINDS[SpanKind.INTERNAL]]
        out = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
        if parent_id:
            out += (b"\x22\x08", parent_id.to_bytes(8, "big"))
        out.append(head)
        if start:
            out += (b"\x39", _U64LE(start))
        if end:
            out += (b"\x41", _U64LE(end))
        key_value = self.key_value
        out += [key_value(b"\x4a", k, v) for k, v in attributes.items()]
        for linked_trace, linked_span in links:
            out += (_LINK_HEAD, linked_trace.to_bytes(16, "big"), b"\x12\x08", linked_span.to_bytes(8, "big"),
                    _LINK_TAIL)
        if error is None:
            out.append(_STATUS_UNSET)
        else:
            out.append(_field(b"\x7a", (_field(b"\x12", error.encode()) if error else b"") + b"\x18\x02"))
        out.append(_SPAN_FLAGS)
        return b"".join(out)

    def plain_request(self, spans: Sequence[PlainSpan], resource: Resource,
                      scope: InstrumentationScope | None = SCOPE) -> bytes:
        """``ExportTraceServiceRequest`` for spans of one resource and scope (the tracer's): the bytes
        :meth:`request` writes for their ``to_readable``."""
        plain_span = self.plain_span
        encoded = [_field(b"\x12", plain_span(span)) for span in spans]
        header = self._headers.get((id(resource), id(scope)))
        if header is None:
            header = self._headers[(id(resource), id(scope))] = (resource, scope, self._scope_header(scope))
        scope_spans = header[2] + b"".join(encoded)
        if scope is not None and scope.schema_url:
            scope_spans += _field(b"\x1a", scope.schema_url.encode())
        body = [_field(b"\x0a", self.attributes(b"\x0a", resource.attributes)), _field(b"\x12", scope_spans)]
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode()))
        return _field(b"\x0a", b"".join(body)) if spans else b""

    def _scope_header(self, scope: InstrumentationScope | None) -> bytes:
        """``ScopeSpans.scope`` (1): ``InstrumentationScope{name 1, version 2, attributes 3}``."""
        scope_body = b""
        if scope is not None:
            scope_body = (_field(b"\x0a", scope.name.encode()) if scope.name else b"") + \
                (_field(b"\x12", scope.version.encode()) if scope.version else b"") + \
                self.attributes(b"\x1a", scope.attributes)
        return _field(b"\x0a", scope_body)

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        """``ExportTraceServiceRequest.resource_spans`` (1): ``ResourceSpans{resource 1, scope_spans 2,
        schema_url 3}``, ``ScopeSpans{scope 1, spans 2, schema_url 3}``, spans grouped by resource, then scope."""
        groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope
            by_scope = groups.setdefault(id(resource), (resource, {}))[1]
            by_scope.setdefault(id(scope), (scope, []))[1].append(_field(b"\x12", self.span(span)))
        out = []
        for resource, by_scope in groups.values():
            body = [_field(b"\x0a", self.attributes(b"\x0a", resource.attributes))]
            for scope, encoded in by_scope.values():
                scope_spans = self._scope_header(scope) + b"".join(encoded)
                if scope is not None and scope.schema_url:
                    scope_spans += _field(b"\x1a", scope.schema_url.encode())
                body.append(_field(b"\x12", scope_spans))
            if resource.schema_url:
                body.append(_field(b"\x1a", resource.schema_url.encode()))
            out.append(_field(b"\x0a", b"".join(body)))
        return b"".join(out)


def encode_spans(spans: Sequence[ReadableSpan], encoder: _Encoder | None = None) -> bytes:
    """The serialized OTLP ``ExportTraceServiceRequest`` for ``spans``."""
    return (encoder or _Encoder()).request(spans)


def encode_plain(spans: Sequence[PlainSpan], resource: Resource, scope: InstrumentationScope | None = SCOPE,
                 encoder: _Encoder | None = None) -> bytes:
    """The serialized OTLP ``ExportTraceServiceRequest`` for span tuples of one resource and scope."""
    return (encoder or _Encoder()).plain_request(spans, resource, scope)


class OtlpHttpSpanExporter(SpanExporter):
    """POSTs each batch of spans to an OTLP/HTTP traces endpoint (binary protobuf)."""

    def __init__(self, endpoint: str, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._stopped = threading.Event()
        self._encoder = _Encoder()
        url = urllib.parse.urlsplit(endpoint)
        self._connection_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        self._netloc = url.netloc
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._connection: http.client.HTTPConnection | None = None
        """Kept open between posts (HTTP/1.1 keep-alive): a new connection per post cost more CPU
        than encoding the spans of a second (``bench/tracing_overhead.py``)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """The SDK's exporter interface: ``spans`` encoded and posted."""
        return self.post(self._encoder.request(spans), len(spans))

    def export_plain(self, spans: Sequence[PlainSpan], resource: Resource,
                     scope: InstrumentationScope | None = SCOPE) -> SpanExportResult:
        """Span tuples of one resource and scope (the :class:`PlainSpanBatcher`'s), encoded and posted."""
        return self.post(self._encoder.plain_request(spans, resource, scope), len(spans))

    def post(self, body: bytes, spans: int) -> SpanExportResult:
        """POST one encoded ``ExportTraceServiceRequest`` (``spans`` spans: for the warning)."""
        problem = ""
        for wait_s in (0.0, *_RETRY_AFTER_S):
            if wait_s and self._stopped.wait(wait_s):
                break  # shutting down: no more waiting for a collector
            try:
                status = self._send(body)
            except (OSError, http.client.HTTPException) as exc:
                problem = str(exc) or type(exc).__name__
                continue
            if 200 <= status < 300:
                return SpanExportResult.SUCCESS
            problem = f"HTTP {status}"
            if status not in _RETRIED_STATUSES:
                break
        log.warning("trace export failed: spans dropped", extra={"otlp_endpoint": self.endpoint,
                                                                 "spans": spans, "problem": problem})
        return SpanExportResult.FAILURE

    def _send(self, body: bytes) -> int:
        """One POST on the kept connection (a new one when there is none); its HTTP status. A kept
        connection the collector has closed since is retried once at once on a new connection."""
        for fresh in (self._connection is None, True):
            if self._connection is None:
                self._connection = self._connection_class(self._netloc, timeout=self.timeout_s)
            connection = self._connection
            try:
                connection.request("POST", self._path, body, {"Content-Type": "application/x-protobuf"})
                response = connection.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                self._connection = None
                if fresh:
                    raise
                continue
            if response.will_close:
                connection.close()
                self._connection = None
            return response.status
        raise AssertionError("unreachable: the second attempt is on a fresh connection")

    def shutdown(self) -> None:
        self._stopped.set()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here (the processor holds the queue)


class PlainSpanBatcher:
    """The service's span queue: the tracer appends span tuples (on the engine's actor thread), a
    thread of its own exports them in batches (:meth:`OtlpHttpSpanExporter.export_plain`).

    Why not the SDK's ``BatchSpanProcessor``: it queues ``ReadableSpan`` objects, which the actor would
    have to build (see :mod:`calculet.server.tracing`), and checks the process id on every span. Here
    :meth:`add` is a deque append and a length check; the thread wakes every ``schedule_delay_s``, or
    as soon as ``wake_at`` spans are queued (half the queue by default), and exports everything queued in posts of up to
    ``max_export_batch_size`` spans. When the queue is full the oldest span is dropped (as the SDK's
    processor does), counted in :attr:`dropped` and reported with one warning per export round.
    ``span_exporter`` is the exporter (the SDK processor's attribute name)."""

    def __init__(self, exporter: OtlpHttpSpanExporter, resource: Resource, *,
                 scope: InstrumentationScope | None = SCOPE,
                 max_queue_size: int = 8192, schedule_delay_s: float = 5.0, max_export_batch_size: int = 2048,
                 wake_at: int | None = None) -> None:
        self.span_exporter = exporter
        self._resource = resource
        self._scope = scope
        self._queue: collections.deque[PlainSpan] = collections.deque(maxlen=max_queue_size)
        self._max_queue = max_queue_size
        self._wake_at = max(1, max_queue_size // 2) if wake_at is None else wake_at
        self._check_at = min(self._wake_at, max_queue_size)
        self._delay_s = schedule_delay_s
        self._batch = max_export_batch_size
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopping = False
        self.dropped = 0
        """Spans dropped because the queue was full (the oldest go first)."""
        self._reported = 0
        self._thread = threading.Thread(target=self._run, name="calculet-span-export", daemon=True)
        self._thread.start()

    def add(self, span: PlainSpan) -> None:
        """(any thread; the actor's in the service) Queue a finished span."""
        queue = self._queue
        size = len(queue)
        if size >= self._check_at:  # rare: the export is behind
            if size == self._max_queue:
                self.dropped += 1  # the append below pushes the oldest out
            if size >= self._wake_at and not self._wake.is_set():
                self._wake.set()
        queue.append(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now (on the caller's thread)."""
        self._export()
        return True

    def shutdown(self) -> None:
        """Stop the thread after a last export of everything queued (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(30.0)  # an export under way ends within its exporter's timeouts
        self._export()
        self.span_exporter.shutdown()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._export()

    def _export(self) -> None:
        with self._export_lock:
            queue, popleft = self._queue, self._queue.popleft
            while queue:
                batch = [popleft() for _ in range(min(self._batch, len(queue)))]
                self.span_exporter.export_plain(batch, self._resource, self._scope)
            if self.dropped != self._reported:
                log.warning("trace queue full: spans dropped", extra={"spans": self.dropped - self._reported})
                self._reported = self.dropped
