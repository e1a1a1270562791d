"""``python -m calculet.package``: every subcommand, clear errors, exit code 1 on failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calculet.package import main

Captured = pytest.CaptureFixture[str]


@pytest.fixture
def setup(tmp_path: Path, capsys: Captured) -> dict[str, Path]:
    """keygen + build --key: a signed package under ``root`` and a trusted keys directory."""
    src = tmp_path / "src"
    (src / "weights").mkdir(parents=True)
    (src / "model.calbin").write_bytes(b"calbin")
    (src / "weights" / "w.bin").write_bytes(b"\x01" * 100)
    assert main(["keygen", "--out", str(tmp_path / "keys"), "--name", "release"]) == 0
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "release.pub.pem").write_bytes((tmp_path / "keys" / "release.pub.pem").read_bytes())
    root = tmp_path / "root"
    code = main([
        "build", str(src), str(root / "pkg"), "--field", "profiles=[1]", "--field", "model=tiny",
        "--key", str(tmp_path / "keys" / "release.key.pem"),
    ])
    assert code == 0
    capsys.readouterr()
    return {"src": src, "root": root, "pkg": root / "pkg", "trusted": trusted,
            "key": tmp_path / "keys" / "release.key.pem", "base": tmp_path}


def test_build_writes_fields_and_signs(setup: dict[str, Path]) -> None:
    manifest = json.loads((setup["pkg"] / "manifest.json").read_bytes())
    assert manifest["profiles"] == [1]
    assert manifest["model"] == "tiny"
    assert (setup["pkg"] / "manifest.sig").stat().st_size == 64


@pytest.mark.req("R11.1", "R11.2")
def test_verify_ok(setup: dict[str, Path], capsys: Captured) -> None:
    code = main(["verify", str(setup["pkg"]), "--trusted-root", str(setup["root"]),
                 "--keys", str(setup["trusted"])])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"OK {setup['pkg']}")
    assert "signed by: ed25519:" in out and "(release)" in out


def test_verify_json(setup: dict[str, Path], capsys: Captured) -> None:
    code = main(["verify", str(setup["pkg"]), "--trusted-root", str(setup["root"]),
                 "--keys", str(setup["trusted"]), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["ok"] is True
    assert result["files"] == 2
    assert result["total_bytes"] == 106


@pytest.mark.req("R11.2")
def test_verify_tampered_package_exits_1_naming_the_file(
    setup: dict[str, Path], capsys: Captured
) -> None:
    weights = setup["pkg"] / "weights" / "w.bin"
    weights.write_bytes(b"\x02" + weights.read_bytes()[1:])
    code = main(["verify", str(setup["pkg"]), "--trusted-root", str(setup["root"]),
                 "--keys", str(setup["trusted"])])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: package ")
    assert "weights/w.bin: sha256 mismatch" in err


@pytest.mark.req("R11.1")
def test_verify_outside_roots_exits_1(setup: dict[str, Path], capsys: Captured) -> None:
    code = main(["verify", str(setup["pkg"]), "--trusted-root", str(setup["src"]),
                 "--keys", str(setup["trusted"])])
    assert code == 1
    assert "outside the trusted roots" in capsys.readouterr().err


def test_verify_needs_roots_and_keys(setup: dict[str, Path], capsys: Captured) -> None:
    assert main(["verify", str(setup["pkg"]), "--keys", str(setup["trusted"])]) == 1
    assert "give --trusted-root" in capsys.readouterr().err
    assert main(["verify", str(setup["pkg"]), "--trusted-root", str(setup["root"])]) == 1
    assert "give --keys" in capsys.readouterr().err


def test_verify_takes_trust_from_a_scheduler_config(
    setup: dict[str, Path], capsys: Captured
) -> None:
    config = setup["base"] / "scheduler.yaml"
    config.write_text(
        "schema: calculet-scheduler/v1\n"
        "trust:\n  trusted_roots: [root]\n  trusted_keys_dir: trusted\n  max_file_bytes: 50\n"
    )
    code = main(["verify", str(setup["pkg"]), "--config", str(config)])
    assert code == 1, "the config's 50-byte limit applies"
    assert "weights/w.bin" in capsys.readouterr().err
    code = main(["verify", str(setup["pkg"]), "--config", str(config), "--max-file-bytes", "1000"])
    assert code == 0
    bad = setup["base"] / "bad.yaml"
    bad.write_text("schema: nope\n")
    assert main(["verify", str(setup["pkg"]), "--config", str(bad)]) == 1
    assert "unknown schema" in capsys.readouterr().err


def test_sign_replaces_the_signature(setup: dict[str, Path], capsys: Captured) -> None:
    (setup["pkg"] / "manifest.sig").unlink()
    assert main(["sign", str(setup["pkg"]), "--key", str(setup["key"])]) == 0
    assert "signed" in capsys.readouterr().out
    assert main(["sign", str(setup["pkg"]), "--key", str(setup["base"] / "absent.pem")]) == 1
    assert "cannot read private key" in capsys.readouterr().err


def test_inspect_and_pack(setup: dict[str, Path], capsys: Captured) -> None:
    assert main(["inspect", str(setup["pkg"]), "--keys", str(setup["trusted"])]) == 0
    out = capsys.readouterr().out
    assert "NOT verified" in out
    assert "matches trusted key ed25519:" in out
    assert "weights/w.bin  100" in out
    archive = setup["root"] / "pkg.tar"
    assert main(["pack", str(setup["pkg"]), str(archive)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(archive), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["verified"] is False
    assert info["archive"] is True
    assert info["manifest"]["model"] == "tiny"
    assert main(["verify", str(archive), "--trusted-root", str(setup["root"]),
                 "--keys", str(setup["trusted"])]) == 0


def test_build_errors_exit_1(setup: dict[str, Path], capsys: Captured) -> None:
    assert main(["build", str(setup["src"]), str(setup["pkg"])]) == 1
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["build", str(setup["src"]), str(setup["base"] / "o"), "--field", "novalue"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err
    fields = setup["base"] / "fields.json"
    fields.write_text("[1]")
    assert main(["build", str(setup["src"]), str(setup["base"] / "o"),
                 "--fields-json", str(fields)]) == 1
    assert "must hold a JSON object" in capsys.readouterr().err
    assert not (setup["base"] / "o").exists()


def test_build_with_fields_json_and_format(setup: dict[str, Path]) -> None:
    fields = setup["base"] / "fields.json"
    fields.write_text('{"model": "from-file", "profiles": [1]}')
    out = setup["base"] / "o"
    assert main(["build", str(setup["src"]), str(out), "--fields-json", str(fields),
                 "--field", "model=override", "--format", "calbin-package/v9"]) == 0
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["model"] == "override"
    assert manifest["format"] == "calbin-package/v9"


def test_keygen_refuses_to_overwrite(setup: dict[str, Path], capsys: Captured) -> None:
    assert main(["keygen", "--out", str(setup["key"].parent), "--name", "release"]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err


def test_usage_errors_exit_1(capsys: Captured) -> None:
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 1
    with pytest.raises(SystemExit) as caught:
        main(["frobnicate"])
    assert caught.value.code == 1
    assert "error:" in capsys.readouterr().err


def test_module_entry_point_runs(setup: dict[str, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "calculet.package", "verify", str(setup["pkg"]),
         "--trusted-root", str(setup["src"]), "--keys", str(setup["trusted"])],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 1
    assert "outside the trusted roots" in result.stderr
