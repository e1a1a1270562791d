"""Ed25519 keys for signed packages: trusted public keys, signing keys, key ids, the dev key.

Why this exists: §11 step 2 (R11.2) accepts a package only if a *trusted* key signed its
manifest. Trusted public keys live in a directory: ``*.pem`` (SubjectPublicKeyInfo PEM) or
``*.pub`` / ``*.hex`` (the raw 32-byte key in hex). ``*.key.pem`` files are private keys and are
ignored, so a development key directory may hold its (development-only) private key next to the
public one. Loading, generating and naming keys is one job, kept apart from what keys sign.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from calculet.packages.checks import PackageCheck, fail
from calculet.packages.files import write_new_file

__all__ = [
    "DEV_KEY_NAME",
    "KeyPair",
    "TrustedKey",
    "default_dev_key_dir",
    "ensure_dev_keypair",
    "generate_keypair",
    "key_id_of",
    "load_private_key",
    "load_trusted_keys",
]

_KEY_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PRIVATE_SUFFIX: Final = ".key.pem"
_PUBLIC_SUFFIX: Final = ".pub.pem"
DEV_KEY_NAME: Final = "calculet-dev"


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


def _is_pem(data: bytes) -> bool:
    return data.lstrip().startswith(b"-----BEGIN")


def _hex32(data: bytes) -> bytes | None:
    """The 32 bytes a file holds as 64 hex digits, or None if it holds something else."""
    text = data.decode("ascii", errors="replace").strip()
    return bytes.fromhex(text) if re.fullmatch(r"[0-9a-fA-F]{64}", text) else None


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        fail(PackageCheck.BAD_KEY, path.parent, f"cannot read {what}: {exc}", file=path.name)


def _load_public_key(path: Path) -> Ed25519PublicKey:
    where = path.parent
    data = _read_key_file(path, "key file")
    if b"PRIVATE KEY" in data:
        fail(
            PackageCheck.BAD_KEY,
            where,
            "is a private key; a trusted keys directory holds public keys only "
            f"(name private keys '*{_PRIVATE_SUFFIX}' to keep them out of trust)",
            file=path.name,
        )
    if _is_pem(data):
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            fail(PackageCheck.BAD_KEY, where, f"not a PEM public key: {exc}", file=path.name)
        if not isinstance(key, Ed25519PublicKey):
            fail(
                PackageCheck.BAD_KEY,
                where,
                f"is a {type(key).__name__}, not an Ed25519 public key",
                file=path.name,
            )
        return key
    raw = _hex32(data)
    if raw is None:
        fail(
            PackageCheck.BAD_KEY,
            where,
            "neither a PEM public key nor a raw 32-byte Ed25519 key in hex (64 hex digits)",
            file=path.name,
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def load_trusted_keys(keys_dir: str | Path | None) -> tuple[TrustedKey, ...]:
    """Load every public key of a trusted keys directory (§11 step 2), sorted by file name.

    An empty or missing directory is an error, not an empty trust set: a loader with no keys
    could only ever reject, and saying why at once is kinder.
    """
    if keys_dir is None:
        fail(PackageCheck.NO_TRUSTED_KEYS, "", "no trusted keys directory configured")
    directory = Path(keys_dir)
    if not directory.is_dir():
        fail(
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
        fail(
            PackageCheck.NO_TRUSTED_KEYS,
            "",
            f"no public keys (*.pem, *.pub, *.hex) in trusted keys directory {directory}",
        )
    return tuple(keys)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 signing key: unencrypted PKCS#8 PEM, or the 32-byte seed in hex."""
    key_path = Path(path)
    data = _read_key_file(key_path, "private key")
    if _is_pem(data):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            fail(PackageCheck.BAD_KEY, key_path.parent,
                 f"not an unencrypted PEM private key: {exc}", file=key_path.name)
        if not isinstance(key, Ed25519PrivateKey):
            fail(PackageCheck.BAD_KEY, key_path.parent,
                 f"is a {type(key).__name__}, not an Ed25519 private key", file=key_path.name)
        return key
    seed = _hex32(data)
    if seed is None:
        fail(PackageCheck.BAD_KEY, key_path.parent,
             "neither a PEM private key nor a 32-byte Ed25519 seed in hex", file=key_path.name)
    return Ed25519PrivateKey.from_private_bytes(seed)


def generate_keypair(directory: str | Path, name: str) -> KeyPair:
    """Write a new Ed25519 key pair ``<name>.key.pem`` (mode 0600) and ``<name>.pub.pem``.

    Never overwrites: replacing a signing key by accident would orphan every package it
    signed. The public file can be copied into a trusted keys directory as is.
    """
    if not _KEY_NAME_RE.match(name):
        fail(PackageCheck.BAD_KEY, "", f"invalid key name {name!r} (letters, digits, . _ -)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    private_path = out / f"{name}{_PRIVATE_SUFFIX}"
    public_path = out / f"{name}{_PUBLIC_SUFFIX}"
    for existing in (private_path, public_path):
        if existing.exists() or existing.is_symlink():
            fail(PackageCheck.BAD_KEY, out, "already exists; refusing to overwrite a key",
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
    write_new_file(private_path, private_pem, mode=0o600)
    write_new_file(public_path, public_pem, mode=0o644)
    return KeyPair(name, key_id_of(private_key.public_key()), private_path, public_path)


def default_dev_key_dir() -> Path:
    """Where the development key pair lives: ``$CALCULET_HOME/dev-keys`` (default ``~/.calculet``).

    Outside the repository on purpose: no private key is ever committed, not even one meant
    only for development.
    """
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
