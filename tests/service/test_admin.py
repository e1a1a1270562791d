"""The admin API: models and generations, effective config, the capability contract, the error
answers of the model operations, and load/unload/rollback through the ModelManager while streams
are open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from calculet.packages import ensure_dev_keypair, sign_package
from calculet.adapters.sim.build import build_package as build_sim_package
from calculet.server.model_admin import ManagedModelAdmin, ModelAdmin
from tests.service.conftest import PACED
from tests.service.support import ALIAS, TENANT_KEYS, RunningServer, service_config, start_server


@pytest.mark.req("R11.1", "R11.2")
def test_models_lists_the_generation_with_state_and_package(server: RunningServer) -> None:
    with server.http() as http:
        data = http.get("/admin/models", headers=server.admin_headers()).json()["data"]
    active = [e for e in data if e["active"]]
    assert len(active) == 1  # refused loads of other tests are listed too, as ended generations
    entry = active[0]
    assert (entry["alias"], entry["generation"], entry["state"]) == (ALIAS, 1, "ready")
    assert entry["calbin"] == "tiny-random-bpe" and entry["profiles"] == [1] and entry["max_seq"] == 256
    assert len(entry["package_sha256"]) == 64 and entry["durations_s"]["load"] > 0
    assert entry["package"] == server.brought.package and "unverified" not in entry["signed_by"]
    assert entry["active_requests"] == 0 and entry["inflight_jobs"] == 0 and entry.get("report") is None
    assert isinstance(server.service.admin, ManagedModelAdmin) and isinstance(server.service.admin, ModelAdmin)


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


@pytest.mark.req("R11.1")
def test_model_operations_refuse_with_the_step_or_field_named(server: RunningServer) -> None:
    headers = server.admin_headers()
    with server.http() as http:
        untrusted = http.post(f"/admin/models/{ALIAS}/load", headers=headers, json={"package": "/nowhere/pkg"})
        no_previous = http.post(f"/admin/models/{ALIAS}/rollback", headers=headers)
        unknown = {op: http.post(f"/admin/models/other/{op}", headers=headers, json={"package": "/nowhere/pkg"})
                   for op in ("load", "unload", "drain", "rollback")}
        bad_alias = http.post("/admin/models/bad alias!/drain", headers=headers)
        listing = http.get("/admin/models", headers=headers).json()["data"]
    assert untrusted.status_code == 400
    error = untrusted.json()["error"]
    assert error["code"] == "load_failed" and error["param"] == "package"
    assert "§11 step 1 (resolve trusted package path)" in error["message"] and "trusted roots" in error["message"]
    assert no_previous.status_code == 404 and "no previous artifact" in no_previous.json()["error"]["message"]
    assert {op: r.status_code for op, r in unknown.items()} == dict.fromkeys(unknown, 404)
    assert bad_alias.status_code in (400, 404)
    refused = [e for e in listing if not e["active"]]
    assert refused and all(e["state"] == "unloaded" and "step 1" in e["detail"] for e in refused)
    assert [e["generation"] for e in listing if e["active"]] == [1]  # nothing changed for the served one


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
    headers = server.admin_headers()

    async def stream_tokens(n: int, started: asyncio.Event | None = None) -> tuple[int, str | None]:
        client = server.async_client("alpha")
        try:
            stream = await client.completions.create(model=ALIAS, prompt="across generations", max_tokens=n,
                                                     stream=True, stream_options={"include_usage": True},
                                                     temperature=0, extra_body={"ignore_eos": True})
            used, finish = 0, None
            async for chunk in stream:
                if started is not None:
                    started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            return used, finish
        finally:
            await client.close()

    def admin(method: str, path: str, **kw: object) -> dict:  # type: ignore[type-arg]
        with server.http() as http:
            response = getattr(http, method)(path, headers=headers, **kw)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def scenario() -> None:
        started = [asyncio.Event() for _ in range(3)]
        old = [asyncio.ensure_future(stream_tokens(120, event)) for event in started]
        # the load starts once the three streams have tokens from generation 1 (events, not a sleep)
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in started)), 30)
        before = (await asyncio.to_thread(admin, "get", "/admin/models"))["data"]
        assert [(e["generation"], e["state"], e["active_requests"]) for e in before] == [(1, "ready", 3)]

        loaded = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/load",
                                         json={"package": str(root / "gen-b")})
        assert loaded["generation"] == 2 and loaded["state"] == "ready" and loaded["calbin"] == "tiny-gen-b"
        report = loaded["report"]
        assert report["kind"] == "load" and report["ok"] and report["replaced"] == 1
        assert report["previous_drained"] and report["rollback_available"] and report["downtime_s"] > 0
        assert "passed" in report["golden"] and {"resolve", "verify", "golden", "publish"} <= set(report["steps"])
        listing = (await asyncio.to_thread(admin, "get", "/admin/models"))["data"]
        by_gen = {e["generation"]: e for e in listing}
        assert by_gen[1]["state"] == "unloaded" and by_gen[1]["active_requests"] == 0
        assert [e["generation"] for e in listing if e["active"]] == [2]
        assert by_gen[1]["package_sha256"] != by_gen[2]["package_sha256"]
        assert by_gen[1]["durations_s"]["drain"] > 0
        # streams that began on generation 1 finished there, whole, before it was unloaded (R10.3)
        assert [await task for task in old] == [(120, "length")] * 3
        assert server.service.info.generation == 2

        new = asyncio.ensure_future(stream_tokens(60))
        rolled = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/rollback")
        assert rolled["state"] == "ready" and rolled["package_sha256"] == by_gen[1]["package_sha256"]
        assert rolled["generation"] == 3 and rolled["calbin"] == "tiny-gen-a"
        assert rolled["report"]["kind"] == "rollback" and rolled["report"]["replaced"] == 2
        assert await new == (60, "length")

        unloaded = await asyncio.to_thread(admin, "post", f"/admin/models/{ALIAS}/unload")
        assert (unloaded["generation"], unloaded["state"], unloaded["active"]) == (3, "unloaded", False)
        assert unloaded["report"]["kind"] == "unload" and unloaded["report"]["ok"]
        assert unloaded["report"]["drain_deadline_ms"] == 5000 and not unloaded["report"]["deadline_passed"]

    asyncio.run(scenario())
    with server.http() as http:
        after = http.post("/v1/completions", json={"model": ALIAS, "prompt": "x", "max_tokens": 1},
                          headers={"Authorization": "Bearer " + TENANT_KEYS["alpha"]})
        ready = http.get("/health/ready")
        listing = http.get("/admin/models", headers=headers).json()["data"]
    assert after.status_code == 503 and after.json()["error"]["code"] == "model_unavailable"
    assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
    assert [(e["generation"], e["state"], e["active"]) for e in listing] == [
        (1, "unloaded", False), (2, "unloaded", False), (3, "unloaded", False)]
    assert all(len(e["package_sha256"]) == 64 and e["signed_by"] for e in listing)
    assert listing[0]["package_sha256"] == listing[2]["package_sha256"] != listing[1]["package_sha256"]
    assert server.service.wait_streams_closed(30)
