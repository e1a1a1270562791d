"""Packages shipped as ``.tar``: extracted safely into a private directory, then verified."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest
from tests.unit.packages.package_testkit import PACKAGE_FILES, Env

from calculet.packages import (
    PackageCheck,
    inspect_package,
    pack_archive,
    verify_package,
)
from calculet.errors import PackageError


def _archive(env: Env, name: str = "pkg") -> Path:
    package = env.make_package(name)
    return pack_archive(package, env.root / f"{name}.tar")


def _rejected(env: Env, archive: Path, reason: PackageCheck, *fragments: str,
              **kwargs: int) -> None:
    with pytest.raises(PackageError) as caught:
        verify_package(archive, [env.root], env.keys, **kwargs)
    assert caught.value.context["reason"] == reason.value, str(caught.value)
    for fragment in fragments:
        assert fragment in str(caught.value), f"{fragment!r} not in {caught.value}"


def _hostile_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@pytest.mark.req("R11.1", "R11.2")
def test_archive_verifies_into_a_private_directory_that_cleanup_removes(
    env: Env, private_tmp: Path
) -> None:
    archive = _archive(env)
    directory_manifest = verify_package(env.root / "pkg", [env.root], env.keys)
    with verify_package(archive, [env.root], env.keys) as verified:
        assert verified.extracted is True
        assert verified.source == archive.resolve()
        assert verified.path.parent == private_tmp
        assert (verified.path.stat().st_mode & 0o777) == 0o700
        assert verified.manifest_sha256 == directory_manifest.manifest_sha256
        assert verified.file("model.calbin").path.read_bytes() == PACKAGE_FILES["model.calbin"]
    assert not verified.path.exists()
    assert list(private_tmp.iterdir()) == []


def test_cleanup_of_a_directory_package_removes_nothing(env: Env) -> None:
    package = env.make_package()
    verify_package(package, [env.root], env.keys).cleanup()
    assert (package / "model.calbin").exists()


def test_pack_is_reproducible(env: Env) -> None:
    package = env.make_package()
    first = pack_archive(package, env.base / "one.tar")
    second = pack_archive(package, env.base / "two.tar")
    assert first.read_bytes() == second.read_bytes()
    with pytest.raises(PackageError, match="already exists"):
        pack_archive(package, first)
    with pytest.raises(PackageError, match="must not be inside the package"):
        pack_archive(package, package / "self.tar")


def test_tar_made_with_dot_prefix_is_accepted(env: Env) -> None:
    """``tar -C pkg -cf x.tar .`` writes ``./name`` members and a ``.`` directory."""
    package = env.make_package()
    archive = env.root / "dot.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(package, arcname=".")
    assert verify_package(archive, [env.root], env.keys).manifest_sha256


@pytest.mark.req("R11.1")
def test_archive_outside_the_trusted_roots_is_rejected(env: Env) -> None:
    archive = pack_archive(env.make_package(), env.base / "outside.tar")
    _rejected(env, archive, PackageCheck.UNTRUSTED_PATH, "outside the trusted roots")


@pytest.mark.req("R11.2")
def test_tampered_file_inside_an_archive_is_rejected_and_leaves_no_temp_dir(
    env: Env, private_tmp: Path
) -> None:
    archive = _archive(env)
    raw = bytearray(archive.read_bytes())
    marker = raw.find(PACKAGE_FILES["weights/shard-0.bin"][:64])
    assert marker > 0
    raw[marker + 10] ^= 0xFF
    archive.write_bytes(bytes(raw))
    _rejected(env, archive, PackageCheck.HASH_MISMATCH, "weights/shard-0.bin")
    assert list(private_tmp.iterdir()) == []


@pytest.mark.req("R11.1")
@pytest.mark.parametrize(
    ("member", "data", "fragment"),
    [
        (_info("../escape.bin"), b"x", "'..' component"),
        (_info("weights/../../escape.bin"), b"x", "'..' component"),
        (_info("/etc/cron.d/evil"), b"x", "absolute path"),
        (_info("link", tarfile.SYMTYPE, "/etc/passwd"), None, "is a link to '/etc/passwd'"),
        (_info("inside-link", tarfile.SYMTYPE, "model.calbin"), None, "is a link"),
        (_info("hard", tarfile.LNKTYPE, "model.calbin"), None, "is a link"),
        (_info("dev", tarfile.CHRTYPE), None, "not a regular file or directory"),
        (_info("fifo", tarfile.FIFOTYPE), None, "not a regular file or directory"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink-out", "symlink-in", "hardlink",
         "device", "fifo"],
)
def test_hostile_archive_member_is_rejected_before_extraction(
    env: Env, private_tmp: Path, member: tarfile.TarInfo, data: bytes | None, fragment: str
) -> None:
    archive = _hostile_tar(env.root / "hostile.tar", [(_info("manifest.json"), b"{}"),
                                                     (member, data)])
    _rejected(env, archive, PackageCheck.UNSAFE_ARCHIVE, fragment)
    assert list(private_tmp.iterdir()) == []
    assert not (env.root.parent / "escape.bin").exists()


def test_duplicate_archive_member_is_rejected(env: Env) -> None:
    archive = _hostile_tar(env.root / "dup.tar", [(_info("a.bin"), b"1"), (_info("a.bin"), b"2")])
    _rejected(env, archive, PackageCheck.UNSAFE_ARCHIVE, "appears twice")


def test_oversize_archive_member_is_rejected_before_extraction(env: Env) -> None:
    archive = _archive(env)
    _rejected(env, archive, PackageCheck.OVERSIZE, "weights/shard-0.bin", max_file_bytes=2000)


def test_compressed_archive_is_refused(env: Env) -> None:
    archive = _archive(env)
    compressed = env.root / "pkg.tar.gz"
    compressed.write_bytes(gzip.compress(archive.read_bytes()))
    _rejected(env, compressed, PackageCheck.NOT_A_PACKAGE, "uncompressed .tar")


def test_regular_file_that_is_not_an_archive_is_refused(env: Env) -> None:
    junk = env.root / "junk.bin"
    junk.write_bytes(b"definitely not a tar archive" * 50)
    _rejected(env, junk, PackageCheck.NOT_A_PACKAGE)


def test_inspect_reads_directory_and_archive_without_verifying(env: Env) -> None:
    archive = _archive(env)
    for target in (env.root / "pkg", archive):
        info = inspect_package(target, env.keys)
        assert info.is_archive is (target == archive)
        assert info.manifest["format"] == "calbin-package/v1"
        assert info.signature_present is True
        assert info.signed_by == env.signer.key_id
    unsigned = env.make_package("unsigned", sign=False)
    info = inspect_package(unsigned)
    assert info.signature_present is False
    assert info.signed_by is None
    other = env.make_package("other", key=env.other_signer)
    assert inspect_package(other, env.keys).signed_by is None
    with pytest.raises(PackageError, match="does not exist"):
        inspect_package(env.root / "absent")
