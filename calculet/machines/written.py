"""Where a declared machine's generated hot path is written, and how its import is matched to the declaration.

The hot path of each machine (``fire``, ``fire_each``, ``__init__``, ``snapshot``, the dispatch functions and the
invariant check) is Python printed from the z3 terms of its declared guards and effects
(:mod:`calculet.machines.codegen`). It used to be printed and ``exec``'d at every import; it is now written out
as importable source under :mod:`calculet.machines.generated` by ``python -m calculet.specgen`` (issue #20: a
module on disk can be compiled — mypyc — where an ``exec``'d string cannot, and the service no longer prints and
compiles it at each start). The declaration stays the single source: ``specgen --check`` (CI) and
``tests/unit/machines/test_generated.py`` fail when a written module is not what the declaration produces.

This module is what the runtime needs to use a written module without generating anything — so it imports no z3:
the module's name for a declaration (:func:`module_name`), the sentinel the generated code compares arguments
with (:data:`MISSING`), and the declaration's *shape* (:func:`shape`): its names, rows, types and initial values,
which the written module records, so that a module left behind by a renamed row or a changed bound is not bound
to the new declaration (the machine is then generated at import as before, with a warning). The shape does not
see a guard's or an effect's body (only z3 can read those); that drift is what ``--check`` and the test catch.
"""

from __future__ import annotations

import hashlib
import importlib
import warnings
from types import ModuleType
from typing import Any

__all__ = ["GENERATED_PACKAGE", "MISSING", "import_written", "module_name", "shape", "snake_name"]

GENERATED_PACKAGE = "calculet.machines.generated"
"""The package that holds one written module per shipped declaration."""

SHIPPED_PREFIX = "calculet.machines."
"""Only declarations of the package itself have written modules; any other (a test's machine, a mutant of
:mod:`calculet.invariants.mutation`) is generated at import."""


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
"""An argument or parameter the caller did not pass (the generated ``fire``'s and ``__init__``'s default)."""


def snake_name(class_name: str) -> str:
    """``KvSequenceMachine`` → ``kv_sequence``: the name of its written module (and of its document in ``specs/``)."""
    name = class_name.removesuffix("Machine")
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def module_name(declaration: type) -> str | None:
    """The written module a declaration class would use, or None (not one of the package's declarations)."""
    if not declaration.__module__.startswith(SHIPPED_PREFIX):
        return None
    return f"{GENERATED_PACKAGE}.{snake_name(declaration.__name__)}"


def import_written(name: str, expected: dict[str, str], what: str, stacklevel: int = 3) -> ModuleType | None:
    """The written module ``name`` if it exists and records ``expected`` (its ``DECLARATION``/``SHAPE``), else None.

    Shared by the machines, the KV pool's guard and the request-lane system's part checks: a module made for
    another shape (a declaration edited without ``specgen``) is never run; the caller then generates ``what`` at
    import, and the warning names the command that rewrites the module."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None
    if any(getattr(module, key, None) != value for key, value in expected.items()):
        warnings.warn(f"{name} is stale (made for another shape): generating {what} at import; run "
                      "`python -m calculet.specgen` to rewrite it",
                      stacklevel=stacklevel)
        return None
    return module


def qualified(declaration: type) -> str:
    """``calculet.machines.request.RequestMachine``: what a written module names as its declaration."""
    return f"{declaration.__module__}.{declaration.__qualname__}"


LAYOUT = 2
"""The generated modules' layout, part of every shape: 2 since the instance is the module's typed ``Instance``
class (issue #20, session 24), so a module of an older layout is regenerated at import, never run."""


def shape(d: Any) -> str:
    """A digest of what the generated code depends on besides guard and effect bodies: states, parameters and
    variables with their types and initial values, events with their argument types, rows (name, source,
    event, target, the arguments the guard and effect read) in order, and the invariants' names. Cheap and
    without z3, so the runtime checks it at each import of a written module."""
    parts: list[Any] = [
        LAYOUT, d.name, tuple(d.states), d.initial, tuple(sorted(d.terminal)),
        tuple((n, p.type.describe()) for n, p in d.params.items()),
        tuple((n, v.type.describe(), repr(v.initial())) for n, v in d.vars.items()),
        tuple((n, tuple((a, t.describe()) for a, t in ev.args.items())) for n, ev in d.events.items()),
        tuple((t.name, t.source, t.event, t.target, t.guard_args, t.effect_args, t.guard is None, t.effect is None)
              for t in d.transitions),
        tuple(inv.name for inv in d.invariants), tuple(sp.name for sp in d.step_properties),
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
