"""The cuts of the event loop's work per request (issue #13, time to 429 under a burst) keep every answer as it was.

* the front answers ``GET /health/live`` with the bytes FastAPI's route writes, and :class:`ServiceApp` sends the
  front exactly what it answers (everything else to FastAPI's own stack);
* ``send_json`` / ``APIError.send`` write what a Starlette ``JSONResponse`` (``JSONBody``) writes: status, headers
  in the same order, body;
* the HTTP metrics' children are kept, and count as ``labels()`` does;
* the JSON formatter's one-pass extras give the line the old two-pass code gave;
* requests held for the engine's next answer share one wait: one waker, released by the answer or the timer, and
  a cancelled waiter does not end the others' wait by failing them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from calculet.runtime.engine.admission_snapshot import EarlyAdmission
from calculet.server.app import ServiceApp
from calculet.server.errors import APIError, admission_error
from calculet.server.front import LIVE_BODY, LIVE_PATH, GenerationFront
from calculet.server.jsonenc import JSONBody, send_json
from calculet.server.logs import JsonFormatter, _extras, _plain, _timestamp
from calculet.server.request_metrics import ServiceMetrics
from calculet.server.schemas import Health
from calculet.server.service import NextAnswer


async def _sent(answer: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await answer(send)
    return messages


async def _response(response: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    await response({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    return messages


@pytest.mark.parametrize("headers", [None, {}, {"Retry-After": "7"}, {"Retry-After": "7", "Connection": "close"},
                                     {"Content-Type": "application/problem+json"}, {"X-Thing": "é"}])
@pytest.mark.parametrize("content", [{"error": {"message": "héllo \u2028", "code": None}}, [1, 2.5, None], "x"])
def test_send_json_writes_what_a_json_response_writes(content: Any, headers: dict[str, str] | None) -> None:
    for status in (200, 429):
        expected = asyncio.run(_response(JSONBody(content, status_code=status, headers=headers)))
        got = asyncio.run(_sent(lambda send: send_json(send, status, content, headers)))
        assert got == expected


def test_an_api_error_sends_the_bytes_of_its_response() -> None:
    for error in (admission_error(429, "no prospect", retry_after_s=12.2), APIError(401, "no key", code="invalid_api_key"),
                  APIError(413, "too large", code="body_too_large", headers={"Connection": "close"})):
        assert asyncio.run(_sent(error.send)) == asyncio.run(_response(error.response()))


def test_the_live_answer_is_the_routes_own() -> None:
    assert json.dumps(LIVE_BODY, separators=(",", ":")).encode() == JSONResponse(
        jsonable_encoder(Health(status="live"))).body


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": [], "state": {}}


def test_the_front_answers_its_routes_by_method_and_the_live_probe_only_when_given() -> None:
    front = GenerationFront(lambda *a: None, service=None, routes={"/v1/completions": object()}, live=object())
    assert front.answers(_scope("POST", "/v1/completions")) and front.answers(_scope("GET", LIVE_PATH))
    for method, path in (("GET", "/v1/completions"), ("POST", LIVE_PATH), ("HEAD", LIVE_PATH),
                         ("GET", LIVE_PATH + "/"), ("GET", "/health"), ("GET", "/metrics")):
        assert not front.answers(_scope(method, path)), (method, path)
    assert not front.answers({"type": "websocket", "path": LIVE_PATH})
    without = GenerationFront(lambda *a: None, service=None, routes={"/v1/completions": object()})
    assert not without.answers(_scope("GET", LIVE_PATH))


def test_the_front_answers_live_with_its_route_named_for_the_log_line() -> None:
    live = object()
    front = GenerationFront(lambda *a: None, service=None, routes={}, live=live)
    scope = _scope("GET", LIVE_PATH)

    async def run() -> list[dict[str, Any]]:
        return await _sent(lambda send: front(scope, lambda: None, send))

    sent = asyncio.run(run())
    assert sent == asyncio.run(_response(JSONResponse(jsonable_encoder(Health(status="live")))))
    assert scope["route"] is live


def test_the_service_app_sends_the_front_what_it_answers_and_fastapi_the_rest() -> None:
    app = ServiceApp()

    @app.get("/other")
    async def other() -> dict[str, str]:
        return {"from": "fastapi"}

    through: list[str] = []

    async def stack(scope: Any, receive: Any, send: Any) -> None:
        through.append(scope["path"])
        assert scope["app"] is app
        await send_json(send, 200, {"from": "front"})

    app.front = GenerationFront(app.router, service=None, routes={"/v1/completions": object()}, live=object())
    app.front_stack = stack

    async def call(method: str, path: str) -> Any:
        messages: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            messages.append(message)

        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "headers": [],
                 "query_string": b"", "root_path": "", "http_version": "1.1", "scheme": "http",
                 "server": ("t", 80), "client": ("c", 1), "state": {}}
        await app(scope, receive, send)
        return json.loads(messages[-1]["body"])

    assert asyncio.run(call("POST", "/v1/completions")) == {"from": "front"}
    assert asyncio.run(call("GET", LIVE_PATH)) == {"from": "front"}
    assert asyncio.run(call("GET", "/other")) == {"from": "fastapi"}
    assert through == ["/v1/completions", LIVE_PATH]


def test_the_http_metrics_children_are_kept_and_count_as_labels_does() -> None:
    metrics = ServiceMetrics(CollectorRegistry(auto_describe=False), ["default"])
    for took in (0.001, 0.2, 0.003):
        metrics.observe_http("/v1/completions", "POST", 429, took)
    metrics.observe_http("/v1/completions", "POST", 200, 0.5)
    assert metrics.http_requests.labels("/v1/completions", "POST", "429")._value.get() == 3
    assert metrics.http_requests.labels("/v1/completions", "POST", "200")._value.get() == 1
    assert metrics.http_duration.labels("/v1/completions")._sum.get() == pytest.approx(0.704)
    assert len(metrics._http_children) == 2


class _Odd:
    def __str__(self) -> str:
        return "odd"


def test_the_json_line_is_the_one_the_two_pass_formatter_wrote() -> None:
    record = logging.LogRecord("calculet.server", logging.INFO, __file__, 1, "http %s", ("x",), None)
    record.__dict__.update({"request_id": "ab", "status": 429, "duration_s": 0.25, "tenant": None, "ok": True,
                            "fields": {1: _Odd(), "k": (1, 2)}, "odd": _Odd(), "_private": 1, "text": "é\u2028"})
    reference = {"ts": _timestamp(record), "level": "INFO", "logger": "calculet.server", "msg": "http x",
                 **{k: _plain(v) for k, v in _extras(record).items()}}
    assert json.loads(JsonFormatter().format(record)) == reference
    assert list(json.loads(JsonFormatter().format(record))) == list(reference)


def test_held_requests_share_one_wait_released_by_the_engines_next_answer() -> None:
    early = EarlyAdmission()

    async def run() -> None:
        waits = NextAnswer(early, hold_s=3600.0)
        first, second = waits.wait(), waits.wait()
        assert first is second and len(early._wakers) == 1 and early.statistics().held == 2
        early.sent()
        early.answered()
        assert first.done()
        third = waits.wait()  # a new wait after the answer
        assert third is not first and len(early._wakers) == 1 and early.statistics().held == 3

    asyncio.run(run())


def test_a_shared_wait_ends_at_its_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    early = EarlyAdmission()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        timers: list[tuple[float, Any]] = []
        monkeypatch.setattr(loop, "call_later", lambda delay, callback: timers.append((delay, callback)))
        wait = NextAnswer(early, hold_s=0.02).wait()
        assert [delay for delay, _ in timers] == [0.02] and not wait.done()
        timers[0][1]()  # the timer fires before any answer
        assert wait.done()
        early.sent()
        early.answered()  # the answer after it changes nothing

    asyncio.run(run())


def test_a_cancelled_held_request_does_not_fail_the_others() -> None:
    """The front's loop (inference._refuse_early): a CancelledError that is not this task's own goes on."""
    early = EarlyAdmission()

    async def held(waits: NextAnswer, log: list[str], name: str) -> None:
        try:
            await waits.wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                log.append(f"{name} cancelled")
                raise
            log.append(f"{name} goes on")
            return
        log.append(f"{name} answered")

    async def run() -> list[str]:
        waits = NextAnswer(early, hold_s=3600.0)
        log: list[str] = []
        one = asyncio.ensure_future(held(waits, log, "one"))
        two = asyncio.ensure_future(held(waits, log, "two"))
        await asyncio.sleep(0)  # both are waiting (one loop turn, no time)
        one.cancel()
        await asyncio.gather(one, two, return_exceptions=True)
        return log

    assert sorted(asyncio.run(run())) == ["one cancelled", "two goes on"]
