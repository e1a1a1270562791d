"""Verifying signed packages: §11 load step 1 (trusted path) and step 2 (signature + all hashes).

Why this exists: §11 loads a model by running its calbin on the device. Anything that reaches
``CreateCalbin`` (step 7) must first be proved to come from a trusted place (step 1, R11.1) and to
be exactly what a trusted key signed (step 2, R11.2); every check here runs before any device
call, and a failure raises :class:`~calculet.errors.PackageError` naming the package and the file
(``context["reason"]`` is a :class:`~calculet.packages.checks.PackageCheck`).

A package is a directory (or an uncompressed ``.tar`` of one, extracted safely into a private
temporary directory by :mod:`calculet.packages.archive`); :mod:`calculet.packages.build` says
what it holds. The manifest's other fields (profiles, capabilities, ...) belong to the step-3
manifest model (:mod:`calculet.packages.manifest`) and are passed through untouched.

Step 11 ("retain old signed artifact for rollback", R11.11) relies on verification being a pure
read: verifying never writes into a package, so a package verified once verifies again later.
:func:`inspect_package` reads a manifest for people, without verifying; it is never a way in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from cryptography.exceptions import InvalidSignature

from calculet.packages.archive import extract_archive, read_archive_manifest
from calculet.packages.checks import (
    DEFAULT_MAX_FILE_BYTES,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    RESERVED_NAMES,
    SIGNATURE_BYTES,
    SIGNATURE_NAME,
    PackageCheck,
    fail,
)
from calculet.packages.files import CHUNK, READ_NOFOLLOW, read_limited, scan_tree, unsafe_relative_path
from calculet.packages.keys import TrustedKey, load_trusted_keys

__all__ = [
    "PackageFile",
    "PackageInfo",
    "VerifiedPackage",
    "inspect_package",
    "verify_package",
]

_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class PackageFile:
    """One verified file: where it is and what the signed manifest says it is."""

    relative_path: str
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class VerifiedPackage:
    """A package that passed §11 steps 1–2.

    ``manifest`` is a read-only view (nested mappings are read-only, lists are tuples) so no
    one can change what was verified; :meth:`manifest_dict` returns a fresh, mutable copy for
    the step-3 manifest model. ``manifest_sha256`` identifies the package (it is what the
    signature covers, and the manifest covers every file), e.g. as ``calbin_sha256``'s sibling
    in the model generation (§10).

    ``path`` is the directory holding the files. For an archive it is a private temporary
    directory owned by this object (``extracted`` is true): call :meth:`cleanup` (or use the
    object as a context manager) when the generation that uses it is destroyed; ``source`` is
    the archive itself, the artifact to retain for rollback (§11 step 11).
    """

    path: Path
    source: Path
    manifest: Mapping[str, Any]
    manifest_bytes: bytes = field(repr=False)
    manifest_sha256: str
    key_id: str
    key_name: str
    files: tuple[PackageFile, ...]
    extracted: bool = False

    @property
    def format(self) -> str:
        """The manifest's ``format`` field (e.g. ``calbin-package/v1``)."""
        return str(self.manifest["format"])

    @property
    def total_bytes(self) -> int:
        """Sum of the listed files' sizes."""
        return sum(f.size for f in self.files)

    def manifest_dict(self) -> dict[str, Any]:
        """A fresh mutable copy of the verified manifest (parsed from the signed bytes)."""
        return json.loads(self.manifest_bytes)  # type: ignore[no-any-return]

    def file(self, relative_path: str) -> PackageFile:
        """The verified file listed as ``relative_path``; ``KeyError`` if not listed."""
        for entry in self.files:
            if entry.relative_path == relative_path:
                return entry
        raise KeyError(relative_path)

    def cleanup(self) -> None:
        """Remove the extraction directory of an archive; a no-op for a package directory."""
        if self.extracted:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> VerifiedPackage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@dataclass(frozen=True, slots=True)
class PackageInfo:
    """What :func:`inspect_package` can tell **without** verifying a package.

    Nothing here is trusted: it is for people looking at a package, never for loading one.
    ``signed_by`` is the id of the trusted key whose signature matches the manifest bytes (only
    when a keys directory was given); the listed files are not hashed.
    """

    path: Path
    is_archive: bool
    manifest: Mapping[str, Any]
    manifest_sha256: str
    signature_present: bool
    signed_by: str | None

    def manifest_dict(self) -> dict[str, Any]:
        """A fresh mutable copy of the (unverified) manifest, e.g. to print as JSON."""
        return _thaw(self.manifest)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------
# verification (§11 steps 1-2)
# --------------------------------------------------------------------------------------------


def verify_package(
    pkg_path: str | Path,
    trusted_roots: Iterable[str | Path],
    trusted_keys_dir: str | Path | None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> VerifiedPackage:
    """Run §11 steps 1–2 on a package directory or ``.tar`` archive.

    Step 1 (R11.1): the path, after following every symlink, lies under a trusted root; the
    package holds only regular files and directories (no symlink, so nothing inside can point
    outside). Step 2 (R11.2): ``manifest.sig`` is a valid Ed25519 signature of the exact bytes
    of ``manifest.json`` by a trusted key; then every listed path is a plain relative path
    inside the package, every listed file exists with the listed size (at most
    ``max_file_bytes``) and SHA-256, and no unlisted file is present.

    The signature is checked before the manifest is parsed, so untrusted JSON is never
    interpreted. Raises :class:`PackageError` (``context["reason"]`` is a
    :class:`PackageCheck`) on the first failed check; nothing is written into the package.
    """
    keys = load_trusted_keys(trusted_keys_dir)
    given = Path(pkg_path)
    resolved = _trusted_path(given, [Path(root).resolve() for root in trusted_roots])
    if not resolved.exists():
        fail(PackageCheck.NOT_FOUND, given, "does not exist")
    if resolved.is_dir():
        return _verify_directory(resolved, resolved, keys, max_file_bytes, extracted=False)
    if not resolved.is_file():
        fail(PackageCheck.NOT_A_PACKAGE, given, "neither a directory nor a .tar archive")
    extract_dir = Path(tempfile.mkdtemp(prefix="calculet-pkg-")).resolve()
    try:
        extract_archive(resolved, extract_dir, max_file_bytes)
        return _verify_directory(extract_dir, resolved, keys, max_file_bytes, extracted=True)
    except BaseException:
        shutil.rmtree(extract_dir, ignore_errors=True)
        raise


def _trusted_path(given: Path, roots: list[Path]) -> Path:
    """Step 1: ``given`` with every symlink followed, if that lies under a trusted root."""
    if not roots:
        fail(PackageCheck.UNTRUSTED_PATH, given, "no trusted roots configured (§11 step 1)")
    try:
        resolved = given.resolve()
    except (OSError, RuntimeError) as exc:
        fail(PackageCheck.NOT_FOUND, given, f"cannot resolve the path: {exc}")
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        via = f" (it resolves to {resolved})" if resolved != given.absolute() else ""
        fail(
            PackageCheck.UNTRUSTED_PATH,
            given,
            f"path is outside the trusted roots [{shown}]{via} (§11 step 1)",
        )
    return resolved


def _verify_directory(
    pkg: Path,
    source: Path,
    keys: tuple[TrustedKey, ...],
    max_file_bytes: int,
    *,
    extracted: bool,
) -> VerifiedPackage:
    where = source
    # Step 1, continued: the tree holds only regular files and directories.
    present = {rel: path for rel, path in scan_tree(pkg, label=where)}
    # Step 2: signature over the exact manifest bytes, before anything is parsed.
    raw_manifest, signer = _signed_manifest(present, where, keys)
    manifest = _parse_manifest(raw_manifest, where)
    listed = _listed_files(manifest, where, max_file_bytes)
    _check_listing(present, listed, pkg, where)
    files = _hashed_files(present, listed, pkg, where, max_file_bytes)
    return VerifiedPackage(
        path=pkg,
        source=source,
        manifest=_freeze(manifest),
        manifest_bytes=raw_manifest,
        manifest_sha256=hashlib.sha256(raw_manifest).hexdigest(),
        key_id=signer.key_id,
        key_name=signer.name,
        files=files,
        extracted=extracted,
    )


def _signed_manifest(
    present: Mapping[str, Path], where: Path, keys: tuple[TrustedKey, ...]
) -> tuple[bytes, TrustedKey]:
    """The raw manifest bytes and the trusted key whose signature covers them (step 2)."""
    if SIGNATURE_NAME not in present:
        fail(PackageCheck.MISSING_SIGNATURE, where, "missing; the package is not signed",
             file=SIGNATURE_NAME)
    if MANIFEST_NAME not in present:
        fail(PackageCheck.MISSING_MANIFEST, where, "missing", file=MANIFEST_NAME)
    signature = read_limited(present[SIGNATURE_NAME], SIGNATURE_BYTES + 1, where, SIGNATURE_NAME)
    if len(signature) != SIGNATURE_BYTES:
        fail(
            PackageCheck.MALFORMED_SIGNATURE,
            where,
            f"truncated or malformed signature: {len(signature)}"
            f"{'+' if len(signature) > SIGNATURE_BYTES else ''} bytes, expected exactly "
            f"{SIGNATURE_BYTES} (raw Ed25519)",
            file=SIGNATURE_NAME,
        )
    raw_manifest = read_limited(present[MANIFEST_NAME], MAX_MANIFEST_BYTES + 1, where,
                                MANIFEST_NAME)
    _check_manifest_size(raw_manifest, where)
    signer = _find_signer(raw_manifest, signature, keys)
    if signer is None:
        key_dirs = sorted({str(k.path.parent) for k in keys})
        fail(
            PackageCheck.BAD_SIGNATURE,
            where,
            f"signature does not match {MANIFEST_NAME} under any of the {len(keys)} trusted "
            f"key(s) in {', '.join(key_dirs)}: {MANIFEST_NAME} or {SIGNATURE_NAME} was "
            "modified, or the package was signed by an untrusted key",
            file=SIGNATURE_NAME,
        )
    return raw_manifest, signer


def _check_manifest_size(raw: bytes, where: Path) -> None:
    if len(raw) > MAX_MANIFEST_BYTES:
        fail(PackageCheck.OVERSIZE, where, f"larger than {MAX_MANIFEST_BYTES} bytes",
             file=MANIFEST_NAME)


def _check_listing(
    present: Mapping[str, Path], listed: Mapping[str, tuple[int, str]], pkg: Path, where: Path
) -> None:
    """The package holds exactly the listed files: none unlisted, none missing."""
    unlisted = sorted(set(present) - set(listed) - RESERVED_NAMES)
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        fail(PackageCheck.UNLISTED_FILE, where,
             f"file is not listed in the signed manifest{more}", file=unlisted[0])
    for rel in sorted(listed):
        if rel not in present:
            kind = "a directory is there instead" if (pkg / rel).is_dir() else "not found"
            fail(PackageCheck.MISSING_FILE, where,
                 f"listed in the manifest but {kind}", file=rel)


def _hashed_files(
    present: Mapping[str, Path],
    listed: Mapping[str, tuple[int, str]],
    pkg: Path,
    where: Path,
    max_file_bytes: int,
) -> tuple[PackageFile, ...]:
    """Every listed file, once its size and SHA-256 match the signed manifest."""
    files: list[PackageFile] = []
    for rel in sorted(listed):
        expected_size, expected_sha = listed[rel]
        path = present[rel]
        if not path.resolve().is_relative_to(pkg):
            fail(PackageCheck.UNSAFE_PATH, where, "resolves outside the package", file=rel)
        digest = _hash_checked(path, expected_size, max_file_bytes, where, rel)
        if digest != expected_sha:
            fail(
                PackageCheck.HASH_MISMATCH,
                where,
                f"sha256 mismatch: manifest says {expected_sha}, file has {digest}",
                file=rel,
            )
        files.append(PackageFile(rel, path, expected_size, expected_sha))
    return tuple(files)


def _find_signer(
    message: bytes, signature: bytes, keys: tuple[TrustedKey, ...]
) -> TrustedKey | None:
    for key in keys:
        try:
            key.public_key.verify(signature, message)
        except InvalidSignature:
            continue
        return key
    return None


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse_manifest(raw: bytes, where: Path) -> dict[str, Any]:
    """Parse the (already signature-checked) manifest and check the generic fields.

    Duplicate keys are rejected: with them, two readers could disagree about what was signed.
    """
    try:
        data = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        fail(PackageCheck.MALFORMED_MANIFEST, where, f"invalid JSON: {exc}", file=MANIFEST_NAME)
    if not isinstance(data, dict):
        fail(PackageCheck.MALFORMED_MANIFEST, where, "must be a JSON object",
             file=MANIFEST_NAME)
    fmt = data.get("format")
    if not isinstance(fmt, str) or not fmt:
        fail(PackageCheck.MALFORMED_MANIFEST, where,
             "'format' must be a non-empty string", file=MANIFEST_NAME)
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        fail(PackageCheck.MALFORMED_MANIFEST, where,
             "'files' must be a non-empty object {path: {sha256, size}}", file=MANIFEST_NAME)
    return data


def _listed_files(
    manifest: Mapping[str, Any], where: Path, max_file_bytes: int
) -> dict[str, tuple[int, str]]:
    listed: dict[str, tuple[int, str]] = {}
    for rel, entry in manifest["files"].items():
        problem = unsafe_relative_path(rel)
        if problem is not None:
            fail(PackageCheck.UNSAFE_PATH, where, f"manifest lists {rel!r}: {problem}",
                 file=MANIFEST_NAME)
        if rel in RESERVED_NAMES:
            fail(PackageCheck.UNSAFE_PATH, where,
                 f"manifest lists the reserved name {rel!r}", file=MANIFEST_NAME)
        if not isinstance(entry, dict):
            fail(PackageCheck.MALFORMED_MANIFEST, where,
                 f"entry of {rel!r} must be an object {{sha256, size}}", file=MANIFEST_NAME)
        sha = entry.get("sha256")
        size = entry.get("size")
        if not isinstance(sha, str) or not _SHA256_RE.match(sha):
            fail(PackageCheck.MALFORMED_MANIFEST, where,
                 f"sha256 of {rel!r} must be 64 lowercase hex digits", file=MANIFEST_NAME)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            fail(PackageCheck.MALFORMED_MANIFEST, where,
                 f"size of {rel!r} must be a non-negative integer", file=MANIFEST_NAME)
        if size > max_file_bytes:
            fail(PackageCheck.OVERSIZE, where,
                 f"listed size {size} exceeds the limit of {max_file_bytes} bytes", file=rel)
        listed[rel] = (size, sha)
    return listed


def _hash_checked(path: Path, expected_size: int, max_file_bytes: int, where: Path,
                  rel: str) -> str:
    """SHA-256 of a listed file, read through one descriptor opened without following links.

    Size is checked on the open descriptor before hashing (cheap rejection of oversize or
    truncated files) and again while reading, so a file that grows after the check is caught.
    """
    try:
        descriptor = os.open(path, READ_NOFOLLOW)
    except OSError as exc:
        fail(PackageCheck.MISSING_FILE, where, f"cannot open: {exc.strerror}", file=rel)
    with os.fdopen(descriptor, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            fail(PackageCheck.SPECIAL_FILE, where, "not a regular file", file=rel)
        if info.st_size > max_file_bytes:
            fail(PackageCheck.OVERSIZE, where,
                 f"{info.st_size} bytes exceeds the limit of {max_file_bytes} bytes", file=rel)
        if info.st_size != expected_size:
            fail(PackageCheck.SIZE_MISMATCH, where,
                 f"size mismatch: manifest says {expected_size} bytes, file has "
                 f"{info.st_size}", file=rel)
        digest = hashlib.sha256()
        read = 0
        while chunk := stream.read(CHUNK):
            read += len(chunk)
            if read > expected_size:
                fail(PackageCheck.SIZE_MISMATCH, where,
                     f"file grew beyond the listed {expected_size} bytes while being read",
                     file=rel)
            digest.update(chunk)
        if read != expected_size:
            fail(PackageCheck.SIZE_MISMATCH, where,
                 f"size mismatch: manifest says {expected_size} bytes, read {read}", file=rel)
    return digest.hexdigest()


def _freeze(value: Any) -> Any:
    """A read-only deep view of parsed JSON: mappings become read-only, lists tuples."""
    if isinstance(value, dict):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """The inverse of :func:`_freeze`: plain dicts and lists again."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# inspection (unverified, for people)
# --------------------------------------------------------------------------------------------


def inspect_package(
    pkg_path: str | Path, trusted_keys_dir: str | Path | None = None
) -> PackageInfo:
    """Read a package's manifest for display, **without** verifying files or trust.

    With ``trusted_keys_dir``, also report which trusted key (if any) signed the manifest.
    Never use the result to load a model; :func:`verify_package` is the only way in.
    """
    path = Path(pkg_path)
    if not path.exists():
        fail(PackageCheck.NOT_FOUND, path, "does not exist")
    is_archive = not path.is_dir()
    raw, signature = read_archive_manifest(path) if is_archive else _read_directory_manifest(path)
    _check_manifest_size(raw, path)
    manifest = _parse_manifest(raw, path)
    signed_by: str | None = None
    if trusted_keys_dir is not None and signature is not None and len(signature) == SIGNATURE_BYTES:
        signer = _find_signer(raw, signature, load_trusted_keys(trusted_keys_dir))
        signed_by = signer.key_id if signer is not None else None
    return PackageInfo(
        path=path,
        is_archive=is_archive,
        manifest=_freeze(manifest),
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        signature_present=signature is not None,
        signed_by=signed_by,
    )


def _read_directory_manifest(path: Path) -> tuple[bytes, bytes | None]:
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        fail(PackageCheck.MISSING_MANIFEST, path, "missing", file=MANIFEST_NAME)
    raw = read_limited(manifest_path, MAX_MANIFEST_BYTES + 1, path, MANIFEST_NAME)
    signature_path = path / SIGNATURE_NAME
    signature = (
        read_limited(signature_path, SIGNATURE_BYTES + 1, path, SIGNATURE_NAME)
        if signature_path.is_file()
        else None
    )
    return raw, signature
