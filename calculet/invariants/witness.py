"""Concrete witnesses: for every declared transition, a path from a fresh instance that takes it.

Breadth-first over concrete configurations; at each one z3 supplies arguments that enable each
row (:func:`solve_arguments`), so rows guarded by exact matches (a job id) are found without
guessing. The paths drive the directed conformance tests and show that no row is dead in
practice, not only satisfiable in the abstract.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from calculet.logic.symbolic import solve_arguments

Step = tuple[str, dict[str, Any]]


def _key(inst: Any) -> tuple:
    return (inst.state, tuple(sorted((k, repr(v)) for k, v in inst.values().items())))


def witness_paths(machine: Any, param_sets: Iterable[dict[str, Any]],
                  max_configurations: int = 5000, variants: int = 2) -> tuple[dict[str, tuple[dict[str, Any], list[Step]]], set[str]]:
    """``{transition name: (params, [(event, args), ...])}`` and the names no search reached.

    ``variants`` distinct argument sets are tried per row, so a choice made early (a small
    reservation, say) does not hide the rows that need another.
    """
    d = machine.definition
    wanted = {t.name for t in d.transitions}
    found: dict[str, tuple[dict[str, Any], list[Step]]] = {}
    for params in param_sets:
        start = machine.create(**params)
        paths: dict[tuple, list[Step]] = {_key(start): []}
        todo = deque([start])
        while todo and len(paths) < max_configurations and len(found) < len(wanted):
            inst = todo.popleft()
            path = paths[_key(inst)]
            for t in d.transitions_from(inst.state):
                tried: list[dict[str, Any]] = []
                for _ in range(variants if d.events[t.event].args else 1):
                    args = solve_arguments(inst, t, avoid=tried)
                    if args is None:
                        break
                    tried.append(args)
                    nxt = inst.snapshot()
                    nxt.fire(t.event, **args)
                    step_path = path + [(t.event, args)]
                    if t.name not in found:
                        found[t.name] = (params, step_path)
                    k = _key(nxt)
                    if k not in paths:
                        paths[k] = step_path
                        todo.append(nxt)
    return found, wanted - set(found)
