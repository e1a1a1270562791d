"""Small-domain helpers shared by the machine tests: parameters, argument candidates, exploration."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Iterator

from calculet.logic.types import Bool, EnumType, Int, VarType
from calculet.machines import ALL_MACHINES
from calculet.machines.core import Machine
from calculet.machines.errors import TransitionNotAllowed

# The declarations' own small parameter sets (they reach every row).
PARAMS: dict[str, list[dict[str, Any]]] = {m.definition.name: list(m.definition.examples) for m in ALL_MACHINES}


def candidates(typ: VarType, current: list[Any]) -> list[Any]:
    """Valid and invalid values of a type, biased toward the instance's current numbers."""
    if isinstance(typ, Bool):
        return [False, True]
    if isinstance(typ, EnumType):
        return list(typ.enum_cls)
    assert isinstance(typ, Int)
    base = {-1, 0, 1, 2, 3}
    base |= {c for c in current if isinstance(c, int) and not isinstance(c, bool)}
    return sorted(base)


def arg_sets(machine: type[Machine], event: str, inst: Any) -> Iterator[dict[str, Any]]:
    ev = machine.definition.events[event]
    numbers = [x for x in list(inst.values().values()) + list(inst.params().values())]
    pools = [candidates(t, numbers) for t in ev.args.values()]
    for combo in itertools.product(*pools):
        yield dict(zip(ev.args, combo))


def key(inst: Any) -> tuple:
    return (inst.state, tuple(sorted((k, int(v)) for k, v in inst.values().items())))


def explore(machine: type[Machine], params: dict[str, Any], limit: int = 400) -> list[Any]:
    """Breadth-first over reachable configurations with small arguments (a bounded state space)."""
    start = machine.create(**params)
    seen = {key(start): start}
    todo = deque([start])
    while todo and len(seen) < limit:
        inst = todo.popleft()
        for event in machine.definition.events:
            for args in arg_sets(machine, event, inst):
                nxt = inst.snapshot()
                try:
                    nxt.fire(event, **args)
                except TransitionNotAllowed:
                    continue
                k = key(nxt)
                if k not in seen:
                    seen[k] = nxt
                    todo.append(nxt)
    return list(seen.values())
