"""Building, signing and key handling of signed packages."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from tests.unit.packages.package_testkit import EXTRA_FIELDS, PACKAGE_FILES, Env

from calculet.packages import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    PackageCheck,
    build_package,
    ensure_dev_keypair,
    file_sha256,
    generate_keypair,
    key_id_of,
    load_private_key,
    load_trusted_keys,
    sign_package,
    verify_package,
)
from calculet.errors import PackageError

REPO = Path(__file__).resolve().parents[3]


def _src(tmp_path: Path, files: dict[str, bytes] | None = None) -> Path:
    src = tmp_path / "src"
    for rel, data in (files or {"a.bin": b"a", "d/b.bin": b"bb"}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


# --------------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------------


def test_build_writes_hashes_sizes_and_extra_fields(env: Env) -> None:
    package = env.make_package(sign=False)
    manifest = json.loads((package / MANIFEST_NAME).read_bytes())
    assert manifest["format"] == "calbin-package/v1"
    assert manifest["model"] == EXTRA_FIELDS["model"]
    assert manifest["profiles"] == EXTRA_FIELDS["profiles"]
    assert set(manifest["files"]) == set(PACKAGE_FILES)
    for rel, data in PACKAGE_FILES.items():
        assert manifest["files"][rel] == {"sha256": file_sha256(package / rel), "size": len(data)}
        assert (package / rel).read_bytes() == data
    assert not (package / SIGNATURE_NAME).exists()


def test_build_accepts_another_format(tmp_path: Path) -> None:
    package = build_package(_src(tmp_path), tmp_path / "out", {"format": "calbin-package/v2"})
    assert json.loads((package / MANIFEST_NAME).read_bytes())["format"] == "calbin-package/v2"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"files": {}}, "may not set 'files'"),
        ({"format": ""}, "'format' must be a non-empty string"),
        ({"format": 3}, "'format' must be a non-empty string"),
        ({"value": float("nan")}, "not JSON-serializable"),
        ({"value": object()}, "not JSON-serializable"),
    ],
)
def test_build_rejects_bad_extra_fields(tmp_path: Path, fields: dict[str, object],
                                        fragment: str) -> None:
    with pytest.raises(PackageError, match=fragment):
        build_package(_src(tmp_path), tmp_path / "out", fields)
    assert not (tmp_path / "out").exists()


def test_build_relays_out_a_built_package_from_its_own_manifest(tmp_path: Path) -> None:
    """#18: the simulator builder's output (a manifest.json, maybe a stale manifest.sig) builds: its
    fields are kept, files recomputed, the old manifest and signature not copied; a bad one is refused."""
    old = {"format": "calbin-package/v1", "name": "kept", "files": {"gone.bin": {"sha256": "0" * 64, "size": 1}}}
    src = _src(tmp_path, {"manifest.json": json.dumps(old).encode(), "manifest.sig": b"x" * 64, "a.bin": b"a"})
    out = build_package(src, tmp_path / "out", {"extra": 1})
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["name"] == "kept" and manifest["extra"] == 1 and set(manifest["files"]) == {"a.bin"}
    assert not (out / "manifest.sig").exists()
    bad = _src(tmp_path / "bad", {"manifest.json": b"[1]", "a.bin": b"a"})
    with pytest.raises(PackageError, match="not a JSON object"):
        build_package(bad, tmp_path / "out2")


def test_build_refuses_names_a_manifest_cannot_carry(tmp_path: Path) -> None:
    src = _src(tmp_path, {"back\\slash.bin": b"x"})
    with pytest.raises(PackageError, match="backslash"):
        build_package(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_build_refuses_symlinks_in_the_source(tmp_path: Path) -> None:
    src = _src(tmp_path)
    (src / "link").symlink_to("a.bin")
    with pytest.raises(PackageError) as caught:
        build_package(src, tmp_path / "out")
    assert caught.value.context["reason"] == PackageCheck.SYMLINK.value


def test_build_refuses_non_empty_or_overlapping_output(tmp_path: Path) -> None:
    src = _src(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(PackageError, match="not an empty directory"):
        build_package(src, busy)
    with pytest.raises(PackageError, match="must not overlap"):
        build_package(src, src / "inner")
    with pytest.raises(PackageError, match="is not a directory"):
        build_package(tmp_path / "absent", tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PackageError, match="holds no files"):
        build_package(empty, tmp_path / "out")


def test_build_into_an_existing_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert build_package(_src(tmp_path), out) == out.absolute()


def test_build_enforces_the_size_limit_and_cleans_up(tmp_path: Path) -> None:
    src = _src(tmp_path, {"big.bin": b"x" * 100})
    with pytest.raises(PackageError) as caught:
        build_package(src, tmp_path / "out", max_file_bytes=99)
    assert caught.value.context["reason"] == PackageCheck.OVERSIZE.value
    assert "big.bin" in str(caught.value)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# sign
# --------------------------------------------------------------------------------------------


def test_signature_is_64_raw_bytes_over_the_manifest(env: Env) -> None:
    package = env.make_package()
    signature = (package / SIGNATURE_NAME).read_bytes()
    assert len(signature) == 64
    public = load_private_key(env.signer.private_key_path).public_key()
    public.verify(signature, (package / MANIFEST_NAME).read_bytes())


def test_resigning_with_another_key_replaces_the_signature(env: Env) -> None:
    package = env.make_package(key=env.other_signer)
    with pytest.raises(PackageError):
        verify_package(package, [env.root], env.keys)
    sign_package(package, env.signer.private_key_path)
    assert verify_package(package, [env.root], env.keys).key_id == env.signer.key_id
    assert not [p for p in package.iterdir() if p.name.startswith(".manifest.sig.")]


def test_sign_needs_a_manifest(tmp_path: Path, env: Env) -> None:
    with pytest.raises(PackageError, match="no manifest.json to sign"):
        sign_package(tmp_path, env.signer.private_key_path)


def test_hex_seed_private_key_signs(env: Env, tmp_path: Path) -> None:
    key = load_private_key(env.signer.private_key_path)
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    seed_file = tmp_path / "seed.hex"
    seed_file.write_text(seed.hex() + "\n")
    package = env.make_package(sign=False)
    sign_package(package, seed_file)
    assert verify_package(package, [env.root], env.keys).key_id == env.signer.key_id


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"not a key", "neither a PEM private key nor a 32-byte Ed25519 seed"),
        (b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n",
         "not an unencrypted PEM private key"),
    ],
)
def test_unusable_private_key_is_reported(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.key.pem"
    path.write_bytes(content)
    with pytest.raises(PackageError, match=fragment):
        load_private_key(path)
    with pytest.raises(PackageError, match="cannot read private key"):
        load_private_key(tmp_path / "absent.key.pem")


def test_non_ed25519_private_key_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "ec.key.pem"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    with pytest.raises(PackageError, match="not an Ed25519 private key"):
        load_private_key(path)


# --------------------------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------------------------


def test_generate_keypair_writes_a_private_0600_and_a_public_file(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path / "k", "release")
    assert pair.private_key_path.name == "release.key.pem"
    assert pair.public_key_path.name == "release.pub.pem"
    assert stat.S_IMODE(pair.private_key_path.stat().st_mode) == 0o600
    assert pair.key_id.startswith("ed25519:") and len(pair.key_id) == len("ed25519:") + 16
    assert key_id_of(load_private_key(pair.private_key_path).public_key()) == pair.key_id
    with pytest.raises(PackageError, match="refusing to overwrite"):
        generate_keypair(tmp_path / "k", "release")
    with pytest.raises(PackageError, match="invalid key name"):
        generate_keypair(tmp_path / "k", "../escape")


@pytest.mark.req("R11.2")
def test_trusted_keys_accept_pem_and_hex_and_skip_private_keys(env: Env, tmp_path: Path) -> None:
    keys = tmp_path / "mixed"
    keys.mkdir()
    shutil.copy(env.signer.public_key_path, keys / "a.pem")
    raw = load_private_key(env.other_signer.private_key_path).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (keys / "b.pub").write_text(raw.hex().upper() + "\n")
    shutil.copy(env.signer.private_key_path, keys / "a.key.pem")  # skipped by name
    (keys / "README.md").write_text("not a key")  # ignored
    loaded = load_trusted_keys(keys)
    assert [(k.name, k.key_id) for k in loaded] == [
        ("a", env.signer.key_id),
        ("b", env.other_signer.key_id),
    ]
    package = env.make_package(key=env.other_signer)
    assert verify_package(package, [env.root], keys).key_name == "b"


@pytest.mark.parametrize(
    ("file_name", "content", "fragment"),
    [
        ("priv.pem", None, "is a private key"),
        ("junk.pub", b"zz" * 32, "neither a PEM public key nor a raw 32-byte Ed25519 key"),
        ("short.hex", b"ab" * 31, "neither a PEM public key"),
        ("bad.pem", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
         "not a PEM public key"),
        ("ec.pem", "ec", "not an Ed25519 public key"),
    ],
)
def test_unusable_trusted_key_file_is_an_error(
    env: Env, tmp_path: Path, file_name: str, content: bytes | str | None, fragment: str
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    if content is None:
        shutil.copy(env.signer.private_key_path, keys / file_name)
    elif content == "ec":
        ec_public = ec.generate_private_key(ec.SECP256R1()).public_key()
        (keys / file_name).write_bytes(ec_public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    else:
        assert isinstance(content, bytes)
        (keys / file_name).write_bytes(content)
    with pytest.raises(PackageError) as caught:
        load_trusted_keys(keys)
    assert caught.value.context["reason"] == PackageCheck.BAD_KEY.value
    assert file_name in str(caught.value)
    assert fragment in str(caught.value)


def test_missing_or_empty_keys_directory_is_an_error(env: Env, tmp_path: Path) -> None:
    package = env.make_package()
    empty = tmp_path / "no-keys"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing here")
    for keys in (None, tmp_path / "absent", empty):
        with pytest.raises(PackageError) as caught:
            verify_package(package, [env.root], keys)
        assert caught.value.context["reason"] == PackageCheck.NO_TRUSTED_KEYS.value


# --------------------------------------------------------------------------------------------
# the bundled development key
# --------------------------------------------------------------------------------------------


def test_dev_key_pair_is_generated_once_per_machine_and_never_in_the_repository(tmp_path: Path) -> None:
    first = ensure_dev_keypair(tmp_path / "dev-keys")
    again = ensure_dev_keypair(tmp_path / "dev-keys")
    assert first.key_id == again.key_id and first.name == "calculet-dev"
    assert [k.name for k in load_trusted_keys(tmp_path / "dev-keys")] == ["calculet-dev"]
    assert not (REPO / "calculet" / "data" / "keys").exists()


def test_dev_private_key_signs_packages_the_dev_directory_trusts(tmp_path: Path) -> None:
    keys = ensure_dev_keypair(tmp_path / "dev-keys")
    root = tmp_path / "root"
    package = build_package(_src(tmp_path), root / "tiny", {"model": "tiny"})
    sign_package(package, keys.private_key_path)
    verified = verify_package(package, [root], tmp_path / "dev-keys")
    assert verified.key_name == "calculet-dev"
