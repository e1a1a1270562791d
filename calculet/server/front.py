"""The generation routes' front door: ``POST /v1/completions`` and ``POST /v1/chat/completions`` answered as pure
ASGI, in front of FastAPI's router (issues #13 and #20).

Why: under a burst every request is refused or admitted by the same few steps — the tenant from the key, the
body parsed, the engine's §5.2 answer — but through FastAPI each also paid for the framework around them:
Starlette's exception and exit-stack middleware, the router's match over every route, dependency solving (the
API key read twice: once by the body gate, once by the route's dependency), the endpoint's result validated
against its response model and encoded again. A profile of the event loop during a 300-request burst of
refusals put the router, dependency solving and the layers between at a large share of the loop's CPU per
429. With the other cuts of this pass (httptools, no worker-thread hops, one log line, orjson), the loop's
CPU per refusal went from 1.90 to 0.64 ms (``bench/overload_http.py --part burst``, on_time, load average
3-8 on 2 cores; bare uvicorn + httptools: 0.10 ms). This front does those steps itself, with the
same functions the FastAPI routes call (:mod:`calculet.server.inference`), so the answers are the same bytes;
everything else (other paths, other methods on these paths: 405) goes on to FastAPI. The routes stay declared
in FastAPI for the OpenAPI document; the front names the matched route in the scope (``scope["route"]``) as
FastAPI's router does, so the request's log line and ``calculet_http_requests_total`` carry its template.

``GET /health/live`` is answered here too, with the bytes its FastAPI route writes: under a burst of probes the
router's match and the route's dependency solving and response-model validation were most of the loop's CPU
per request (0.36 ms of loop CPU per probe against 0.09 ms through the front, ``bench/loop_profile.py``, 300
probes fed at once in-process; a bare ASGI app on the same protocol: 0.06 ms).

:class:`~calculet.server.app.ServiceApp` sends the front exactly what :meth:`GenerationFront.answers` (its own
fallback to ``app`` is then never taken), through :class:`~calculet.server.app.RequestContext` (request id, log
line, HTTP metrics) and the :class:`~calculet.server.body_gate.BodyGate` (credentials before the body, the body
bounded) — instances of their own, not FastAPI's middleware — so those hold for it as for every route; errors are
answered as the app's exception handlers answer them (the OpenAI shape, the same bytes sent without a response
object, code and reason noted for the log line), and an unexpected exception still reaches ``RequestContext``'s
500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from calculet.errors import CalculetError
from calculet.server.errors import APIError, from_calculet
from calculet.server.inference import generate_route
from calculet.server.jsonenc import JSONBody, send_json

LIVE_PATH = "/health/live"
LIVE_BODY = {"status": "live", "detail": ""}
"""``GET /health/live``'s answer (the ``Health`` model FastAPI's route returns, as FastAPI writes it)."""


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return bytes(value).decode("latin-1")
    return None


class GenerationFront:
    """Pure ASGI middleware: the generation routes (``routes``: path → the FastAPI route declaring it) and, given
    ``live``, ``GET /health/live`` answered here; any other request passes to ``app``."""

    def __init__(self, app: ASGIApp, *, service: Any, routes: Mapping[str, Any], live: Any = None) -> None:
        self.app = app
        self.service = service
        self.routes = dict(routes)
        self.live = live

    def answers(self, scope: Scope) -> bool:
        """Whether this front answers ``scope`` itself (an HTTP request to one of its routes, by its method)."""
        if scope["type"] != "http":
            return False
        path = scope["path"]
        if path in self.routes:
            return scope["method"] == "POST"
        return path == LIVE_PATH and self.live is not None and scope["method"] == "GET"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.answers(scope):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == LIVE_PATH:  # liveness is the event loop answering (#14): nothing to read, nothing to ask
            scope["route"] = self.live
            await send_json(send, 200, LIVE_BODY)
            return
        scope["route"] = self.routes[path]
        request = Request(scope, receive, send)
        try:
            tenant = self.service.tenants.resolve(_authorization(scope))
            scope.setdefault("state", {})["tenant"] = tenant  # what ``request.state.tenant = `` sets, without its
            # State wrapper (#20: five calls a request fewer on the event loop)
            result = await generate_route(self.service, request, tenant, path)
        except APIError as exc:
            await _answer(scope, send, exc)
            return
        except CalculetError as exc:
            await _answer(scope, send, from_calculet(exc))
            return
        response = result if isinstance(result, Response) else _json(result)
        await response(scope, receive, send)


async def _answer(scope: Scope, send: Send, exc: APIError) -> None:
    """As the app's ``APIError`` handler: the OpenAI-shaped answer (the same bytes, sent without a Starlette
    response object: a 429 of a burst is one of these, on the event loop), its code and reason noted for the
    log line."""
    scope["state"]["error"] = (exc.code, exc.message)
    await exc.send(send)


def _json(result: BaseModel) -> Response:
    """A route's response model as FastAPI writes it (JSON mode, by alias, nothing left out)."""
    return JSONBody(result.model_dump(mode="json", by_alias=True))


__all__ = ["GenerationFront", "LIVE_BODY", "LIVE_PATH"]
