"""The admin API's routes (§10–§12, §1, §20).

Routes (all behind ``Authorization: Bearer <admin token>``, checked against
``server.admin_token_sha256`` in constant time):

=======================================  =======================================================
``GET  /admin/models``                   every model generation with its §10 state
``POST /admin/models/{alias}/load``      load a signed package under ``alias`` (§11)
``POST /admin/models/{alias}/unload``    drain and unload the alias (§12); answers once Unloaded
                                         (409 if it is unloaded or already being unloaded)
``POST /admin/models/{alias}/drain``     the same unload, answered at once (state ``draining``):
                                         new requests 503, accepted ones run to their end
``POST /admin/models/{alias}/rollback``  back to the previous signed artifact (§11 step 11)
``GET  /admin/config``                   the effective ``calculet-scheduler/v1`` configuration
``GET  /admin/capabilities``             the device capability contract, each answer with its
                                         tier C0–C4 as the spec rates it and its evidence source
=======================================  =======================================================

The model operations go through the service's :class:`~calculet.server.model_admin.ModelAdmin`
(by default :class:`~calculet.server.model_admin.ManagedModelAdmin` over the engine's model
manager); this module only turns them into HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from calculet.adapters.calrt import CALRT_VERSION, DeviceCapabilities, EvidenceTier, profile_tier
from calculet.config import SchedulerConfig
from calculet.errors import CalculetError
from calculet.runtime.engine.types import ModelInfo
from calculet.server.errors import from_calculet
from calculet.server.schemas import (
    CapabilityContract,
    CapabilityRow,
    ErrorResponse,
    LoadRequest,
    ModelStatusList,
    ModelStatusResponse,
    ProfileRow,
)
from calculet.server.service import Service

log = logging.getLogger("calculet.server.admin")

ALIAS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


# ---------------------------------------------------------------------------------------------
# the capability contract as the admin API shows it
# ---------------------------------------------------------------------------------------------


def capability_contract(caps: DeviceCapabilities, info: ModelInfo, *, device: str,
                        profile_tiers: Mapping[int, EvidenceTier] | None = None) -> CapabilityContract:
    """Every capability with its tier and evidence source (§1, §20, R20.7); a profile's tier is the
    spec's unless conformance evidence earned a better one (``profile_tiers``, #18)."""
    rows = [CapabilityRow(name=c.name, value=v, tier=c.tier.value, source=c.source.value, ref=c.ref,
                          simulated=c.simulated, proved=c.proved)
            for c, (_, v, _, _, _) in zip(caps.all(), caps.rows())]
    profiles = [ProfileRow(compiled_batch=b, tier=(profile_tiers or {}).get(b, profile_tier(b)).value, usable=True,
                           max_seq=info.max_seq)
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


def served_contract(service: Service) -> CapabilityContract:
    """The contract the service offers: its capabilities and the profile tiers evidence earned (#18)."""
    return capability_contract(service.capabilities, service.info, device=service.device_label,
                               profile_tiers=service.options.profile_tiers)


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
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 501, 503)}

_admin_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken",
                           description="The admin token whose SHA-256 is server.admin_token_sha256.")


def admin_router(service: Service) -> APIRouter:
    """The admin routes of ``service``."""

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
        return ModelStatusList(data=[ModelStatusResponse.model_validate(e) for e in entries])

    @router.post("/models/{alias}/load", response_model=ModelStatusResponse, summary="Load a signed package (§11)",
                 openapi_extra={"x-calculet-refusals": {
                     "load_failed": "400: the package fails a §11 check (outside trust.trusted_roots, not signed by a "
                                    "trusted key, a manifest the configuration does not fit)",
                     "not_found": "404: the alias is not this process's model_alias",
                     "not_supported": "501: another configured alias needs a process of its own (§13.1)"}})
    def load(body: LoadRequest, alias: str = alias_path) -> ModelStatusResponse:
        return ModelStatusResponse.model_validate(call("load", alias, body.package))

    @router.post("/models/{alias}/unload", response_model=ModelStatusResponse, summary="Drain and unload (§12); answers when unloaded")
    def unload(alias: str = alias_path) -> ModelStatusResponse:
        return ModelStatusResponse.model_validate(call("unload", alias))

    @router.post("/models/{alias}/drain", response_model=ModelStatusResponse, summary="Drain: no new requests, then unload (§12); answers at once")
    def drain(alias: str = alias_path) -> ModelStatusResponse:
        return ModelStatusResponse.model_validate(call("drain", alias))

    @router.post("/models/{alias}/rollback", response_model=ModelStatusResponse,
                 summary="Roll back to the previous signed artifact (§11 step 11)")
    def rollback(alias: str = alias_path) -> ModelStatusResponse:
        return ModelStatusResponse.model_validate(call("rollback", alias))

    @router.get("/config", summary="The effective configuration (key hashes shortened)")
    def config() -> dict[str, Any]:
        return redacted_config(service.config)

    @router.get("/capabilities", response_model=CapabilityContract,
                summary="The device capability contract with tiers C0–C4 and evidence sources")
    def capabilities() -> CapabilityContract:
        return served_contract(service)

    return router


__all__ = ["ALIAS_PATTERN", "admin_router", "capability_contract", "redacted_config"]
