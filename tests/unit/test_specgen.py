"""specs/ is derived: --check passes on the committed tree and fails after a declaration changes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from calculet import specgen

ROOT = Path(__file__).resolve().parents[2]


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "calculet.specgen", *args], cwd=cwd, text=True,
                          capture_output=True, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_committed_specs_are_current():
    assert specgen.check(specgen.SPECS_DIR) == []


def test_check_fails_after_a_declaration_changes_until_regenerated(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "calculet", copy / "calculet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "specs", copy / "specs")
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run(copy, "--check").returncode == 0

    kv = copy / "calculet" / "machines" / "kv_sequence.py"
    text = kv.read_text()
    changed = text.replace("guard=lambda v, tokens: tokens <= v.max_seq,",
                           "guard=lambda v, tokens: tokens <= v.max_seq - 1,")
    assert changed != text
    kv.write_text(changed)

    stale = _run(copy, "--check")
    assert stale.returncode == 1
    assert "kv_sequence.md" in stale.stdout and "tokens ≤ (max_seq - 1)" in stale.stdout

    assert _run(copy).returncode == 0
    assert _run(copy, "--check").returncode == 0


def test_every_machine_document_has_banner_table_and_diagram():
    docs = specgen.render_all()
    for name in ("request.md", "kv_sequence.md", "model.md", "device_job.md", "index.md"):
        assert docs[name].startswith(specgen.BANNER)
    for name in ("request.md", "kv_sequence.md", "model.md", "device_job.md"):
        assert "stateDiagram-v2" in docs[name] and "## Transitions" in docs[name] and "## Invariants" in docs[name]
