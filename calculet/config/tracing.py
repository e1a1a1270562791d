"""``monitoring.tracing``: where request traces go (§16: request and job ids belong to traces and logs).

Why a section of its own: tracing is off by default (no exporter, no span, no cost on the
request path) and turns on only when an OTLP endpoint is named; the service then exports one
trace per request — admission, queue wait, prefill jobs, decode — and one span per decode batch,
linked from the requests that rode in it, with OpenTelemetry (:mod:`calculet.server.tracing`).
``sample_ratio`` is decided once per request at its arrival; a batch is traced when it carries a
traced request. No prompt or completion text is ever put in a span.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from calculet.config.base import LabelName, Section

__all__ = ["TracingConfig"]


class TracingConfig(Section):
    """OpenTelemetry export of request traces (off unless ``otlp_endpoint`` is set)."""

    otlp_endpoint: Annotated[str, Field(min_length=1, max_length=2048)] | None = Field(
        None,
        description="OTLP traces endpoint, e.g. 'http://127.0.0.1:4318/v1/traces' (OTLP/HTTP, protobuf). "
        "null = tracing off (the default).",
    )
    protocol: Literal["http/protobuf"] = Field(
        "http/protobuf", description="OTLP transport (only OTLP over HTTP with protobuf bodies is built in)."
    )
    service_name: LabelName = Field("calculet", description="The traces' service.name resource attribute.")
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        1.0, description="Share of requests traced (trace-id ratio, decided once per request at its arrival)."
    )
