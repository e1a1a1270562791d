"""Request traces with OpenTelemetry (issue #19; §16: request and job ids go to traces, never to labels).

A completion through the running service produces one ``calculet.request`` span with children for
admission, queue wait, prefill and its decode batches (ids, profile, lanes, engines), with the
expected attributes and no prompt text anywhere (the SDK's in-memory exporter). In virtual time,
B4 batches of 3 lanes give decode spans with profile 4, lanes [3, 3], the same batch ids for the
three requests, and span durations equal to the fake clock's. Tracing is off by default: no tracer
without an OTLP endpoint; a request the sampler drops gets no child span.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from calculet.config import parse_config
from calculet.server.tracing import RequestTracer, otlp_provider
from tests.integration.engine.support import engine_config
from tests.service.support import ALIAS, RunningServer, service_config, start_server
from tests.service.test_metrics_values import stack

PROMPT = "the secret prompt text 7f3a"


@pytest.fixture
def traced(key_dir: Path) -> Iterator[tuple[RunningServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    running = start_server(service_config(), key_dir, service_options={"tracer_provider": provider})
    yield running, exporter
    running.stop()


def _tree(spans: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    roots = [s for s in spans if s.name == "calculet.request"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert len(children) == len(spans) - 1, "every other span is a child of the request span"
    assert all(s.context.trace_id == root.context.trace_id for s in spans)
    return root, sorted(children, key=lambda s: (s.start_time or 0, s.name))


def test_a_completion_produces_the_span_tree_with_attributes_and_no_prompt_text(
        traced: tuple[RunningServer, InMemorySpanExporter]) -> None:
    server, exporter = traced
    completion = server.client("beta").completions.create(model=ALIAS, prompt=PROMPT, max_tokens=4)
    assert completion.usage is not None
    server.service.wait_streams_closed(10)
    root, children = _tree(exporter.get_finished_spans())
    attrs = dict(root.attributes or {})
    assert attrs["calculet.tenant"] == "beta" and attrs["calculet.model"] == ALIAS
    assert attrs["calculet.prompt_tokens"] == completion.usage.prompt_tokens
    assert attrs["calculet.generated_tokens"] == completion.usage.completion_tokens == 4
    assert attrs["calculet.outcome"] == "completed" and attrs["calculet.max_new_tokens"] == 4
    names = [s.name for s in children]
    assert names[:3] == ["calculet.admission", "calculet.queue_wait", "calculet.prefill"]
    assert names[3:] == ["calculet.decode"]
    assert dict(children[0].attributes or {})["calculet.decision"] == "admit"
    decode = dict(children[3].attributes or {})
    assert decode["calculet.decode.steps"] == 3  # 4 tokens: the prefill's, then 3 decode batches
    assert decode["calculet.batch.profile"] == 1 and decode["calculet.batch.lanes"] == "1 1 1"
    ids = [int(i) for i in str(decode["calculet.batch.ids"]).split()]
    assert len(set(ids)) == 3 and decode["calculet.decode.ok"] is True
    assert set(str(decode["calculet.batch.engines"]).split()) <= {"ping", "pong"}
    assert dict(children[2].attributes or {})["calculet.batch.id"] not in ids
    for span in (root, *children):
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time  # type: ignore[operator]
        for value in (span.attributes or {}).values():
            assert "secret" not in str(value)
    assert server.service.tracer is not None and server.service.tracer.open == 0


def test_decode_spans_carry_b4_profile_and_3_lanes_with_fake_clock_durations() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = engine_config(profiles=(4,), batch={"batching_window_us": 50_000})
    tracer: list[RequestTracer] = []
    st = stack(config, profiles=(1, 4), variant="future")
    tracer.append(RequestTracer(provider, st.clock, job=st.driver.job, alias="tiny"))
    st.driver.core._observer = _chain(st.driver.core._observer, tracer[0].observe)
    for _ in range(3):
        st.submit(8, 3)
    st.driver.run_until_idle()
    spans = exporter.get_finished_spans()
    decodes = [dict(s.attributes or {}) for s in spans if s.name == "calculet.decode"]
    assert len(decodes) == 3  # one per request: its profile never changed
    assert {d["calculet.batch.profile"] for d in decodes} == {4}
    assert {d["calculet.batch.lanes"] for d in decodes} == {"3 3"}
    assert len({d["calculet.batch.ids"] for d in decodes}) == 1  # the 3 lanes rode the same 2 jobs
    assert len(str(decodes[0]["calculet.batch.ids"]).split()) == 2
    started = st.entered("decode_running")[0]
    ended = [t for t, _, src, _ in st.transitions if src == "decode_running"][-1]
    spans_by_name = [s for s in spans if s.name == "calculet.decode"]
    assert {round((s.end_time - s.start_time) / 1e9, 9) for s in spans_by_name} == {round(ended - started, 9)}  # type: ignore[operator]
    assert tracer[0].open == 0


def test_a_request_the_sampler_drops_gets_no_child_span() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    st = stack(engine_config())
    tracer = RequestTracer(provider, st.clock, job=st.driver.job)
    st.driver.core._observer = _chain(st.driver.core._observer, tracer.observe)
    st.submit(8, 3)
    st.driver.run_until_idle()
    assert exporter.get_finished_spans() == () and tracer.open == 0


def _chain(first, second):  # type: ignore[no-untyped-def]
    def both(rec, source, target):  # type: ignore[no-untyped-def]
        first(rec, source, target)
        second(rec, source, target)
    return both


def test_tracing_is_off_by_default_and_on_with_an_otlp_endpoint() -> None:
    base = {"schema": "calculet-scheduler/v1"}
    assert otlp_provider(parse_config(base).monitoring.tracing) is None
    on = parse_config({**base, "monitoring": {"tracing": {"otlp_endpoint": "http://127.0.0.1:1/v1/traces",
                                                          "sample_ratio": 0.5}}})
    provider = otlp_provider(on.monitoring.tracing)
    assert isinstance(provider, TracerProvider)
    provider.shutdown()


def test_the_default_service_installs_no_tracer(key_dir: Path) -> None:
    running = start_server(service_config(), key_dir)
    try:
        assert running.service.tracer is None
    finally:
        running.stop()
