"""The ``calculet`` console command: one table of subcommands mapped to the modules' mains,
``python -m calculet.run`` unchanged, and ``calculet config check`` validating without starting
(R15.1: invalid settings name their field; R15.19: a configuration the package cannot serve)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from calculet.cli import COMMANDS, check_config, main
from calculet.errors import ConfigError, PackageError
from calculet.fleet.local import make_package
from calculet.packages import generate_keypair

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_names_a_module_main_and_the_console_script_is_declared() -> None:
    assert {"serve", "verify", "specs", "package", "bench", "config", "fleet"} <= set(COMMANDS)
    for name, command in COMMANDS.items():
        assert callable(command.load()), name
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["calculet"] == "calculet.cli:main"
    assert COMMANDS["serve"].module == "calculet.run"  # `calculet serve` is `python -m calculet.run`
    assert importlib.import_module("calculet.run").main is COMMANDS["serve"].load()


def test_usage_lists_the_commands_and_an_unknown_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(f"  {name}" in shown for name in COMMANDS)
    assert main(["frobnicate"]) == 2 and "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["serve", "--help"]) == 0 and "--sim-cost" in capsys.readouterr().out


def test_the_console_script_runs_in_a_fresh_interpreter() -> None:
    script = Path(sys.executable).with_name("calculet")
    assert script.exists(), "pip install -e . installs the calculet console script"
    done = subprocess.run([str(script), "fleet", "haproxy-config", "--board", "127.0.0.1:8001"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "server board1 127.0.0.1:8001" in done.stdout


@pytest.mark.req("R15.1")
def test_config_check_names_the_invalid_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: calculet-scheduler/v1\nqueues:\n  decode_weight: 0\n")
    assert main(["config", "check", str(bad)]) == 1
    assert "queues.decode_weight" in capsys.readouterr().err
    good = ROOT / "calculet" / "data" / "config" / "default.yaml"
    assert main(["config", "check", str(good)]) == 0 and "OK" in capsys.readouterr().out


@pytest.mark.req("R11.1", "R11.2", "R15.19")
def test_config_check_verifies_the_served_package_and_its_fit(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path / "keys", "ops")
    package = make_package(tmp_path / "packages", "qwen3-b1", pair.private_key_path)
    config = {"schema": "calculet-scheduler/v1", "model_alias": "qwen3",
              "models": [{"alias": "qwen3", "package": str(package)}],
              "trust": {"trusted_roots": [str(tmp_path / "packages")], "trusted_keys_dir": str(tmp_path / "keys")}}
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(config))
    lines = check_config(str(path))
    assert any("signature by" in line for line in lines) and any("tiny-qwen3-b1" in line for line in lines)
    path.write_text(yaml.safe_dump({**config, "batch": {"profiles": [8]}}))
    with pytest.raises(ConfigError, match="8"):
        check_config(str(path))  # a B8 asked of a B1 calbin (R15.19)
    assert check_config(str(path), packages=False)  # the schema alone is fine
    (package / "weights.bin").write_bytes(b"tampered")
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(PackageError):
        check_config(str(path))
