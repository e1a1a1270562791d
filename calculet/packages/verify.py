"""Signed model packages: §11 load step 1 (trusted path) and step 2 (signature + all hashes).

Why this exists: §11 loads a model by running its calbin on the device. Anything that reaches
``CreateCalbin`` (step 7) must first be proved to come from a trusted place (step 1, R11.1) and to
be exactly what a trusted key signed (step 2, R11.2); every check here runs before any device
call, and a failure raises :class:`~calculet.errors.PackageError` naming the package and the file.

A package is a directory (or an uncompressed ``.tar`` of one, extracted safely into a private
temporary directory) that holds:

* ``manifest.json`` — a JSON object with at least ``"format"`` (e.g. ``"calbin-package/v1"``)
  and ``"files": {relative_path: {"sha256": hex, "size": int}}``. The other fields (profiles,
  capabilities, ...) belong to the manifest model of step 3 and are passed through untouched;
* every file that ``files`` lists, and no other file;
* ``manifest.sig`` — the raw 64-byte Ed25519 signature of the exact bytes of ``manifest.json``
  (the same bytes ``openssl pkeyutl -sign -rawin`` produces, so vendor tooling can sign too).

Signing the manifest and hashing every file from it makes one signature cover the whole
package: change one byte anywhere and either the signature or a hash no longer matches.

Trusted public keys live in a directory: ``*.pem`` (SubjectPublicKeyInfo PEM) or ``*.pub`` /
``*.hex`` (the raw 32-byte key in hex). ``*.key.pem`` files are private keys and are ignored, so
a development key directory may hold its (development-only) private key next to the public one.

Step 11 ("retain old signed artifact for rollback", R11.11) relies on verification being a pure
read: verifying never writes into a package, so a package verified once verifies again later.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from calculet.errors import PackageError

__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "DEFAULT_FORMAT",
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_MANIFEST_BYTES",
    "SIGNATURE_BYTES",
    "PackageCheck",
    "PackageFile",
    "VerifiedPackage",
    "PackageInfo",
    "TrustedKey",
    "KeyPair",
    "build_package",
    "sign_package",
    "verify_package",
    "inspect_package",
    "pack_archive",
    "generate_keypair",
    "load_trusted_keys",
    "load_private_key",
    "key_id_of",
    "file_sha256",
    "manifest_bytes",
]

MANIFEST_NAME: Final = "manifest.json"
SIGNATURE_NAME: Final = "manifest.sig"
RESERVED_NAMES: Final = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
DEFAULT_FORMAT: Final = "calbin-package/v1"
DEFAULT_MAX_FILE_BYTES: Final = 32 * 1024**3
"""Per-file limit; the reference model's parameters are 16.938 GiB (§13.1)."""
MAX_MANIFEST_BYTES: Final = 16 * 1024**2
SIGNATURE_BYTES: Final = 64
MAX_ARCHIVE_MEMBERS: Final = 100_000
_CHUNK: Final = 1024 * 1024
_SHA256_RE: Final = re.compile(r"^[0-9a-f]{64}$")
_KEY_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PRIVATE_SUFFIX: Final = ".key.pem"
_PUBLIC_SUFFIX: Final = ".pub.pem"


class PackageCheck(enum.StrEnum):
    """Which check rejected a package; carried as ``PackageError.context["reason"]``.

    Callers (the model manager, metrics' ``reason`` label, tests) branch on this bounded set
    instead of parsing messages.
    """

    UNTRUSTED_PATH = "untrusted_path"
    NOT_FOUND = "not_found"
    NOT_A_PACKAGE = "not_a_package"
    SYMLINK = "symlink"
    SPECIAL_FILE = "special_file"
    UNSAFE_PATH = "unsafe_path"
    UNSAFE_ARCHIVE = "unsafe_archive"
    NO_TRUSTED_KEYS = "no_trusted_keys"
    BAD_KEY = "bad_key"
    MISSING_SIGNATURE = "missing_signature"
    MALFORMED_SIGNATURE = "malformed_signature"
    BAD_SIGNATURE = "bad_signature"
    MISSING_MANIFEST = "missing_manifest"
    MALFORMED_MANIFEST = "malformed_manifest"
    MISSING_FILE = "missing_file"
    UNLISTED_FILE = "unlisted_file"
    OVERSIZE = "oversize"
    SIZE_MISMATCH = "size_mismatch"
    HASH_MISMATCH = "hash_mismatch"
    BUILD = "build"


def _fail(
    reason: PackageCheck, where: Path | str, message: str, *, file: str | None = None
) -> NoReturn:
    """Raise the one error of this module; the message names the package and the file."""
    prefix = f"package {where}: " if str(where) else ""
    subject = f"{file}: " if file is not None else ""
    raise PackageError(
        f"{prefix}{subject}{message}",
        reason=reason.value,
        package=str(where),
        file=file,
    )


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """A public key allowed to sign packages, loaded from the trusted keys directory."""

    key_id: str
    name: str
    path: Path
    public_key: Ed25519PublicKey = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """Files written by :func:`generate_keypair`."""

    name: str
    key_id: str
    private_key_path: Path
    public_key_path: Path


# --------------------------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------------------------


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """A short, stable id of an Ed25519 public key: ``ed25519:`` + 16 hex of SHA-256(raw key)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def _is_public_key_file(name: str) -> bool:
    if name.endswith(_PRIVATE_SUFFIX):
        return False
    return name.endswith((".pem", ".pub", ".hex"))


def _key_name(file_name: str) -> str:
    for suffix in (_PUBLIC_SUFFIX, ".pem", ".pub", ".hex"):
        if file_name.endswith(suffix):
            return file_name[: -len(suffix)]
    return file_name


def _load_public_key(path: Path) -> Ed25519PublicKey:
    where = path.parent
    try:
        data = path.read_bytes()
    except OSError as exc:
        _fail(PackageCheck.BAD_KEY, where, f"cannot read key file: {exc}", file=path.name)
    if b"PRIVATE KEY" in data:
        _fail(
            PackageCheck.BAD_KEY,
            where,
            "is a private key; a trusted keys directory holds public keys only "
            f"(name private keys '*{_PRIVATE_SUFFIX}' to keep them out of trust)",
            file=path.name,
        )
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            _fail(PackageCheck.BAD_KEY, where, f"not a PEM public key: {exc}", file=path.name)
        if not isinstance(key, Ed25519PublicKey):
            _fail(
                PackageCheck.BAD_KEY,
                where,
                f"is a {type(key).__name__}, not an Ed25519 public key",
                file=path.name,
            )
        return key
    text = data.decode("ascii", errors="replace").strip()
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        _fail(
            PackageCheck.BAD_KEY,
            where,
            "neither a PEM public key nor a raw 32-byte Ed25519 key in hex (64 hex digits)",
            file=path.name,
        )
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))


def load_trusted_keys(keys_dir: str | Path | None) -> tuple[TrustedKey, ...]:
    """Load every public key of a trusted keys directory (§11 step 2), sorted by file name.

    An empty or missing directory is an error, not an empty trust set: a loader with no keys
    could only ever reject, and saying why at once is kinder.
    """
    if keys_dir is None:
        _fail(PackageCheck.NO_TRUSTED_KEYS, "", "no trusted keys directory configured")
    directory = Path(keys_dir)
    if not directory.is_dir():
        _fail(
            PackageCheck.NO_TRUSTED_KEYS,
            "",
            f"trusted keys directory {directory} does not exist or is not a directory",
        )
    keys: list[TrustedKey] = []
    seen: set[str] = set()
    for path in sorted(directory.iterdir()):
        if not path.is_file() or not _is_public_key_file(path.name):
            continue
        public_key = _load_public_key(path)
        key_id = key_id_of(public_key)
        if key_id in seen:
            continue
        seen.add(key_id)
        keys.append(TrustedKey(key_id, _key_name(path.name), path, public_key))
    if not keys:
        _fail(
            PackageCheck.NO_TRUSTED_KEYS,
            "",
            f"no public keys (*.pem, *.pub, *.hex) in trusted keys directory {directory}",
        )
    return tuple(keys)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 signing key: unencrypted PKCS#8 PEM, or the 32-byte seed in hex."""
    key_path = Path(path)
    try:
        data = key_path.read_bytes()
    except OSError as exc:
        _fail(PackageCheck.BAD_KEY, key_path.parent, f"cannot read private key: {exc}",
              file=key_path.name)
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            _fail(PackageCheck.BAD_KEY, key_path.parent,
                  f"not an unencrypted PEM private key: {exc}", file=key_path.name)
        if not isinstance(key, Ed25519PrivateKey):
            _fail(PackageCheck.BAD_KEY, key_path.parent,
                  f"is a {type(key).__name__}, not an Ed25519 private key", file=key_path.name)
        return key
    text = data.decode("ascii", errors="replace").strip()
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        _fail(PackageCheck.BAD_KEY, key_path.parent,
              "neither a PEM private key nor a 32-byte Ed25519 seed in hex", file=key_path.name)
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text))


def generate_keypair(directory: str | Path, name: str) -> KeyPair:
    """Write a new Ed25519 key pair ``<name>.key.pem`` (mode 0600) and ``<name>.pub.pem``.

    Never overwrites: replacing a signing key by accident would orphan every package it
    signed. The public file can be copied into a trusted keys directory as is.
    """
    if not _KEY_NAME_RE.match(name):
        _fail(PackageCheck.BAD_KEY, "", f"invalid key name {name!r} (letters, digits, . _ -)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    private_path = out / f"{name}{_PRIVATE_SUFFIX}"
    public_path = out / f"{name}{_PUBLIC_SUFFIX}"
    for existing in (private_path, public_path):
        if existing.exists() or existing.is_symlink():
            _fail(PackageCheck.BAD_KEY, out, "already exists; refusing to overwrite a key",
                  file=existing.name)
    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_new_file(private_path, private_pem, mode=0o600)
    _write_new_file(public_path, public_pem, mode=0o644)
    return KeyPair(name, key_id_of(private_key.public_key()), private_path, public_path)


# --------------------------------------------------------------------------------------------
# building and signing
# --------------------------------------------------------------------------------------------


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The canonical encoding written by :func:`build_package` (sorted keys, ASCII, LF).

    It matches ``CalbinManifest.to_json_bytes`` of the step-3 manifest model.

    Verification never re-encodes: the signature covers the exact bytes on disk. Canonical
    output only makes builds reproducible and diffs readable.
    """
    try:
        text = json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        _fail(PackageCheck.BUILD, "", f"manifest is not JSON-serializable: {exc}")
    return (text + "\n").encode("utf-8")


def build_package(
    src_dir: str | Path,
    out_dir: str | Path,
    extra_fields: Mapping[str, Any] | None = None,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Path:
    """Copy ``src_dir`` into a new package ``out_dir`` and write its ``manifest.json``.

    The manifest lists every file with its SHA-256 and size (hashed while copying, so the
    hash is of the bytes actually written) plus ``extra_fields`` (e.g. the step-3 fields the
    manifest model defines). ``format`` defaults to ``calbin-package/v1``. The package is not
    signed yet: :func:`sign_package` does that, usually with a key kept elsewhere.
    Returns the package directory.
    """
    src = Path(src_dir).resolve()
    out = Path(out_dir).absolute()
    if not src.is_dir():
        _fail(PackageCheck.BUILD, out, f"source {src} is not a directory")
    fields = dict(extra_fields or {})
    if "files" in fields:
        _fail(PackageCheck.BUILD, out, "extra_fields may not set 'files'; it is computed")
    fmt = fields.pop("format", DEFAULT_FORMAT)
    if not isinstance(fmt, str) or not fmt:
        _fail(PackageCheck.BUILD, out, f"'format' must be a non-empty string, got {fmt!r}")
    manifest_bytes({**fields, "format": fmt, "files": {}})  # fail before copying gigabytes
    out_resolved = out.resolve()
    if out_resolved == src or out_resolved.is_relative_to(src) or src.is_relative_to(out_resolved):
        _fail(PackageCheck.BUILD, out, f"output must not overlap the source {src}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        _fail(PackageCheck.BUILD, out, "output exists and is not an empty directory")

    regular = list(_scan_tree(src, label=src))
    if not regular:
        _fail(PackageCheck.BUILD, out, f"source {src} holds no files")
    for rel, _ in regular:
        problem = _unsafe_relative_path(rel)
        if problem is not None:
            _fail(PackageCheck.BUILD, out, f"file name cannot go into a manifest: {problem}",
                  file=rel)
        if rel in RESERVED_NAMES:
            _fail(PackageCheck.BUILD, out, f"the source may not contain {rel}; it is written "
                  "by build/sign", file=rel)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        files: dict[str, dict[str, Any]] = {}
        for rel, path in regular:
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = _copy_and_hash(path, target, max_file_bytes, out, rel)
            files[rel] = {"sha256": digest, "size": size}
        manifest = {**fields, "format": fmt, "files": files}
        _write_new_file(out / MANIFEST_NAME, manifest_bytes(manifest), mode=0o644)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise
    return out


def sign_package(pkg_dir: str | Path, private_key_path: str | Path) -> Path:
    """Sign the exact bytes of ``manifest.json`` and write ``manifest.sig`` (§11 step 2).

    The signature is the raw 64-byte Ed25519 signature. An existing signature is replaced
    atomically (a package can be re-signed by a new key). Returns the signature's path.
    """
    pkg = Path(pkg_dir)
    manifest_path = pkg / MANIFEST_NAME
    if not manifest_path.is_file() or manifest_path.is_symlink():
        _fail(PackageCheck.MISSING_MANIFEST, pkg, "no manifest.json to sign", file=MANIFEST_NAME)
    private_key = load_private_key(private_key_path)
    signature = private_key.sign(manifest_path.read_bytes())
    signature_path = pkg / SIGNATURE_NAME
    handle, temp_name = tempfile.mkstemp(prefix=".manifest.sig.", dir=pkg)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(signature)
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, signature_path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return signature_path


def pack_archive(pkg_dir: str | Path, archive_path: str | Path) -> Path:
    """Write a package directory as a reproducible, uncompressed ``.tar`` (members at the root).

    Only regular files and directories go in, with fixed owners, modes and times, so the same
    package always gives the same archive bytes.
    """
    pkg = Path(pkg_dir).resolve()
    archive = Path(archive_path).absolute()
    if not pkg.is_dir():
        _fail(PackageCheck.NOT_A_PACKAGE, pkg, "not a directory")
    if archive.resolve().is_relative_to(pkg):
        _fail(PackageCheck.BUILD, pkg, f"archive {archive} must not be inside the package")
    if archive.exists():
        _fail(PackageCheck.BUILD, pkg, f"archive {archive} already exists")
    entries = list(_scan_tree(pkg, label=pkg))
    directories = sorted({str(Path(rel).parent) for rel, _ in entries} - {"."})
    all_dirs: set[str] = set()
    for directory in directories:
        parts = directory.split("/")
        for depth in range(1, len(parts) + 1):
            all_dirs.add("/".join(parts[:depth]))
    try:
        with tarfile.open(archive, mode="x", format=tarfile.PAX_FORMAT) as tar:
            for directory in sorted(all_dirs):
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


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


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
    roots = [Path(root).resolve() for root in trusted_roots]
    given = Path(pkg_path)
    if not roots:
        _fail(PackageCheck.UNTRUSTED_PATH, given, "no trusted roots configured (§11 step 1)")
    try:
        resolved = given.resolve()
    except (OSError, RuntimeError) as exc:
        _fail(PackageCheck.NOT_FOUND, given, f"cannot resolve the path: {exc}")
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        via = f" (it resolves to {resolved})" if resolved != given.absolute() else ""
        _fail(
            PackageCheck.UNTRUSTED_PATH,
            given,
            f"path is outside the trusted roots [{shown}]{via} (§11 step 1)",
        )
    if not resolved.exists():
        _fail(PackageCheck.NOT_FOUND, given, "does not exist")
    if resolved.is_dir():
        return _verify_directory(resolved, resolved, keys, max_file_bytes, extracted=False)
    if not resolved.is_file():
        _fail(PackageCheck.NOT_A_PACKAGE, given, "neither a directory nor a .tar archive")
    extract_dir = Path(tempfile.mkdtemp(prefix="calculet-pkg-")).resolve()
    try:
        _extract_archive(resolved, extract_dir, max_file_bytes)
        return _verify_directory(extract_dir, resolved, keys, max_file_bytes, extracted=True)
    except BaseException:
        shutil.rmtree(extract_dir, ignore_errors=True)
        raise


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
    present = {rel: path for rel, path in _scan_tree(pkg, label=where)}

    # Step 2: signature over the exact manifest bytes, before anything is parsed.
    if SIGNATURE_NAME not in present:
        _fail(PackageCheck.MISSING_SIGNATURE, where, "missing; the package is not signed",
              file=SIGNATURE_NAME)
    if MANIFEST_NAME not in present:
        _fail(PackageCheck.MISSING_MANIFEST, where, "missing", file=MANIFEST_NAME)
    signature = _read_limited(present[SIGNATURE_NAME], SIGNATURE_BYTES + 1, where, SIGNATURE_NAME)
    if len(signature) != SIGNATURE_BYTES:
        _fail(
            PackageCheck.MALFORMED_SIGNATURE,
            where,
            f"truncated or malformed signature: {len(signature)}"
            f"{'+' if len(signature) > SIGNATURE_BYTES else ''} bytes, expected exactly "
            f"{SIGNATURE_BYTES} (raw Ed25519)",
            file=SIGNATURE_NAME,
        )
    raw_manifest = _read_limited(present[MANIFEST_NAME], MAX_MANIFEST_BYTES + 1, where,
                                 MANIFEST_NAME)
    if len(raw_manifest) > MAX_MANIFEST_BYTES:
        _fail(PackageCheck.OVERSIZE, where, f"larger than {MAX_MANIFEST_BYTES} bytes",
              file=MANIFEST_NAME)
    signer = _find_signer(raw_manifest, signature, keys)
    if signer is None:
        key_dirs = sorted({str(k.path.parent) for k in keys})
        _fail(
            PackageCheck.BAD_SIGNATURE,
            where,
            f"signature does not match {MANIFEST_NAME} under any of the {len(keys)} trusted "
            f"key(s) in {', '.join(key_dirs)}: {MANIFEST_NAME} or {SIGNATURE_NAME} was "
            "modified, or the package was signed by an untrusted key",
            file=SIGNATURE_NAME,
        )

    manifest = _parse_manifest(raw_manifest, where)
    listed = _listed_files(manifest, where, max_file_bytes)

    unlisted = sorted(set(present) - set(listed) - RESERVED_NAMES)
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        _fail(PackageCheck.UNLISTED_FILE, where,
              f"file is not listed in the signed manifest{more}", file=unlisted[0])
    for rel in sorted(listed):
        if rel not in present:
            kind = "a directory is there instead" if (pkg / rel).is_dir() else "not found"
            _fail(PackageCheck.MISSING_FILE, where,
                  f"listed in the manifest but {kind}", file=rel)

    files: list[PackageFile] = []
    for rel in sorted(listed):
        expected_size, expected_sha = listed[rel]
        path = present[rel]
        if not path.resolve().is_relative_to(pkg):
            _fail(PackageCheck.UNSAFE_PATH, where, "resolves outside the package", file=rel)
        digest = _hash_checked(path, expected_size, max_file_bytes, where, rel)
        if digest != expected_sha:
            _fail(
                PackageCheck.HASH_MISMATCH,
                where,
                f"sha256 mismatch: manifest says {expected_sha}, file has {digest}",
                file=rel,
            )
        files.append(PackageFile(rel, path, expected_size, expected_sha))

    return VerifiedPackage(
        path=pkg,
        source=source,
        manifest=_freeze(manifest),
        manifest_bytes=raw_manifest,
        manifest_sha256=hashlib.sha256(raw_manifest).hexdigest(),
        key_id=signer.key_id,
        key_name=signer.name,
        files=tuple(files),
        extracted=extracted,
    )


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
        _fail(PackageCheck.MALFORMED_MANIFEST, where, f"invalid JSON: {exc}", file=MANIFEST_NAME)
    if not isinstance(data, dict):
        _fail(PackageCheck.MALFORMED_MANIFEST, where, "must be a JSON object",
              file=MANIFEST_NAME)
    fmt = data.get("format")
    if not isinstance(fmt, str) or not fmt:
        _fail(PackageCheck.MALFORMED_MANIFEST, where,
              "'format' must be a non-empty string", file=MANIFEST_NAME)
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        _fail(PackageCheck.MALFORMED_MANIFEST, where,
              "'files' must be a non-empty object {path: {sha256, size}}", file=MANIFEST_NAME)
    return data


def _listed_files(
    manifest: Mapping[str, Any], where: Path, max_file_bytes: int
) -> dict[str, tuple[int, str]]:
    listed: dict[str, tuple[int, str]] = {}
    for rel, entry in manifest["files"].items():
        problem = _unsafe_relative_path(rel)
        if problem is not None:
            _fail(PackageCheck.UNSAFE_PATH, where, f"manifest lists {rel!r}: {problem}",
                  file=MANIFEST_NAME)
        if rel in RESERVED_NAMES:
            _fail(PackageCheck.UNSAFE_PATH, where,
                  f"manifest lists the reserved name {rel!r}", file=MANIFEST_NAME)
        if not isinstance(entry, dict):
            _fail(PackageCheck.MALFORMED_MANIFEST, where,
                  f"entry of {rel!r} must be an object {{sha256, size}}", file=MANIFEST_NAME)
        sha = entry.get("sha256")
        size = entry.get("size")
        if not isinstance(sha, str) or not _SHA256_RE.match(sha):
            _fail(PackageCheck.MALFORMED_MANIFEST, where,
                  f"sha256 of {rel!r} must be 64 lowercase hex digits", file=MANIFEST_NAME)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            _fail(PackageCheck.MALFORMED_MANIFEST, where,
                  f"size of {rel!r} must be a non-negative integer", file=MANIFEST_NAME)
        if size > max_file_bytes:
            _fail(PackageCheck.OVERSIZE, where,
                  f"listed size {size} exceeds the limit of {max_file_bytes} bytes", file=rel)
        listed[rel] = (size, sha)
    return listed


def _unsafe_relative_path(rel: object) -> str | None:
    """Why ``rel`` is not a plain relative POSIX path inside the package, or None if it is."""
    if not isinstance(rel, str) or not rel:
        return "not a non-empty string"
    if len(rel) > 4096:
        return "path too long"
    if "\x00" in rel or any(ord(ch) < 0x20 for ch in rel):
        return "control character in path"
    if "\\" in rel:
        return "backslash in path (use '/')"
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return "absolute path; paths must be relative to the package"
    parts = rel.split("/")
    if ".." in parts:
        return "'..' component would leave the package"
    if any(part in ("", ".") for part in parts):
        return "empty or '.' component; paths must be normalised"
    return None


def _hash_checked(path: Path, expected_size: int, max_file_bytes: int, where: Path,
                  rel: str) -> str:
    """SHA-256 of a listed file, read through one descriptor opened without following links.

    Size is checked on the open descriptor before hashing (cheap rejection of oversize or
    truncated files) and again while reading, so a file that grows after the check is caught.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        _fail(PackageCheck.MISSING_FILE, where, f"cannot open: {exc.strerror}", file=rel)
    with os.fdopen(descriptor, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            _fail(PackageCheck.SPECIAL_FILE, where, "not a regular file", file=rel)
        if info.st_size > max_file_bytes:
            _fail(PackageCheck.OVERSIZE, where,
                  f"{info.st_size} bytes exceeds the limit of {max_file_bytes} bytes", file=rel)
        if info.st_size != expected_size:
            _fail(PackageCheck.SIZE_MISMATCH, where,
                  f"size mismatch: manifest says {expected_size} bytes, file has "
                  f"{info.st_size}", file=rel)
        digest = hashlib.sha256()
        read = 0
        while chunk := stream.read(_CHUNK):
            read += len(chunk)
            if read > expected_size:
                _fail(PackageCheck.SIZE_MISMATCH, where,
                      f"file grew beyond the listed {expected_size} bytes while being read",
                      file=rel)
            digest.update(chunk)
        if read != expected_size:
            _fail(PackageCheck.SIZE_MISMATCH, where,
                  f"size mismatch: manifest says {expected_size} bytes, read {read}", file=rel)
    return digest.hexdigest()


def _read_limited(path: Path, limit: int, where: Path, rel: str) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        _fail(PackageCheck.NOT_FOUND, where, f"cannot open: {exc.strerror}", file=rel)
    with os.fdopen(descriptor, "rb") as stream:
        return stream.read(limit)


def _scan_tree(root: Path, *, label: Path) -> Iterator[tuple[str, Path]]:
    """Yield ``(relative POSIX path, path)`` of every regular file under ``root``, sorted.

    Symlinks and special files are rejected rather than skipped: a symlink in a package is
    either an escape (§11 step 1, R11.1) or a second name for a file that would be hashed
    twice, and neither belongs in a signed artifact.
    """
    stack = [root]
    found: list[tuple[str, Path]] = []
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                path = Path(entry.path)
                rel = path.relative_to(root).as_posix()
                if entry.is_symlink():
                    target = os.readlink(path)
                    escapes = not (path.parent / target).resolve().is_relative_to(root)
                    detail = (f"symlink to {target!r} points outside the package"
                              if escapes else f"symlink to {target!r}; packages hold regular "
                              "files only")
                    _fail(PackageCheck.SYMLINK, label, detail, file=rel)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, path))
                else:
                    _fail(PackageCheck.SPECIAL_FILE, label,
                          "not a regular file or directory", file=rel)
    yield from sorted(found)


def _extract_archive(archive: Path, dest: Path, max_file_bytes: int) -> None:
    """Extract an uncompressed tar into the empty private directory ``dest``, safely.

    Every member is checked before anything is written: only regular files and directories,
    plain relative names (no absolute paths, no ``..``), no duplicates, each file within
    ``max_file_bytes``. Files are created exclusively, so nothing outside ``dest`` can be
    reached. Compressed archives are refused: an uncompressed one cannot expand beyond its
    own size on disk.
    """
    try:
        tar = tarfile.open(archive, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        _fail(PackageCheck.NOT_A_PACKAGE, archive,
              f"not a directory nor an uncompressed .tar archive ({exc})")
    with tar:
        members: list[tuple[str, tarfile.TarInfo]] = []
        names: set[str] = set()
        try:
            for index, member in enumerate(tar):
                if index >= MAX_ARCHIVE_MEMBERS:
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive,
                          f"more than {MAX_ARCHIVE_MEMBERS} members")
                name = member.name
                if name in (".", "./"):
                    continue
                name = name.removeprefix("./").rstrip("/") if member.isdir() else \
                    name.removeprefix("./")
                problem = _unsafe_relative_path(name)
                if problem is not None:
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive,
                          f"archive member {member.name!r}: {problem}", file=member.name)
                if member.issym() or member.islnk():
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive,
                          f"archive member is a link to {member.linkname!r}; packages hold "
                          "regular files only", file=name)
                if not (member.isfile() or member.isdir()):
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive,
                          "archive member is not a regular file or directory", file=name)
                if name in names:
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive,
                          "archive member appears twice", file=name)
                names.add(name)
                if member.isfile() and member.size > max_file_bytes:
                    _fail(PackageCheck.OVERSIZE, archive,
                          f"{member.size} bytes exceeds the limit of {max_file_bytes} bytes",
                          file=name)
                members.append((name, member))
        except tarfile.TarError as exc:
            _fail(PackageCheck.UNSAFE_ARCHIVE, archive, f"corrupt archive: {exc}")
        try:
            for name, member in members:
                target = dest / name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                stream = tar.extractfile(member)
                if stream is None:
                    _fail(PackageCheck.UNSAFE_ARCHIVE, archive, "unreadable member", file=name)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                with stream, os.fdopen(os.open(target, flags, 0o644), "wb") as out:
                    shutil.copyfileobj(stream, out, _CHUNK)
        except (OSError, tarfile.TarError) as exc:
            _fail(PackageCheck.UNSAFE_ARCHIVE, archive, f"cannot extract: {exc}")


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
        _fail(PackageCheck.NOT_FOUND, path, "does not exist")
    signature: bytes | None
    if path.is_dir():
        manifest_path = path / MANIFEST_NAME
        if not manifest_path.is_file():
            _fail(PackageCheck.MISSING_MANIFEST, path, "missing", file=MANIFEST_NAME)
        raw = _read_limited(manifest_path, MAX_MANIFEST_BYTES + 1, path, MANIFEST_NAME)
        signature_path = path / SIGNATURE_NAME
        signature = (
            _read_limited(signature_path, SIGNATURE_BYTES + 1, path, SIGNATURE_NAME)
            if signature_path.is_file()
            else None
        )
        is_archive = False
    else:
        raw, signature = _read_archive_manifest(path)
        is_archive = True
    if len(raw) > MAX_MANIFEST_BYTES:
        _fail(PackageCheck.OVERSIZE, path, f"larger than {MAX_MANIFEST_BYTES} bytes",
              file=MANIFEST_NAME)
    manifest = _parse_manifest(raw, path)
    signed_by: str | None = None
    if trusted_keys_dir is not None and signature is not None and len(signature) == 64:
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


def _read_archive_manifest(archive: Path) -> tuple[bytes, bytes | None]:
    try:
        tar = tarfile.open(archive, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        _fail(PackageCheck.NOT_A_PACKAGE, archive,
              f"not a directory nor an uncompressed .tar archive ({exc})")
    raw: bytes | None = None
    signature: bytes | None = None
    with tar:
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
        _fail(PackageCheck.MISSING_MANIFEST, archive, "missing from the archive",
              file=MANIFEST_NAME)
    return raw, signature


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def file_sha256(path: str | Path) -> str:
    """SHA-256 (lowercase hex) of a file, streamed."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_and_hash(src: Path, dst: Path, max_file_bytes: int, where: Path,
                   rel: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with src.open("rb") as reader, os.fdopen(os.open(dst, flags, 0o644), "wb") as writer:
        while chunk := reader.read(_CHUNK):
            size += len(chunk)
            if size > max_file_bytes:
                _fail(PackageCheck.OVERSIZE, where,
                      f"exceeds the limit of {max_file_bytes} bytes", file=rel)
            digest.update(chunk)
            writer.write(chunk)
    return digest.hexdigest(), size


def _write_new_file(path: Path, data: bytes, *, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, mode), "wb") as stream:
        stream.write(data)
    os.chmod(path, mode)


def _freeze(value: Any) -> Any:
    """A read-only deep view of parsed JSON: mappings become read-only, lists tuples."""
    if isinstance(value, dict):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value



# --------------------------------------------------------------------------------------------
# the local development key
# --------------------------------------------------------------------------------------------

DEV_KEY_NAME = "calculet-dev"


def default_dev_key_dir() -> Path:
    """Where the development key pair lives: ``$CALCULET_HOME/dev-keys`` (default ``~/.calculet``).

    Outside the repository on purpose: no private key is ever committed, not even one meant
    only for development.
    """
    import os

    home = Path(os.environ.get("CALCULET_HOME", Path.home() / ".calculet"))
    return home / "dev-keys"


def ensure_dev_keypair(directory: str | Path | None = None) -> KeyPair:
    """The development key pair, generated on first use on this machine.

    It signs the bundled tiny model package so that the simulated service exercises the real
    §11 step 2 checks with no setup. It is a *development* key: each machine makes its own,
    and no production configuration should ever trust its directory.
    """
    out = Path(directory) if directory is not None else default_dev_key_dir()
    private_path = out / f"{DEV_KEY_NAME}{_PRIVATE_SUFFIX}"
    public_path = out / f"{DEV_KEY_NAME}{_PUBLIC_SUFFIX}"
    if private_path.exists() and public_path.exists():
        return KeyPair(DEV_KEY_NAME, key_id_of(load_private_key(private_path).public_key()),
                       private_path, public_path)
    return generate_keypair(out, DEV_KEY_NAME)
