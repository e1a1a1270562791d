"""A machine's states as the spec names them: the machine's own, and states derived from a runtime condition.

Why this exists (#20): a spec enumeration may name a state the declaration deliberately does not have. §9.1's
``KvSequenceState`` has Updating; the KV lane machine has none, because a lane's open step is its *binding* to the
device job writing it (:class:`~calculet.machines.job_lanes.JobLaneSystem`), kept by the KV manager, not a lane
event (one lane event per decode step instead of two). The spec's state is then a projection of (machine state,
condition). It is declared once, as a :class:`StateProjection` beside the machine, and everything is derived from
it: the enumeration (an ``enum.StrEnum``, R9.1.1), the table every reader of a reported state goes through
(``projection.of(state, condition)``), and its section of the machine's document (``python -m calculet.specgen``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from calculet.machines.definition import Group
from calculet.machines.errors import InvalidDefinition


@dataclass(frozen=True)
class DerivedState:
    """A reported state the machine does not have: any member of ``among`` while the condition holds."""

    name: str
    among: Group
    doc: str
    rid: str = ""


class StateProjection:
    """The spec's enumeration ``name`` over ``machine``: each state as itself, except that a member of a
    derived state's group is reported as the derived state while ``condition`` holds.

    ``states`` is the enumeration in order (each derived state right after the last member of its group,
    in declaration order); ``enum`` the ``StrEnum`` of it (members compare and hash equal to their names,
    so a state read as a string and as the enum agree); ``table`` maps every ``(machine state, condition)``
    to its member, and ``of`` reads it.
    """

    def __init__(self, machine: Any, name: str, *, condition: str, condition_doc: str,
                 derived: tuple[DerivedState, ...], spec: str, rid: str) -> None:
        d = machine.definition
        self.machine, self.name, self.spec, self.rid = machine, name, spec, rid
        self.condition, self.condition_doc, self.derived = condition, condition_doc, derived
        order = list(d.states)
        covered: set[str] = set()
        for extra in derived:
            members = [s for s in d.states if s in extra.among.of(machine)]
            if not members or extra.name in order or covered & set(members):
                raise InvalidDefinition(name, f"derived state {extra.name!r} needs states of its own, a new name, "
                                              "and members no other derived state has")
            covered |= set(members)
            order.insert(order.index(members[-1]) + 1, extra.name)
        self.states: tuple[str, ...] = tuple(order)
        self.enum: type[enum.StrEnum] = enum.StrEnum(name, [(s.upper(), s) for s in order],  # type: ignore[misc]
                                                     module=machine.__module__)
        reported = {s: self.enum(s) for s in order}
        self.table: dict[tuple[str, bool], enum.StrEnum] = {}
        for state in d.states:
            self.table[state, False] = reported[state]
            held = [x.name for x in derived if state in x.among.of(machine)]
            self.table[state, True] = reported[held[0] if held else state]

    def of(self, state: str, condition: bool) -> enum.StrEnum:
        """The reported state of an instance in machine state ``state`` (``condition``: e.g. its step is open)."""
        return self.table[state, condition]

    def document(self) -> list[str]:
        """The projection's section of the machine's document (specgen): the enumeration and the table."""
        out = [f"## Reported states: `{self.name}` ({self.spec}, {self.rid})", "",
               f"The spec's enumeration is a projection of the machine's state and one runtime condition, "
               f"*{self.condition}*: {self.condition_doc}",
               f"Declared once (`{self.machine.__module__}`); `{self.name}` is "
               f"{', '.join(f'`{s}`' for s in self.states)}.", "",
               f"| machine state | {self.condition}: no | {self.condition}: yes |", "|---|---|---|"]
        for state in self.machine.definition.states:
            out.append(f"| `{state}` | `{self.table[state, False]}` | `{self.table[state, True]}` |")
        out += ["", "| derived state | requirement | meaning |", "|---|---|---|"]
        out += [f"| `{x.name}` | {x.rid or '—'} | {x.doc} |" for x in self.derived]
        return out + [""]

    def references(self) -> dict[str, list[str]]:
        """R-id → what of the projection states it (traceability: declared, not a proof)."""
        refs = {self.rid: [f"{self.name} (projection of {self.machine.definition.name})"]}
        for x in self.derived:
            if x.rid:
                refs.setdefault(x.rid, []).append(f"{self.name}.{x.name} ({self.condition})")
        return refs
