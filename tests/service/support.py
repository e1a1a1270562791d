"""Real servers for the service tests: uvicorn in a thread on 127.0.0.1, a free port, stopped by the test.

A server is the production stack — :func:`calculet.server.bringup.bring_up` (unless the config
names packages: the bundled tiny package built, signed with a development key made for the test;
either way loaded through the model manager's §11 steps 1–11 on the simulated NPU in real time),
:class:`~calculet.server.service.Service` (its admin API bound to that manager), :func:`create_app`, uvicorn.
The listening socket is bound before uvicorn starts, so clients can connect at once (the
kernel queues them) and nothing polls for readiness.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from calculet.adapters.sim import CostModel, SimConfig, TimeMode
from calculet.config import SchedulerConfig, parse_config
from calculet.runtime.engine.types import EngineOptions
from calculet.server.app import create_app
from calculet.server.bringup import BroughtUp, bring_up
from calculet.server.http_server import uvicorn_config
from calculet.server.service import Service, ServiceOptions

TENANT_KEYS = {"alpha": "sk-alpha-0001", "beta": "sk-beta-0002", "gamma": "sk-gamma-0003", "delta": "sk-delta-0004"}
TENANT_WEIGHTS = {"alpha": 1.0, "beta": 2.0, "gamma": 1.0, "delta": 1.0}
TENANT_LIMITS: dict[str, dict[str, Any]] = {"alpha": {"max_waiting_tokens": 4096}, "beta": {"max_active_sequences": 8},
                                            "gamma": {"qps": 1000.0}}
ADMIN_TOKEN = "admin-token-for-tests"
ALIAS = "tiny"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def service_config(*, admin: bool = True, keyless: bool = False, server: Mapping[str, Any] | None = None,
                   **sections: Any) -> SchedulerConfig:
    """Four keyed tenants (weights 1/2/1/1, a few limits), an admin token, alias ``tiny``, ``server`` options, plus
    ``sections``."""
    tenants = [{"name": name, "api_key_sha256": sha(key), "weight": TENANT_WEIGHTS[name], **TENANT_LIMITS.get(name, {})}
               for name, key in TENANT_KEYS.items()]
    if keyless:
        tenants.append({"name": "anonymous"})
    server = {**({"admin_token_sha256": sha(ADMIN_TOKEN)} if admin else {}), **dict(server or {})}
    return parse_config({"schema": "calculet-scheduler/v1", "model_alias": ALIAS, "tenants": tenants,
                         "server": server, **sections})


@dataclass
class RunningServer:
    service: Service
    brought: BroughtUp
    port: int
    server: uvicorn.Server
    thread: threading.Thread
    base_url: str = field(init=False)

    def __post_init__(self) -> None:
        self.base_url = f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ clients

    def client(self, tenant: str = "alpha", *, api_key: str | None = None, **kwargs: Any) -> OpenAI:
        """The official OpenAI client for ``tenant`` (no retries: a 429 must reach the test)."""
        return OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key or TENANT_KEYS[tenant], max_retries=0,
                      timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def async_client(self, tenant: str = "alpha", **kwargs: Any) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=TENANT_KEYS[tenant], max_retries=0,
                           timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def metrics_text(self) -> str:
        with self.http() as http:
            response = http.get("/metrics")
        response.raise_for_status()
        return response.text

    def metrics(self) -> dict[str, list[Sample]]:
        """Family name (as the parser names it) → samples."""
        return {f.name: list(f.samples) for f in text_string_to_metric_families(self.metrics_text())}

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Stop uvicorn, then drain and stop the engine, then remove the bundled package."""
        self.server.should_exit = True
        self.thread.join(30)
        self.service.stop(drain_timeout_s=5.0, wait_s=30)
        self.brought.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


def start_server(config: SchedulerConfig, key_dir: Path, *, cost: CostModel | None = None,
                 service_options: Mapping[str, Any] | None = None) -> RunningServer:
    """Bring up the bundled model and serve it on 127.0.0.1:<free port> from a thread."""
    sim = SimConfig(time_mode=TimeMode.REAL, cost=cost or CostModel.tiny())
    brought = bring_up(config, sim=sim, key_dir=key_dir, options=EngineOptions(monitor_mode=None))
    service = Service(brought.config, brought.engine, options=ServiceOptions(**dict(service_options or {})))
    service.start()
    app = create_app(service)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as run.py
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, brought.config.server, timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    return RunningServer(service, brought, port, server, thread)


def families_value(families: Mapping[str, list[Sample]], name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` (parser family name) with exactly ``labels`` among its labels."""
    matches = [s.value for s in families.get(name, ()) if all(s.labels.get(k) == v for k, v in labels.items())
               and s.name in (name, name + "_total")]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples"
    return matches[0]


def iter_json(value: Any) -> Iterator[str]:
    """Every key and string value of a JSON document (for capability-claim scans)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from iter_json(item)
    elif isinstance(value, list):
        for item in value:
            yield from iter_json(item)
    elif isinstance(value, str):
        yield value
