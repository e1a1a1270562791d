"""A cheaper ``__init__`` for the frozen dataclasses made once per job, lane or step (issue #20).

Ground level (it imports only :mod:`calculet.errors`): the CalRT records and the scheduler's
completions use the same generator instead of each writing a constructor by hand. (The scheduler's
``DecodeBatch`` and ``KvBatchReservation``, built once per decode step, are named tuples now: a
third of even this one's cost, issue #20.)

A frozen dataclass's generated ``__init__`` writes every field through ``object.__setattr__`` (one
C call per field, since ``__setattr__`` itself refuses). The device builds a :class:`JobTicket`, a
:class:`JobResult`, its :class:`StatusCounters` and one :class:`LaneResult` per lane for every job,
so those writes were most of the cost of a job's records (ticket, result, counters and lanes: 11 µs
of CPU for a B1 job, 50 µs for B16; 6 and 17 µs with this, measured side by side). :func:`quick_init`
swaps in an ``__init__`` generated from the same fields that stores them in the instance's
``__dict__`` directly (what ``object.__setattr__`` ends up doing for a class without slots).

Everything else stays the dataclass's: the class is still a frozen dataclass (assignment raises
``FrozenInstanceError``, ``dataclasses.replace``/``fields``/``asdict`` work, ``repr`` and equality
are unchanged), and the new ``__init__`` takes exactly the parameters, order, kinds and defaults of
the one it replaces — checked when the class is decorated, so a field added later cannot drift.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

from calculet.errors import DefinitionError

__all__ = ["quick_init"]

_C = TypeVar("_C", bound=type)


def quick_init(cls: _C) -> _C:
    """Replace frozen dataclass ``cls``'s ``__init__`` with one writing ``__dict__`` (see the module).

    Supported: positional-or-keyword and keyword-only fields, plain defaults, ``init=False`` fields
    with a default, and ``__post_init__`` (called last, as the dataclass does). Refused with a
    :class:`DefinitionError` (use the dataclass's own ``__init__`` then): a class that is not a frozen
    dataclass, has ``__slots__`` or a ``default_factory``, or whose ``__init__`` would take other
    parameters than the dataclass's (an ``InitVar``, say: it is a parameter but not a field).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise DefinitionError(f"quick_init: {cls.__name__} is not a frozen dataclass")
    if "__slots__" in cls.__dict__:
        raise DefinitionError(f"quick_init: {cls.__name__} has __slots__ (no instance __dict__ to write)")
    namespace: dict[str, Any] = {}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = ["    __quick_fields = self.__dict__"]  # a name no field can clash with
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            raise DefinitionError(f"quick_init: {cls.__name__}.{f.name} has a default_factory")
        has_default = f.default is not dataclasses.MISSING
        if has_default:
            namespace[f"__quick_default_{f.name}"] = f.default
        if not f.init:
            if has_default:
                body.append(f"    __quick_fields[{f.name!r}] = __quick_default_{f.name}")
            continue
        (keyword if f.kw_only else positional).append(f"{f.name}=__quick_default_{f.name}" if has_default else f.name)
        body.append(f"    __quick_fields[{f.name!r}] = {f.name}")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}) -> None:\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<calculet quick_init {cls.__name__}>", "exec"), namespace)  # noqa: S102 - generated
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    _same_parameters(cls, cls.__init__, init)
    cls.__init__ = init  # type: ignore[misc]
    return cls


def _same_parameters(cls: type, dataclass_init: Any, init: Any) -> None:
    """The generated ``__init__`` must take what the dataclass's took: names, kinds, defaults, order."""
    def shape(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    if shape(dataclass_init) != shape(init):
        raise DefinitionError(f"quick_init: {cls.__name__}.__init__ would change its parameters: "
                              f"{shape(dataclass_init)} != {shape(init)}")
