"""Devices as plug-ins through the HTTP API (#18): a device registered by another distribution (an
``importlib.metadata`` double of the ``calculet.devices`` table) is found by name and served; the
capability endpoint shows a tier above C3 only with a passing conformance report for that device and
package, and refuses it without one (§1, §20, R20.7)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from calculet.adapters import devices
from calculet.adapters.devices import ENTRY_POINT_GROUP
from calculet.adapters.sim import SimConfig, TimeMode
from calculet.conformance import run_conformance, simulator_package
from calculet.conformance.specs import simulator_evidence
from calculet.packages import ensure_dev_keypair, sign_package
from calculet.runtime.engine.types import EngineOptions
from calculet.server.app import create_app
from calculet.server.bringup import bring_up
from calculet.server.service import Service, ServiceOptions
from tests.service.support import ALIAS, RunningServer, service_config
from tests.unit.conformance.fake_board import PLUGIN as BOARD

ENTRY_POINTS = [metadata.EntryPoint("sim", "calculet.adapters.sim.plugin:PLUGIN", ENTRY_POINT_GROUP),
                metadata.EntryPoint("fakeboard", "tests.unit.conformance.fake_board:PLUGIN", ENTRY_POINT_GROUP)]


@pytest.fixture(autouse=True)
def vendor_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed table as if a vendor distribution registered ``fakeboard``."""
    monkeypatch.setattr(devices, "installed_entry_points", lambda: ENTRY_POINTS)


@pytest.fixture(scope="module")
def signed_package(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, Path]:
    """The simulator's future package (B1..B16, a reset it says it verifies), signed with the test dev key."""
    root = tmp_path_factory.mktemp("vendor-packages")
    package = simulator_package(root)
    pair = ensure_dev_keypair(key_dir)
    sign_package(package, pair.private_key_path)
    return root, package


def serve(device: str, package: tuple[Path, Path], key_dir: Path, evidence: Path | None) -> RunningServer:
    """``python -m calculet.run --device NAME`` in a thread: bring-up, the offered contract, uvicorn."""
    root, pkg = package
    pair = ensure_dev_keypair(key_dir)
    config = service_config(models=[{"alias": ALIAS, "package": str(pkg)}],
                            trust={"trusted_roots": [str(root)], "trusted_keys_dir": str(pair.public_key_path.parent)},
                            device={"name": device, **({"evidence": str(evidence)} if evidence else {})},
                            batch={"profiles": [1, 4]})
    brought = bring_up(config, sim=SimConfig(time_mode=TimeMode.REAL), options=EngineOptions(monitor_mode=None))
    offered = brought.offered()
    service = Service(brought.config, brought.engine,
                      options=ServiceOptions(device_label=brought.device_label, capabilities=offered.capabilities,
                                             profile_tiers=offered.profiles))
    service.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(create_app(service), log_config=None, access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return RunningServer(service, brought, sock.getsockname()[1], server, thread)


@pytest.fixture
def running(request: pytest.FixtureRequest, signed_package: tuple[Path, Path], key_dir: Path,
            tmp_path: Path) -> Iterator[RunningServer]:
    device, report = request.param
    evidence = None
    if report == "board":
        evidence = tmp_path / "conformance-fakeboard.json"
        evidence.write_text(run_conformance(BOARD, signed_package[1]).to_json())
    elif report == "simulator":
        evidence = tmp_path / "conformance-sim.json"
        evidence.write_text(simulator_evidence().to_json())
    server = serve(device, signed_package, key_dir, evidence)
    yield server
    server.stop()


def capabilities(server: RunningServer) -> dict[str, Any]:
    with server.http() as http:
        contract = http.get("/admin/capabilities", headers=server.admin_headers()).json()
    return contract


def above_c3(contract: dict[str, Any]) -> dict[str, str]:
    return {r["name"]: r["tier"] for r in contract["capabilities"] if r["source"] == "measured"}


@pytest.mark.parametrize("running", [("fakeboard", "board")], indirect=True)
def test_a_plugin_device_is_found_by_name_and_serves_with_its_evidence(running: RunningServer) -> None:
    """R20.7: a passing report for this device and package earns C2 for what the package switches on."""
    with running.client() as client:
        done = client.completions.create(model=ALIAS, prompt="hello", max_tokens=4)
    assert done.usage is not None and done.usage.completion_tokens >= 1
    contract = capabilities(running)
    assert contract["device"].startswith("fakeboard:")
    rows = {r["name"]: r for r in contract["capabilities"]}
    assert rows["reset_configuration_verified"]["tier"] == "C2"
    assert rows["reset_configuration_verified"]["source"] == "measured"
    assert above_c3(contract) == {"reset_configuration_verified": "C2", "multi_profile_residency": "C2",
                                  "reset_domain": "C2", "incremental_prefill": "C2"}
    assert {p["compiled_batch"]: p["tier"] for p in contract["profiles"]} == {1: "C0", 4: "C2"}


@pytest.mark.parametrize("running", [("fakeboard", None), ("fakeboard", "simulator"), ("sim", "board")],
                         indirect=True, ids=["no-report", "another-device's-report", "simulated-device"])
def test_without_a_passing_report_for_this_device_nothing_rises_above_its_spec_tier(running: RunningServer) -> None:
    """R20.7: no report, a report for another device or package, or a simulated device: refused."""
    contract = capabilities(running)
    rows = {r["name"]: r for r in contract["capabilities"]}
    assert rows["reset_configuration_verified"]["tier"] == "C3"
    assert above_c3(contract) == {}
    assert {p["compiled_batch"]: p["tier"] for p in contract["profiles"]} == {1: "C0", 4: "C3"}
