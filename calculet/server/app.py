"""The FastAPI app factory over a :class:`~calculet.server.service.Service` (DESIGN "server → runtime", §3).

:func:`create_app` builds the app:

* ``/v1/*`` — the OpenAI-compatible API (:mod:`calculet.server.inference`);
* ``/admin/*`` — the admin API (:mod:`calculet.server.admin`);
* ``GET /health`` — vLLM's health check: 200 while the engine runs, 503 once it stops;
* ``GET /health/live`` — the process serves HTTP;
* ``GET /health/ready`` — 200 only while a model is Ready and the service accepts requests
  (a load balancer routes on it, DESIGN "Scaling out"; 503 while loading, draining, recovering);
* ``GET /metrics`` — Prometheus text, collected at scrape time (:mod:`calculet.server.metrics`).

The edge against careless and hostile clients (issue #14), outermost first:

1. :class:`RequestContext` gives every request a **server-generated** id (``x-request-id`` on
   every response, 4xx and 5xx included); a client's own ``X-Request-Id`` is only a correlation
   field (logged as ``client_request_id``, echoed as ``x-client-request-id``), never the id, so
   two tenants cannot make ids collide. It writes one log line per request, naming the error
   code and reason of every 4xx/5xx, and turns an unexpected exception into a 500 that carries
   the id and keeps the connection;
2. :class:`~calculet.server.body_gate.BodyGate` checks credentials before reading a body and
   counts the body while reading it (``server.max_body_bytes``, ``server.body_timeout_s``);
3. the generation routes and ``GET /health/live`` are answered by their pure-ASGI front
   (:mod:`calculet.server.front`) through a stack of their own (:class:`ServiceApp`: the same two layers, then
   the front, without FastAPI's), the rest by FastAPI; a large body is parsed off the event loop
   (:mod:`calculet.server.request_parsing`).

Every error is an OpenAI-style JSON body (:mod:`calculet.server.errors`); validation errors are
400 naming the field, never FastAPI's 422. Request ids appear in log lines, never in metric
labels (§16).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.errors import CalculetError
from calculet.server.admin import admin_router
from calculet.server.body_gate import BULK_RATE_BYTES_S, BodyGate, BulkPacer
from calculet.server.errors import APIError, from_calculet, internal
from calculet.server.metrics_runtime import exposition
from calculet.server.front import LIVE_PATH, GenerationFront
from calculet.server.edge_answers import new_request_id
from calculet.server.inference import GENERATION_ROUTES, REQUEST_MODELS, inference_router, lane_sent
from calculet.server.logs import log_fields
from calculet.server.refusal_lane import CLIENT_ID, RefusalLane
from calculet.server.request_parsing import from_validation
from calculet.server.schemas import Health
from calculet.server.service import Service

log = logging.getLogger("calculet.server")

_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
_QUIET_ROUTES = frozenset({"/metrics", "/health", "/health/live", "/health/ready"})
MAX_BODY_BYTES = 8 * 1024 * 1024
"""The default of ``server.max_body_bytes``: a context of a few thousand tokens never needs more."""




class _Exchange:
    """One request as :class:`RequestContext` sees it: its ids, its status, and its one log line."""

    def __init__(self, scope: Scope, service: Service) -> None:
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), "")
        self.client_id = given if CLIENT_ID.match(given) else None
        self.request_id = str(scope.get("state", {}).get("request_id") or new_request_id())  # the server's own
        # protocol may have answered this request already (a broken chunked body): that id, not a second one
        self.scope = scope
        self.state = scope.setdefault("state", {})
        self.state["request_id"] = self.request_id
        self.service = service
        self.started = time.perf_counter()
        self.status = 500
        self.response_started = False
        self.recorded = False

    def record(self) -> None:
        """Count and log the request once — before its last byte leaves, so a client that
        has the whole response also finds it in the metrics and the log."""
        if self.recorded:
            return
        self.recorded = True
        took = time.perf_counter() - self.started
        template = _route_template(self.scope)
        method = self.scope.get("method", "OTHER")
        method = method if method in _METHODS else "OTHER"
        status = self.status
        self.service.metrics.observe_http(template, method, status, took)
        level = logging.DEBUG if template in _QUIET_ROUTES and status < 400 else logging.INFO
        if not log.isEnabledFor(level):
            return
        extra: dict[str, Any] = {"request_id": self.request_id, "method": method, "route": template,
                                 "status": status, "duration_s": round(took, 6), "tenant": self.state.get("tenant")}
        if self.client_id is not None:
            extra["client_request_id"] = self.client_id
        if status >= 400:
            code, reason = self.state.get("error") or ("http_" + str(status), "")
            extra["code"] = code
            extra["reason"] = reason
        fields = self.state.get("log_fields")  # what the route adds to its one line (a refusal's engine id, model)
        if fields:
            extra.update(fields)
        log_fields(log, level, "http", extra)  # without a record when the JSON handler is its only reader (#13)

    def sender(self, send: Send) -> Send:
        """``send`` with the ids added to the response headers and the request recorded at its last byte."""

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.response_started = True
                headers = [*message.get("headers", []), (b"x-request-id", self.request_id.encode())]
                if self.client_id is not None:
                    headers.append((b"x-client-request-id", self.client_id.encode()))
                message["headers"] = headers
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                self.record()
            await send(message)

        return send_with_id


class RequestContext:
    """Pure ASGI middleware: request id, one log line and the HTTP metrics per request.

    Pure ASGI (not ``BaseHTTPMiddleware``) so streamed responses pass through untouched and a
    client disconnect still reaches the route.
    """

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(scope, self.service)
        send_with_id = exchange.sender(send)
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # noqa: BLE001 - answered as a 500 with the request id; the connection stays usable
            log.error("unhandled error", exc_info=exc, extra={"request_id": exchange.request_id,
                                                              "path": scope.get("path")})
            if not exchange.response_started:
                error = internal()
                exchange.state["error"] = (error.code, f"{type(exc).__name__}: {exc}")
                await error(scope, receive, send_with_id)
        finally:
            lane_sent(self.service, exchange.state)  # forwarded by the refusal lane, ended before its submit
            if not exchange.recorded:  # a response that never finished (client gone, error before the body)
                exchange.record()


def _route_template(scope: Scope) -> str:
    """The route's path template, also for the routes FastAPI adds itself (``/openapi.json``, ``/docs``)."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if template:
        return str(template)
    app = scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            return str(getattr(candidate, "path", "unmatched"))
    return "unmatched"


def _validation_error(exc: RequestValidationError) -> APIError:
    return from_validation(exc.errors(), body_loc=True)


NO_FRAMEWORK_TELEMETRY = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry instrumentation, off: the service traces requests itself (:mod:`calculet.server.tracing`,
§16) and exports its own metrics; left on, FastAPI looked up the global OpenTelemetry providers on every request,
on the event loop (issue #13)."""


class ServiceApp(FastAPI):
    """FastAPI, with the front's routes (:class:`~calculet.server.front.GenerationFront`: the generation POSTs and
    ``GET /health/live``) answered before FastAPI's own stack.

    Why: every request FastAPI serves crosses its server-error, telemetry and body-limit layers, the exception
    layer, the exit-stack layer and the router's match over every route (two passes, about thirty routes),
    then dependency solving and response-model validation; a profile of the event loop serving a burst of
    ``GET /health/live`` put the router and those layers at about two thirds of its CPU per request (issue #13:
    under a burst the loop's CPU per request bounds the time to the last answer). The front's routes go
    through :class:`RequestContext` and :class:`~calculet.server.body_gate.BodyGate` as every request does
    (``front_stack``: instances of their own, sharing the body pacer), then the front; the routes stay declared
    in FastAPI for the OpenAPI document, and FastAPI answers everything else as before."""

    front: GenerationFront | None = None
    front_stack: ASGIApp | None = None
    refusal_lane: RefusalLane | None = None
    """The 429s the edge's protocol answers itself (:mod:`calculet.server.refusal_lane`; found by the httptools
    protocol through uvicorn's wrappers of this app)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        front, stack = self.front, self.front_stack
        if front is not None and stack is not None and front.answers(scope):
            scope["app"] = self  # as Starlette sets it
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _fastapi(**kwargs: Any) -> ServiceApp:
    """``ServiceApp(**kwargs)`` without the framework's own telemetry where the installed FastAPI has it."""
    try:
        return ServiceApp(telemetry=NO_FRAMEWORK_TELEMETRY, **kwargs)  # type: ignore[call-arg]
    except TypeError:  # a FastAPI without native telemetry (before 0.160): nothing to switch off
        return ServiceApp(**kwargs)


def create_app(service: Service) -> ServiceApp:
    """The FastAPI app of ``service`` (the engine is started/stopped by the caller, see run.py)."""
    app = _fastapi(title="calculet", version="0.1.0",
                   description=("OpenAI-compatible inference, admin API and Prometheus metrics for the Calculet NPU "
                                "scheduler. Device batch, continuous batching, prompt cache, fork and beam search "
                                "are not offered; the capability contract with evidence tiers is at "
                                "GET /admin/capabilities."))
    _add_error_handlers(app)
    server = service.config.server

    def authorize(scope: Scope) -> APIError | None:
        authorization = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        try:
            service.authorize(str(scope.get("path", "")), authorization)
        except APIError as exc:
            return exc
        return None

    inference = inference_router(service)
    app.include_router(inference)
    app.include_router(admin_router(service))
    _add_health_and_metrics(app, service)
    # the front's routes (the generation POSTs and GET /health/live: pure ASGI, before FastAPI, issue #13), from
    # the inside out: the front, the body gate, the request context (outermost: every answer carries the request id)
    generation = {route.path: route for route in inference.routes
                  if isinstance(route, APIRoute) and route.path in GENERATION_ROUTES and "POST" in route.methods}
    if generation.keys() != GENERATION_ROUTES.keys():
        raise RuntimeError(f"the generation routes {sorted(GENERATION_ROUTES)} are not all declared: {sorted(generation)}")
    live = next(route for route in app.routes if isinstance(route, APIRoute) and route.path == LIVE_PATH)
    pacer = BulkPacer(BULK_RATE_BYTES_S)  # one bulk rate for every body, through either stack

    def edge(inner: ASGIApp) -> ASGIApp:
        return RequestContext(BodyGate(inner, max_body_bytes=server.max_body_bytes,
                                       body_timeout_s=server.body_timeout_s,
                                       body_min_rate_bytes_s=server.body_min_rate_bytes_s, authorize=authorize,
                                       pacer=pacer), service=service)

    # the front's routes through a stack of their own: the request context and the body gate around the front
    # (its fallback, FastAPI's router, is never reached: ServiceApp sends it only what it answers)
    app.front = GenerationFront(app.router, service=service, routes=generation, live=live)
    app.front_stack = edge(app.front)
    app.refusal_lane = service.refusal_lane = RefusalLane(service, generation)  # its statistics: /metrics
    # everything else through FastAPI with the same two layers, outermost: every answer carries the request id
    app.add_middleware(BodyGate, max_body_bytes=server.max_body_bytes, body_timeout_s=server.body_timeout_s,
                       body_min_rate_bytes_s=server.body_min_rate_bytes_s, authorize=authorize, pacer=pacer)
    app.add_middleware(RequestContext, service=service)
    app.openapi = _openapi(app, service.alias, service.tokenizer.vocab_size)  # type: ignore[method-assign]
    return app


NOT_SERVED = {
    "/v1/responses": ("the Responses API (POST /v1/responses) is not served: its point is server-side conversation "
                      "state, tools and reasoning items, none of which this service has; send the same text through "
                      "POST /v1/chat/completions"),
}


def _not_found(request: Request, detail: str) -> APIError:
    path = request.url.path
    message = NOT_SERVED.get(path) or (
        f"no route {request.method} {path}: this service serves POST /v1/completions, POST /v1/chat/completions, "
        "GET /v1/models, GET /v1/models/{model_id}, /admin/..., GET /health, /health/live, /health/ready, /metrics "
        "and /openapi.json" if detail == "Not Found" else detail)
    return APIError(404, message, code="not_found")


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI-style JSON body; validation errors 400, an unexpected one 500 and logged.
    Each notes its code and reason in the request's state for the request's log line."""

    def answer(request: Request, exc: APIError) -> JSONResponse:
        request.state.error = (exc.code, exc.message)
        return exc.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(request, _validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return answer(request, _not_found(request, str(exc.detail)))
        code = {405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return answer(request, APIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(CalculetError)
    async def calculet_error(request: Request, exc: CalculetError) -> JSONResponse:
        return answer(request, from_calculet(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc,
                  extra={"request_id": getattr(request.state, "request_id", None)})
        return internal().response()


def _add_health_and_metrics(app: FastAPI, service: Service) -> None:
    """``/health``, ``/health/live``, ``/health/ready`` and ``/metrics``."""

    @app.get("/health", response_model=Health, tags=["health"],
             responses={503: {"model": Health, "description": "The engine has stopped."}},
             summary="vLLM's health check: 200 while the engine runs")
    async def health() -> Any:  # async (on the event loop, no thread hop): it reads one flag, never blocks
        state = service.lifecycle.state
        if state == "stopped":
            return JSONResponse(Health(status="stopped", detail="the engine has stopped").model_dump(), status_code=503)
        return Health(status="ok", detail=f"engine {state}")

    @app.get("/health/live", response_model=Health, tags=["health"], summary="The process serves HTTP")
    async def live() -> Health:  # answered by the event loop itself: that it serves is what liveness means (#14)
        return Health(status="live")

    @app.get("/health/ready", response_model=Health, tags=["health"],
             responses={503: {"model": Health, "description": "No model Ready, or shutting down."}},
             summary="Ready only while a model is Ready")
    def ready() -> Any:
        ok, detail = service.readiness()
        if ok:
            return Health(status="ready", detail=detail)
        return JSONResponse(Health(status="not_ready", detail=detail).model_dump(), status_code=503)

    @app.get("/metrics", tags=["metrics"], response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}},
                                          "application/openmetrics-text": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format 0.0.4, or OpenMetrics 1.0 when Accept asks."}},
             summary="Prometheus metrics (§16)")
    def metrics(request: Request) -> Response:
        body, content_type = exposition(service.registry, request.headers.get("accept"))
        return Response(body, media_type=content_type)


def _token_ids_below(schema: Any, vocab_size: int) -> None:
    """Every token id of a prompt schema (an integer ``minimum: 0``) bounded by the served vocabulary."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer" and schema.get("minimum") == 0:
            schema["maximum"] = vocab_size - 1
        for value in schema.values():
            _token_ids_below(value, vocab_size)
    elif isinstance(schema, list):
        for value in schema:
            _token_ids_below(value, vocab_size)


def _openapi(app: FastAPI, alias: str, vocab_size: int) -> Any:
    """The app's OpenAPI document: the bodies the routes parse themselves (:data:`REQUEST_MODELS`) in its components,
    their ``model`` the one alias this process serves (another is 404, or 503 when configured elsewhere) and their
    token ids within the served vocabulary, and without FastAPI's 422 responses and schemas (validation is 400
    here)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            for model in REQUEST_MODELS:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                body["properties"]["model"]["enum"] = [alias]
                if "prompt" in body["properties"]:
                    _token_ids_below(body["properties"]["prompt"], vocab_size)
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


__all__ = ["MAX_BODY_BYTES", "RequestContext", "ServiceApp", "create_app"]
