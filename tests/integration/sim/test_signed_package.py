"""A simulated calbin package goes through signing and verification (§11 steps 1–3, 7).

The sim builder writes ``manifest.json`` with the ``files`` map that
``calculet.packages`` signs and verifies; the manifest model then parses the verified
bytes and the device loads the verified directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.packages.manifest import CalbinManifest
from calculet.packages import generate_keypair, sign_package, verify_package
from calculet.adapters.sim import SimCalRT, SimConfig
from calculet.adapters.sim.build import build_package
from calculet.adapters.host_driver import HostDriver
from calculet.errors import PackageError
from calculet.clock import FakeClock


@pytest.mark.req("R11.2", "R11.3", "R11.7", "R11.9")
def test_sim_package_signs_verifies_parses_and_loads(tmp_path: Path) -> None:
    root = tmp_path / "packages"
    pkg = root / "tiny-current"
    build_package(pkg, variant="current")
    keys = tmp_path / "keys"
    pair = generate_keypair(keys, "sim-signer")
    sign_package(pkg, pair.private_key_path)

    verified = verify_package(pkg, [root], keys)
    manifest = CalbinManifest.parse(verified.manifest_bytes)
    assert {f.relative_path for f in verified.files} == set(manifest.files) == {"weights.bin"}

    with SimCalRT(SimConfig(clock=FakeClock())).create_virtual_device() as dev:
        calbin = dev.create_calbin(verified.path)
        assert calbin.package_sha256 == verified.manifest_sha256
        dev.configure(calbin)
        kv = dev.create_kv_manager(calbin)
        assert all(HostDriver(dev, calbin, kv).check_golden(v).ok for v in calbin.golden)

    weights = pkg / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[1000] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(PackageError):
        verify_package(pkg, [root], keys)
