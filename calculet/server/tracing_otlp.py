"""OTLP/HTTP export of the service's spans: a protobuf wire-format writer and a plain POST (issue #19).

Why not ``opentelemetry-exporter-otlp-proto-http``'s ``OTLPSpanExporter``: its encoder builds a
protobuf message object per span, attribute and value (with type dispatch, flag and trace-state
helpers, and resource grouping by hashing), ~40 µs of CPU per span here, and at B1 every
generated token is a ``calculet.decode_batch`` span, so the export was three quarters of
tracing's cost per completion (``bench/tracing_overhead.py``). This module writes the same
``ExportTraceServiceRequest`` directly in the protocol-buffers wire format — bytes joined, the
encoded (key, value) pairs that repeat kept — at about a third of that CPU.
``tests/service/test_tracing.py`` parses its output and compares it, message for message, with
the library's for the tracer's spans and for every field kind a span can carry (events, arrays,
remote parents, trace state, links with attributes, dropped counts, status messages), so it
writes what the library writes. The wire format is OTLP/HTTP binary protobuf (``POST
<endpoint>``, ``Content-Type: application/x-protobuf``), which every OTLP collector accepts.

The export runs on the batching span processor's thread, never on the engine's actor. A post
that fails with a connection error, 429 or 5xx is retried twice (0.5 s, then 1 s later); then
the batch is dropped with one warning line — traces are best-effort, and the processor's queue
is bounded so a collector outage never holds the service's memory.
"""

from __future__ import annotations

import logging
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

log = logging.getLogger("calculet.server.tracing")

__all__ = ["OtlpHttpSpanExporter", "encode_spans"]

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
"""opentelemetry.proto.trace.v1.Span.SpanKind (SPAN_KIND_INTERNAL = 1, ...)."""
_HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: "is the parent remote" is known
_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_RETRY_AFTER_S = (0.5, 1.0)
_RETRIED_STATUSES = frozenset({429, 502, 503, 504})
_U64 = (1 << 64) - 1
_CACHED_ATTRIBUTES = 4096
"""Encoded (key, value) pairs kept: tenant, queue, profile, lanes, decision... repeat in every batch."""

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

    def key_value(self, tag: bytes, key: str, value: Any) -> bytes:
        """The field ``tag`` holding ``KeyValue{key (1), value (2)}``."""
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
                scope_body = b""
                if scope is not None:  # InstrumentationScope: name 1, version 2, attributes 3
                    scope_body = (_field(b"\x0a", scope.name.encode()) if scope.name else b"") + \
                        (_field(b"\x12", scope.version.encode()) if scope.version else b"") + \
                        self.attributes(b"\x1a", scope.attributes)
                scope_spans = _field(b"\x0a", scope_body) + b"".join(encoded)
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


class OtlpHttpSpanExporter(SpanExporter):
    """POSTs each batch of spans to an OTLP/HTTP traces endpoint (binary protobuf)."""

    def __init__(self, endpoint: str, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._stopped = threading.Event()
        self._encoder = _Encoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = self._encoder.request(spans)
        problem = ""
        for wait_s in (0.0, *_RETRY_AFTER_S):
            if wait_s and self._stopped.wait(wait_s):
                break  # shutting down: no more waiting for a collector
            request = urllib.request.Request(self.endpoint, data=body, method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
                return SpanExportResult.SUCCESS
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}"
                if exc.code not in _RETRIED_STATUSES:
                    break
            except (urllib.error.URLError, OSError) as exc:
                problem = str(getattr(exc, "reason", exc))
        log.warning("trace export failed: spans dropped", extra={"otlp_endpoint": self.endpoint,
                                                                 "spans": len(spans), "problem": problem})
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._stopped.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here (the processor holds the queue)
