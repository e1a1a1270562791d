"""The three ways a declared machine refuses: a wrong declaration, an event it does not allow,
a broken invariant.

They live apart from the declaration elements so that every layer that raises or catches them
(resolution at import, the compiled and reference forms, the run-time monitor, the runtime's
registry) imports them without importing the machinery that derives a machine. They sit in the
one error tree (DESIGN principle 5): a definition fault is the developer's, a refused event is a
409 conflict (§4: a terminal state is never left, an event outside its states is refused).
"""

from __future__ import annotations

from typing import Any, Mapping

from calculet.errors import CalculetError, DefinitionError

__all__ = ["InvalidDefinition", "InvariantViolation", "TransitionNotAllowed"]


class InvalidDefinition(DefinitionError):
    """A declaration is wrong (unreachable state, unknown name, ...); raised at import."""

    def __init__(self, machine: str, fault: str) -> None:
        super().__init__(f"{machine}: {fault}", machine=machine, fault=fault)
        self.machine = machine
        self.fault = fault


class TransitionNotAllowed(CalculetError):
    """An event with no enabled transition; the instance's state and variables are unchanged."""

    http_status = 409
    code = "transition_not_allowed"

    def __init__(self, machine: str, state: str, event: str, reason: str) -> None:
        super().__init__(f"{machine}: event {event!r} not allowed in state {state!r}: {reason}",
                         machine=machine, state=state, event=event, reason=reason)
        self.machine = machine
        self.state = state
        self.event = event
        self.reason = reason


class InvariantViolation(DefinitionError):
    """A run-time monitor found a declared invariant false after a transition."""

    code = "invariant_violation"

    def __init__(self, machine: str, invariant: str, rid: str, transition: str,
                 pre: Mapping[str, Any], post: Mapping[str, Any]) -> None:
        super().__init__(
            f"{machine}: invariant {invariant} ({rid}) broken by {transition}: pre={dict(pre)} post={dict(post)}",
            machine=machine, invariant=invariant, rid=rid, transition=transition)
        self.machine = machine
        self.invariant = invariant
        self.rid = rid
        self.transition = transition
        self.pre = dict(pre)
        self.post = dict(post)
