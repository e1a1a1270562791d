"""The vocabulary every package step shares: reserved names, limits, and the one way to fail.

Why this exists: building, signing, archiving and verifying (§11 steps 1–2) all reject a
package for a reason from one bounded set (:class:`PackageCheck`), carried as
``PackageError.context["reason"]`` so callers (the model manager, the metrics' ``reason`` label,
tests) branch on data instead of parsing messages. Keeping the set and the names of the two
reserved files in one place keeps every step's errors alike.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Final, NoReturn

from calculet.errors import PackageError

__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "RESERVED_NAMES",
    "DEFAULT_FORMAT",
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_MANIFEST_BYTES",
    "SIGNATURE_BYTES",
    "MAX_ARCHIVE_MEMBERS",
    "PackageCheck",
    "fail",
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


def fail(
    reason: PackageCheck, where: Path | str, message: str, *, file: str | None = None
) -> NoReturn:
    """Raise the one error of the package steps; the message names the package and the file."""
    prefix = f"package {where}: " if str(where) else ""
    subject = f"{file}: " if file is not None else ""
    raise PackageError(
        f"{prefix}{subject}{message}",
        reason=reason.value,
        package=str(where),
        file=file,
    )
