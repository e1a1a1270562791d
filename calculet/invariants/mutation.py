"""Deliberately broken copies of declarations, to show the checker can fail.

A mutant is derived from a real declaration by editing its rows (drop or widen a guard, change
an effect, add a row), never by writing a machine by hand, so the suite tests the checker on
the very machines it proves. Structural import checks are off for mutants: the z3 checks must
find the fault and name the invariant it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from calculet.machines.core import Machine
from calculet.machines.definition import State, T, Transition
from calculet.machines.pool import Pool, PoolOp

Edit = Callable[[list[T], Any], list[T]]


def rows_of(machine: type[Machine]) -> list[T]:
    """The declaration's resolved rows as ``T`` rows again (one per source state)."""
    d = machine.definition
    states = d.states
    events = d.events
    return [T(states[t.source], events[t.event], states[t.target], guard=t.guard, effect=t.effect,
              name=t.name, choice=t.choice, emits=t.emits, doc=t.doc, policy=t.policy) for t in d.transitions]


def derive(machine: type[Machine], name: str, edit: Edit, *, states: dict[str, State] | None = None,
           properties: Callable[[list[Any]], list[Any]] | None = None) -> type[Machine]:
    """A copy of ``machine`` whose rows are ``edit(rows, definition)``; invariants unchanged unless
    ``properties`` edits the declared list; ``states`` replaces states by name (e.g. one whose
    ``terminal`` flag is dropped — rows are re-pointed at the replacements)."""
    d = machine.definition
    namespace: dict[str, Any] = {"__doc__": f"Mutant {name} of {d.name}.", "spec": d.spec,
                                 "structure_checks": False, "examples": list(d.examples)}
    replaced = {n: State(initial=s.initial, terminal=s.terminal, doc=s.doc, groups=s.groups)
                for n, s in d.states.items()}  # fresh objects: resolution names them in place
    replaced.update(states or {})
    namespace.update(replaced)
    namespace.update(d.params)
    namespace.update(d.vars)
    namespace.update(d.events)
    rows = edit(rows_of(machine), d)
    namespace["transitions"] = [_repointed(row, replaced) for row in rows]
    declared = [p for p in (*d.invariants, *d.all_step_properties)
                if not p.name.startswith("bounds_") and p.name != "terminal_is_final"]
    namespace["invariants"] = properties(declared) if properties else declared
    return type(name, (Machine,), namespace)


def _repointed(row: T, states: dict[str, State]) -> T:
    """``row`` with its source and target states looked up by name in ``states``."""
    sources = row.source if isinstance(row.source, tuple) else (row.source,)
    fresh = tuple(states[s.name] for s in sources)
    return T(fresh if isinstance(row.source, tuple) else fresh[0], row.event, states[row.target.name],
             guard=row.guard, effect=row.effect, name=row.name, choice=row.choice, emits=row.emits, doc=row.doc,
             policy=row.policy)


def replace_row(rows: list[T], transition_name: str, **changes: Any) -> list[T]:
    out = []
    found = False
    for row in rows:
        if row.name == transition_name:
            found = True
            fields = dict(source=row.source, event=row.event, target=row.target, guard=row.guard,
                          effect=row.effect, name=row.name, choice=row.choice, emits=row.emits, doc=row.doc,
                          policy=row.policy)
            fields.update(changes)
            row = T(**fields)
        out.append(row)
    if not found:
        raise KeyError(f"no row named {transition_name!r}")
    return out


def derive_pool(pool: type[Pool], name: str, ops: list[PoolOp]) -> type[Pool]:
    """A copy of ``pool`` with some pool operations replaced."""
    p = pool.definition
    replaced = {op.event: op for op in ops}
    namespace = {"__doc__": f"Mutant {name} of {p.name}.", "spec": p.spec, "instance": p.instance,
                 "params": dict(p.params), "ghosts": dict(p.ghosts),
                 "ops": [replaced.get(e, op) for e, op in p.ops.items()],
                 "invariants": list(p.invariants), "related": list(p.related)}
    return type(name, (Pool,), namespace)


@dataclass(frozen=True)
class Mutant:
    """A named fault, the machine it is applied to, and the invariant the checker must name."""

    name: str
    description: str
    build: Callable[[], Any]
    expected_invariant: str
    kind: str = "machine"  # or "pool"


__all__ = ["Mutant", "derive", "derive_pool", "replace_row", "rows_of", "Transition"]
