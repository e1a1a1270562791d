"""Bounded variable types: how a declared value is checked concretely and encoded for z3.

A machine's parameters, variables and event arguments carry one of these. The same object
answers both readings of a declaration (DESIGN: declare once): ``check`` for a live value on the
hot path, ``symbol``/``constraint`` for its z3 twin in the proofs and the symbolic namespace.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import z3

__all__ = ["VarType", "Int", "Bool", "EnumType"]



class VarType(ABC):
    """A bounded type: how to check a plain value, and how to make and constrain a z3 term."""

    default: Any = None

    @abstractmethod
    def check(self, value: Any) -> str | None:
        """None when ``value`` belongs to the type, otherwise the reason it does not."""

    @abstractmethod
    def symbol(self, name: str) -> z3.ExprRef:
        """A fresh z3 constant of this type's sort."""

    def constraint(self, term: Any) -> Any:
        """The z3 domain constraint of ``term`` (None when the sort alone is the domain)."""
        return None

    @abstractmethod
    def describe(self) -> str:
        """How the documents print the type."""

    @abstractmethod
    def is_sort_of(self, term: Any) -> bool:
        """Whether an effect's value (plain or z3) can be assigned to a variable of this type."""


@dataclass(frozen=True)
class Int(VarType):
    """An integer, unbounded unless ``ge``/``le`` say otherwise (CalRT ids and lengths are unsigned)."""

    ge: int | None = None
    le: int | None = None
    default: int = 0

    def check(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an int, got {type(value).__name__}"
        if self.ge is not None and value < self.ge:
            return f"{value} < {self.ge}"
        if self.le is not None and value > self.le:
            return f"{value} > {self.le}"
        return None

    def symbol(self, name: str) -> z3.ArithRef:
        return z3.Int(name)

    def constraint(self, term: Any) -> Any:
        parts = []
        if self.ge is not None:
            parts.append(term >= self.ge)
        if self.le is not None:
            parts.append(term <= self.le)
        if not parts:
            return None
        return z3.And(*parts) if len(parts) > 1 else parts[0]

    def describe(self) -> str:
        lo = "" if self.ge is None else f"{self.ge} ≤ "
        hi = "" if self.le is None else f" ≤ {self.le}"
        return f"{lo}int{hi}"

    def is_sort_of(self, term: Any) -> bool:
        if isinstance(term, z3.ExprRef):
            return term.sort() == z3.IntSort()
        return isinstance(term, int) and not isinstance(term, bool)


@dataclass(frozen=True)
class Bool(VarType):
    default: bool = False

    def check(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"expected a bool, got {type(value).__name__}"

    def symbol(self, name: str) -> z3.BoolRef:
        return z3.Bool(name)

    def describe(self) -> str:
        return "bool"

    def is_sort_of(self, term: Any) -> bool:
        if isinstance(term, z3.ExprRef):
            return z3.is_bool(term)
        return isinstance(term, bool)


@dataclass(frozen=True)
class EnumType(VarType):
    """An ``IntEnum``; encoded for z3 as an integer restricted to the members' values."""

    enum_cls: type[enum.IntEnum] = enum.IntEnum
    default: Any = None

    def __post_init__(self) -> None:
        if self.default is None:
            object.__setattr__(self, "default", next(iter(self.enum_cls)))

    def check(self, value: Any) -> str | None:
        if isinstance(value, self.enum_cls):
            return None
        return f"expected a {self.enum_cls.__name__}, got {value!r}"

    def symbol(self, name: str) -> z3.ArithRef:
        return z3.Int(name)

    def constraint(self, term: Any) -> Any:
        return z3.Or(*[term == int(member) for member in self.enum_cls])

    def describe(self) -> str:
        return f"{self.enum_cls.__name__} ({', '.join(m.name for m in self.enum_cls)})"

    def is_sort_of(self, term: Any) -> bool:
        if isinstance(term, z3.ExprRef):
            return term.sort() == z3.IntSort()
        return isinstance(term, self.enum_cls)
