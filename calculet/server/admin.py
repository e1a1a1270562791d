"""The admin API (§10–§12, §1, §20) and the ``ModelAdmin`` protocol it is written against.

Routes (all behind ``Authorization: Bearer <admin token>``, checked against
``server.admin_token_sha256`` in constant time):

=======================================  =======================================================
``GET  /admin/models``                   every model generation with its §10 state
``POST /admin/models/{alias}/load``      load a signed package under ``alias`` (§11)
``POST /admin/models/{alias}/unload``    drain and unload the alias (§12); answers once Unloaded
``POST /admin/models/{alias}/drain``     the same unload, answered at once (state ``draining``):
                                         new requests 503, accepted ones run to their end
``POST /admin/models/{alias}/rollback``  back to the previous signed artifact (§11 step 11)
``GET  /admin/config``                   the effective ``calculet-scheduler/v1`` configuration
``GET  /admin/capabilities``             the device capability contract, each answer with its
                                         tier C0–C4 as the spec rates it and its evidence source
=======================================  =======================================================

:class:`ModelAdmin` is the seam to the model manager: methods return plain dicts (the
:class:`~calculet.server.schemas.ModelStatus` shape, with an ``OperationReport`` under
``report`` for operations) and raise the runtime's error tree — ``NotFound`` (404),
``BadRequest`` / ``PackageError`` / ``ConfigError`` / a ``LoadFailed`` at §11 steps 1–3 (400),
``Unavailable`` (503), ``NotSupported`` (501).

:class:`ManagedModelAdmin` binds it to the engine's
:class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from calculet.adapters.calrt import CALRT_VERSION, DeviceCapabilities, profile_tier
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, NotFound, NotSupported, Unavailable
from calculet.runtime.engine.core import Engine, EngineStatistics, ModelInfo
from calculet.runtime.models.manager import LoadReport, ModelManager, OperationHandle, StepTiming, UnloadReport
from calculet.runtime.models.manager import ModelStatus as ManagerStatus
from calculet.server.errors import from_calculet
from calculet.server.schemas import (
    CapabilityContract,
    CapabilityRow,
    ErrorResponse,
    LoadRequest,
    ModelStatus,
    ModelStatusList,
    ProfileRow,
)

if TYPE_CHECKING:
    from calculet.server.app import Service

log = logging.getLogger("calculet.server.admin")

ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


@runtime_checkable
class ModelAdmin(Protocol):
    """Model lifecycle operations of the admin API (§10–§12); the ModelManager implements it."""

    def load(self, alias: str, package: str) -> dict[str, Any]:
        """§11: verify, configure, golden/warm up and publish ``package`` under ``alias``."""
        ...

    def unload(self, alias: str) -> dict[str, Any]:
        """§12: drain the alias's generation and free everything it holds."""
        ...

    def drain(self, alias: str) -> dict[str, Any]:
        """§12 first half: reject new requests for ``alias``; accepted ones run to the end."""
        ...

    def rollback(self, alias: str) -> dict[str, Any]:
        """§11 step 11: publish the previous signed artifact of ``alias`` again."""
        ...

    def status(self) -> list[dict[str, Any]]:
        """Every generation known (alias, generation, §10 state, package, durations, ...)."""
        ...

    def unloaded(self, alias: str) -> bool:
        """True while ``alias`` was unloaded here and no generation is published or on its way."""
        ...


# ---------------------------------------------------------------------------------------------
# the engine's lifecycle (shared by the admin drain, signals and tests)
# ---------------------------------------------------------------------------------------------


class EngineLifecycle:
    """Starts the engine once and stops it once, from whichever asks first (drain, signal, test)."""

    def __init__(self, engine: Engine, *, drain_timeout_s: float) -> None:
        self.engine = engine
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()
        self._started = False
        self._stopper: threading.Thread | None = None
        self._stopped = threading.Event()
        self.stop_requested_at: float | None = None
        self.stop_duration_s: float | None = None
        self.final: EngineStatistics | None = None

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self.engine.start()
                self._started = True

    @property
    def state(self) -> str:
        """``running``, ``stopping`` or ``stopped``."""
        if self._stopped.is_set():
            return "stopped"
        return "stopping" if self._stopper is not None else "running"

    def begin_stop(self, drain_timeout_s: float | None = None) -> bool:
        """Stop admission and drain in the background (§12); True if this call began it."""
        with self._lock:
            if self._stopper is not None:
                return False
            timeout = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            self.stop_requested_at = time.perf_counter()
            self._stopper = threading.Thread(target=self._stop, args=(timeout,), name="calculet-drain", daemon=True)
            self._stopper.start()
            return True

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def _stop(self, drain_timeout_s: float) -> None:
        try:
            self.final = self.engine.stop(drain_timeout_s)
        except Exception:  # noqa: BLE001 - reported; the service still reports itself stopped
            log.exception("engine stop failed")
        finally:
            if self.stop_requested_at is not None:
                self.stop_duration_s = time.perf_counter() - self.stop_requested_at
            self._stopped.set()
            log.info("engine stopped", extra={"drain_s": self.stop_duration_s})


# ---------------------------------------------------------------------------------------------
# the binding: the engine's ModelManager
# ---------------------------------------------------------------------------------------------

OPERATION_MARGIN_S = 120.0
"""How long an admin call waits for a load/rollback/unload beyond the drain deadline (the old
generation's drain, §11 step 6) before answering 503 "still running" (the operation goes on)."""
STATUS_TIMEOUT_S = 10.0
"""Longest wait for the engine's actor to answer a status read."""


def _steps(timings: tuple[StepTiming, ...]) -> dict[str, float]:
    return {t.step: round(t.seconds, 6) for t in timings}


def _load_report(report: LoadReport) -> dict[str, Any]:
    return {"kind": report.kind, "ok": report.ok, "replaced": report.replaced,
            "previous_drained": report.previous_drained, "downtime_s": report.downtime_s,
            "rollback_available": report.rollback_available, "golden": report.golden,
            "warnings": list(report.warnings), "steps": _steps(report.steps)}


def _unload_report(report: UnloadReport, deadline_ms: int) -> dict[str, Any]:
    return {"kind": "unload", "ok": not report.problems, "drain_s": report.drain_s,
            "deadline_passed": report.deadline_passed, "cancelled_requests": report.cancelled_requests,
            "drain_deadline_ms": deadline_ms, "warnings": list(report.problems), "steps": _steps(report.steps)}


class ManagedModelAdmin:
    """``ModelAdmin`` over the engine's :class:`~calculet.runtime.models.manager.ModelManager` (``engine.models``).

    * ``load`` — §11 steps 1–11 on the calling thread and the engine's actor; the package must
      resolve under ``trust.trusted_roots`` and be signed by a key in ``trust.trusted_keys_dir``
      (the manager checks both). Streams pinned to the old generation run on to their end (up to
      ``executor.drain_deadline_ms``); new requests are held meanwhile and run on the new one.
    * ``rollback`` — the artifact §11 step 11 kept, verified again and loaded as a new generation.
    * ``unload`` — §12, blocking until the generation is Unloaded (drain deadline:
      ``executor.drain_deadline_ms``).
    * ``drain`` — the same §12 unload, started and answered at once (state ``draining``): new
      requests 503 now, accepted ones run to their end or the deadline, then the generation is
      freed. The manager has no "drain and stay resident" operation; :meth:`wait` waits for it.
      Once unloaded, new requests for the alias are 503 until a load or rollback is under way
      (:meth:`unloaded`; the engine alone would hold them for the next load).
    * ``status`` — every generation the manager knows (ended ones too, bounded) with its §10
      state, package sha256, signer, pinned requests and in-flight jobs; ``stopped`` says when
      the engine's actor has ended, after which the records are read directly.

    Failures keep the runtime's error tree: :class:`~calculet.runtime.models.manager.LoadFailed` names the
    §11 step (400 for a package or config the checks refuse); another configured alias is 501
    (one alias per process on CalRT 0.7.6, §13.1); an unknown alias is 404.
    """

    def __init__(self, models: ModelManager, config: SchedulerConfig, *, timeout_s: float | None = None,
                 stopped: Callable[[], bool] = lambda: False) -> None:
        self._models = models
        self._stopped = stopped
        self._config = config
        self._deadline_ms = config.executor.drain_deadline_ms
        self._timeout_s = timeout_s if timeout_s is not None else self._deadline_ms / 1000 + OPERATION_MARGIN_S
        self._lock = threading.Lock()
        self._drains: dict[str, OperationHandle] = {}
        self._unloaded: set[str] = set()

    # ------------------------------------------------------------------ ModelAdmin

    def load(self, alias: str, package: str) -> dict[str, Any]:
        self._check_alias(alias)
        report: LoadReport = self._finish("load", alias, lambda: self._models.begin_load(alias, package))
        self._published(alias)
        return self._entry(report.generation, report=_load_report(report))

    def rollback(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        report: LoadReport = self._finish("rollback", alias, lambda: self._models.begin_rollback(alias))
        self._published(alias)
        return self._entry(report.generation, report=_load_report(report))

    def unload(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        report: UnloadReport = self._finish("unload", alias, lambda: self._begin_unload(alias))
        return self._entry(report.generation, report=_unload_report(report, self._deadline_ms))

    def drain(self, alias: str) -> dict[str, Any]:
        self._check_alias(alias)
        handle = self._begin_unload(alias)
        with self._lock:
            self._drains[alias] = handle
        log.info("drain requested", extra={"alias": alias, "generation": handle.generation,
                                           "drain_deadline_ms": self._deadline_ms})
        return self._entry(handle.generation, report={"kind": "drain", "ok": True,
                                                      "drain_deadline_ms": self._deadline_ms})

    def status(self) -> list[dict[str, Any]]:
        return [g.as_dict() for g in self._status().generations]

    def unloaded(self, alias: str) -> bool:
        """The engine routes a request for an alias without a generation to the next load (it waits,
        WaitingModel); the HTTP layer answers 503 instead while no load is on its way after an
        unload or drain here. Costs a status read only after such an unload."""
        with self._lock:
            if alias not in self._unloaded:
                return False
        status = self._status()
        if status.current is not None:
            self._published(alias)
            return False
        return status.operation is None and status.queued_operations == 0

    # ------------------------------------------------------------------ waiting

    def wait(self, alias: str, timeout: float | None = None) -> bool:
        """Block until the last drain of ``alias`` has ended (True; at once if there was none)."""
        with self._lock:
            handle = self._drains.get(alias)
        if handle is None:
            return True
        try:
            handle.result(timeout)
        except TimeoutError:
            return False
        except CalculetError:
            pass  # the generation's detail in status() says why
        with self._lock:
            if self._drains.get(alias) is handle:
                del self._drains[alias]
        return True

    # ------------------------------------------------------------------ internals

    def _check_alias(self, alias: str) -> None:
        served = self._models.alias
        if alias == served:
            return
        if alias in {m.alias for m in self._config.models}:
            raise NotSupported(f"this process serves {served!r}; {alias!r} needs a process of its own: CalRT 0.7.6 "
                               "offers no multi-model runtime contract (§13.1–§13.2)", field="alias")
        raise NotFound(f"no model alias {alias!r}; this process serves {served!r}", field="alias")

    def _begin_unload(self, alias: str) -> OperationHandle:
        handle = self._models.begin_unload(alias, drain_deadline_ms=self._deadline_ms)
        with self._lock:
            self._unloaded.add(alias)
        return handle

    def _published(self, alias: str) -> None:
        with self._lock:
            self._unloaded.discard(alias)

    def _finish(self, kind: str, alias: str, begin: Callable[[], OperationHandle]) -> Any:
        handle = begin()
        try:
            return handle.result(self._timeout_s)
        except TimeoutError:
            raise Unavailable(f"the {kind} of {alias!r} (generation {handle.generation}) is still running after "
                              f"{self._timeout_s:.0f} s ({handle.step}); GET /admin/models shows its progress",
                              field="alias") from None

    def _status(self) -> ManagerStatus:
        if self._stopped():
            return self._models.status_now()  # the actor has ended: nothing writes the records any more
        try:
            return self._models.status(timeout=STATUS_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(f"the engine did not answer within {STATUS_TIMEOUT_S:.0f} s") from None

    def _entry(self, generation: int, *, report: dict[str, Any]) -> dict[str, Any]:
        status = self._status()
        found = [g for g in status.generations if g.id == generation]
        if found:
            entry = found[0].as_dict()
        else:  # an operation queued behind another (its generation is chosen when it runs)
            entry = {"alias": status.alias, "generation": generation, "state": "unloaded", "active": False,
                     "detail": f"queued behind: {status.operation}" if status.operation else ""}
        entry["report"] = report
        return entry


# ---------------------------------------------------------------------------------------------
# the capability contract as the admin API shows it
# ---------------------------------------------------------------------------------------------


def capability_contract(caps: DeviceCapabilities, info: ModelInfo, *, device: str) -> CapabilityContract:
    """Every capability with the spec's tier and its evidence source (§1, §20, R20.7)."""
    rows = [CapabilityRow(name=c.name, value=v, tier=c.tier.value, source=c.source.value, ref=c.ref,
                          simulated=c.simulated, proved=c.proved)
            for c, (_, v, _, _, _) in zip(caps.all(), caps.rows())]
    profiles = [ProfileRow(compiled_batch=b, tier=profile_tier(b).value, usable=True, max_seq=info.max_seq)
                for b in info.profiles]
    largest = max(profiles, key=lambda p: p.compiled_batch, default=None)
    return CapabilityContract(
        device=device, runtime=f"CalRT {CALRT_VERSION} protocol",
        note=("Tiers are the spec's ratings (§1): C0 shipped; C1/C2 SDK hint or experimental; C3 designed, awaiting "
              "vendor artifacts or evidence; C4 unsupported by CalRT 0.7.6. A 'simulated' source means the simulated "
              "NPU offers the capability so the software can be tested; it proves nothing about the device (§20)."),
        npu_batch=largest, profiles=profiles, capabilities=rows,
        software_multi_slot=("Concurrent requests are served by alternating sequences on the compiled profiles "
                             "above (software multi-slot, C0); this is not NPU batch (R1.1)."))


def redacted_config(config: SchedulerConfig) -> dict[str, Any]:
    """The effective configuration, with key and token hashes shortened to an 8-hex prefix."""
    data = config.model_dump(mode="json", by_alias=True)
    for tenant in data.get("tenants", []):
        if tenant.get("api_key_sha256"):
            tenant["api_key_sha256"] = tenant["api_key_sha256"][:8] + "…"
    server = data.get("server", {})
    if server.get("admin_token_sha256"):
        server["admin_token_sha256"] = server["admin_token_sha256"][:8] + "…"
    return data


# ---------------------------------------------------------------------------------------------
# routes
# ---------------------------------------------------------------------------------------------

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 501, 503)}

_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                           description="The admin token whose SHA-256 is server.admin_token_sha256.")


def admin_router(service: Service) -> APIRouter:
    """The admin routes of ``service`` (a :class:`calculet.server.app.Service`)."""

    def guard(credentials: HTTPAuthorizationCredentials | None = Depends(_admin_bearer)) -> None:
        service.admin_guard.check(f"Bearer {credentials.credentials}" if credentials else None)

    router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(guard)], responses=_ERRORS)
    alias_path = Path(pattern=ALIAS_PATTERN, description="Model alias.")

    def call(operation: str, *args: str) -> dict[str, Any]:
        try:
            result: dict[str, Any] = getattr(service.admin, operation)(*args)
        except CalculetError as exc:
            raise from_calculet(exc, admin=True) from None
        log.info("admin operation", extra={"operation": operation, "alias": args[0] if args else None,
                                           "generation": result.get("generation"), "state": result.get("state")})
        if operation in ("load", "rollback"):
            service.published(result)
        return result

    @router.get("/models", response_model=ModelStatusList, summary="Models and generations with their state")
    def list_models() -> ModelStatusList:
        try:
            entries = service.admin.status()
        except CalculetError as exc:
            raise from_calculet(exc, admin=True) from None
        return ModelStatusList(data=[ModelStatus.model_validate(e) for e in entries])

    @router.post("/models/{alias}/load", response_model=ModelStatus, summary="Load a signed package (§11)")
    def load(body: LoadRequest, alias: str = alias_path) -> ModelStatus:
        return ModelStatus.model_validate(call("load", alias, body.package))

    @router.post("/models/{alias}/unload", response_model=ModelStatus, summary="Drain and unload (§12); answers when unloaded")
    def unload(alias: str = alias_path) -> ModelStatus:
        return ModelStatus.model_validate(call("unload", alias))

    @router.post("/models/{alias}/drain", response_model=ModelStatus, summary="Drain: no new requests, then unload (§12); answers at once")
    def drain(alias: str = alias_path) -> ModelStatus:
        return ModelStatus.model_validate(call("drain", alias))

    @router.post("/models/{alias}/rollback", response_model=ModelStatus,
                 summary="Roll back to the previous signed artifact (§11 step 11)")
    def rollback(alias: str = alias_path) -> ModelStatus:
        return ModelStatus.model_validate(call("rollback", alias))

    @router.get("/config", summary="The effective configuration (key hashes shortened)")
    def config() -> dict[str, Any]:
        return redacted_config(service.config)

    @router.get("/capabilities", response_model=CapabilityContract,
                summary="The device capability contract with tiers C0–C4 and evidence sources")
    def capabilities() -> CapabilityContract:
        return capability_contract(service.capabilities, service.info, device=service.device_label)

    return router


__all__ = ["EngineLifecycle", "ManagedModelAdmin", "ModelAdmin", "admin_router",
           "capability_contract", "redacted_config"]
