"""The HTTP service (§3 "API threads"): OpenAI-compatible API, admin API, health, /metrics.

``create_app(Service(config, engine))`` builds the FastAPI app; ``python -m calculet.run``
brings a model up (:mod:`calculet.server.bringup`) and serves it with uvicorn.
"""

from calculet.server.admin import EngineLifecycle, ManagedModelAdmin, ModelAdmin
from calculet.server.app import Service, ServiceOptions, create_app

__all__ = ["EngineLifecycle", "ManagedModelAdmin", "ModelAdmin", "Service", "ServiceOptions", "create_app"]
