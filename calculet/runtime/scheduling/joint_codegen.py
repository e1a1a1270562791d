"""The requests × lanes invariants on a part of one request and one lane, generated (issue #20).

The joint monitor (:mod:`.joint_checks`) splits what moved into connected parts — usually one request and its
lane — and judges each declared RequestLaneSystem invariant as the conjunction over the parts. Walking the
declared predicates through the expression helpers per part and per invariant was about half of the host CPU of
a B16 run with every event checked (the test suite's setting: 0.45 of 0.94 s profiled). As the machines' own
invariants are compiled (``codegen.invariant_source``), this evaluates each declared predicate once on a
symbolic view of the part's shape (at most one request, at most one lane; the request's binding and seq id
symbolic) and prints the z3 terms as straight-line Python: the runtime executes the formula the declaration
states, not a hand-written copy. A shape with more instances, or a term outside the printable fragment, is left
to the declared predicates (``None``). The tests compare the generated verdict with the declared predicates on
random parts.
"""

from __future__ import annotations

from typing import Any, Callable

import z3

from calculet.logic.symbolic import SymbolicVars
from calculet.machines.codegen import ExprPrinter
from calculet.machines.system import SystemDefinition, SystemView

__all__ = ["PartCheck", "compile_part_check"]

PartCheck = Callable[[Any, Any, int, int], list[str]]
"""``broken(r0, l0, b0, s0)``: the invariants false on the part of request ``r0`` (its binding ``b0``: 0 for the
part's lane, else NONE or ELSEWHERE; its seq id ``s0``) and lane ``l0``; an absent instance is passed as None."""


class _PartPrinter(ExprPrinter):
    """Python for a term over one request (``<var>_r0``, ``state_r0``) and one lane (``_l0``)."""

    def __init__(self, sd: SystemDefinition) -> None:
        super().__init__(sd.request.definition, set())
        self.machines = {"r0": sd.request.definition, "l0": sd.lane.definition}

    def symbol(self, name: str) -> str:
        if name in ("b0", "s0"):
            return name
        for tag in self.machines:
            if name == f"state_{tag}":
                return f"{tag}.state"
            if name.endswith(f"_{tag}"):
                return f"{tag}.{name[: -len(tag) - 1]}"
        raise TypeError(f"unknown symbol {name!r} in a joint part")

    def expr(self, e: Any) -> str:
        if isinstance(e, z3.ExprRef) and z3.is_eq(e):
            left, right = e.children()
            for tag, d in self.machines.items():
                if z3.is_const(left) and left.decl().name() == f"state_{tag}" and z3.is_int_value(right):
                    return f"({tag}.state == {list(d.states)[right.as_long()]!r})"
        return super().expr(e)

    def _enum_of(self, e: Any) -> Any:
        if z3.is_const(e) and any(e.decl().name() == f"{v}_r0" for v, decl in self.machines["r0"].vars.items()
                                  if type(decl.type).__name__ == "EnumType"):
            raise TypeError("an enum variable in a joint invariant: left to the declared predicate")
        return None


def compile_part_check(sd: SystemDefinition, requests: int, lanes: int) -> PartCheck | None:
    """The generated check of ``sd``'s invariants on a part of ``requests`` ≤ 1 requests and ``lanes`` ≤ 1 lanes,
    or None (a larger shape, or a term the printer does not print)."""
    if requests > 1 or lanes > 1:
        return None
    reqs = [SymbolicVars(sd.request.definition, "_r0")][:requests]
    lns = [SymbolicVars(sd.lane.definition, "_l0")][:lanes]
    view = SystemView(reqs, lns, [z3.Int("b0")][:requests], [z3.Int("s0")][:requests])
    printer = _PartPrinter(sd)
    lines = [f"def part_broken(r0, l0, b0, s0):  # {sd.name} on {requests} request(s) x {lanes} lane(s)",
             "    broken = []"]
    try:
        for inv in sd.invariants:
            term = inv.predicate(view)
            term = z3.BoolVal(term) if isinstance(term, bool) else term
            lines += [f"    if not {printer.expr(z3.simplify(term))}:", f"        broken.append({inv.name!r})"]
    except TypeError:
        return None
    source = "\n".join([*lines, "    return broken"]) + "\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<calculet joint part {sd.name} {requests}x{lanes}>", "exec"), namespace)  # noqa: S102
    return namespace["part_broken"]  # type: ignore[no-any-return]
