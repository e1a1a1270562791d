"""The declaration core: a machine is declared once, as data, and everything else is derived.

A declaration is a subclass of :class:`Machine` whose body lists (elements from
:mod:`calculet.machines.definition`, bounded types from :mod:`calculet.logic.types`)

* ``State`` objects (one ``initial``; ``terminal`` ones are entered once and never left),
* ``Param`` (fixed at creation) and ``Var`` (changed only by effects) with bounded types,
* ``Event`` objects with typed arguments,
* ``transitions``: ``T(source, event, target, guard=..., effect=...)`` rows,
* ``invariants``: named state predicates and ``StepProperty`` predicates over (pre, post).

Guards, effects and invariants are plain callables over a *variables view* ``v`` (a live
instance, or its z3 twin) and the event's arguments, written with the helpers of
:mod:`calculet.logic.expr` so that the same code evaluates concretely and symbolically.
Effects are pure: they return the updated variables as a dict.

Creating the subclass resolves and checks it (:mod:`calculet.machines.resolution`; faults are
``InvalidDefinition`` at import) and derives a compiled dispatch table
(:mod:`calculet.machines.compiled`) and a python-statemachine reference class
(:mod:`calculet.machines.reference`). The z3 checks (:mod:`calculet.invariants`) and the
documents in ``specs/`` (:mod:`calculet.specgen`) read the same ``definition``. This module is
the only one that knows all of these forms, so it sits above them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable

from calculet.machines.compiled import CompiledInstance, compile_instance_type
from calculet.machines.definition import Definition, Invariant, StepProperty, T
from calculet.machines.reference import ReferenceMachine, build_reference_class
from calculet.machines.resolution import check, resolve

__all__ = ["Machine"]


class Machine:
    """Base class of every declaration. Subclassing it resolves, checks and compiles the machine."""

    definition: ClassVar[Definition]
    spec: ClassVar[str] = ""
    # Small parameter sets (short contexts, few tokens) that reach every row: used for witness
    # paths, bounded exploration and the documents' examples.
    examples: ClassVar[list[dict[str, Any]]] = [{}]
    transitions: ClassVar[Iterable[T]] = ()
    invariants: ClassVar[Iterable[Invariant | StepProperty]] = ()
    Instance: ClassVar[type[CompiledInstance]]
    Reference: ClassVar[type[ReferenceMachine] | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.definition = resolve(cls)
        structure = cls.__dict__.get("structure_checks", True)
        check(cls.definition, structure=structure)
        cls.Instance = compile_instance_type(cls.definition, cls)
        # python-statemachine validates the graph itself; a mutant skips it like ours.
        cls.Reference = build_reference_class(cls.definition) if structure else None

    @classmethod
    def create(cls, **params: Any) -> Any:
        """A new compiled instance (the runtime's form) in the initial state."""
        return cls.Instance(**params)

    @classmethod
    def reference(cls, **params: Any) -> Any:
        """A new python-statemachine instance (the reference semantics, for conformance tests)."""
        return cls.Reference(**params)  # type: ignore[misc]  # None only for a mutant
