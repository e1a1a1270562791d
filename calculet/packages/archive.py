"""Packages as uncompressed ``.tar`` archives: packing, safe extraction, reading the manifest.

Why this exists: a package may travel as one file. An archive is only ever *extracted* into a
private temporary directory, member by member, after every member has been checked (§11 step 1,
R11.1: nothing may land outside that directory, no link may point anywhere), and only then
verified like a directory. Compressed archives are refused: an uncompressed one cannot expand
beyond its own size on disk. Packing is reproducible (fixed owners, modes and times), so the
same package always gives the same archive bytes.
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path

from calculet.packages.checks import (
    MANIFEST_NAME,
    MAX_ARCHIVE_MEMBERS,
    MAX_MANIFEST_BYTES,
    RESERVED_NAMES,
    SIGNATURE_BYTES,
    PackageCheck,
    fail,
)
from calculet.packages.files import CHUNK, create_new, scan_tree, unsafe_relative_path

__all__ = ["extract_archive", "pack_archive", "read_archive_manifest"]


def pack_archive(pkg_dir: str | Path, archive_path: str | Path) -> Path:
    """Write a package directory as a reproducible, uncompressed ``.tar`` (members at the root).

    Only regular files and directories go in, with fixed owners, modes and times, so the same
    package always gives the same archive bytes.
    """
    pkg = Path(pkg_dir).resolve()
    archive = Path(archive_path).absolute()
    if not pkg.is_dir():
        fail(PackageCheck.NOT_A_PACKAGE, pkg, "not a directory")
    if archive.resolve().is_relative_to(pkg):
        fail(PackageCheck.BUILD, pkg, f"archive {archive} must not be inside the package")
    if archive.exists():
        fail(PackageCheck.BUILD, pkg, f"archive {archive} already exists")
    entries = list(scan_tree(pkg, label=pkg))
    try:
        with tarfile.open(archive, mode="x", format=tarfile.PAX_FORMAT) as tar:
            for directory in _all_directories(rel for rel, _ in entries):
                info = tarfile.TarInfo(directory)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(_normalise(info))
            for rel, path in entries:
                info = tarfile.TarInfo(rel)
                info.size = path.stat().st_size
                info.mode = 0o644
                with path.open("rb") as stream:
                    tar.addfile(_normalise(info), stream)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return archive


def _all_directories(files: Iterable[str]) -> list[str]:
    """Every directory (and each of its parents) that holds one of ``files``, sorted."""
    directories = sorted({str(Path(rel).parent) for rel in files} - {"."})
    all_dirs: set[str] = set()
    for directory in directories:
        parts = directory.split("/")
        for depth in range(1, len(parts) + 1):
            all_dirs.add("/".join(parts[:depth]))
    return sorted(all_dirs)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _open_tar(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        fail(PackageCheck.NOT_A_PACKAGE, archive,
             f"not a directory nor an uncompressed .tar archive ({exc})")


def extract_archive(archive: Path, dest: Path, max_file_bytes: int) -> None:
    """Extract an uncompressed tar into the empty private directory ``dest``, safely.

    Every member is checked before anything is written: only regular files and directories,
    plain relative names (no absolute paths, no ``..``), no duplicates, each file within
    ``max_file_bytes``. Files are created exclusively, so nothing outside ``dest`` can be
    reached. Compressed archives are refused: an uncompressed one cannot expand beyond its
    own size on disk.
    """
    with _open_tar(archive) as tar:
        try:
            members = _checked_members(tar, archive, max_file_bytes)
        except tarfile.TarError as exc:
            fail(PackageCheck.UNSAFE_ARCHIVE, archive, f"corrupt archive: {exc}")
        try:
            _write_members(tar, members, archive, dest)
        except (OSError, tarfile.TarError) as exc:
            fail(PackageCheck.UNSAFE_ARCHIVE, archive, f"cannot extract: {exc}")


def _checked_members(
    tar: tarfile.TarFile, archive: Path, max_file_bytes: int
) -> list[tuple[str, tarfile.TarInfo]]:
    """Every member with its normalised name, or the first reason the archive is unsafe."""
    members: list[tuple[str, tarfile.TarInfo]] = []
    names: set[str] = set()
    for index, member in enumerate(tar):
        if index >= MAX_ARCHIVE_MEMBERS:
            fail(PackageCheck.UNSAFE_ARCHIVE, archive, f"more than {MAX_ARCHIVE_MEMBERS} members")
        if member.name in (".", "./"):
            continue
        name = _member_name(member, archive)
        if name in names:
            fail(PackageCheck.UNSAFE_ARCHIVE, archive, "archive member appears twice", file=name)
        names.add(name)
        if member.isfile() and member.size > max_file_bytes:
            fail(PackageCheck.OVERSIZE, archive,
                 f"{member.size} bytes exceeds the limit of {max_file_bytes} bytes", file=name)
        members.append((name, member))
    return members


def _member_name(member: tarfile.TarInfo, archive: Path) -> str:
    """The member's plain relative name, once it is known to be a file or directory."""
    name = member.name.removeprefix("./")
    if member.isdir():
        name = name.rstrip("/")
    problem = unsafe_relative_path(name)
    if problem is not None:
        fail(PackageCheck.UNSAFE_ARCHIVE, archive,
             f"archive member {member.name!r}: {problem}", file=member.name)
    if member.issym() or member.islnk():
        fail(PackageCheck.UNSAFE_ARCHIVE, archive,
             f"archive member is a link to {member.linkname!r}; packages hold "
             "regular files only", file=name)
    if not (member.isfile() or member.isdir()):
        fail(PackageCheck.UNSAFE_ARCHIVE, archive,
             "archive member is not a regular file or directory", file=name)
    return name


def _write_members(
    tar: tarfile.TarFile, members: list[tuple[str, tarfile.TarInfo]], archive: Path, dest: Path
) -> None:
    for name, member in members:
        target = dest / name
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        stream = tar.extractfile(member)
        if stream is None:
            fail(PackageCheck.UNSAFE_ARCHIVE, archive, "unreadable member", file=name)
        with stream, create_new(target, 0o644) as out:
            shutil.copyfileobj(stream, out, CHUNK)


def read_archive_manifest(archive: Path) -> tuple[bytes, bytes | None]:
    """The raw ``manifest.json`` of an archive and its ``manifest.sig`` if present (unverified).

    Each is read up to one byte past its limit, so the caller can tell an oversize one.
    """
    raw: bytes | None = None
    signature: bytes | None = None
    with _open_tar(archive) as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not member.isfile() or name not in RESERVED_NAMES:
                continue
            limit = MAX_MANIFEST_BYTES + 1 if name == MANIFEST_NAME else SIGNATURE_BYTES + 1
            stream = tar.extractfile(member)
            data = stream.read(limit) if stream is not None else b""
            if name == MANIFEST_NAME:
                raw = data
            else:
                signature = data
    if raw is None:
        fail(PackageCheck.MISSING_MANIFEST, archive, "missing from the archive",
             file=MANIFEST_NAME)
    return raw, signature
