"""Expression helpers that work on plain values *and* on z3 terms.

Guards, effects and invariants are written once (DESIGN: declare once) and evaluated two ways:
concretely on the runtime's hot path and symbolically by the formal checks. Python's own
``and``/``or``/``not``/``if`` call ``bool()`` on their operands, which raises on a z3 term, and
``x in (1, 2)`` silently answers False for one — so declarations use these helpers instead.

On plain values every helper evaluates all of its operands (no short-circuit): expressions in
declarations must therefore be total, which is also what makes them encodable.
"""

from __future__ import annotations

from typing import Any, Iterable

import z3

__all__ = ["And", "Or", "Not", "Implies", "If", "In", "Max", "Min", "is_symbolic"]


def is_symbolic(*values: Any) -> bool:
    """True when any operand is a z3 term, i.e. the expression is being encoded, not evaluated."""
    for value in values:
        if isinstance(value, z3.ExprRef):
            return True
    return False


def And(*operands: Any) -> Any:
    if is_symbolic(*operands):
        return z3.And(*operands)
    for operand in operands:
        if not operand:
            return False
    return True


def Or(*operands: Any) -> Any:
    if is_symbolic(*operands):
        return z3.Or(*operands)
    for operand in operands:
        if operand:
            return True
    return False


def Not(operand: Any) -> Any:
    if is_symbolic(operand):
        return z3.Not(operand)
    return not operand


def Implies(premise: Any, conclusion: Any) -> Any:
    if is_symbolic(premise, conclusion):
        return z3.Implies(premise, conclusion)
    return (not premise) or bool(conclusion)


def If(condition: Any, then: Any, otherwise: Any) -> Any:
    if is_symbolic(condition, then, otherwise):
        return z3.If(condition, then, otherwise)
    return then if condition else otherwise


def In(value: Any, choices: Iterable[Any]) -> Any:
    """Membership that also works on a z3 term (``x in (...)`` does not)."""
    options = tuple(choices)
    if is_symbolic(value):
        return z3.Or(*[value == option for option in options]) if options else z3.BoolVal(False)
    return value in options


def Max(first: Any, second: Any) -> Any:
    """``max`` calls ``bool`` on a comparison; this stays linear for z3."""
    return If(first >= second, first, second)


def Min(first: Any, second: Any) -> Any:
    return If(first <= second, first, second)
