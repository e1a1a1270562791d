"""specs/ is derived: --check passes on the committed tree and fails after a declaration changes."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from calculet import specgen
from calculet.invariants.mutation import derive, replace_row
from calculet.machines import ALL_MACHINES, KvSequenceMachine

ROOT = Path(__file__).resolve().parents[2]
MACHINE_DOCUMENTS = ("request.md", "kv_sequence.md", "model.md", "device_job.md")


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """Every document, rendered once for the module (a render reads every declaration and test)."""
    return specgen.render_all()


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "calculet.specgen", *args], cwd=cwd, text=True,
                          capture_output=True, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_committed_specs_are_current(rendered):
    assert specgen.check(specgen.SPECS_DIR, rendered) == []


def test_check_fails_after_a_declaration_changes_until_regenerated(tmp_path, monkeypatch, capsys, rendered):
    """In-process: the KV sequence's reserve guard tightened by one token; --check names the
    document and the new formula, exits 1; writing makes it current again."""
    target = tmp_path / "specs"
    target.mkdir()
    for name, text in rendered.items():  # current for this tree
        (target / name).write_text(text, encoding="utf-8")
    mutant = derive(KvSequenceMachine, "KvSequenceMachine",
                    lambda rows, d: replace_row(rows, "reserve@free", guard=lambda v, tokens: tokens <= v.max_seq - 1))
    # specgen reads only ``definition``; keep the declaration's own docstring (a mutant names itself).
    changed = SimpleNamespace(definition=dataclasses.replace(mutant.definition, doc=KvSequenceMachine.definition.doc))
    monkeypatch.setattr(specgen, "ALL_MACHINES",
                        tuple(changed if m is KvSequenceMachine else m for m in ALL_MACHINES))

    assert specgen.main(["--check", "--out", str(target)]) == 1
    stale = capsys.readouterr().out
    assert "kv_sequence.md" in stale and "tokens ≤ (max_seq - 1)" in stale
    assert all(name not in stale for name in MACHINE_DOCUMENTS if name != "kv_sequence.md")

    assert specgen.main(["--out", str(target)]) == 0
    assert specgen.main(["--check", "--out", str(target)]) == 0


@pytest.mark.slow
def test_check_fails_after_a_declaration_source_changes_until_regenerated(tmp_path):
    """The same through the command line, on a copy of the tree whose source file is edited."""
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


def test_every_machine_document_has_banner_table_and_diagram(rendered):
    for name in (*MACHINE_DOCUMENTS, "index.md", "traceability.md", "request_lanes.md"):
        assert rendered[name].startswith(specgen.BANNER)
    for name in MACHINE_DOCUMENTS:
        assert "stateDiagram-v2" in rendered[name] and "## Transitions" in rendered[name] and "## Invariants" in rendered[name]


@pytest.mark.req("R9.1.1", "R9.2.5")
def test_the_kv_sequence_document_renders_the_declared_projection(monkeypatch, rendered):
    """§9.1's KvSequenceState is a projection of the lane machine's state and its open step (#20); its table in
    kv_sequence.md is generated from the one declaration (``KV_SEQUENCE_STATE``). Mutant caught: a hand-written
    table, or a section not rendered from ``REPORTED_STATES``: a changed declaration does not change the document."""
    from calculet.machines.definition import Group
    from calculet.machines.projection import DerivedState, StateProjection

    text = rendered["kv_sequence.md"]
    assert "## Reported states: `KvSequenceState` (§9.1, R9.1.1)" in text
    assert "| `reserved` | `reserved` | `updating` |" in text and "| `unknown` | `unknown` | `unknown` |" in text
    other = StateProjection(KvSequenceMachine, "KvSequenceState", spec="§9.1", rid="R9.1.1", condition="bound",
                            condition_doc="stand-in.", derived=(DerivedState("writing", Group("working"), "stand-in"),))
    monkeypatch.setattr(specgen, "REPORTED_STATES", {"KvSequenceMachine": other})
    changed = specgen.machine_document(KvSequenceMachine)
    assert "| `active` | `active` | `writing` |" in changed and "| `active` | `active` | `updating` |" not in changed
