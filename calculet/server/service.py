"""The service object: what the HTTP layer serves (DESIGN "server → runtime", §3 API threads).

:class:`Service` joins what the routes need: the configuration, the running
:class:`~calculet.runtime.engine.threaded.ThreadedEngine` (the only owner of request state — HTTP handlers only
post to it, §4), the :class:`~calculet.server.model_admin.ModelAdmin` binding (by default
:class:`~calculet.server.model_admin.ManagedModelAdmin` over ``engine.models``), tenants and the
admin guard, the metrics registry, the open-stream count and the shutdown (§12).

It lives apart from the FastAPI app (:mod:`calculet.server.app`) so that the routers
(:mod:`calculet.server.admin`, :mod:`calculet.server.inference`) and the app factory all import
it from below: the state type of the app has one home and no import points back up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio

from calculet.adapters.calrt import DeviceCapabilities, EvidenceTier
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError
from calculet.runtime.engine.admission_snapshot import EarlyAdmission
from calculet.runtime.engine.threaded import ThreadedEngine
from calculet.server.auth import AdminGuard, TenantDirectory
from calculet.server.errors import APIError
from calculet.server.lifecycle import EngineLifecycle
from calculet.server.metrics import EngineCollector, ServedModelFacts
from calculet.server.metrics_front import FrontCollector, LaneCollector
from calculet.server.metrics_runtime import add_process_collectors
from calculet.server.model_admin import ManagedModelAdmin, ModelAdmin
from calculet.server.request_metrics import RequestPhases, ServiceMetrics, make_registry
from calculet.server.timed_stream import TimedStream
from calculet.server.tracing import RequestTracer, SpanPipeline, otlp_pipeline

log = logging.getLogger("calculet.server")


@dataclass(frozen=True)
class ServiceOptions:
    """Service settings that are not part of ``calculet-scheduler/v1``."""

    submit_timeout_s: float = 30.0
    """Longest wait for the engine's actor to answer a submit/cancel/statistics call."""
    starvation_threshold_s: float = 30.0
    """§5.3 starvation event threshold (see :class:`calculet.server.request_metrics.StarvationWatch`)."""
    max_threads: int = 64
    """Worker threads for blocking engine calls (submit, statistics)."""
    device_label: str = "simulated NPU (calculet.adapters.sim)"
    """Where the device facts come from, shown next to every capability."""
    span_pipeline: SpanPipeline | None = None
    """Where request traces go (tests: a simple processor with the in-memory exporter); None follows
    ``monitoring.tracing`` (off unless an OTLP endpoint is configured)."""
    capabilities: DeviceCapabilities | None = None
    """The contract offered (bring-up's ``BroughtUp.offered()``: above C3 only with conformance evidence,
    #18); None: the engine's package contract as it is."""
    profile_tiers: Mapping[int, EvidenceTier] | None = None
    """Compiled batch → offered tier (``BroughtUp.offered().profiles``, #18); None: the spec's (§1)."""


class NextAnswer:
    """One future for every request held until the engine's next answer (or ``hold_s``, whichever is first).

    Why one for all: at a burst's start most requests are held (issue #13 measured about a third of a burst's
    300), and a future, a timer and a ``wait_for`` of its own for each cost the event loop more than the rest of
    its refusal; a request joining a wait already armed waits less than ``hold_s``, never more."""

    def __init__(self, early: EarlyAdmission, hold_s: float) -> None:
        self._early = early
        self._hold_s = hold_s
        self._future: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        """The future of the current wait, armed now if none is (the engine's next answer, or the timer, ends it)."""
        future = self._future
        if future is None or future.done():
            loop = asyncio.get_running_loop()
            future = self._future = loop.create_future()

            def release() -> None:
                if not future.done():
                    future.set_result(None)

            self._early.hold(release)
            loop.call_later(self._hold_s, release)
        else:
            self._early.hold(None)
        return future


HOLD_S = 0.02
"""Longest wait of a held request for the engine's next answer (:meth:`EarlyAdmission.should_hold`)."""


class Service:
    """What the HTTP layer serves: engine, admin binding, tenants, metrics, shutdown."""

    def __init__(self, config: SchedulerConfig, engine: ThreadedEngine, *, admin: ModelAdmin | None = None,
                 options: ServiceOptions = ServiceOptions()) -> None:
        self.config = config
        self.engine = engine
        self.options = options
        self.alias = config.model_alias
        self.info = engine.model_info()
        self.capabilities: DeviceCapabilities = options.capabilities or engine.capabilities()
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
                                               facts=ServedModelFacts(self.info.profiles, kv_tokens)))
        add_process_collectors(self.registry)
        self.early_admission = EarlyAdmission()
        self.next_answer = NextAnswer(self.early_admission, HOLD_S)
        """The wait of requests held for the engine's next answer (:func:`calculet.server.inference._refuse_early`)."""
        """The event loop's 429s from the engine's admission snapshot (issue #13, :mod:`.inference`)."""
        self.registry.register(FrontCollector(self.early_admission.statistics))
        self.refusal_lane: Any = None
        """The app's :class:`~calculet.server.refusal_lane.RefusalLane` (set by ``create_app``; the app builds it
        from its routes), exported by :class:`LaneCollector` whichever app serves."""
        self.registry.register(LaneCollector(
            lambda: None if self.refusal_lane is None else self.refusal_lane.statistics()))
        self.phases = RequestPhases(self.metrics, engine.clock)
        pipeline = options.span_pipeline or otlp_pipeline(config.monitoring.tracing)
        self.tracer = (RequestTracer(pipeline, engine.clock, job=engine.job, alias=self.alias)
                       if pipeline is not None else None)
        if self.tracer is None:  # the phases read a decode's steps from the record at its end: no call per token
            engine.set_observer(self.phases.observe, decode_steps=False)
        else:  # a trace records each decode step (its span events)
            engine.set_observer(self._observe_traced)
        self.limiter = anyio.CapacityLimiter(options.max_threads)
        self.large_body_limiter = anyio.CapacityLimiter(1)
        """Large request bodies are parsed one at a time (see :mod:`calculet.server.inference`)."""
        self._accepting = True
        self._streams = 0
        self._streams_cv = threading.Condition()

    def _observe_traced(self, rec: Any, source: str, target: str) -> None:
        """(actor thread) Every request transition: its phase histograms, then its trace."""
        self.phases.observe(rec, source, target)
        assert self.tracer is not None
        self.tracer.observe(rec, source, target)

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
        stopped = self.lifecycle.wait_stopped(wait_s)
        if self.tracer is not None:  # the traces of the drained requests go out before the process does
            self.tracer.shutdown()
        return stopped

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

    @property
    def max_seq(self) -> int:
        """The served model's context (tokens)."""
        return self.info.max_seq

    def authorize(self, path: str, authorization: str | None) -> None:
        """The credentials a path needs, from its ``Authorization`` header alone (the body gate asks this before
        reading a body): a tenant's API key under ``/v1/``, the admin token under ``/admin/``; :class:`APIError`
        401/403 otherwise."""
        if path.startswith("/v1/"):
            self.tenants.resolve(authorization)
        elif path.startswith("/admin/"):
            self.admin_guard.check(authorization)

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

    def model_checked_at_once(self, model: str) -> bool:
        """Whether :meth:`check_model` answers ``model`` without a round trip to the engine: the served alias while
        the admin binding knows, by itself, that it was not unloaded here (``loaded_here``; a binding without it
        is asked the long way). The inference routes check such a model on the event loop, any other on a worker
        thread (issue #13)."""
        if model != self.alias:
            return False
        loaded_here = getattr(self.admin, "loaded_here", None)
        return loaded_here is not None and bool(loaded_here(model))

    def open_stream(self, *, tenant: str, stop: tuple[tuple[int, ...], ...],
                    stop_text: tuple[str, ...] = ()) -> TimedStream:
        """A sink for one request; its close updates the latency metrics and the open-stream count."""
        stream = TimedStream(tokenizer=self.tokenizer, stop=stop, tenant=tenant, arrival=time.perf_counter(),
                             on_first_token=self._first_token, on_close=self._closed, stop_text=stop_text)
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
        operation = getattr(self.admin, "operation_in_progress", None)  # ManagedModelAdmin; fakes may lack it
        busy = operation() if operation is not None else None
        if busy:
            return False, f"model operation under way: {busy}"
        try:
            entries = self.admin.status()
        except CalculetError as exc:
            return False, str(exc)
        ready = [str(e["alias"]) for e in entries if e.get("state") == "ready" and e.get("active", True)]
        if ready:
            return True, "ready: " + ", ".join(ready)
        states = ", ".join(f"{e['alias']}={e.get('state')}" for e in entries) or "no model loaded"
        return False, states


__all__ = ["Service", "ServiceOptions"]
