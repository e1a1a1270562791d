"""The admin API: models and generations, effective config, the capability contract, the 501s of
this build, and — once the ModelManager is bound — load/unload/rollback while streams are open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from calculet.adapters.packages import ensure_dev_keypair, sign_package
from calculet.adapters.sim.build import build_package as build_sim_package
from calculet.server.admin import BundledModelAdmin, ModelAdmin
from tests.service.conftest import PACED
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer, service_config, start_server

MODEL_MANAGER_PENDING = ("waits for the ModelManager binding (calculet/runtime/models.py): this build's "
                         "BundledModelAdmin serves one model and answers load/unload/rollback with 501")


def test_models_lists_the_generation_with_state_and_package(server: RunningServer) -> None:
    with server.http() as http:
        data = http.get("/admin/models", headers=server.admin_headers()).json()["data"]
    assert len(data) == 1
    entry = data[0]
    assert (entry["alias"], entry["generation"], entry["state"], entry["active"]) == (ALIAS, 1, "ready", True)
    assert entry["calbin"] == "tiny-sim-current" and entry["profiles"] == [1] and entry["max_seq"] == 256
    assert len(entry["package_sha256"]) == 64 and entry["durations_s"]["load"] > 0
    assert isinstance(server.service.admin, ModelAdmin)


def test_effective_config_is_served_with_key_hashes_shortened(server: RunningServer) -> None:
    with server.http() as http:
        config = http.get("/admin/config", headers=server.admin_headers()).json()
    assert config["schema"] == "calculet-scheduler/v1" and config["model_alias"] == ALIAS
    assert [t["name"] for t in config["tenants"]] == ["alpha", "beta", "gamma", "delta"]
    assert all(t["api_key_sha256"].endswith("…") and len(t["api_key_sha256"]) == 9 for t in config["tenants"])
    assert config["server"]["admin_token_sha256"].endswith("…")
    assert config["admission"]["max_waiting_requests"] == 128 and config["batch"]["profiles"] == [1]


@pytest.mark.req("R20.7", "R1.4", "R9.3.4", "R9.3.8")
def test_capability_contract_shows_each_tier_and_source(server: RunningServer) -> None:
    with server.http() as http:
        contract = http.get("/admin/capabilities", headers=server.admin_headers()).json()
    rows = {r["name"]: r for r in contract["capabilities"]}
    assert rows["ctx.append_decode"]["tier"] == "C0"
    assert rows["ping_pong"]["tier"] == "C1/C2" and rows["ping_pong"]["value"] == "false"
    assert rows["model_coresidency"]["tier"] == "C3" and rows["physical_devices_per_process"]["tier"] == "C4"
    assert rows["ctx.copy_prefix"]["value"] == "empty" and rows["ctx.shift"]["value"] == "gated"
    assert all(r["source"] in ("spec", "simulated", "vendor", "measured") for r in rows.values())
    assert [p["compiled_batch"] for p in contract["profiles"]] == [1]
    assert "simulated" in contract["device"] and "not NPU batch" in contract["software_multi_slot"]


@pytest.mark.parametrize("operation", ["unload", "rollback"])
def test_unload_and_rollback_answer_501_in_this_build(server: RunningServer, operation: str) -> None:
    with server.http() as http:
        response = http.post(f"/admin/models/{ALIAS}/{operation}", headers=server.admin_headers())
        unknown = http.post(f"/admin/models/other/{operation}", headers=server.admin_headers())
    assert response.status_code == 501
    error = response.json()["error"]
    assert error["code"] == "not_available_in_this_build" and "not available in this build" in error["message"]
    assert unknown.status_code == 404


def test_load_answers_501_in_this_build(server: RunningServer) -> None:
    with server.http() as http:
        response = http.post(f"/admin/models/{ALIAS}/load", headers=server.admin_headers(),
                             json={"package": "/nowhere/pkg"})
        bad_alias = http.post("/admin/models/bad alias!/drain", headers=server.admin_headers())
        unknown_drain = http.post("/admin/models/other/drain", headers=server.admin_headers())
    assert response.status_code == 501 and "model manager" in response.json()["error"]["message"]
    assert bad_alias.status_code in (400, 404) and unknown_drain.status_code == 404


# ---------------------------------------------------------------------------------------------
# load / unload / rollback while streams are open (enabled by binding the ModelManager)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def managed_server(tmp_path: Path, key_dir: Path) -> Iterator[tuple[RunningServer, Path]]:
    """A server whose alias comes from a configured, signed package under a trusted root, with a
    second signed package next to it to load."""
    root = tmp_path / "packages"
    pair = ensure_dev_keypair(key_dir)
    for name in ("gen-a", "gen-b"):
        build_sim_package(root / name, variant="current", name=f"tiny-{name}")
        sign_package(root / name, pair.private_key_path)
    config = service_config(models=[{"alias": ALIAS, "package": str(root / "gen-a")},
                                    {"alias": "spare", "package": str(root / "gen-b")}],
                            trust={"trusted_roots": [str(root)], "trusted_keys_dir": str(key_dir)},
                            executor={"drain_deadline_ms": 5000})
    running = start_server(config, key_dir, cost=PACED)
    yield running, root
    running.stop()


@pytest.mark.req("R11.1", "R11.2", "R5.2.5")
def test_a_configured_package_is_verified_and_served_and_other_aliases_are_not_loaded(
        managed_server: tuple[RunningServer, Path]) -> None:
    server, root = managed_server
    with server.http() as http:
        entry = http.get("/admin/models", headers=server.admin_headers()).json()["data"][0]
    assert entry["calbin"] == "tiny-gen-a" and entry["package"] == str(root / "gen-a")
    out = server.client("alpha").completions.create(model=ALIAS, prompt="configured", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens >= 1
    with pytest.raises(openai.InternalServerError) as caught:
        server.client("alpha").completions.create(model="spare", prompt="x", max_tokens=1)
    assert caught.value.status_code == 503 and caught.value.code == "model_unavailable"
    assert "not loaded" in caught.value.message


@pytest.mark.req("R10.3", "R10.4", "R11.11", "R12.1", "R12.2", "R19.13")
def test_load_unload_and_rollback_while_streams_are_open(managed_server: tuple[RunningServer, Path]) -> None:
    server, root = managed_server
    if isinstance(server.service.admin, BundledModelAdmin):
        pytest.skip(MODEL_MANAGER_PENDING)
    headers = server.admin_headers()

    async def stream_tokens(n: int) -> tuple[int, str | None]:
        client = server.async_client("alpha")
        try:
            stream = await client.completions.create(model=ALIAS, prompt="across generations", max_tokens=n,
                                                     stream=True, stream_options={"include_usage": True},
                                                     temperature=0, extra_body={"ignore_eos": True})
            used, finish = 0, None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            return used, finish
        finally:
            await client.close()

    async def scenario() -> None:
        old = [asyncio.ensure_future(stream_tokens(120)) for _ in range(3)]
        # the load starts once the three streams are in the engine (an event, not a sleep)
        assert await asyncio.to_thread(server.service.wait_streams, lambda n: n >= 3, 30)

        def admin(method: str, path: str, **kw: object) -> dict:  # type: ignore[type-arg]
            with server.http() as http:
                response = getattr(http, method)(path, headers=headers, **kw)
            assert response.status_code == 200, response.text
            return response.json()  # type: ignore[no-any-return]

        loaded = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/load",
                                         json={"package": str(root / "gen-b")})
        assert loaded["generation"] == 2 and loaded["state"] == "ready"
        listing = (await asyncio.to_thread(admin, "get", "/admin/models"))["data"]
        assert {e["generation"] for e in listing} >= {1, 2}
        assert [e["generation"] for e in listing if e["active"]] == [2]
        # streams that began on generation 1 finish there, whole (R10.3)
        assert [await task for task in old] == [(120, "length")] * 3
        new = asyncio.ensure_future(stream_tokens(60))
        first_sha = next(e["package_sha256"] for e in listing if e["generation"] == 1)
        rolled = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/rollback")
        assert rolled["state"] == "ready" and rolled["package_sha256"] == first_sha and rolled["generation"] != 2
        assert await new == (60, "length")
        unloaded = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/unload")
        assert unloaded["state"] in ("unloaded", "draining", "unloading")
        with server.http() as http:
            after = http.post("/v1/completions", json={"model": ALIAS, "prompt": "x", "max_tokens": 1},
                              headers={"Authorization": "Bearer " + TENANT_KEYS["alpha"]})
        assert after.status_code == 503

    asyncio.run(scenario())
    assert server.service.wait_streams_closed(30)
