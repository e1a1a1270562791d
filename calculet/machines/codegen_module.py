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

import re
from typing import Any

from calculet.logic.types import Bool, EnumType, Int
from calculet.machines.codegen import (dispatch_source, fire_each_source, fire_source, invariant_source,
                                       lifecycle_source)
from calculet.machines.definition import Definition
from calculet.machines.written import shape

__all__ = ["HOOKS", "module_source"]

COMMAND = "python -m calculet.specgen"

HOOKS = ("_exact", "_one_by_one", "_split", "_slow_init")
"""The runtime's functions the generated code calls for what its fast path does not take; set when bound."""

_PRELUDE = [
    "from __future__ import annotations",
    "",
    "from itertools import islice as _islice",
    "from typing import Any as _Any, Sequence as _Sequence",
    "",
    "from calculet.machines.written import MISSING as _M",
    "",
    "try:  # mypyc's: the compiled Instance may be subclassed by the runtime's class of the machine",
    "    from mypy_extensions import mypyc_attr as _mypyc_attr",
    "except ImportError:  # the service's install has no mypy_extensions: in plain Python it does nothing",
    "    def _mypyc_attr(*_: str, **__: object) -> _Any:  # type: ignore  # (a redefinition, for mypy)",
    "        return lambda cls: cls",
    "",
    "_MISSING = _M",
    "_int = int",
    "_draws: _Any = iter(())  # the monitor's draws: set by calculet.machines.monitor.Monitor.install",
    *(f"{hook}: _Any = None  # the runtime's exact path: set by calculet.machines.compiled.bind" for hook in HOOKS),
]

METHODS = ("fire_plain", "fire_sampled", "_check_invariants", "__init__", "snapshot")
"""The generated functions that are the instance's methods: printed in the module's ``Instance`` class (a
compiled function binds as a method only there) and named at module level as before."""


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
        *(f"{name}: _Any = None" for name in namespace),
        "",
    ]
    functions, methods = _split_methods("\n".join([dispatch, fire, each, checks, life]))
    text = "\n".join(header) + "\n" + "\n".join(functions) + "\n" + "\n".join(_instance_class(d, methods))
    return "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n") + "\n"


_TYPED = (  # the generated function heads that get their instance typed (what mypyc compiles to slot reads)
    (re.compile(r"^def (_fire_\d+|_dispatch_\d+)\(self\b"), r"def \1(self: Instance"),
    (re.compile(r"^def (_each_\d+)\(instances\b"), r"def \1(instances: _Sequence[Instance]"),
    (re.compile(r"^(_table|_ft) = \{"), r"\1: dict[str, dict[str, _Any]] = {"),
    (re.compile(r"^_each = \{"), r"_each: dict[str, _Any] = {"),
    (re.compile(r"^(def (?:fire_plain|fire_sampled|_check_invariants|snapshot)\(.*\)):"), r"\1 -> _Any:"),
    (re.compile(r"^(def __init__\(.*\)):"), r"\1 -> None:"),
    (re.compile(r"^    copy = _new\("), r"    copy: Instance = _new("),
    (re.compile(r"^    targets = \[\]"), r"    targets: list[_Any] = []"),
)


def _split_methods(text: str) -> tuple[list[str], list[str]]:
    """The printed functions, typed (``_TYPED``), split into module-level lines and the lines of the ``METHODS``
    (indented, for the class body)."""
    functions: list[str] = []
    methods: list[str] = []
    into = functions
    for line in text.splitlines():
        if line and not line[0].isspace():
            into = methods if any(line.startswith(f"def {m}(") for m in METHODS) else functions
        for pattern, replacement in _TYPED:
            line = pattern.sub(replacement, line)
        into.append(f"    {line}" if into is methods and line else line)
    return functions, methods


def _annotation(vtype: Any) -> str:
    """A declared type as mypyc's native attribute type: a tagged ``int``, a C ``bool``; an enum member stays an
    object (its class is the declaration's, bound at import)."""
    if isinstance(vtype, Int):
        return "int"
    if isinstance(vtype, Bool):
        return "bool"
    return "_Any"


def _instance_class(d: Definition, methods: list[str]) -> list[str]:
    """``Instance``: the instance's slots with their declared types and the ``METHODS``; the runtime's class of
    the machine (:func:`calculet.machines.compiled.compile_instance_type`) derives from it. Compiled by mypyc,
    it is a native class: typed slots read and written without the generic attribute lookup."""
    typed = [(n, p.type) for n, p in d.params.items()] + [(n, v.type) for n, v in d.vars.items()]
    slots = ("_state", "last_transition", *(n for n, _ in typed))
    return [
        "@_mypyc_attr(allow_interpreted_subclasses=True)",
        "class Instance:",
        f'    """{d.name}\'s instance: its state, last row, parameters and variables, typed as declared."""',
        "",
        f"    __slots__ = {slots!r}",
        "",
        "    _state: str",
        "    last_transition: _Any",
        *(f"    {name}: {_annotation(vtype)}" for name, vtype in typed),
        "",
        *methods,
        "",
        *(f"{m} = Instance.{m}" for m in METHODS),
        "_new: _Any = Instance.__new__  # object's, or the compiled class's allocator (no __init__)",
    ]


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

