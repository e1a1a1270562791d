"""Structured logs carry request id, tenant and generation; starvation events are counted (§5.3, §16)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from calculet.server.logs import JsonFormatter, TextFormatter, configure_logging
from calculet.server.request_metrics import StarvationWatch
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer


@pytest.mark.req("R16.10")
def test_request_logs_carry_request_id_tenant_and_generation(server: RunningServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="calculet"):
        raw = server.client("gamma").completions.with_raw_response.create(model=ALIAS, prompt="log me", max_tokens=2)
        assert server.service.wait_streams_closed(30)
    request_id = raw.headers["x-request-id"]
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == request_id]
    assert [r.getMessage() for r in lines] == ["http"]  # the request's one line (#20: no second line beside it)
    record = lines[0]
    assert (record.tenant, record.generation, record.model) == ("gamma", 1, ALIAS)  # type: ignore[attr-defined]
    assert record.engine_request_id >= 1 and record.finish_reason in ("length", "stop")  # type: ignore[attr-defined]
    assert (record.route, record.status, record.completion_tokens) == ("/v1/completions", 200, 2)  # type: ignore
    assert record.client_disconnected is False and record.ttft_s >= 0  # type: ignore[attr-defined]
    line = json.loads(JsonFormatter().format(record))
    assert {"ts", "level", "logger", "msg", "request_id", "tenant", "generation", "engine_request_id"} <= set(line)
    text = TextFormatter().format(record)
    assert f"request_id={request_id}" in text and "tenant=gamma" in text and "generation=1" in text


@pytest.mark.req("R16.10")
def test_a_streamed_request_has_one_line_saying_how_it_ended(server: RunningServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Catches: the stream's end fields set after the request's line was written (its last message), or a second
    line for the end of the stream."""
    with caplog.at_level(logging.INFO, logger="calculet"):
        with server.client("gamma").completions.with_streaming_response.create(
                model=ALIAS, prompt="log my stream", max_tokens=3, stream=True, extra_body={"ignore_eos": True}) as raw:
            request_id = raw.headers["x-request-id"]
            assert "data: [DONE]" in raw.read().decode()
        assert server.service.wait_streams_closed(30)
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == request_id]
    assert [r.getMessage() for r in lines] == ["http"]
    record = lines[0]
    assert (record.status, record.finish_reason, record.completion_tokens) == (200, "length", 3)  # type: ignore
    assert record.client_disconnected is False and record.engine_request_id >= 1  # type: ignore[attr-defined]


@pytest.mark.usefixtures("restore_logging")
def test_configure_logging_writes_one_json_object_per_line() -> None:
    stream = io.StringIO()
    configure_logging("json", "INFO", stream=stream)
    logging.getLogger("calculet.test").info("hello", extra={"request_id": "r1", "tenant": "alpha"})
    record = json.loads(stream.getvalue().strip())
    assert (record["msg"], record["request_id"], record["tenant"], record["level"]) == ("hello", "r1", "alpha", "INFO")
    with pytest.raises(ValueError):
        configure_logging("xml")  # type: ignore[arg-type]


@pytest.mark.req("R16.7", "R5.3.4")
def test_a_request_overtaken_after_the_threshold_is_one_starvation_event() -> None:
    """Times are given, not slept: request 1 waits past the threshold while later ones start."""
    events: list[str] = []
    watch = StarvationWatch(events.append, threshold_s=30.0)
    watch.arrived(1, "alpha", at=0.0)
    watch.arrived(2, "beta", at=1.0)
    watch.arrived(3, "beta", at=2.0)
    watch.started(2, at=10.0)  # overtakes 1, but 1 has waited only 10 s
    assert events == []
    watch.started(3, at=31.0)  # 1 has waited 31 s > 30 s while a later arrival starts
    assert events == ["alpha"]
    watch.arrived(4, "gamma", at=32.0)
    watch.started(4, at=70.0)  # 1 already counted: one event per starved request
    assert events == ["alpha"] and watch.events == 1
    watch.started(1, at=71.0)
    watch.arrived(5, "delta", at=80.0)
    watch.ended(5)  # cancelled while waiting: forgotten, never counted
    watch.arrived(6, "delta", at=200.0)
    watch.started(6, at=201.0)
    assert events == ["alpha"]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


FOUR_XX = [  # (label, method, path, headers, json body or raw bytes, status)
    ("no prompt", "POST", "/v1/completions", _bearer(TENANT_KEYS["alpha"]), {"model": ALIAS}, 400),
    ("negative max_tokens", "POST", "/v1/completions", _bearer(TENANT_KEYS["alpha"]),
     {"model": ALIAS, "prompt": "x", "max_tokens": -1}, 400),
    ("body not json", "POST", "/v1/completions", {**_bearer(TENANT_KEYS["alpha"]), "content-type": "application/json"},
     b"{not json", 400),
    ("no api key", "POST", "/v1/completions", {}, {"model": ALIAS, "prompt": "x"}, 401),
    ("wrong api key", "POST", "/v1/completions", _bearer("sk-nobody"), {"model": ALIAS, "prompt": "x"}, 401),
    ("admin with a tenant key", "GET", "/admin/models", _bearer(TENANT_KEYS["alpha"]), None, 401),
    ("unknown route", "GET", "/v1/nothing-here", _bearer(TENANT_KEYS["alpha"]), None, 404),
    ("unknown model", "POST", "/v1/completions", _bearer(TENANT_KEYS["alpha"]), {"model": "nope", "prompt": "x"}, 404),
    ("method not allowed", "DELETE", "/v1/models", _bearer(TENANT_KEYS["alpha"]), None, 405),
]


@pytest.mark.req("R16.10")
@pytest.mark.parametrize("label,method,path,headers,body,status", FOUR_XX, ids=[c[0] for c in FOUR_XX])
def test_every_4xx_log_line_names_its_code_and_reason(server: RunningServer, caplog: pytest.LogCaptureFixture,
                                                       label: str, method: str, path: str, headers: dict[str, str],
                                                       body: object, status: int) -> None:
    """Issue #19: 4xx lines carried only the status (429 lines the reason). The request's one "http" line
    names the code and the reason the client was told — the error body's code and message — for each
    kind of refusal, not a bare status."""
    with caplog.at_level(logging.INFO, logger="calculet"), server.http() as http:
        content = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
        response = http.request(method, path, headers=headers, **content)  # type: ignore[arg-type]
    assert response.status_code == status, (label, response.text)
    error = response.json()["error"]
    request_id = response.headers["x-request-id"]
    lines = [r for r in caplog.records if r.getMessage() == "http" and getattr(r, "request_id", None) == request_id]
    assert len(lines) == 1, label
    line = lines[0]
    assert line.status == status and line.levelno == logging.INFO  # type: ignore[attr-defined]
    assert line.code == error["code"] and not line.code.startswith("http_")  # type: ignore[attr-defined]
    assert line.reason and line.reason == error["message"], (label, line.reason)  # type: ignore[attr-defined]
