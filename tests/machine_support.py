"""Small-domain helpers shared by the machine tests: parameters, argument candidates, exploration."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Iterator

from calculet.machines.core import Bool, EnumType, Int, Machine, TransitionNotAllowed, VarType

# Small parameter sets that reach every transition (short contexts, few output tokens).
PARAMS: dict[str, list[dict[str, Any]]] = {
    "RequestMachine": [dict(prompt_tokens=2, max_new_tokens=3, max_seq=8),
                       dict(prompt_tokens=1, max_new_tokens=1, max_seq=2),
                       dict(prompt_tokens=6, max_new_tokens=4, max_seq=8)],
    "KvSequenceMachine": [dict(max_seq=4, lane=0), dict(max_seq=1, lane=3)],
    "ModelMachine": [dict(generation=1)],
    "DeviceJobMachine": [dict(job_id=1, generation=1, engine=e, lanes=4) for e in
                         __import__("calculet.machines.job", fromlist=["Engine"]).Engine],
}


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
