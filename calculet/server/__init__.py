"""The HTTP service (§3 "API threads"): OpenAI-compatible API, admin API, health, /metrics.

``create_app(Service(config, engine))`` builds the FastAPI app; ``python -m calculet.run``
brings a model up (:mod:`calculet.server.bringup`) and serves it with uvicorn.
"""

from calculet.server.app import create_app
from calculet.server.lifecycle import EngineLifecycle
from calculet.server.model_admin import ManagedModelAdmin, ModelAdmin
from calculet.server.service import Service, ServiceOptions

__all__ = ["EngineLifecycle", "ManagedModelAdmin", "ModelAdmin", "Service", "ServiceOptions", "create_app"]
