"""Building and signing packages: the producer's side of §11 step 2.

Why this exists: a package is a directory holding ``manifest.json`` — a JSON object with at
least ``"format"`` (e.g. ``"calbin-package/v1"``) and ``"files": {relative_path: {"sha256":
hex, "size": int}}`` — every file that ``files`` lists and no other, and ``manifest.sig``, the
raw 64-byte Ed25519 signature of the exact bytes of ``manifest.json`` (the bytes ``openssl
pkeyutl -sign -rawin`` produces, so vendor tooling can sign too). Signing the manifest and
hashing every file from it makes one signature cover the whole package: change one byte anywhere
and either the signature or a hash no longer matches (R11.2).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calculet.packages.checks import (
    DEFAULT_FORMAT,
    DEFAULT_MAX_FILE_BYTES,
    MANIFEST_NAME,
    RESERVED_NAMES,
    SIGNATURE_NAME,
    PackageCheck,
    fail,
)
from calculet.packages.files import CHUNK, create_new, scan_tree, unsafe_relative_path, write_new_file
from calculet.packages.keys import load_private_key

__all__ = ["build_package", "file_sha256", "manifest_bytes", "sign_package"]


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The canonical encoding written by :func:`build_package` (sorted keys, ASCII, LF).

    It matches ``CalbinManifest.to_json_bytes`` of the step-3 manifest model.

    Verification never re-encodes: the signature covers the exact bytes on disk. Canonical
    output only makes builds reproducible and diffs readable.
    """
    try:
        text = json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        fail(PackageCheck.BUILD, "", f"manifest is not JSON-serializable: {exc}")
    return (text + "\n").encode("utf-8")


def file_sha256(path: str | Path) -> str:
    """SHA-256 (lowercase hex) of a file, streamed."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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

    A source that already holds a ``manifest.json`` (a built package, e.g. the simulator's
    builder's output) is re-laid out: that manifest's fields other than ``files`` are the
    defaults ``extra_fields`` override, ``files`` is computed again, and neither it nor a
    ``manifest.sig`` (which signed the old bytes) is copied (#18).
    Returns the package directory.
    """
    src = Path(src_dir).resolve()
    out = Path(out_dir).absolute()
    if not src.is_dir():
        fail(PackageCheck.BUILD, out, f"source {src} is not a directory")
    fields = _manifest_fields({**_source_manifest_fields(src, out), **dict(extra_fields or {})}, out)
    _check_output(src, out)
    regular = [(rel, path) for rel, path in _source_files(src, out) if rel not in RESERVED_NAMES]
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        files: dict[str, dict[str, Any]] = {}
        for rel, path in regular:
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = _copy_and_hash(path, target, max_file_bytes, out, rel)
            files[rel] = {"sha256": digest, "size": size}
        manifest = {**fields, "files": files}
        write_new_file(out / MANIFEST_NAME, manifest_bytes(manifest), mode=0o644)
    except BaseException:
        _undo_build(out, created=created)
        raise
    return out


def _source_manifest_fields(src: Path, out: Path) -> dict[str, Any]:
    """The fields of a ``manifest.json`` already in the source (none when there is none)."""
    path = src / MANIFEST_NAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(PackageCheck.BUILD, out, f"the source's {MANIFEST_NAME} is not readable JSON: {exc}", file=MANIFEST_NAME)
    if not isinstance(data, dict):
        fail(PackageCheck.BUILD, out, f"the source's {MANIFEST_NAME} is not a JSON object", file=MANIFEST_NAME)
    data.pop("files", None)
    return data


def _manifest_fields(extra_fields: Mapping[str, Any] | None, out: Path) -> dict[str, Any]:
    """The manifest's own fields (all but ``files``), with ``format`` defaulted and checked."""
    fields = dict(extra_fields or {})
    if "files" in fields:
        fail(PackageCheck.BUILD, out, "extra_fields may not set 'files'; it is computed")
    fmt = fields.pop("format", DEFAULT_FORMAT)
    if not isinstance(fmt, str) or not fmt:
        fail(PackageCheck.BUILD, out, f"'format' must be a non-empty string, got {fmt!r}")
    manifest_bytes({**fields, "format": fmt, "files": {}})  # fail before copying gigabytes
    return {**fields, "format": fmt}


def _check_output(src: Path, out: Path) -> None:
    out_resolved = out.resolve()
    if out_resolved == src or out_resolved.is_relative_to(src) or src.is_relative_to(out_resolved):
        fail(PackageCheck.BUILD, out, f"output must not overlap the source {src}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail(PackageCheck.BUILD, out, "output exists and is not an empty directory")


def _source_files(src: Path, out: Path) -> list[tuple[str, Path]]:
    """Every file of the source, each with a name a manifest can list."""
    regular = list(scan_tree(src, label=src))
    if not regular:
        fail(PackageCheck.BUILD, out, f"source {src} holds no files")
    for rel, _ in regular:
        problem = unsafe_relative_path(rel)
        if problem is not None:
            fail(PackageCheck.BUILD, out, f"file name cannot go into a manifest: {problem}",
                 file=rel)
    return regular


def _undo_build(out: Path, *, created: bool) -> None:
    """Leave the output as it was before a failed build: gone, or an empty directory."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _copy_and_hash(src: Path, dst: Path, max_file_bytes: int, where: Path,
                   rel: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with src.open("rb") as reader, create_new(dst, 0o644) as writer:
        while chunk := reader.read(CHUNK):
            size += len(chunk)
            if size > max_file_bytes:
                fail(PackageCheck.OVERSIZE, where,
                     f"exceeds the limit of {max_file_bytes} bytes", file=rel)
            digest.update(chunk)
            writer.write(chunk)
    return digest.hexdigest(), size


def sign_package(pkg_dir: str | Path, private_key_path: str | Path) -> Path:
    """Sign the exact bytes of ``manifest.json`` and write ``manifest.sig`` (§11 step 2).

    The signature is the raw 64-byte Ed25519 signature. An existing signature is replaced
    atomically (a package can be re-signed by a new key). Returns the signature's path.
    """
    pkg = Path(pkg_dir)
    manifest_path = pkg / MANIFEST_NAME
    if not manifest_path.is_file() or manifest_path.is_symlink():
        fail(PackageCheck.MISSING_MANIFEST, pkg, "no manifest.json to sign", file=MANIFEST_NAME)
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
