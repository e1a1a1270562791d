"""§11 steps 1–2: a package verifies only if trusted, signed and untouched (R11.1, R11.2)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calculet.packages import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    PackageCheck,
    build_package,
    generate_keypair,
    sign_package,
    verify_package,
)
from calculet.errors import DefinitionError, PackageError

from tests.unit.packages.package_testkit import EXTRA_FIELDS, PACKAGE_FILES, Env


def _verify(env: Env, package: Path, **kwargs: object) -> object:
    return verify_package(package, [env.root], env.keys, **kwargs)  # type: ignore[arg-type]


def _rejected(env: Env, package: Path, reason: PackageCheck, *fragments: str,
              **kwargs: object) -> PackageError:
    with pytest.raises(PackageError) as caught:
        _verify(env, package, **kwargs)
    error = caught.value
    assert error.context["reason"] == reason.value, str(error)
    for fragment in fragments:
        assert fragment in str(error), f"{fragment!r} not in {error}"
    return error


# --------------------------------------------------------------------------------------------
# happy path
# --------------------------------------------------------------------------------------------


@pytest.mark.req("R11.1", "R11.2")
def test_signed_package_verifies(env: Env) -> None:
    package = env.make_package()
    verified = verify_package(package, [env.root], env.keys)
    raw = (package / MANIFEST_NAME).read_bytes()
    assert verified.path == package.resolve()
    assert verified.source == package.resolve()
    assert verified.extracted is False
    assert verified.format == "calbin-package/v1"
    assert verified.manifest_sha256 == hashlib.sha256(raw).hexdigest()
    assert verified.manifest_bytes == raw
    assert verified.key_id == env.signer.key_id
    assert verified.key_name == "test-signer"
    assert [f.relative_path for f in verified.files] == sorted(PACKAGE_FILES)
    assert verified.total_bytes == sum(len(d) for d in PACKAGE_FILES.values())
    calbin = verified.file("model.calbin")
    assert calbin.path == package.resolve() / "model.calbin"
    assert calbin.sha256 == hashlib.sha256(PACKAGE_FILES["model.calbin"]).hexdigest()
    assert verified.manifest["model"] == "tiny"
    assert verified.manifest["profiles"][0]["compiled_batch"] == 1
    with pytest.raises(KeyError):
        verified.file("absent")


def test_verified_manifest_is_read_only_but_a_copy_is_mutable(env: Env) -> None:
    verified = verify_package(env.make_package(), [env.root], env.keys)
    with pytest.raises(TypeError):
        verified.manifest["format"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        verified.manifest["files"]["model.calbin"]["size"] = 0  # type: ignore[index]
    copy = verified.manifest_dict()
    copy["format"] = "changed"
    assert verified.manifest["format"] == "calbin-package/v1"
    assert copy["profiles"] == EXTRA_FIELDS["profiles"]


def test_package_errors_are_definition_errors(env: Env) -> None:
    package = env.make_package()
    (package / SIGNATURE_NAME).unlink()
    with pytest.raises(DefinitionError):
        _verify(env, package)


# --------------------------------------------------------------------------------------------
# step 1: trusted path (R11.1)
# --------------------------------------------------------------------------------------------


@pytest.mark.req("R11.1")
def test_package_outside_the_trusted_roots_is_rejected(env: Env) -> None:
    outside = env.base / "elsewhere"
    outside.mkdir()
    package = env.make_package()
    moved = Path(shutil.move(str(package), str(outside / "pkg")))
    _rejected(env, moved, PackageCheck.UNTRUSTED_PATH, "outside the trusted roots", str(env.root))


@pytest.mark.req("R11.1")
def test_dotdot_in_the_package_path_cannot_leave_the_root(env: Env) -> None:
    outside = env.base / "elsewhere"
    outside.mkdir()
    package = env.make_package()
    shutil.move(str(package), str(outside / "pkg"))
    sneaky = env.root / ".." / "elsewhere" / "pkg"
    _rejected(env, sneaky, PackageCheck.UNTRUSTED_PATH, "outside the trusted roots", "resolves to")


@pytest.mark.req("R11.1")
def test_symlink_in_the_root_pointing_outside_is_rejected(env: Env) -> None:
    outside = env.base / "elsewhere"
    outside.mkdir()
    package = env.make_package()
    target = Path(shutil.move(str(package), str(outside / "pkg")))
    link = env.root / "looks-trusted"
    link.symlink_to(target, target_is_directory=True)
    _rejected(env, link, PackageCheck.UNTRUSTED_PATH, "resolves to", str(target))


def test_symlink_to_a_package_inside_the_root_is_followed(env: Env) -> None:
    package = env.make_package()
    link = env.root / "current"
    link.symlink_to(package, target_is_directory=True)
    assert verify_package(link, [env.root], env.keys).path == package.resolve()


def test_second_trusted_root_is_honoured(env: Env) -> None:
    package = env.make_package()
    other_root = env.base / "other-root"
    other_root.mkdir()
    moved = Path(shutil.move(str(package), str(other_root / "pkg")))
    verify_package(moved, [env.root, other_root], env.keys)


def test_no_trusted_roots_means_nothing_loads(env: Env) -> None:
    package = env.make_package()
    with pytest.raises(PackageError, match="no trusted roots configured") as caught:
        verify_package(package, [], env.keys)
    assert caught.value.context["reason"] == PackageCheck.UNTRUSTED_PATH.value


def test_missing_package_is_reported(env: Env) -> None:
    _rejected(env, env.root / "absent", PackageCheck.NOT_FOUND, "does not exist")


@pytest.mark.req("R11.1")
def test_symlink_inside_the_package_escaping_it_is_rejected(env: Env) -> None:
    secret = env.base / "secret.txt"
    secret.write_text("not part of the package")
    package = env.make_package()
    (package / "weights" / "escape.bin").symlink_to(secret)
    _rejected(env, package, PackageCheck.SYMLINK, "weights/escape.bin",
              "points outside the package")


@pytest.mark.req("R11.1")
def test_listed_file_replaced_by_an_escaping_symlink_is_rejected(env: Env) -> None:
    package = env.make_package()
    outside = env.base / "shard.bin"
    outside.write_bytes(PACKAGE_FILES["weights/shard-1.bin"])  # same bytes, same hash
    (package / "weights" / "shard-1.bin").unlink()
    (package / "weights" / "shard-1.bin").symlink_to(outside)
    _rejected(env, package, PackageCheck.SYMLINK, "weights/shard-1.bin", "outside the package")


@pytest.mark.req("R11.1")
def test_symlinked_directory_escaping_the_package_is_rejected(env: Env) -> None:
    outside = env.base / "outside-dir"
    outside.mkdir()
    package = env.make_package()
    shutil.move(str(package / "weights"), str(outside / "weights"))
    (package / "weights").symlink_to(outside / "weights", target_is_directory=True)
    _rejected(env, package, PackageCheck.SYMLINK, "weights", "outside the package")


def test_symlink_inside_the_package_is_rejected_even_when_it_stays_inside(env: Env) -> None:
    package = env.make_package()
    (package / "alias.calbin").symlink_to("model.calbin")
    _rejected(env, package, PackageCheck.SYMLINK, "alias.calbin", "regular files only")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_file_in_the_package_is_rejected(env: Env) -> None:
    package = env.make_package()
    os.mkfifo(package / "pipe")
    _rejected(env, package, PackageCheck.SPECIAL_FILE, "pipe")


# --------------------------------------------------------------------------------------------
# step 2: signature (R11.2)
# --------------------------------------------------------------------------------------------


@pytest.mark.req("R11.2")
def test_missing_signature_is_rejected(env: Env) -> None:
    package = env.make_package(sign=False)
    _rejected(env, package, PackageCheck.MISSING_SIGNATURE, "manifest.sig", "not signed")


@pytest.mark.req("R11.2")
@pytest.mark.parametrize("length", [0, 1, 32, 63, 65])
def test_truncated_or_padded_signature_is_rejected(env: Env, length: int) -> None:
    package = env.make_package()
    signature = (package / SIGNATURE_NAME).read_bytes()
    (package / SIGNATURE_NAME).write_bytes((signature + b"\x00")[:length])
    _rejected(env, package, PackageCheck.MALFORMED_SIGNATURE, "manifest.sig",
              "truncated or malformed signature")


@pytest.mark.req("R11.2")
def test_package_signed_by_an_untrusted_key_is_rejected(env: Env) -> None:
    package = env.make_package(key=env.other_signer)
    _rejected(env, package, PackageCheck.BAD_SIGNATURE, "manifest.sig",
              "does not match manifest.json under any of the 1 trusted key(s)", str(env.keys))


def test_any_trusted_key_may_sign(env: Env) -> None:
    shutil.copy(env.other_signer.public_key_path, env.keys / "second.pub.pem")
    package = env.make_package(key=env.other_signer)
    verified = verify_package(package, [env.root], env.keys)
    assert verified.key_id == env.other_signer.key_id
    assert verified.key_name == "second"


def test_missing_manifest_is_rejected(env: Env) -> None:
    package = env.make_package()
    (package / MANIFEST_NAME).unlink()
    _rejected(env, package, PackageCheck.MISSING_MANIFEST, "manifest.json")


# --------------------------------------------------------------------------------------------
# step 2: every byte, every file (R11.2)
# --------------------------------------------------------------------------------------------

# Every file that has a byte to change; the empty file is covered by gaining a byte.
EVERY_FILE = [rel for rel in sorted(PACKAGE_FILES) if PACKAGE_FILES[rel]] + [
    MANIFEST_NAME,
    SIGNATURE_NAME,
]


@pytest.mark.req("R11.2")
@pytest.mark.parametrize("rel", EVERY_FILE)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_byte_changed_in_any_file_is_rejected_naming_it(env: Env, rel: str, where: str) -> None:
    package = env.make_package()
    path = package / rel
    size = path.stat().st_size
    offset = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    env.flip_byte(path, offset)
    if rel in (MANIFEST_NAME, SIGNATURE_NAME):
        _rejected(env, package, PackageCheck.BAD_SIGNATURE, "manifest.sig")
    else:
        _rejected(env, package, PackageCheck.HASH_MISMATCH, f"{rel}: sha256 mismatch")


@pytest.mark.req("R11.2")
def test_empty_file_gaining_a_byte_is_rejected(env: Env) -> None:
    package = env.make_package()
    (package / "empty.txt").write_bytes(b"\n")
    _rejected(env, package, PackageCheck.SIZE_MISMATCH, "empty.txt", "manifest says 0 bytes")


@pytest.mark.req("R11.2")
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_anywhere_is_rejected(env: Env, data: st.DataObject) -> None:
    """Property: whatever file and byte is changed, and however, verification fails."""
    with tempfile.TemporaryDirectory(dir=env.base) as scratch:
        package = Path(scratch) / "pkg"
        shutil.copytree(_pristine(env), package)
        candidates = [p for p in sorted(package.rglob("*")) if p.is_file() and p.stat().st_size]
        path = data.draw(st.sampled_from(candidates), label="file")
        raw = bytearray(path.read_bytes())
        offset = data.draw(st.integers(0, len(raw) - 1), label="offset")
        mask = data.draw(st.integers(1, 255), label="xor mask")
        raw[offset] ^= mask
        path.write_bytes(bytes(raw))
        roots = [Path(scratch)]
        with pytest.raises(PackageError) as caught:
            verify_package(package, roots, env.keys)
        assert caught.value.context["reason"] in {
            PackageCheck.HASH_MISMATCH.value,
            PackageCheck.BAD_SIGNATURE.value,
        }


_PRISTINE: dict[Path, Path] = {}


def _pristine(env: Env) -> Path:
    """One signed package per test environment, copied for each Hypothesis example."""
    if env.base not in _PRISTINE:
        _PRISTINE[env.base] = env.make_package("pristine")
    return _PRISTINE[env.base]


@pytest.mark.req("R11.2")
@pytest.mark.parametrize("rel", ["added.bin", "weights/added.bin", "new-dir/deep/added.bin"])
def test_file_added_is_rejected_naming_it(env: Env, rel: str) -> None:
    package = env.make_package()
    (package / rel).parent.mkdir(parents=True, exist_ok=True)
    (package / rel).write_bytes(b"payload")
    _rejected(env, package, PackageCheck.UNLISTED_FILE, f"{rel}: file is not listed")


@pytest.mark.req("R11.2")
def test_nested_file_named_like_the_manifest_is_not_exempt(env: Env) -> None:
    package = env.make_package()
    (package / "weights" / MANIFEST_NAME).write_bytes(b"{}")
    _rejected(env, package, PackageCheck.UNLISTED_FILE, "weights/manifest.json")


@pytest.mark.req("R11.2")
@pytest.mark.parametrize("rel", sorted(PACKAGE_FILES))
def test_file_removed_is_rejected_naming_it(env: Env, rel: str) -> None:
    package = env.make_package()
    (package / rel).unlink()
    _rejected(env, package, PackageCheck.MISSING_FILE,
              f"{rel}: listed in the manifest but not found")


def test_file_replaced_by_a_directory_is_rejected(env: Env) -> None:
    package = env.make_package()
    (package / "model.calbin").unlink()
    (package / "model.calbin").mkdir()
    _rejected(env, package, PackageCheck.MISSING_FILE, "model.calbin", "a directory is there")


@pytest.mark.req("R11.2")
def test_truncated_file_is_rejected(env: Env) -> None:
    package = env.make_package()
    path = package / "weights" / "shard-0.bin"
    path.write_bytes(path.read_bytes()[:-1])
    _rejected(env, package, PackageCheck.SIZE_MISMATCH, "weights/shard-0.bin",
              "manifest says 4096 bytes, file has 4095")


@pytest.mark.req("R11.2")
def test_extended_file_is_rejected(env: Env) -> None:
    package = env.make_package()
    with (package / "model.calbin").open("ab") as stream:
        stream.write(b"!")
    _rejected(env, package, PackageCheck.SIZE_MISMATCH, "model.calbin")


# --------------------------------------------------------------------------------------------
# step 2: the manifest's own content, even when a trusted key signed it
# --------------------------------------------------------------------------------------------


def _signed_manifest(env: Env, package: Path) -> dict[str, object]:
    return json.loads((package / MANIFEST_NAME).read_bytes())  # type: ignore[no-any-return]


@pytest.mark.req("R11.1", "R11.2")
@pytest.mark.parametrize(
    ("bad_path", "fragment"),
    [
        ("/etc/passwd", "absolute path"),
        ("C:/Windows/system.ini", "absolute path"),
        ("../outside.bin", "'..' component"),
        ("weights/../../outside.bin", "'..' component"),
        ("..", "'..' component"),
        ("./model.calbin", "'.' component"),
        ("weights//shard-0.bin", "empty or '.' component"),
        ("weights/", "empty or '.' component"),
        ("weights\\shard-0.bin", "backslash"),
        ("nul\x00byte", "control character"),
        ("", "not a non-empty string"),
    ],
)
def test_manifest_pointing_outside_the_package_is_rejected(
    env: Env, bad_path: str, fragment: str
) -> None:
    package = env.make_package()
    manifest = _signed_manifest(env, package)
    files = manifest["files"]
    assert isinstance(files, dict)
    files[bad_path] = {"sha256": "0" * 64, "size": 1}
    env.resign_with_manifest(package, manifest)
    _rejected(env, package, PackageCheck.UNSAFE_PATH, "manifest.json", fragment)


@pytest.mark.parametrize("reserved", [MANIFEST_NAME, SIGNATURE_NAME])
def test_manifest_listing_a_reserved_name_is_rejected(env: Env, reserved: str) -> None:
    package = env.make_package()
    manifest = _signed_manifest(env, package)
    manifest["files"][reserved] = {"sha256": "0" * 64, "size": 1}  # type: ignore[index]
    env.resign_with_manifest(package, manifest)
    _rejected(env, package, PackageCheck.UNSAFE_PATH, "reserved name")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda m: m.pop("format"), "'format' must be a non-empty string"),
        (lambda m: m.update(format=""), "'format' must be a non-empty string"),
        (lambda m: m.update(files={}), "'files' must be a non-empty object"),
        (lambda m: m.update(files=["model.calbin"]), "'files' must be a non-empty object"),
        (lambda m: m["files"].update({"model.calbin": "abc"}), "must be an object"),
        (lambda m: m["files"]["model.calbin"].update(sha256="ABC"), "64 lowercase hex"),
        (lambda m: m["files"]["model.calbin"].pop("sha256"), "64 lowercase hex"),
        (lambda m: m["files"]["model.calbin"].update(size=-1), "non-negative integer"),
        (lambda m: m["files"]["model.calbin"].update(size=True), "non-negative integer"),
        (lambda m: m["files"]["model.calbin"].update(size="10"), "non-negative integer"),
    ],
    ids=["no-format", "empty-format", "no-files", "files-list", "entry-string", "upper-hex",
         "no-sha", "negative-size", "bool-size", "string-size"],
)
def test_malformed_signed_manifest_is_rejected(env: Env, mutate: object, fragment: str) -> None:
    package = env.make_package()
    manifest = _signed_manifest(env, package)
    mutate(manifest)  # type: ignore[operator]
    env.resign_with_manifest(package, manifest)
    _rejected(env, package, PackageCheck.MALFORMED_MANIFEST, "manifest.json", fragment)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"not json", "invalid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"format": "a", "format": "b", "files": {}}', "duplicate key 'format'"),
        (b'{"format": "a", "files": {"x": {"sha256": "0", "size": NaN}}}', "NaN"),
        (b"\xff\xfe", "invalid JSON"),
    ],
    ids=["garbage", "array", "duplicate-key", "nan", "not-utf8"],
)
def test_signed_garbage_manifest_is_rejected(env: Env, raw: bytes, fragment: str) -> None:
    package = env.make_package()
    (package / MANIFEST_NAME).write_bytes(raw)
    sign_package(package, env.signer.private_key_path)
    _rejected(env, package, PackageCheck.MALFORMED_MANIFEST, "manifest.json", fragment)


# --------------------------------------------------------------------------------------------
# size limits
# --------------------------------------------------------------------------------------------


@pytest.mark.req("R11.2")
def test_oversize_file_is_rejected_naming_it(env: Env) -> None:
    package = env.make_package()
    _rejected(env, package, PackageCheck.OVERSIZE, "weights/shard-0.bin",
              "exceeds the limit of 2000 bytes", max_file_bytes=2000)


def test_file_exactly_at_the_limit_is_accepted(env: Env) -> None:
    package = env.make_package()
    largest = max(len(data) for data in PACKAGE_FILES.values())
    verify_package(package, [env.root], env.keys, max_file_bytes=largest)


@pytest.mark.req("R11.2")
def test_oversize_file_is_rejected_before_hashing(env: Env) -> None:
    """A signed manifest listing a huge file is refused from its listed size alone."""
    package = env.make_package()
    manifest = _signed_manifest(env, package)
    manifest["files"]["model.calbin"]["size"] = 10**15  # type: ignore[index]
    env.resign_with_manifest(package, manifest)
    _rejected(env, package, PackageCheck.OVERSIZE, "model.calbin", "listed size")


# --------------------------------------------------------------------------------------------
# rollback (R11.11)
# --------------------------------------------------------------------------------------------


def _snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    snapshot: dict[str, tuple[int, int, int]] = {}
    for path in sorted(directory.rglob("*")):
        info = path.stat()
        snapshot[path.relative_to(directory).as_posix()] = (
            info.st_size, info.st_mtime_ns, info.st_mode)
    return snapshot


@pytest.mark.req("R11.11")
def test_previously_verified_package_stays_verifiable(env: Env) -> None:
    """Step 11: the old signed artifact is retained and still verifies for a rollback load."""
    old = env.make_package("qwen3-v1")
    before = _snapshot(old)
    first = verify_package(old, [env.root], env.keys)

    new = env.make_package("qwen3-v2", {**PACKAGE_FILES, "model.calbin": b"CALBIN v2"})
    replacement = verify_package(new, [env.root], env.keys)
    assert replacement.manifest_sha256 != first.manifest_sha256

    rollback = verify_package(old, [env.root], env.keys)
    assert rollback.manifest_sha256 == first.manifest_sha256
    assert rollback.files == first.files
    assert _snapshot(old) == before, "verification must never write into a package"


@pytest.mark.req("R11.11")
def test_rollback_survives_a_key_rotation(env: Env) -> None:
    """Adding a new release key to the trusted set keeps old packages verifiable."""
    old = env.make_package("old")
    old_sha = verify_package(old, [env.root], env.keys).manifest_sha256
    rotated = generate_keypair(env.base / "private", "rotated")
    shutil.copy(rotated.public_key_path, env.keys / rotated.public_key_path.name)
    new = env.make_package("new", key=rotated)
    assert verify_package(new, [env.root], env.keys).key_id == rotated.key_id
    assert verify_package(old, [env.root], env.keys).manifest_sha256 == old_sha


def test_build_output_is_reproducible(env: Env) -> None:
    first = env.make_package("a")
    second = build_package(env.base / "src" / "a", env.root / "b", EXTRA_FIELDS)
    assert (first / MANIFEST_NAME).read_bytes() == (second / MANIFEST_NAME).read_bytes()
