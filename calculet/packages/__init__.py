"""Signed calbin model packages (§11 load steps 1–2): keys, building and signing, verification,
archives and the ``calbin-package/v1`` manifest. A package is data the device adapters and the
model manager read; it is not itself a device adapter.

The rooms: :mod:`~calculet.packages.checks` (reserved names, limits, the :class:`PackageCheck`
reasons), :mod:`~calculet.packages.files` (safe file-system primitives),
:mod:`~calculet.packages.keys`, :mod:`~calculet.packages.build` (build and sign),
:mod:`~calculet.packages.archive` (pack and extract ``.tar``), :mod:`~calculet.packages.verify`
(steps 1–2, and unverified inspection) and :mod:`~calculet.packages.manifest` (the step-3 model).
The public names of the first five are re-exported here.
"""

from calculet.packages.archive import pack_archive
from calculet.packages.build import build_package, file_sha256, manifest_bytes, sign_package
from calculet.packages.checks import (
    DEFAULT_FORMAT,
    DEFAULT_MAX_FILE_BYTES,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_BYTES,
    SIGNATURE_NAME,
    PackageCheck,
)
from calculet.packages.keys import (
    KeyPair,
    TrustedKey,
    ensure_dev_keypair,
    generate_keypair,
    key_id_of,
    load_private_key,
    load_trusted_keys,
)
from calculet.packages.verify import (
    PackageFile,
    PackageInfo,
    VerifiedPackage,
    inspect_package,
    verify_package,
)

__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_MAX_FILE_BYTES",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "SIGNATURE_BYTES",
    "SIGNATURE_NAME",
    "KeyPair",
    "PackageCheck",
    "PackageFile",
    "PackageInfo",
    "TrustedKey",
    "VerifiedPackage",
    "build_package",
    "ensure_dev_keypair",
    "file_sha256",
    "generate_keypair",
    "inspect_package",
    "key_id_of",
    "load_private_key",
    "load_trusted_keys",
    "manifest_bytes",
    "pack_archive",
    "sign_package",
    "verify_package",
]
