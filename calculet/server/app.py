"""The FastAPI app factory over a :class:`~calculet.server.service.Service` (DESIGN "server → runtime", §3).

:func:`create_app` builds the app:

* ``/v1/*`` — the OpenAI-compatible API (:mod:`calculet.server.inference`);
* ``/admin/*`` — the admin API (:mod:`calculet.server.admin`);
* ``GET /health/live`` — the process serves HTTP;
* ``GET /health/ready`` — 200 only while a model is Ready and the service accepts requests
  (a load balancer routes on it, DESIGN "Scaling out");
* ``GET /metrics`` — Prometheus text, collected at scrape time (:mod:`calculet.server.metrics`).

Every error is an OpenAI-style JSON body (:mod:`calculet.server.errors`); validation errors are
400 naming the field, never FastAPI's 422. Each request gets an id (``X-Request-Id``, echoed or
generated) that appears in its log lines and nowhere in metric labels (§16).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.errors import CalculetError
from calculet.server.admin import admin_router
from calculet.server.errors import APIError, from_calculet, internal
from calculet.server.metrics_runtime import exposition
from calculet.server.inference import inference_router
from calculet.server.schemas import Health
from calculet.server.service import Service

log = logging.getLogger("calculet.server")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
_QUIET_ROUTES = frozenset({"/metrics", "/health/live", "/health/ready"})
MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest declared request body; a context of a few thousand tokens never needs more."""


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
        given = ""
        declared = 0
        for key, value in scope.get("headers", ()):
            if key == b"x-request-id":
                given = value.decode("latin-1")
            elif key == b"content-length" and value.isdigit():
                declared = int(value)
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = time.perf_counter()
        status = 500
        recorded = False

        def record() -> None:
            """Count and log the request once — before its last byte leaves, so a client that
            has the whole response also finds it in the metrics and the log."""
            nonlocal recorded
            if recorded:
                return
            recorded = True
            took = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "OTHER")
            method = method if method in _METHODS else "OTHER"
            metrics = self.service.metrics
            metrics.http_requests.labels(template, method, str(status)).inc()
            metrics.http_duration.labels(template).observe(took)
            level = logging.DEBUG if template in _QUIET_ROUTES and status < 400 else logging.INFO
            log.log(level, "http", extra={"request_id": request_id, "method": method, "route": template,
                                          "status": status, "duration_s": round(took, 6),
                                          "tenant": state.get("tenant")})

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                record()
            await send(message)

        try:
            if declared > MAX_BODY_BYTES:
                await APIError(413, f"the request body of {declared} bytes exceeds {MAX_BODY_BYTES}",
                               code="body_too_large")(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            record()  # a response that never finished (client gone, error before the body)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        message = f"unknown or unsupported field {param!r}: this service refuses fields it would otherwise ignore"
        return APIError(400, message, code="unsupported_parameter", param=param)
    if kind in ("json_invalid", "model_attributes_type") or (kind == "missing" and not loc):
        return APIError(400, f"the body must be a JSON object: {first.get('msg', '')}", code="invalid_json")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}{more}", code="invalid_value", param=param)


def create_app(service: Service) -> FastAPI:
    """The FastAPI app of ``service`` (the engine is started/stopped by the caller, see run.py)."""
    app = FastAPI(title="calculet", version="0.1.0",
                  description=("OpenAI-compatible inference, admin API and Prometheus metrics for the Calculet NPU "
                               "scheduler. Device batch, continuous batching, prompt cache, fork and beam search "
                               "are not offered; the capability contract with evidence tiers is at "
                               "GET /admin/capabilities."))
    _add_error_handlers(app)
    app.add_middleware(RequestContext, service=service)
    app.include_router(inference_router(service))
    app.include_router(admin_router(service))
    _add_health_and_metrics(app, service)
    app.openapi = _openapi_without_422(app)  # type: ignore[method-assign]
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI-style JSON body; validation errors 400, an unexpected one 500 and logged."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return APIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {})).response()

    @app.exception_handler(CalculetError)
    async def calculet_error(_: Request, exc: CalculetError) -> JSONResponse:
        return from_calculet(exc).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc,
                  extra={"request_id": getattr(request.state, "request_id", None)})
        return internal().response()


def _add_health_and_metrics(app: FastAPI, service: Service) -> None:
    """``/health/live``, ``/health/ready`` and ``/metrics``."""

    @app.get("/health/live", response_model=Health, tags=["health"], summary="The process serves HTTP")
    def live() -> Health:
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


def _openapi_without_422(app: FastAPI) -> Any:
    """The app's OpenAPI document without FastAPI's 422 responses and schemas (validation is 400 here)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


__all__ = ["MAX_BODY_BYTES", "RequestContext", "create_app"]
