"""Request traces with OpenTelemetry (issue #19; §16: request and job ids go to traces, never to labels).

A completion through the running service produces one ``calculet.request`` span with children for
admission, queue wait, prefill and decode, the decode span linked to one ``calculet.decode_batch``
span per decode batch (id, profile, lanes), with the expected attributes and no prompt
text anywhere (the SDK's in-memory exporter). In virtual time, B4 batches of 3 lanes give one
batch span per batch — not per request — shared by the three requests' links, with durations
equal to the fake clock's; a batch the device fails is an error span. With an OTLP endpoint the
service posts the same tree over OTLP/HTTP (a collector in the test decodes it). Tracing is off by
default: no tracer without an OTLP endpoint; a request the sampler drops gets no span, and neither
does a batch that carries only such requests.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from calculet.adapters.calrt import ReturnCode
from calculet.config import parse_config
from calculet.server.tracing import RequestTracer, SpanPipeline, otlp_pipeline
from calculet.server.tracing_otlp import (OtlpHttpSpanExporter, PlainSpan, PlainSpanBatcher, encode_plain,
                                          encode_spans, to_readable)
from tests.integration.engine.support import engine_config
from tests.service.support import ALIAS, RunningServer, service_config, start_server
from tests.service.test_metrics_values import Stack, stack

PROMPT = "the secret prompt text 7f3a"

Observer = Callable[[Any, str, str], None]


def _pipeline(sample_ratio: float = 1.0) -> tuple[SpanPipeline, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return SpanPipeline(SimpleSpanProcessor(exporter), sample_ratio=sample_ratio), exporter


@pytest.fixture
def traced(key_dir: Path) -> Iterator[tuple[RunningServer, InMemorySpanExporter]]:
    pipeline, exporter = _pipeline()
    running = start_server(service_config(), key_dir, service_options={"span_pipeline": pipeline})
    yield running, exporter
    running.stop()


def _chain(first: Observer, second: Observer) -> Observer:
    def both(rec: Any, source: str, target: str) -> None:
        first(rec, source, target)
        second(rec, source, target)
    return both


def _traced_stack(st: Stack, sample_ratio: float = 1.0) -> tuple[RequestTracer, InMemorySpanExporter]:
    pipeline, exporter = _pipeline(sample_ratio)
    tracer = RequestTracer(pipeline, st.clock, job=st.driver.job, alias="tiny")
    st.driver.core.set_observer(_chain(st.driver.core._observer, tracer.observe))
    return tracer, exporter


def _requests(spans: tuple[ReadableSpan, ...]) -> dict[int, tuple[ReadableSpan, list[ReadableSpan]]]:
    """Each request trace: its root span and its children (sorted by start), checked to be one tree."""
    out = {}
    for root in (s for s in spans if s.name == "calculet.request"):
        in_trace = [s for s in spans if s.context.trace_id == root.context.trace_id and s is not root]
        assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in in_trace)
        out[root.context.trace_id] = (root, sorted(in_trace, key=lambda s: (s.start_time or 0, s.name)))
    return out


def _batches(spans: tuple[ReadableSpan, ...]) -> dict[tuple[int, int], ReadableSpan]:
    """The decode-batch spans by (trace id, span id): each the root of a trace of its own."""
    batches = {(s.context.trace_id, s.context.span_id): s for s in spans if s.name == "calculet.decode_batch"}
    assert all(s.parent is None for s in batches.values())
    assert len({trace_id for trace_id, _ in batches}) == len(batches)
    return batches


def _linked(decode: ReadableSpan, batches: dict[tuple[int, int], ReadableSpan]) -> list[dict[str, Any]]:
    """The attributes of the batch spans ``decode`` links to, in link order (every link resolves)."""
    return [dict(batches[(link.context.trace_id, link.context.span_id)].attributes or {})
            for link in decode.links]


def test_a_completion_produces_the_span_tree_with_attributes_and_no_prompt_text(
        traced: tuple[RunningServer, InMemorySpanExporter]) -> None:
    server, exporter = traced
    completion = server.client("beta").completions.create(model=ALIAS, prompt=PROMPT, max_tokens=4)
    assert completion.usage is not None
    server.service.wait_streams_closed(10)
    spans = exporter.get_finished_spans()
    (root, children), = _requests(spans).values()
    batches = _batches(spans)
    assert len(spans) == 1 + len(children) + len(batches)
    attrs = dict(root.attributes or {})
    assert attrs["calculet.tenant"] == "beta" and attrs["calculet.model"] == ALIAS
    assert attrs["calculet.prompt_tokens"] == completion.usage.prompt_tokens
    assert attrs["calculet.generated_tokens"] == completion.usage.completion_tokens == 4
    assert attrs["calculet.outcome"] == "completed" and attrs["calculet.max_new_tokens"] == 4
    assert [s.name for s in children] == ["calculet.admission", "calculet.queue_wait", "calculet.prefill",
                                          "calculet.decode"]
    assert dict(children[0].attributes or {})["calculet.decision"] == "admit"
    decode = children[3]
    assert dict(decode.attributes or {}) == {"calculet.decode.steps": 3, "calculet.decode.ok": True}
    linked = _linked(decode, batches)  # 4 tokens: the prefill's, then 3 decode batches, a span each
    assert len(linked) == len(batches) == 3
    assert [b["calculet.batch.profile"] for b in linked] == [1, 1, 1]
    assert [b["calculet.batch.lanes"] for b in linked] == [1, 1, 1]
    assert all(set(b) == {"calculet.batch.id", "calculet.batch.profile", "calculet.batch.lanes"} for b in linked)
    assert all(s.status.is_ok for s in batches.values())
    ids = [b["calculet.batch.id"] for b in linked]
    assert len(set(ids)) == 3 and dict(children[2].attributes or {})["calculet.batch.id"] not in ids
    for span in (root, *children):
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time  # type: ignore[operator]
    for batch in batches.values():
        assert decode.start_time <= batch.start_time <= batch.end_time <= decode.end_time  # type: ignore[operator]
    for span in spans:
        assert all("secret" not in str(value) for value in (span.attributes or {}).values())
    assert server.service.tracer is not None and server.service.tracer.open == 0


def test_one_span_per_decode_batch_shared_by_its_lanes_with_fake_clock_durations() -> None:
    """Three requests on B4 (3 and 3 and 5 new tokens): batches of 3 lanes, then of 1 — a span each,
    linked from every request that rode in it; a span lasts from its batch's submission to its end."""
    config = engine_config(profiles=(4,), batch={"batching_window_us": 50_000})
    st = stack(config, profiles=(1, 4), variant="future")
    tracer, exporter = _traced_stack(st)
    for new in (3, 3, 5):
        st.submit(8, new)
    st.driver.run_until_idle()
    spans = exporter.get_finished_spans()
    batches = _batches(spans)
    boarded = sorted({at for at, _, _, target in st.transitions if target == "decode_running"})
    assert len(batches) == len(boarded) == 4  # one span per batch, not one per request per batch
    decodes = [c for _, children in _requests(spans).values() for c in children if c.name == "calculet.decode"]
    links = sorted((_linked(d, batches) for d in decodes), key=len)
    assert [len(x) for x in links] == [2, 2, 4]
    assert [b["calculet.batch.lanes"] for b in links[2]] == [3, 3, 1, 1]
    assert {b["calculet.batch.profile"] for b in links[2][:2]} == {4}
    shared = [tuple(b["calculet.batch.id"] for b in x[:2]) for x in links]
    assert len(set(shared)) == 1  # the three requests link to the same two 3-lane batches
    for batch, at in zip(sorted(batches.values(), key=lambda s: s.start_time or 0), boarded):
        left = min(t for t, _, source, _ in st.transitions if source == "decode_running" and t >= at)
        assert (batch.end_time - batch.start_time) / 1e9 == pytest.approx(left - at, abs=1e-9)  # type: ignore[operator]
    started = st.entered("decode_running")[0]
    ended = [t for t, _, source, _ in st.transitions if source == "decode_running"][-1]
    longest = max(decodes, key=lambda d: len(d.links))
    assert (longest.end_time - longest.start_time) / 1e9 == pytest.approx(ended - started, abs=1e-9)  # type: ignore[operator]
    assert dict(longest.attributes or {})["calculet.decode.steps"] == 4
    assert tracer.open == 0


def test_a_decode_batch_the_device_fails_is_an_error_span_and_its_request_a_failed_trace() -> None:
    """The request's second decode job ends INTERNAL: that batch's span has status ERROR, the first
    batch's does not; the decode span says not ok and links both; the request span is an error."""
    st = stack(engine_config())
    _, exporter = _traced_stack(st)
    st.submit(8, 6)
    st.runtime.hooks.result_rc[st.runtime.hooks.accepted + 3] = ReturnCode.INTERNAL  # prefill, decode, decode
    st.driver.run_until_idle()
    assert [target for _, _, _, target in st.transitions][-1] == "failed"
    spans = exporter.get_finished_spans()
    (root, children), = _requests(spans).values()
    decode = [c for c in children if c.name == "calculet.decode"][0]
    batches = _batches(spans)
    linked = [batches[(link.context.trace_id, link.context.span_id)] for link in decode.links]
    assert [b.status.status_code for b in linked] == [StatusCode.UNSET, StatusCode.ERROR]
    assert dict(decode.attributes or {}) == {"calculet.decode.steps": 2, "calculet.decode.ok": False}
    assert root.status.status_code is StatusCode.ERROR
    assert dict(root.attributes or {})["calculet.outcome"] == "failed"


def test_the_lean_otlp_encoder_writes_the_librarys_messages_for_every_span_the_tracer_builds() -> None:
    """calculet.server.tracing_otlp replaces the library's generic encoder on the export path: for the
    spans of completed and failed requests, B4 batches and links, its bytes decode to the message
    ``opentelemetry-exporter-otlp-proto-common`` builds, field for field."""
    config = engine_config(profiles=(4,), batch={"batching_window_us": 50_000})
    st = stack(config, profiles=(1, 4), variant="future")
    _, exporter = _traced_stack(st)
    for new in (3, 3, 5):
        st.submit(8, new)
    st.runtime.hooks.result_rc[st.runtime.hooks.accepted + 4] = ReturnCode.INTERNAL
    st.driver.run_until_idle()
    spans = exporter.get_finished_spans()
    kinds = {s.name for s in spans} | {s.status.status_code.name for s in spans}
    assert {"calculet.request", "calculet.decode", "calculet.decode_batch", "ERROR", "UNSET"} <= kinds
    assert any(s.links for s in spans)
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    assert ours == library_encode_spans(spans)
    assert ours.SerializeToString(deterministic=True) == library_encode_spans(spans).SerializeToString(
        deterministic=True)


def test_the_lean_encoder_matches_the_library_on_every_field_kind() -> None:
    """Beyond the tracer's own spans: events, arrays, negative and float values, a remote parent, trace
    state, links with attributes, a status message, dropped attributes, kinds, no scope — the same
    message as the library's, so the encoder is not tied to today's span shapes."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
    from opentelemetry.trace import set_span_in_context

    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=6))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("probe", "1.2.3")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "x1")]))
    link = Link(SpanContext(0x123, 0x456, is_remote=True, trace_flags=TraceFlags(1)), {"why": "batch", "n": -3})
    with tracer.start_as_current_span("outer", context=set_span_in_context(NonRecordingSpan(remote)),
                                      kind=SpanKind.SERVER, links=[link],
                                      attributes={"f": 0.25, "b": False, "i": -(2 ** 40), "s": "",
                                                  "arr": [1, 2, 3], "names": ("a", "b"), "x": 1, "y": 2}) as outer:
        outer.add_event("tick", {"k": 7}, timestamp=123)
        outer.set_status(Status(StatusCode.ERROR, "went wrong"))
        with tracer.start_as_current_span("inner", kind=SpanKind.CLIENT):
            pass
    spans = list(memory.get_finished_spans())
    spans.append(ReadableSpan("scopeless", SpanContext(1, 2, False, TraceFlags(1)), None, spans[0].resource,
                              {"k": True, "id": 1024, "big": 2 ** 40 + 7, "small": 1023},
                              start_time=5, end_time=9))
    assert spans[1].dropped_attributes == 2 and spans[1].events and spans[1].parent.is_remote  # type: ignore[union-attr]
    assert ExportTraceServiceRequest.FromString(encode_spans(spans)) == library_encode_spans(spans)


def test_a_request_the_sampler_drops_gets_no_span_nor_do_its_batches() -> None:
    st = stack(engine_config())
    tracer, exporter = _traced_stack(st, sample_ratio=0.0)
    st.submit(8, 3)
    st.driver.run_until_idle()
    assert st.entered("decode_running") and exporter.get_finished_spans() == () and tracer.open == 0


def test_tracing_is_off_by_default_and_on_with_an_otlp_endpoint() -> None:
    base = {"schema": "calculet-scheduler/v1"}
    assert otlp_pipeline(parse_config(base).monitoring.tracing) is None
    on = parse_config({**base, "monitoring": {"tracing": {"otlp_endpoint": "http://127.0.0.1:1/v1/traces",
                                                          "sample_ratio": 0.5, "service_name": "board7"}}})
    pipeline = otlp_pipeline(on.monitoring.tracing)
    assert pipeline is not None and pipeline.sample_ratio == 0.5
    assert pipeline.processor.span_exporter.endpoint == "http://127.0.0.1:1/v1/traces"  # type: ignore[attr-defined]
    assert isinstance(pipeline.processor.span_exporter, OtlpHttpSpanExporter)  # type: ignore[attr-defined]
    assert pipeline.resource.attributes["service.name"] == "board7"
    pipeline.processor.shutdown()


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint that keeps the protobuf bodies it is posted."""

    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.bodies.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


def test_with_an_otlp_endpoint_the_service_posts_the_span_tree_over_otlp_http(key_dir: Path) -> None:
    """The configured path end to end: monitoring.tracing.otlp_endpoint → the batching processor →
    OTLP/HTTP protobuf posts, flushed when the service stops; the collector decodes one request trace
    (5 spans, the service.name resource) and one decode-batch trace per decode step, linked."""
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    _Collector.bodies = []
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    config = service_config(monitoring={"tracing": {"otlp_endpoint": endpoint, "service_name": "board-3"}})
    running = start_server(config, key_dir)
    try:
        running.client("alpha").completions.create(model=ALIAS, prompt=PROMPT, max_tokens=3)
        running.service.wait_streams_closed(10)
    finally:
        running.stop()  # flushes the processor
        collector.shutdown()
    spans = []
    for body in _Collector.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            names = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            assert names["service.name"] == "board-3"
            spans += [span for scope in resource_spans.scope_spans for span in scope.spans]
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert {name: len(found) for name, found in by_name.items()} == {
        "calculet.request": 1, "calculet.admission": 1, "calculet.queue_wait": 1, "calculet.prefill": 1,
        "calculet.decode": 1, "calculet.decode_batch": 2}  # 3 tokens: the prefill's and 2 decode steps
    root, decode = by_name["calculet.request"][0], by_name["calculet.decode"][0]
    assert decode.parent_span_id == root.span_id and decode.trace_id == root.trace_id
    assert {(link.trace_id, link.span_id) for link in decode.links} == {
        (batch.trace_id, batch.span_id) for batch in by_name["calculet.decode_batch"]}
    assert b"secret" not in b"".join(_Collector.bodies)  # no prompt text on the wire


def test_an_unreachable_collector_drops_the_batch_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the endpoint: the post fails, no retry waits once the exporter is shut down,
    the batch is reported failed and one warning names the endpoint and the spans dropped."""
    st = stack(engine_config())
    _, memory = _traced_stack(st)
    st.submit(8, 2)
    st.driver.run_until_idle()
    with socket.socket() as probe:  # a port that was free a moment ago: nothing accepts on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exporter = OtlpHttpSpanExporter(f"http://127.0.0.1:{port}/v1/traces", timeout_s=5.0)
    exporter.shutdown()
    spans = memory.get_finished_spans()
    with caplog.at_level(logging.WARNING, logger="calculet.server.tracing"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
    warnings = [r for r in caplog.records if r.getMessage() == "trace export failed: spans dropped"]
    assert len(warnings) == 1 and warnings[0].spans == len(spans) > 0  # type: ignore[attr-defined]


def test_the_default_service_installs_no_tracer(key_dir: Path) -> None:
    running = start_server(service_config(), key_dir)
    try:
        assert running.service.tracer is None
    finally:
        running.stop()


class _Tuples(list):  # type: ignore[type-arg]
    """A span sink keeping the tracer's span tuples (the service's batcher's side of the pipeline)."""

    def add(self, span: PlainSpan) -> None:
        self.append(span)

    def shutdown(self) -> None:
        return


def test_the_span_tuples_are_written_as_the_library_writes_the_same_spans() -> None:
    """The service's path (span tuples → OTLP bytes on the export thread, issue #19's cost cut) writes
    the message the library builds from the SDK spans of the same tuples (the spans an SDK processor
    gets), for completed and failed requests, B4 batches of 3 lanes and 1, an ERROR batch and links."""
    config = engine_config(profiles=(4,), batch={"batching_window_us": 50_000})
    st = stack(config, profiles=(1, 4), variant="future")
    tuples = _Tuples()
    tracer = RequestTracer(SpanPipeline(tuples), st.clock, job=st.driver.job, alias="tiny")
    st.driver.core.set_observer(_chain(st.driver.core._observer, tracer.observe))
    for new in (3, 3, 5):
        st.submit(8, new)
    st.runtime.hooks.result_rc[st.runtime.hooks.accepted + 5] = ReturnCode.INTERNAL
    st.driver.run_until_idle()
    assert tracer.open == 0
    resource = SpanPipeline(tuples).resource
    spans = [to_readable(span, resource) for span in tuples]
    names = {s.name for s in spans} | {s.status.status_code.name for s in spans}
    assert {"calculet.request", "calculet.decode", "calculet.decode_batch", "ERROR", "UNSET"} <= names
    assert any(len(s.links) > 1 for s in spans) and any(s.parent is not None for s in spans)
    ours = ExportTraceServiceRequest.FromString(encode_plain(tuples, resource))
    assert ours == library_encode_spans(spans)
    assert ours.SerializeToString(deterministic=True) == library_encode_spans(spans).SerializeToString(
        deterministic=True)
    assert encode_plain([], resource) == b""


class _Recorder(OtlpHttpSpanExporter):
    """Keeps each batch the batcher exports instead of posting it."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1/v1/traces")
        self.batches: list[list[PlainSpan]] = []

    def export_plain(self, spans: Any, resource: Any, scope: Any = None) -> SpanExportResult:
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS


def _span(n: int) -> PlainSpan:
    return ("calculet.decode_batch", n, n, 0, n, n + 1, {"calculet.batch.id": n}, (), None)


def test_the_span_batcher_posts_in_batches_drops_the_oldest_when_full_and_flushes_at_shutdown(
        caplog: pytest.LogCaptureFixture) -> None:
    """Six spans into a queue of four (never woken early, no timed wake within the test): the two
    oldest are dropped and counted, one warning says so; a flush exports the four newest in posts of
    at most three; shutdown exports what was added since."""
    exporter = _Recorder()
    batcher = PlainSpanBatcher(exporter, SpanPipeline(_Tuples()).resource, max_queue_size=4,
                               schedule_delay_s=1e6, max_export_batch_size=3, wake_at=5)
    for n in range(1, 7):
        batcher.add(_span(n))
    assert batcher.dropped == 2
    with caplog.at_level(logging.WARNING, logger="calculet.server.tracing"):
        batcher.force_flush()
    assert [[s[1] for s in batch] for batch in exporter.batches] == [[3, 4, 5], [6]]
    dropped = [getattr(r, "spans") for r in caplog.records if r.getMessage() == "trace queue full: spans dropped"]
    assert dropped == [2]
    batcher.add(_span(7))
    batcher.shutdown()
    assert [s[1] for s in exporter.batches[-1]] == [7]
    batcher.shutdown()  # idempotent
    assert len(exporter.batches) == 3


def test_the_sample_ratio_keeps_the_sdk_samplers_decision() -> None:
    """sample_ratio 0.5 over 24 requests (seeded ids): some traced, some not, and a request is traced
    exactly when the SDK's TraceIdRatioBased(0.5) samples its trace id; its batches with it."""
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    state = random.getstate()
    random.seed(19)
    try:
        st = stack(engine_config())
        tracer, exporter = _traced_stack(st, sample_ratio=0.5)
        for _ in range(24):
            st.submit(8, 2)
        st.driver.run_until_idle()
    finally:
        random.setstate(state)
    roots = [s for s in exporter.get_finished_spans() if s.name == "calculet.request"]
    assert 0 < len(roots) < 24 and tracer.open == 0
    sampler = TraceIdRatioBased(0.5)
    assert all(sampler.should_sample(None, s.context.trace_id, s.name).decision.is_sampled() for s in roots)
    batches = [s for s in exporter.get_finished_spans() if s.name == "calculet.decode_batch"]
    assert len(batches) == len(roots)  # 2 tokens: the prefill's and one decode batch per traced request


class _KeepAliveCollector(BaseHTTPRequestHandler):
    """An HTTP/1.1 OTLP endpoint recording the client port of each post; ``close_after`` posts on a
    connection, it closes it without saying so (as a collector's idle timeout does)."""

    protocol_version = "HTTP/1.1"
    ports: list[int] = []
    close_after = 2
    served: dict[int, int] = {}

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        port = self.client_address[1]
        self.ports.append(port)
        self.served[port] = self.served.get(port, 0) + 1
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
        if self.served[port] >= self.close_after:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return


def test_the_exporter_keeps_its_connection_and_reconnects_when_the_collector_closed_it() -> None:
    """Posts reuse one connection; after the collector silently closed it, the next post goes out on a
    new connection at once (no retry wait, no failure)."""
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveCollector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    _KeepAliveCollector.ports, _KeepAliveCollector.served = [], {}
    exporter = OtlpHttpSpanExporter(f"http://127.0.0.1:{collector.server_address[1]}/v1/traces")
    resource = SpanPipeline(_Tuples()).resource
    try:
        for n in range(3):
            assert exporter.export_plain([_span(n + 1)], resource) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        collector.shutdown()
    ports = _KeepAliveCollector.ports
    assert len(ports) == 3 and ports[0] == ports[1] != ports[2]
