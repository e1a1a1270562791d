"""Fixtures for signed-package tests: a key pair, a trusted root and a package factory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.unit.packages.package_testkit import Env

from calculet.packages import generate_keypair


@pytest.fixture
def env(tmp_path: Path) -> Env:
    private = tmp_path / "private"
    signer = generate_keypair(private, "test-signer")
    other = generate_keypair(private, "untrusted")
    keys = tmp_path / "trusted-keys"
    keys.mkdir()
    shutil.copy(signer.public_key_path, keys / signer.public_key_path.name)
    root = tmp_path / "packages"
    root.mkdir()
    return Env(base=tmp_path, root=root, keys=keys, signer=signer, other_signer=other)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point ``tempfile`` at a directory of our own so extraction leftovers can be counted."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory

