"""The generation routes' pure-ASGI front (issue #13) and the choice of the edge's HTTP implementation.

The front must answer exactly the generation routes' POSTs (anything else goes on to FastAPI), name the
matched route in the scope (the log line's and the HTTP metrics' template), answer an ``APIError`` as the
app's handler does (OpenAI shape, code and reason noted for the request's line), and write a response model
as FastAPI writes it. The whole service path through it is covered by tests/service (OpenAI client, hostile
inputs, overload).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder
from starlette.responses import PlainTextResponse

from calculet.server import front
from calculet.server.errors import APIError
from calculet.server.front import GenerationFront
from calculet.server.http_fast import FastEdgeProtocol
from calculet.server.http_server import EdgeProtocol, edge_protocol
from calculet.server.schemas import CompletionChoice, CompletionResponse, Usage


class _Tenants:
    def resolve(self, authorization: str | None) -> str:
        if authorization != "Bearer good":
            raise APIError(401, "unknown API key", code="invalid_api_key")
        return "alpha"


class _Service:
    tenants = _Tenants()


ROUTES = {"/v1/completions": object(), "/v1/chat/completions": object()}


def _call(app: Any, method: str, path: str, *, key: str = "good") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "state": {},
                             "headers": [(b"authorization", f"Bearer {key}".encode())]}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return scope, sent


def _front(monkeypatch: pytest.MonkeyPatch, result: Any) -> tuple[GenerationFront, list[str]]:
    passed: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        passed.append(scope["path"])
        await PlainTextResponse("router")(scope, receive, send)

    async def generate_route(service: Any, request: Any, tenant: str, path: str) -> Any:
        assert tenant == "alpha" and request.state.tenant == "alpha"
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(front, "generate_route", generate_route)
    return GenerationFront(inner, service=_Service(), routes=ROUTES), passed  # type: ignore[arg-type]


@pytest.mark.req("R5.2.1")
def test_the_front_answers_generation_posts_and_passes_everything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    app, passed = _front(monkeypatch, PlainTextResponse("generated"))
    for path in ROUTES:
        scope, sent = _call(app, "POST", path)
        assert sent[-1]["body"] == b"generated" and scope["route"] is ROUTES[path]
    assert passed == []
    for method, path in (("GET", "/v1/completions"), ("POST", "/v1/models"), ("POST", "/v1/completions/")):
        _, sent = _call(app, method, path)
        assert sent[-1]["body"] == b"router"
    assert passed == ["/v1/completions", "/v1/models", "/v1/completions/"]


@pytest.mark.req("R5.2.1")
def test_errors_are_answered_in_the_openai_shape_and_noted_for_the_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    app, _ = _front(monkeypatch, APIError(429, "over capacity", code="over_capacity", headers={"Retry-After": "7"}))
    scope, sent = _call(app, "POST", "/v1/completions")
    start, body = sent
    assert start["status"] == 429 and (b"retry-after", b"7") in start["headers"]
    assert json.loads(body["body"]) == {"error": {"message": "over capacity", "type": "rate_limit_error",
                                                  "code": "over_capacity", "param": None}}
    assert scope["state"]["error"] == ("over_capacity", "over capacity")
    scope, sent = _call(app, "POST", "/v1/completions", key="bad")  # the tenant is resolved before the body is used
    assert sent[0]["status"] == 401 and scope["state"]["error"][0] == "invalid_api_key"


def test_a_response_model_is_written_as_fastapi_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = CompletionResponse(id="cmpl-1", created=1, model="tiny", system_fingerprint="calculet-g1",
                               choices=[CompletionChoice(index=0, text="héllo\u2028", finish_reason="length",
                                                         stop_reason=None)],
                               usage=Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5))
    app, _ = _front(monkeypatch, model)
    _, sent = _call(app, "POST", "/v1/completions")
    assert sent[0]["status"] == 200 and (b"content-type", b"application/json") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == jsonable_encoder(model, by_alias=True)


def test_the_edge_protocol_is_httptools_when_installed_and_h11_on_request() -> None:
    assert issubclass(edge_protocol(1.5), FastEdgeProtocol) and edge_protocol(1.5).header_timeout_s == 1.5
    assert issubclass(edge_protocol(1.5, "h11"), EdgeProtocol)
    with pytest.raises(ValueError, match="CALCULET_HTTP"):
        edge_protocol(1.5, "hyper")
