"""A device from a separately installed distribution (#18): a dist-info with a ``calculet.devices``
entry point on ``sys.path`` — what ``pip install`` of a vendor binding leaves — is listed by name and
served by ``python -m calculet.run --device NAME`` over HTTP (R3.4: still one device per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def install_distribution(site: Path) -> None:
    """The metadata ``pip install`` writes for a distribution registering ``fakeboard``."""
    info = site / "fakeboard_vendor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeboard-vendor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[calculet.devices]\nfakeboard = tests.unit.conformance.fake_board:PLUGIN\n")


def environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def test_an_installed_plugin_is_listed_and_served_over_http(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    install_distribution(site)
    env = environment(site)
    listed = subprocess.run([sys.executable, "-m", "calculet.conformance", "--list"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=True).stdout
    assert "fakeboard\tdevice\t" in listed and "sim\tsimulated\t" in listed
    proc = subprocess.Popen([sys.executable, "-m", "calculet.run", "--device", "fakeboard", "--host", "127.0.0.1",
                             "--port", "0", "--log-format", "json"], env={**env, "CALCULET_HOME": str(tmp_path)},
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        loaded = None
        for line in proc.stderr:
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("msg") == "model loaded":
                loaded = record
            if record.get("msg") == "listening":
                url = record["url"]
                break
        assert url is not None and loaded is not None and loaded.get("device") == "fakeboard", loaded
        body = {"model": "tiny-random", "prompt": "hello", "max_tokens": 3}
        out = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        assert out["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=60)
