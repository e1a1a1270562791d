"""The rows of one (state, event) in the generated hot path: shared atoms once, rows as a tree of their tests.

Split from :mod:`.codegen` (size limits): :mod:`.codegen` prints a declaration's guards and effects as
Python; this module decides how the rows of one (state, event) are laid out so that the usual row costs
few tests — the atoms several guards read computed once into locals (:func:`shared_atom_lines`), and
consecutive rows whose guards begin with the same conjunct sharing one test of it
(:func:`row_tree_lines`). Both keep the declared semantics exactly: the first row (in declared order)
whose guard holds is the one taken; the conformance tests hold the generated code to the reference class.
"""

from __future__ import annotations

from typing import Any, Protocol

import z3

from calculet.logic.symbolic import SymbolicVars
from calculet.machines.definition import Transition


class Printer(Protocol):
    """What the layout needs of :class:`~calculet.machines.codegen.ExprPrinter`: print a term, honouring
    ``shared`` (term id → the local holding its value)."""

    shared: dict[int, str]

    def expr(self, e: Any) -> str: ...


def guard_term(t: Transition, v: SymbolicVars, args: dict[str, Any]) -> Any:
    """The row's guard as a z3 term (None: no guard)."""
    return None if t.guard is None else t.guard(v, *[args[n] for n in t.guard_args])


_CONNECTIVES = frozenset({z3.Z3_OP_AND, z3.Z3_OP_OR, z3.Z3_OP_NOT, z3.Z3_OP_IMPLIES})


def _atoms(term: Any, out: list[Any]) -> None:
    """The atoms of a guard term — its subterms right below the Boolean connectives (comparisons, flags)."""
    if not isinstance(term, z3.ExprRef) or z3.is_true(term) or z3.is_false(term):
        return
    if term.decl().kind() in _CONNECTIVES:
        for kid in term.children():
            _atoms(kid, out)
    else:
        out.append(term)


def shared_atom_lines(guards: list[Any], tr: Printer, indent: str) -> list[str]:
    """Each atom read by more than one of a (state, event)'s row guards, computed once into a local
    (``_g<k> = <atom>``) that ``tr`` then prints in its place (``tr.shared``).

    Why: the rows are tried in declared order and each repeats the conjuncts the others share (a decode
    result's five rows each compare the job and read both flags: ~25 attribute reads for the last row,
    the usual one), once per lane per step (issue #20). Evaluating an atom before the rows cannot change
    what a row decides: atoms are linear comparisons and reads of the instance's variables and the
    accepted arguments — they cannot raise — and nothing is written before a row is taken."""
    counts: dict[int, int] = {}
    terms: dict[int, Any] = {}
    for guard in guards:
        found: list[Any] = []
        _atoms(guard, found)
        for atom in found:
            counts[atom.get_id()] = counts.get(atom.get_id(), 0) + 1
            terms[atom.get_id()] = atom
    tr.shared = {}
    lines: list[str] = []
    shared: dict[int, str] = {}
    for key, count in counts.items():
        text = tr.expr(terms[key])
        if count > 1 and not text.isidentifier():  # a bare local is read as cheaply as its copy would be
            shared[key] = f"_g{len(lines)}"
            lines.append(f"{indent}{shared[key]} = {text}")
    tr.shared = shared
    return lines


def conjuncts(term: Any) -> list[Any]:
    """A guard term as its conjuncts, nested ``And``s flattened in order (no guard, or ``True``: none)."""
    if term is None or not isinstance(term, z3.ExprRef) or z3.is_true(term):
        return []
    if z3.is_and(term):
        return [c for kid in term.children() for c in conjuncts(kid)]
    return [term]


def row_tree_lines(rows: list[tuple[list[Any], list[str]]], tr: Printer, indent: str) -> list[str]:
    """Rows tried in declared order — each (its guard's conjuncts, the lines that apply it and leave with
    ``continue`` or ``return``) — as nested ``if``s: consecutive rows whose guards start with the same
    conjunct share one test of it, recursively (a decode result's last row, the usual one, tests the job
    and each flag once instead of once per row before it; issue #20). The first row whose guard holds
    is still the one taken: a shared conjunct that is false rules out every row in its group, and
    within a group the rows keep their order."""
    lines: list[str] = []
    i = 0
    while i < len(rows):
        terms, body = rows[i]
        j = i + 1
        while j < len(rows) and terms and rows[j][0] and rows[j][0][0].get_id() == terms[0].get_id():
            j += 1
        if not terms:
            lines += [indent + line for line in body]
        elif j == i + 1:  # alone: its remaining conjuncts in one test
            lines.append(f"{indent}if {' and '.join(tr.expr(c) for c in terms)}:")
            lines += [indent + "    " + line for line in body]
        else:
            lines.append(f"{indent}if {tr.expr(terms[0])}:")
            lines += row_tree_lines([(c[1:], b) for c, b in rows[i:j]], tr, indent + "    ")
        i = j
    return lines
