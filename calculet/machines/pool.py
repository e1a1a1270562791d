"""Pool declarations: N instances of one machine plus the pool's own rules.

A pool is where per-instance proofs stop being enough: "a seq_id holds at most one lane",
"reserved tokens never exceed the budget" speak of all lanes at once. A pool declaration names
the instance machine, pool parameters (budgets), per-instance ghost variables, the pool-level
guard and ghost effect of each instance event, and pool invariants. The formal checks prove the
invariants by induction (one instance moves, the others are arbitrary) and search for
counterexamples by bounded model checking — all from this declaration and the instance
machine's own, with nothing restated.

Pool invariants must be symmetric in the instances (they quantify over all of them or over all
pairs); that is what lets the induction move only instance 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from calculet.logic.types import Int
from calculet.machines.core import Machine
from calculet.machines.errors import InvalidDefinition


@dataclass(frozen=True)
class PoolOp:
    """Pool-level rules for one event of the instance machine.

    ``guard(pool, i, **args)`` must hold in addition to the instance's own guard;
    ``ghost(pool, i, **args)`` returns updated ghost variables of instance ``i``.
    """

    event: str
    guard: Callable[..., Any] | None = None
    ghost: Callable[..., dict[str, Any]] | None = None
    doc: str = ""


@dataclass(frozen=True)
class PoolInvariant:
    """A pool predicate; ``rejects`` are negative witnesses (``{"params": {...}, "lanes": [{...}],
    "ghosts": [{...}]}``, partial; lanes default to the instance's initial state) it must be false on."""

    rid: str
    name: str
    predicate: Callable[[Any], Any]
    doc: str = ""
    rejects: tuple[Mapping[str, Any], ...] = ()


class PoolView:
    """What pool guards and invariants read: ``pool.lanes[j]``, ``pool.<param>``, ``pool.ghost(j, name)``.

    Works on concrete instances (the runtime's pool) and on z3 terms (the checks) alike.
    """

    def __init__(self, lanes: list[Any], params: dict[str, Any], ghosts: list[dict[str, Any]]) -> None:
        self.lanes = lanes
        self._params = params
        self._ghosts = ghosts

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("_params", {})
        if name in params:
            return params[name]
        raise AttributeError(f"pool has no parameter {name!r}")

    def ghost(self, lane: int, name: str) -> Any:
        return self._ghosts[lane][name]

    def others(self, lane: int) -> list[int]:
        return [j for j in range(len(self.lanes)) if j != lane]


@dataclass(frozen=True)
class PoolDefinition:
    name: str
    doc: str
    spec: str
    instance: type[Machine]
    params: dict[str, Int]
    ghosts: dict[str, Int]
    ops: dict[str, PoolOp]
    invariants: tuple[PoolInvariant, ...]
    related: tuple[tuple[str, str, str], ...] = field(default=())


class Pool:
    """Base of pool declarations; subclassing resolves and checks the declaration."""

    definition: ClassVar[PoolDefinition]
    instance: ClassVar[type[Machine]]
    spec: ClassVar[str] = ""
    params: ClassVar[dict[str, Int]] = {}
    ghosts: ClassVar[dict[str, Int]] = {}
    ops: ClassVar[list[PoolOp]] = []
    invariants: ClassVar[list[PoolInvariant]] = []
    # Per-instance properties that also hold pool-wide because every instance obeys them:
    # (machine name, invariant name, why it lifts) — listed in the report, proved per machine.
    related: ClassVar[list[tuple[str, str, str]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        d = cls.instance.definition
        ops = {}
        for op in cls.ops:
            if op.event not in d.events:
                raise InvalidDefinition(cls.__name__, f"pool op names unknown event {op.event!r} of {d.name}")
            ops[op.event] = op
        for event in d.events:
            ops.setdefault(event, PoolOp(event))
        cls.definition = PoolDefinition(
            name=cls.__name__, doc=(cls.__doc__ or "").strip(), spec=cls.spec, instance=cls.instance,
            params=dict(cls.params), ghosts=dict(cls.ghosts), ops=ops, invariants=tuple(cls.invariants),
            related=tuple(cls.related))
