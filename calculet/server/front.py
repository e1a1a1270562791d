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

It sits inside :class:`~calculet.server.app.RequestContext` (request id, log line, HTTP metrics) and the
:class:`~calculet.server.body_gate.BodyGate` (credentials before the body, the body bounded), so those hold for
it as for every route; errors are answered as the app's exception handlers answer them (the OpenAI shape,
code and reason noted for the log line), and an unexpected exception still reaches ``RequestContext``'s 500.
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
from calculet.server.jsonenc import JSONBody
from calculet.server.service import Service


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return bytes(value).decode("latin-1")
    return None


class GenerationFront:
    """Pure ASGI middleware: the generation routes (``routes``: path → the FastAPI route declaring it) answered
    here; any other request passes to ``app``."""

    def __init__(self, app: ASGIApp, *, service: Service, routes: Mapping[str, Any]) -> None:
        self.app = app
        self.service = service
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        scope["route"] = route
        request = Request(scope, receive, send)
        try:
            tenant = self.service.tenants.resolve(_authorization(scope))
            request.state.tenant = tenant
            result = await generate_route(self.service, request, tenant, scope["path"])
        except APIError as exc:
            response: Response = _answer(request, exc)
        except CalculetError as exc:
            response = _answer(request, from_calculet(exc))
        else:
            response = result if isinstance(result, Response) else _json(result)
        await response(scope, receive, send)


def _answer(request: Request, exc: APIError) -> Response:
    """As the app's ``APIError`` handler: the OpenAI-shaped answer, its code and reason noted for the log line."""
    request.state.error = (exc.code, exc.message)
    return exc.response()


def _json(result: BaseModel) -> Response:
    """A route's response model as FastAPI writes it (JSON mode, by alias, nothing left out)."""
    return JSONBody(result.model_dump(mode="json", by_alias=True))


__all__ = ["GenerationFront"]
