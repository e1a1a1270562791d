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

For the shipped RequestLaneSystem the checks are written out as a module,
``calculet/machines/generated/request_lane_system_parts.py``, by ``python -m calculet.specgen`` (which ``--check``
holds to the declaration), and imported instead of generated at each start (issue #20: as the machines' hot
path, :mod:`calculet.machines.compiled`); a mutant system, or a module whose recorded shape is stale, is generated
here as before.
"""

from __future__ import annotations

import hashlib
from types import ModuleType
from typing import Any, Callable

import z3

from calculet.logic.symbolic import SymbolicVars
from calculet.machines.codegen import ExprPrinter
from calculet.machines.request_lanes import RequestLaneSystem
from calculet.machines.system import SystemDefinition, SystemView
from calculet.machines.written import GENERATED_PACKAGE, import_written, shape

__all__ = ["PartCheck", "compile_part_check", "module_source"]

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
        if isinstance(e, z3.ExprRef) and (z3.is_and(e) or z3.is_or(e)):
            # ``z3.simplify`` orders a conjunction's or disjunction's operands by term id, which depends on every
            # term made before in the process: printed in text order, the written module is the same whatever
            # ran first (``specgen --check``). The operands read only the part's own instances and cannot raise,
            # so their order changes no verdict.
            parts = sorted(self.expr(k) for k in e.children())
            return "(" + (self.AND if z3.is_and(e) else self.OR).join(parts) + ")"
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


SHAPES = ((0, 0), (0, 1), (1, 0), (1, 1))
"""The part shapes (requests, lanes) a check is generated for."""


def part_check_source(sd: SystemDefinition, requests: int, lanes: int) -> str | None:
    """The source of ``part_broken_<requests>x<lanes>(r0, l0, b0, s0)``, the check of ``sd``'s invariants on a part
    of ``requests`` ≤ 1 requests and ``lanes`` ≤ 1 lanes, or None (a larger shape, or a term the printer does not
    print)."""
    if requests > 1 or lanes > 1:
        return None
    reqs = [SymbolicVars(sd.request.definition, "_r0")][:requests]
    lns = [SymbolicVars(sd.lane.definition, "_l0")][:lanes]
    view = SystemView(reqs, lns, [z3.Int("b0")][:requests], [z3.Int("s0")][:requests])
    printer = _PartPrinter(sd)
    lines = [f"def part_broken_{requests}x{lanes}(r0, l0, b0, s0):  # {sd.name} on {requests} request(s) x "
             f"{lanes} lane(s)", "    broken = []"]
    try:
        for inv in sd.invariants:
            term = inv.predicate(view)
            term = z3.BoolVal(term) if isinstance(term, bool) else term
            lines += [f"    if not {printer.expr(z3.simplify(term))}:", f"        broken.append({inv.name!r})"]
    except TypeError:
        return None
    return "\n".join([*lines, "    return broken"]) + "\n"


def system_shape(sd: SystemDefinition) -> str:
    """What a written module of ``sd``'s part checks depends on besides the predicates' bodies: the system's name,
    its invariants' names in order and its two machines' shapes (:func:`calculet.machines.written.shape`)."""
    parts = (sd.name, tuple(inv.name for inv in sd.invariants), shape(sd.request.definition), shape(sd.lane.definition))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def module_source(sd: SystemDefinition, declaration: str) -> str:
    """The module text of ``sd``'s part checks, one function per shape of :data:`SHAPES` (None where the shape is
    left to the declared predicates): what ``python -m calculet.specgen`` writes to
    ``calculet/machines/generated/`` for the shipped RequestLaneSystem."""
    sources = {shape_: part_check_source(sd, *shape_) for shape_ in SHAPES}
    header = [
        f'"""The generated checks of {sd.name}\'s invariants on a small part — do not edit: regenerate with',
        "`python -m calculet.specgen`.",
        "",
        f"Printed from the z3 terms of the invariants declared in {declaration} by",
        "calculet.runtime.scheduling.joint_codegen (issue #20); `python -m calculet.specgen --check` fails when this",
        "file is not what the declaration produces. The joint monitor imports it instead of generating it at start.",
        '"""',
        "",
        f"DECLARATION = {declaration!r}",
        f"SHAPE = {system_shape(sd)!r}",
        "",
    ]
    body = [text for text in sources.values() if text is not None]
    table = ", ".join(f"{s!r}: {'None' if text is None else f'part_broken_{s[0]}x{s[1]}'}" for s, text in sources.items())
    return "\n".join(header) + "\n" + "\n\n".join(body) + f"\n\nCHECKS = {{{table}}}\n"


WRITTEN = f"{GENERATED_PACKAGE}.request_lane_system_parts"
"""The written module of the shipped RequestLaneSystem's part checks."""


def _written(sd: SystemDefinition) -> ModuleType | None:
    """The written module of the shipped RequestLaneSystem's part checks when ``sd`` is that system and the module
    was made for its shape; else None (a mutant system, or a stale module: then generated here, with a warning)."""
    if sd is not RequestLaneSystem.definition:
        return None
    return import_written(WRITTEN, {"SHAPE": system_shape(sd)}, f"{sd.name}'s part checks")


def compile_part_check(sd: SystemDefinition, requests: int, lanes: int) -> PartCheck | None:
    """The generated check of ``sd``'s invariants on a part of ``requests`` ≤ 1 requests and ``lanes`` ≤ 1 lanes,
    or None (a larger shape, or a term the printer does not print): the written module's for the shipped system,
    else generated and ``exec``'d now."""
    module = _written(sd)
    if module is not None:
        return module.CHECKS.get((requests, lanes))  # type: ignore[no-any-return]
    source = part_check_source(sd, requests, lanes)
    if source is None:
        return None
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<calculet joint part {sd.name} {requests}x{lanes}>", "exec"), namespace)  # noqa: S102
    return namespace[f"part_broken_{requests}x{lanes}"]  # type: ignore[no-any-return]
