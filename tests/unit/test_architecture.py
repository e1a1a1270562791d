"""The architecture as tests (issue #16; DESIGN "Layout"): no import cycle anywhere, and rooms small
enough to hold in one's head.

The layer contracts themselves are import-linter's (``[tool.importlinter]`` in pyproject.toml, run by
``lint-imports`` in ``.ci/run`` and here, so ``make test`` catches an upward import too). This file adds
what import-linter does not state: a repository-wide cycle check — a cycle between two modules of one
package is as much a tangle as one between layers — and the size limits that keep one idea to a file.
A size exception is allowed only with its reason written next to it in ``SIZE_EXCEPTIONS``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "calculet"

MODULE_LINES = 600
CLASS_LINES = 400
FUNCTION_LINES = 60

# qualified name ("calculet/x/y.py" for a module, "calculet/x/y.py::Class.method" otherwise) → why it
# reads better whole than split.
SIZE_EXCEPTIONS: dict[str, str] = {}

GENERATED = PACKAGE / "machines" / "generated"
"""Printed by ``python -m calculet.specgen`` from the declarations (docs/machines_codegen.md): their size follows the
declarations', which the limits above already hold; nobody writes or reads them as rooms."""


def _strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over module → imported module edges (iterative: the graph is deep)."""
    modules = sorted(m for m in graph.modules if m.startswith("calculet"))
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i.startswith("calculet"))
             for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components



def test_no_import_cycle_anywhere_in_calculet() -> None:
    graph = grimp.build_graph("calculet")
    cycles = _strongly_connected(graph)
    described = []
    for component in cycles:
        members = set(component)
        edges = [f"{a} -> {b}" for a in component
                 for b in sorted(graph.find_modules_directly_imported_by(a)) if b in members]
        described.append("\n    ".join(edges))
    assert not cycles, "import cycles:\n  " + "\n  ".join(described)


def test_lint_imports_contracts_are_kept() -> None:
    executable = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert executable, "lint-imports (import-linter) is a test dependency; reinstall with '.[test]'"
    result = subprocess.run([executable, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def _sizes() -> list[tuple[str, int, int]]:
    """(qualified name, lines, limit) of every module, class and function in calculet/."""
    found: list[tuple[str, int, int]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        found.append((rel, len(text.splitlines()), MODULE_LINES))
        tree = ast.parse(text)

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    found.append((f"{rel}::{name}", child.end_lineno - child.lineno + 1, CLASS_LINES))
                    visit(child, name + ".")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}{child.name}"
                    found.append((f"{rel}::{name}", child.end_lineno - child.lineno + 1, FUNCTION_LINES))
                    visit(child, name + ".")

        visit(tree, "")
    return found


def test_modules_classes_and_functions_stay_within_their_size() -> None:
    over = [f"{name}: {lines} lines (limit {limit})" for name, lines, limit in _sizes()
            if lines > limit and name not in SIZE_EXCEPTIONS]
    assert not over, "split by responsibility, or name the exception and why in SIZE_EXCEPTIONS:\n" + "\n".join(over)


def test_every_size_exception_is_still_needed() -> None:
    sizes = {name: (lines, limit) for name, lines, limit in _sizes()}
    stale = [name for name in SIZE_EXCEPTIONS if name not in sizes or sizes[name][0] <= sizes[name][1]]
    assert not stale, f"size exceptions that no longer apply (remove them): {stale}"


@pytest.mark.parametrize("folder", ["unit", "property", "integration", "service"])
def test_test_folders_are_packages(folder: str) -> None:
    """Test modules are named after what they test; packages keep equal basenames apart."""
    for directory in [ROOT / "tests" / folder, *sorted((ROOT / "tests" / folder).rglob("*/"))]:
        if directory.name == "__pycache__" or not any(directory.glob("test_*.py")):
            continue
        assert (directory / "__init__.py").exists(), f"{directory.relative_to(ROOT)} has no __init__.py"
