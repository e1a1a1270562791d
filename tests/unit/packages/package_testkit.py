"""Shared helpers of the signed-package tests (imported by conftest.py and the test modules).

A uniquely named module rather than imports from conftest.py, which pytest discourages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calculet.packages import (
    KeyPair,
    build_package,
    manifest_bytes,
    sign_package,
)

# Small but varied contents: a calbin at the top, weights in a sub-directory, nested config.
PACKAGE_FILES: dict[str, bytes] = {
    "model.calbin": b"CALBIN\x00\x01" + bytes(range(256)) * 4,
    "weights/shard-0.bin": bytes((i * 7) % 251 for i in range(4096)),
    "weights/shard-1.bin": b"\x00" * 1000,
    "config/tokenizer/vocab.json": b'{"<s>": 0, "</s>": 1}\n',
    "empty.txt": b"",
}
EXTRA_FIELDS = {"model": "tiny", "profiles": [{"compiled_batch": 1, "max_seq": 256}]}


@dataclass(frozen=True)
class Env:
    """A trust set-up: ``root`` is the only trusted root, ``keys`` holds the trusted public key."""

    base: Path
    root: Path
    keys: Path
    signer: KeyPair
    other_signer: KeyPair

    def make_package(
        self,
        name: str = "pkg",
        files: dict[str, bytes] | None = None,
        *,
        sign: bool = True,
        key: KeyPair | None = None,
    ) -> Path:
        src = self.base / "src" / name
        src.mkdir(parents=True)
        for rel, data in (files if files is not None else PACKAGE_FILES).items():
            path = src / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        package = build_package(src, self.root / name, EXTRA_FIELDS)
        if sign:
            sign_package(package, (key or self.signer).private_key_path)
        return package

    @staticmethod
    def flip_byte(path: Path, offset: int) -> None:
        """Change one byte of ``path`` in place (XOR 0x01)."""
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x01
        path.write_bytes(bytes(data))

    def resign_with_manifest(self, package: Path, manifest: dict[str, object]) -> None:
        """Replace manifest.json and sign it with the *trusted* key.

        Used to show that checks after the signature (paths, entries) hold even for a manifest
        a trusted key signed by mistake.
        """
        (package / "manifest.json").write_bytes(manifest_bytes(manifest))
        sign_package(package, self.signer.private_key_path)

