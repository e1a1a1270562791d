"""``promtool``, Prometheus' own checker, for the metrics, alert-rule and dashboard tests (issue #19).

``make system-tools`` installs it (Debian package ``prometheus``). Without it the tests that need
it fail under ``CI=true`` and are skipped elsewhere, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def promtool() -> str:
    """The promtool executable, or fail (CI) / skip (elsewhere)."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed: run `make system-tools` (Debian package prometheus)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool args...`` from the repository root; stdout and stderr captured as text."""
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)
