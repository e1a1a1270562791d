"""Requirement traceability: which proofs and tests cover each [software] requirement.

Proofs name their requirement on the declaration (``Invariant("R9.2.3", ...)``); tests with
``@pytest.mark.req("R…")``. This module reads both — the declarations by import, the tests by
parsing their source (no test is run) — against the catalogue of R-ids in
``calculet/data/requirements.yaml`` (our own short titles; the texts stay in the seed).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from calculet.machines import ALL_MACHINES, REPORTED_STATES
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.admission_budgets import AdmissionBudgetSystem
from calculet.machines.job_lanes import JobLaneSystem
from calculet.machines.model_couplings import GenerationJobSystem, GenerationRequestSystem
from calculet.machines.request_lanes import RequestLaneSystem

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = Path(__file__).resolve().parents[1] / "data" / "requirements.yaml"


@dataclass(frozen=True)
class Requirement:
    id: str
    tag: str
    section: str
    title: str


@dataclass
class Coverage:
    requirement: Requirement
    proofs: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)
    """Declarations that state it without a proof: a spec enumeration projected from a machine's states (#20)."""

    @property
    def covered(self) -> bool:
        return bool(self.proofs or self.tests)


@lru_cache(maxsize=1)
def catalogue() -> tuple[Requirement, ...]:
    rows = yaml.safe_load(CATALOGUE.read_text(encoding="utf-8"))
    return tuple(Requirement(str(r["id"]), str(r["tag"]), str(r["section"]), str(r["title"])) for r in rows)


def proof_references() -> dict[str, list[str]]:
    """R-id → the declared invariants, pool properties and requests × lanes properties that state
    it (proved by verify)."""
    refs: dict[str, list[str]] = {}
    for machine in ALL_MACHINES:
        d = machine.definition
        for prop in (*d.invariants, *d.all_step_properties):
            if prop.rid.startswith("R"):
                refs.setdefault(prop.rid, []).append(f"{d.name}.{prop.name}")
    for inv in KvLanePool.definition.invariants:
        refs.setdefault(inv.rid, []).append(f"{KvLanePool.definition.name}.{inv.name}")
    for system in (RequestLaneSystem, GenerationRequestSystem, GenerationJobSystem, JobLaneSystem, AdmissionBudgetSystem):
        for inv in (*system.definition.invariants, *system.definition.step_properties):
            refs.setdefault(inv.rid, []).append(f"{system.definition.name}.{inv.name}")
    return refs


def declared_references() -> dict[str, list[str]]:
    """R-id → the reported-state projections (and their derived states) that state it: declared, not proved."""
    refs: dict[str, list[str]] = {}
    for projection in REPORTED_STATES.values():
        for rid, names in projection.references().items():
            refs.setdefault(rid, []).extend(names)
    return refs


def _marker_ids(node: ast.AST) -> list[str]:
    """R-ids of a ``pytest.mark.req(...)`` expression (a call, or a list of marks)."""
    ids: list[str] = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "req":
            ids += [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return ids


def tested_references(tests_dir: Path | None = None) -> dict[str, list[str]]:
    """R-id → test ids (``path::name``) whose ``req`` marker names it."""
    base = tests_dir or ROOT / "tests"
    refs: dict[str, list[str]] = {}
    if not base.exists():
        return refs
    for path in sorted(base.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = path.relative_to(base.parent).as_posix()
        module_ids: list[str] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
                module_ids += _marker_ids(stmt.value)
        for rid in module_ids:
            refs.setdefault(rid, []).append(rel)

        def visit(body: list[ast.stmt], prefix: str, inherited: list[str]) -> None:
            for stmt in body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own = [rid for dec in stmt.decorator_list for rid in _marker_ids(dec)]
                    name = f"{prefix}{stmt.name}"
                    if isinstance(stmt, ast.ClassDef):
                        visit(stmt.body, f"{name}::", inherited + own)
                    elif stmt.name.startswith("test"):
                        for rid in inherited + own:
                            refs.setdefault(rid, []).append(f"{rel}::{name}")

        visit(tree.body, "", [])
    return {rid: sorted(set(names)) for rid, names in refs.items()}


def coverage(tests_dir: Path | None = None) -> list[Coverage]:
    proofs = proof_references()
    tests = tested_references(tests_dir)
    declared = declared_references()
    return [Coverage(r, sorted(proofs.get(r.id, [])), tests.get(r.id, []), declared.get(r.id, [])) for r in catalogue()]


def software_figure(rows: list[Coverage] | None = None) -> tuple[int, int]:
    rows = coverage() if rows is None else rows
    software = [c for c in rows if c.requirement.tag == "software"]
    return sum(c.covered for c in software), len(software)


def unknown_references() -> list[str]:
    """R-ids named by proofs or tests that the catalogue does not know (typos)."""
    known = {r.id for r in catalogue()}
    named = set(proof_references()) | set(tested_references()) | set(declared_references())
    return sorted(named - known)


def traceability_document() -> str:
    """``specs/traceability.md`` without its banner (specgen puts it on top)."""
    rows = coverage()
    covered, total = software_figure(rows)
    out = ["# Requirement traceability", "",
           "Every requirement of the seed checklist (`../shared/seed/requirements.md`) by id, with our own",
           "short title, the proofs (declared invariants proved by `python -m calculet.verify`) and the",
           "tests (`@pytest.mark.req`) that cover it. Hardware requirements need a real NPU; a test",
           "listed against one is simulated evidence only. A *declared* entry in the proofs column is a",
           "declaration that states the requirement without a proof (a spec enumeration projected from a",
           "machine's states, listed in that machine's document); it alone does not cover a requirement.", "",
           f"**[software] requirements covered: {covered} of {total} ({100 * covered / total:.0f}%).**", ""]
    unknown = unknown_references()
    if unknown:
        out += [f"Named but not in the catalogue: {', '.join(unknown)}", ""]
    for tag in ("software", "hardware"):
        out += [f"## [{tag}]", "", "| id | title | proofs | tests |", "|---|---|---|---|"]
        for c in rows:
            if c.requirement.tag != tag:
                continue
            proofs = "<br>".join([f"`{p}`" for p in c.proofs] + [f"declared: `{d}`" for d in c.declared]) or "—"
            tests = "<br>".join(f"`{t}`" for t in c.tests[:6]) or ("**uncovered**" if tag == "software" else "—")
            if len(c.tests) > 6:
                tests += f"<br>… {len(c.tests) - 6} more"
            out.append(f"| {c.requirement.id} | {c.requirement.title} | {proofs} | {tests} |")
        out.append("")
    return "\n".join(out)
