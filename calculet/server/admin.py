"""The admin API (§10–§12, §1, §20) and the ``ModelAdmin`` protocol it is written against.

Routes (all behind ``Authorization: Bearer <admin token>``, checked against
``server.admin_token_sha256`` in constant time):

=======================================  =======================================================
``GET  /admin/models``                   every model generation with its §10 state
``POST /admin/models/{alias}/load``      load a signed package under ``alias`` (§11)
``POST /admin/models/{alias}/unload``    drain and unload the alias (§12)
``POST /admin/models/{alias}/drain``     stop new requests for the alias, let accepted ones end
``POST /admin/models/{alias}/rollback``  back to the previous signed artifact (§11 step 11)
``GET  /admin/config``                   the effective ``calculet-scheduler/v1`` configuration
``GET  /admin/capabilities``             the device capability contract, each answer with its
                                         tier C0–C4 as the spec rates it and its evidence source
=======================================  =======================================================

:class:`ModelAdmin` is the seam to the model manager (``calculet/runtime/models.py``, being
built separately): methods return plain dicts (the :class:`~calculet.server.schemas.ModelStatus`
shape) and raise the runtime's error tree — ``NotFound`` (404), ``BadRequest`` /
``PackageError`` / ``ConfigError`` (400), ``Unavailable`` (503), ``NotSupported`` (501).

:class:`BundledModelAdmin` is this build's binding: it serves the engine's one bundled model.
``status`` and ``drain`` work (drain stops admission and drains the engine within
``executor.drain_deadline_ms``; the model then stays unloaded); ``load``, ``unload`` and
``rollback`` answer 501 until the ModelManager is bound.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from calculet.adapters.calrt import CALRT_VERSION, DeviceCapabilities, profile_tier
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError, NotFound, NotSupported
from calculet.runtime.engine import Engine, EngineStatistics, ModelInfo
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

NOT_IN_THIS_BUILD = ("is not available in this build: the model manager (calculet/runtime/models.py) is not bound "
                     "yet, so this service runs only its single bundled model")


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
# this build's binding: the single bundled model
# ---------------------------------------------------------------------------------------------

_AVAILABILITY_STATE = {"loading": "configuring", "ready": "ready", "draining": "draining",
                       "recovering": "recovering", "failed": "failed", "unloaded": "unloaded",
                       "shutdown": "draining"}


class BundledModelAdmin:
    """``ModelAdmin`` for the engine's one model: status and drain work, the rest is 501."""

    def __init__(self, lifecycle: EngineLifecycle, *, alias: str, info: ModelInfo, package: str | None,
                 load_duration_s: float | None = None) -> None:
        self._lifecycle = lifecycle
        self.alias = alias
        self._info = info
        self._package = package
        self._load_duration_s = load_duration_s

    def load(self, alias: str, package: str) -> dict[str, Any]:
        raise NotSupported(f"loading a package {NOT_IN_THIS_BUILD}")

    def unload(self, alias: str) -> dict[str, Any]:
        self._entry_for(alias)
        raise NotSupported(f"unloading a model {NOT_IN_THIS_BUILD}; POST /admin/models/{alias}/drain drains it")

    def rollback(self, alias: str) -> dict[str, Any]:
        self._entry_for(alias)
        raise NotSupported(f"rollback {NOT_IN_THIS_BUILD}")

    def drain(self, alias: str) -> dict[str, Any]:
        self._entry_for(alias)
        if self._lifecycle.begin_stop():
            log.info("drain requested", extra={"alias": alias, "generation": self._info.generation,
                                               "drain_timeout_s": self._lifecycle.drain_timeout_s})
        return self._entry()

    def status(self) -> list[dict[str, Any]]:
        return [self._entry()]

    # ------------------------------------------------------------------ internals

    def _entry_for(self, alias: str) -> dict[str, Any]:
        if alias != self.alias:
            raise NotFound(f"no model alias {alias!r}; this service serves {self.alias!r}", field="alias")
        return self._entry()

    def _state(self) -> tuple[str, str]:
        lifecycle = self._lifecycle.state
        if lifecycle == "stopped":
            return "unloaded", "drained and unloaded"
        if lifecycle == "stopping":
            return "draining", "draining: no new requests; accepted ones run until the drain deadline"
        try:
            stats = self._lifecycle.engine.statistics(timeout=5.0)
        except CalculetError as exc:
            return "unloaded", str(exc)
        except TimeoutError:
            return "recovering", "the engine did not answer within 5 s"
        detail = stats.recovery.last_detail if stats.availability in ("recovering", "failed") else ""
        return _AVAILABILITY_STATE.get(stats.availability, stats.availability), detail

    def _entry(self) -> dict[str, Any]:
        info = self._info
        state, detail = self._state()
        durations: dict[str, float] = {}
        if self._load_duration_s is not None:
            durations["load"] = self._load_duration_s
        if self._lifecycle.stop_duration_s is not None:
            durations["drain"] = self._lifecycle.stop_duration_s
        return {"alias": self.alias, "generation": info.generation, "state": state, "active": True,
                "calbin": info.calbin, "exact_submodel": info.exact_submodel, "package": self._package,
                "package_sha256": info.package_sha256, "max_seq": info.max_seq, "profiles": list(info.profiles),
                "durations_s": durations, "detail": detail}


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
                                           "state": result.get("state")})
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

    @router.post("/models/{alias}/unload", response_model=ModelStatus, summary="Drain and unload (§12)")
    def unload(alias: str = alias_path) -> ModelStatus:
        return ModelStatus.model_validate(call("unload", alias))

    @router.post("/models/{alias}/drain", response_model=ModelStatus, summary="Drain: no new requests (§12)")
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


__all__ = ["BundledModelAdmin", "EngineLifecycle", "ModelAdmin", "admin_router",
           "capability_contract", "redacted_config"]
