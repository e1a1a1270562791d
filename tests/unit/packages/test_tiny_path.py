"""The one documented path (#18): ``package tiny`` → ``verify`` → serve, and ``build`` of the
simulator builder's output (which ``build`` used to refuse). R11.1 R11.2 R11.3"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from calculet.adapters.sim.build import main as sim_build_main
from calculet.adapters.sim.bundled import BUNDLED_ALIAS
from calculet.config import parse_config
from calculet.package import main
from calculet.runtime.engine.types import EngineOptions
from calculet.runtime.streams.package_tokenizer import HfTokenizer
from calculet.server.bringup import bring_up

Captured = pytest.CaptureFixture[str]


def test_tiny_builds_signs_verifies_and_serves(tmp_path: Path, capsys: Captured) -> None:
    keys, pkgs = tmp_path / "keys", tmp_path / "pkgs"
    assert main(["keygen", "--out", str(keys), "--name", "mine"]) == 0
    assert main(["tiny", str(pkgs / "tiny"), "--key", str(keys / "mine.key.pem")]) == 0
    assert "random weights" in capsys.readouterr().out
    assert {p.name for p in (pkgs / "tiny").iterdir()} == {"manifest.json", "manifest.sig", "weights.bin",
                                                             "tokenizer.json", "tokenizer_config.json"}
    assert main(["verify", str(pkgs / "tiny"), "--trusted-root", str(pkgs), "--keys", str(keys)]) == 0
    config = parse_config({"schema": "calculet-scheduler/v1", "model_alias": BUNDLED_ALIAS,
                           "models": [{"alias": BUNDLED_ALIAS, "package": str(pkgs / "tiny")}],
                           "trust": {"trusted_roots": [str(pkgs)], "trusted_keys_dir": str(keys)}})
    brought = bring_up(config, key_dir=tempfile.mkdtemp(), options=EngineOptions(monitor_mode=None))
    try:
        assert isinstance(brought.engine.tokenizer, HfTokenizer)
        assert not brought.bundled and brought.engine.model_info().calbin == "tiny-random-bpe"
    finally:
        brought.engine.stop(0)
        brought.close()


def test_build_accepts_the_simulator_builders_output(tmp_path: Path, capsys: Captured) -> None:
    assert sim_build_main([str(tmp_path / "sim")]) == 0
    assert main(["build", str(tmp_path / "sim"), str(tmp_path / "pkg")]) == 0
    assert main(["inspect", str(tmp_path / "pkg")]) == 0
    assert "tiny-sim-current" in capsys.readouterr().out


def test_the_default_configuration_serves_the_bundled_model_under_an_honest_alias() -> None:
    """The §15 example alias qwen3 names a real model; the bundled one is served as tiny-random."""
    from calculet.config import default_config

    brought = bring_up(default_config(), key_dir=tempfile.mkdtemp(), options=EngineOptions(monitor_mode=None))
    try:
        assert brought.config.model_alias == BUNDLED_ALIAS and brought.bundled
        assert brought.engine.model_info().calbin == "tiny-random-bpe"
    finally:
        brought.engine.stop(0)
        brought.close()
