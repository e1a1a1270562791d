"""Fixtures shared by the model-lifecycle integration tests (§10–§13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.models.support import ModelsEnv


@pytest.fixture
def env(tmp_path: Path) -> ModelsEnv:
    """A fresh package/key/board environment per test (packages are built into ``tmp_path``)."""
    return ModelsEnv.create(tmp_path)
