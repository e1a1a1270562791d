"""A declaration's whole generated hot path as the text of one Python module (issue #20).

:mod:`.codegen` prints the pieces — the dispatch functions and their tables, ``fire``, ``fire_each``, the
invariant check, ``__init__`` and ``snapshot`` — from the z3 terms of the declared guards and effects. This module
puts them in one module text: a header saying it is generated, from which declaration and by which command; the
declaration's :func:`~calculet.machines.written.shape`; the objects the code reads that are not literals (a row's
:class:`~calculet.machines.definition.Transition`, an enum class, a type's exact check, an initial value) as
``BINDINGS`` — each a recipe that finds the object in the declaration, resolved when the module is bound
(:func:`calculet.machines.compiled.bind`) — then the functions in declaration order.

The same text serves both forms: ``python -m calculet.specgen`` writes it to ``calculet/machines/generated/`` for
the shipped declarations, which the runtime imports; any other declaration (a test's machine, a mutant) has it
``exec``'d at import. So the conformance tests, run on both, judge one generator. The text has no timestamp and
no path, and its order follows the declaration, so a changed row changes a few lines.
"""

from __future__ import annotations

from typing import Any

from calculet.logic.types import EnumType
from calculet.machines.codegen import (dispatch_source, fire_each_source, fire_source, invariant_source,
                                       lifecycle_source)
from calculet.machines.definition import Definition
from calculet.machines.written import shape

__all__ = ["HOOKS", "module_source"]

COMMAND = "python -m calculet.specgen"

HOOKS = ("_exact", "_one_by_one", "_split", "_slow_init")
"""The runtime's functions the generated code calls for what its fast path does not take; set when bound."""

_PRELUDE = [
    "from itertools import islice as _islice",
    "",
    "from calculet.machines.written import MISSING as _M",
    "",
    "_MISSING = _M",
    "_int = int",
    "_new = object.__new__",
    "_draws = iter(())  # the monitor's draws: set by calculet.machines.monitor.Monitor.install",
    f"{' = '.join(HOOKS)} = None  # the runtime's exact paths: set by calculet.machines.compiled.bind",
]


def module_source(d: Definition, declaration: str) -> str:
    """The module text of ``d``'s hot path; ``declaration`` is the declaring class's qualified name."""
    namespace: dict[str, Any] = {}
    # the same order as when each piece was exec'd on its own: z3 builds (and numbers) the terms in this order
    dispatch = dispatch_source(d, namespace)
    fire = fire_source(d)
    each = fire_each_source(d, namespace)
    checks = invariant_source(d)
    life = lifecycle_source(d, namespace)
    bindings = [f"    {name!r}: {_recipe(d, name, value)!r}," for name, value in namespace.items()]
    header = [
        f'"""The generated hot path of {d.name} — do not edit: regenerate with `{COMMAND}`.',
        "",
        f"Printed from the z3 terms of the guards and effects declared in {declaration} by",
        "calculet.machines.codegen_module (issue #20); `python -m calculet.specgen --check` fails when this file is",
        "not what the declaration produces. The runtime imports it (calculet.machines.compiled) instead of",
        "generating it at each start.",
        '"""',
        "",
        *_PRELUDE,
        "",
        f"DECLARATION = {declaration!r}",
        f"SHAPE = {shape(d)!r}",
        "",
        "BINDINGS = {  # name: where the object is found in the declaration (calculet.machines.codegen_module)",
        *bindings,
        "}",
        "",
    ]
    body = "\n".join(["", dispatch, fire, each, checks, life])
    text = "\n".join(header) + body
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n") + "\n"


def _types(d: Definition) -> list[tuple[tuple[str, ...], Any]]:
    """Every typed name of ``d`` with its path: ("param", p), ("var", v), ("arg", event, a)."""
    out: list[tuple[tuple[str, ...], Any]] = [(("param", n), p.type) for n, p in d.params.items()]
    out += [(("var", n), v.type) for n, v in d.vars.items()]
    out += [(("arg", e, a), t) for e, ev in d.events.items() for a, t in ev.args.items()]
    return out


def _recipe(d: Definition, name: str, value: Any) -> tuple[Any, ...]:
    """Where ``value`` (bound to ``name`` in the generated namespace) is found in ``d``: the inverse of
    :func:`calculet.machines.compiled.resolve_binding`."""
    if name.startswith(("_row_", "_each_row_")):
        return ("row", next(i for i, t in enumerate(d.transitions) if t is value))
    if name.startswith("_init_"):
        return ("init", list(d.vars)[int(name.removeprefix("_init_"))])
    for path, vtype in _types(d):
        if name.startswith("_enum_") and isinstance(vtype, EnumType) and vtype.enum_cls is value:
            return ("enum", *path)
        if name.startswith("_check_") and vtype.check == value:
            return ("check", *path)
    raise ValueError(f"{d.name}: no recipe for the generated name {name!r}")

