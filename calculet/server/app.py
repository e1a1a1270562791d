"""The service object and the FastAPI app factory (DESIGN "server → runtime", §3 API threads).

:class:`Service` joins what the HTTP layer needs: the configuration, the running
:class:`~calculet.runtime.engine.core.Engine` (the only owner of request state — HTTP handlers only
post to it, §4), the :class:`~calculet.server.admin.ModelAdmin` binding (by default
:class:`~calculet.server.admin.ManagedModelAdmin` over ``engine.models``), tenants and the admin
guard, and the metrics registry. :func:`create_app` builds the FastAPI app over it:

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
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from calculet.adapters.calrt import DeviceCapabilities
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError
from calculet.runtime.engine.core import Engine
from calculet.server.admin import EngineLifecycle, ManagedModelAdmin, ModelAdmin, admin_router
from calculet.server.auth import AdminGuard, TenantDirectory
from calculet.server.errors import APIError, from_calculet, internal
from calculet.server.inference import TimedStream, inference_router
from calculet.server.metrics import EngineCollector, ModelFacts, ServiceMetrics, make_registry
from calculet.server.schemas import Health

log = logging.getLogger("calculet.server")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})
_QUIET_ROUTES = frozenset({"/metrics", "/health/live", "/health/ready"})
MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest declared request body; a context of a few thousand tokens never needs more."""


@dataclass(frozen=True)
class ServiceOptions:
    """Service settings that are not part of ``calculet-scheduler/v1``."""

    submit_timeout_s: float = 30.0
    """Longest wait for the engine's actor to answer a submit/cancel/statistics call."""
    starvation_threshold_s: float = 30.0
    """§5.3 starvation event threshold (see :class:`calculet.server.metrics.StarvationWatch`)."""
    max_threads: int = 64
    """Worker threads for blocking engine calls (submit, statistics)."""
    device_label: str = "simulated NPU (calculet.adapters.sim)"
    """Where the device facts come from, shown next to every capability."""


class Service:
    """What the HTTP layer serves: engine, admin binding, tenants, metrics, shutdown."""

    def __init__(self, config: SchedulerConfig, engine: Engine, *, admin: ModelAdmin | None = None,
                 options: ServiceOptions = ServiceOptions()) -> None:
        self.config = config
        self.engine = engine
        self.options = options
        self.alias = config.model_alias
        self.info = engine.model_info()
        self.capabilities: DeviceCapabilities = engine.capabilities()
        self.tokenizer = engine.tokenizer
        self.device_label = options.device_label
        self.submit_timeout_s = options.submit_timeout_s
        self.created = int(time.time())
        self.lifecycle = EngineLifecycle(engine, drain_timeout_s=config.executor.drain_deadline_ms / 1000)
        self.admin: ModelAdmin = admin if admin is not None else ManagedModelAdmin(
            engine.models, config, stopped=lambda: self.lifecycle.state == "stopped")
        self.tenants = TenantDirectory(config)
        self.admin_guard = AdminGuard(config)
        self.registry = make_registry()
        self.metrics = ServiceMetrics(self.registry, self.tenants.names,
                                      starvation_threshold_s=options.starvation_threshold_s)
        kv_tokens = engine.statistics().session.kv_token_capacity
        self.registry.register(EngineCollector(statistics=lambda: engine.statistics(timeout=self.submit_timeout_s),
                                               models=self.admin.status, config=config,
                                               facts=ModelFacts(self.info.profiles, kv_tokens)))
        self.limiter = anyio.CapacityLimiter(options.max_threads)
        self._accepting = True
        self._streams = 0
        self._streams_cv = threading.Condition()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the engine (idempotent)."""
        self.lifecycle.start()

    @property
    def accepting(self) -> bool:
        return self._accepting and self.lifecycle.state == "running"

    def begin_shutdown(self, drain_timeout_s: float | None = None) -> None:
        """SIGTERM/SIGINT: stop admission now (503, not ready), drain within the deadline (§12)."""
        if self._accepting:
            self._accepting = False
            log.info("shutdown: admission stopped, draining",
                     extra={"drain_timeout_s": drain_timeout_s if drain_timeout_s is not None
                            else self.lifecycle.drain_timeout_s})
        self.lifecycle.begin_stop(drain_timeout_s)

    def stop(self, drain_timeout_s: float | None = None, wait_s: float | None = None) -> bool:
        """Begin the shutdown and wait for the engine to stop; True when it has."""
        self.begin_shutdown(drain_timeout_s)
        return self.lifecycle.wait_stopped(wait_s)

    def published(self, entry: Mapping[str, Any]) -> None:
        """A load or rollback published ``entry``'s generation: what responses and logs name follows it
        (the engine contract — tokenizer, context, profiles, capabilities — stays, §11 step 3)."""
        if entry.get("state") != "ready" or not entry.get("active"):
            return
        self.info = replace(self.info, generation=int(entry["generation"]),
                            calbin=str(entry.get("calbin") or self.info.calbin),
                            exact_submodel=str(entry.get("exact_submodel") or self.info.exact_submodel),
                            package_sha256=str(entry.get("package_sha256") or self.info.package_sha256))

    # ------------------------------------------------------------------ requests

    def check_model(self, model: str) -> None:
        """The served alias passes (its availability is the engine's to answer: 503 while draining,
        recovering, failed or stopped) unless the admin API unloaded it and no load is on its way
        (503); another alias the configuration or the admin binding knows is 503 "not loaded";
        anything else is 404."""
        if model == self.alias:
            if self.admin.unloaded(model):
                raise APIError(503, f"the model {model!r} is unloaded; POST /admin/models/{model}/load loads it",
                               code="model_unavailable", param="model")
            return
        known = {m.alias for m in self.config.models}
        try:
            known.update(str(e["alias"]) for e in self.admin.status())
        except CalculetError:
            pass
        if model in known:
            raise APIError(503, f"the model {model!r} is not loaded; this process serves {self.alias!r}",
                           code="model_unavailable", param="model")
        raise APIError(404, f"the model {model!r} does not exist; GET /v1/models lists what is served",
                       code="model_not_found", param="model")

    def open_stream(self, *, tenant: str, stop: tuple[tuple[int, ...], ...]) -> TimedStream:
        """A sink for one request; its close updates the latency metrics and the open-stream count."""
        stream = TimedStream(tokenizer=self.tokenizer, stop=stop, tenant=tenant, arrival=time.perf_counter(),
                             on_first_token=self._first_token, on_close=self._closed)
        self.metrics.watch.arrived(id(stream), tenant, stream.arrival)
        with self._streams_cv:
            self._streams += 1
            self._streams_cv.notify_all()
        self.metrics.open_streams.inc()
        return stream

    def _first_token(self, stream: TimedStream) -> None:
        self.metrics.watch.started(id(stream), stream.token_times[0])

    def _closed(self, stream: TimedStream) -> None:
        self.metrics.watch.ended(id(stream))
        outcome = stream.final
        if outcome is not None and outcome.http_status not in (400, 429, 503):
            self.metrics.observe_request(stream.tenant, stream.arrival, stream.token_times,
                                         stream.closed_at or time.perf_counter())
        self.metrics.open_streams.dec()
        with self._streams_cv:
            self._streams -= 1
            self._streams_cv.notify_all()

    @property
    def open_streams(self) -> int:
        with self._streams_cv:
            return self._streams

    def wait_streams_closed(self, timeout: float) -> bool:
        """Block until every engine request the service opened has its terminal outcome."""
        return self.wait_streams(lambda n: n == 0, timeout)

    def wait_streams(self, predicate: Callable[[int], bool], timeout: float) -> bool:
        """Block until ``predicate(open streams)`` holds (woken by every open and close)."""
        with self._streams_cv:
            return self._streams_cv.wait_for(lambda: predicate(self._streams), timeout)

    # ------------------------------------------------------------------ health

    def readiness(self) -> tuple[bool, str]:
        """Ready while accepting and at least one model generation is Ready (§10)."""
        if not self.accepting:
            return False, "shutting down"
        try:
            entries = self.admin.status()
        except CalculetError as exc:
            return False, str(exc)
        ready = [str(e["alias"]) for e in entries if e.get("state") == "ready" and e.get("active", True)]
        if ready:
            return True, "ready: " + ", ".join(ready)
        states = ", ".join(f"{e['alias']}={e.get('state')}" for e in entries) or "no model loaded"
        return False, states


# ---------------------------------------------------------------------------------------------
# the ASGI app
# ---------------------------------------------------------------------------------------------


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

    app.add_middleware(RequestContext, service=service)
    app.include_router(inference_router(service))
    app.include_router(admin_router(service))

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
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format 0.0.4."}},
             summary="Prometheus metrics (§16)")
    def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)

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

    app.openapi = openapi  # type: ignore[method-assign]
    return app


__all__ = ["RequestContext", "Service", "ServiceOptions", "create_app"]
