"""The generated rows' layout (:mod:`calculet.machines.codegen_rows`, issue #20): atoms shared between guards
computed once, and consecutive rows sharing a leading conjunct tested once, still take the first row (in
declared order) whose guard holds — for every valuation, whatever the rows' shape."""

from __future__ import annotations

import itertools
from typing import Any

import z3
from hypothesis import example, given, settings
from hypothesis import strategies as st

from calculet.machines.codegen_rows import conjuncts, row_tree_lines, shared_atom_lines

NAMES = ("a", "b", "c", "d")
VARS = [z3.Bool(n) for n in NAMES]


class _Printer:
    """Prints Boolean terms over ``VARS`` as Python reading the dict ``v`` (and ``shared`` locals)."""

    def __init__(self) -> None:
        self.shared: dict[int, str] = {}

    def expr(self, e: Any) -> str:
        if e.get_id() in self.shared:
            return self.shared[e.get_id()]
        if z3.is_not(e):
            return f"(not {self.expr(e.children()[0])})"
        if z3.is_and(e) or z3.is_or(e):
            joint = " and " if z3.is_and(e) else " or "
            return "(" + joint.join(self.expr(k) for k in e.children()) + ")"
        return f"v[{e.decl().name()!r}]"


literal = st.tuples(st.integers(0, 3), st.booleans(), st.booleans())  # (var, negated, wrapped in Or with d)
row = st.lists(literal, max_size=3)


def _term(lits: list[tuple[int, bool, bool]]) -> Any:
    parts = []
    for var, negated, with_d in lits:
        atom = z3.Not(VARS[var]) if negated else VARS[var]
        parts.append(z3.Or(atom, VARS[3]) if with_d else atom)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else z3.And(parts[0], z3.And(*parts[1:])) if len(parts) > 2 else z3.And(*parts)


@settings(max_examples=300)
@given(st.lists(row, min_size=1, max_size=6), st.booleans())
@example([[(0, False, False), (1, False, False)], [(2, False, False)], [(0, False, False)]], True)
@example([[(0, False, False)], [(0, True, False), (1, False, False)], [(0, True, False), (1, True, False)]], False)
def test_the_first_row_whose_guard_holds_is_taken(rows: list[list[tuple[int, bool, bool]]], share: bool):
    guards = [_term(lits) for lits in rows]
    printer = _Printer()
    lines = ["def pick(v):"]
    if share:
        lines += shared_atom_lines(guards, printer, "    ")
    lines += row_tree_lines([(conjuncts(g), [f"return {i}"]) for i, g in enumerate(guards)], printer, "    ")
    lines.append("    return -1")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - the code under test
    for values in itertools.product((False, True), repeat=len(NAMES)):
        v = dict(zip(NAMES, values))
        model = [z3.BoolVal(x) for x in values]
        expected = next((i for i, g in enumerate(guards)
                         if g is None or z3.is_true(z3.simplify(z3.substitute(g, *zip(VARS, model))))), -1)
        assert namespace["pick"](v) == expected, "\n".join(lines)


def test_nested_conjunctions_are_flattened_in_order():
    a, b, c, d = VARS
    assert [str(t) for t in conjuncts(z3.And(a, z3.And(b, z3.Not(c)), d))] == ["a", "b", "Not(c)", "d"]
    assert conjuncts(None) == [] and conjuncts(z3.BoolVal(True)) == []
    assert [str(t) for t in conjuncts(z3.Or(a, b))] == ["Or(a, b)"]
