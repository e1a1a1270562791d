"""Configuration errors a person can act on: one line per field path, with the fix in view.

Why this exists: §15's loader must say *which* setting is wrong and why
(``queues.decode_weight: must be > 0, got 0``), never pydantic's internal wording. Each pydantic
error becomes ``(field path, message)``; an unknown key lists the allowed keys and suggests the
closest one, and a cross-field check (:class:`~calculet.config.base.FieldProblem`) names the
exact field it is about.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pydantic import BaseModel

from calculet.config.base import FieldProblem
from calculet.config.scheduler import SchedulerConfig

__all__ = ["describe", "format_error", "problem_lines"]


def problem_lines(problems: Iterable[tuple[str, str]]) -> str:
    """The indented ``path: message`` lines of a :class:`~calculet.errors.ConfigError`."""
    return "\n".join(
        f"  {path}: {message}" if path else f"  {message}" for path, message in problems
    )


def describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, int | float):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            path += " (key)"
        elif isinstance(part, int):
            path += f"[{part}]"
        elif path:
            path += f".{part}"
        else:
            path = str(part)
    return path


def _join(path: str, field: str) -> str:
    if not path:
        return field
    return path + field if field.startswith("[") else f"{path}.{field}"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model validating the mapping at ``loc`` (to list its allowed keys)."""
    model: type[BaseModel] | None = SchedulerConfig
    annotation: Any = None
    for part in loc:
        if isinstance(part, int):
            if annotation is None:
                return None
            model = _unwrap_model(annotation)
            annotation = None
            continue
        if model is None:
            return None
        field = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part), None
        )
        if field is None:
            return None
        annotation = field.annotation
        model = _unwrap_model(annotation)
    return model


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


_TYPE_NAMES: Final = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path string",
}


def format_error(error: Mapping[str, Any]) -> tuple[str, str]:
    """Turn one pydantic error into ``(field path, message a person can act on)``."""
    loc: tuple[int | str, ...] = tuple(error["loc"])
    kind: str = error["type"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    given = error.get("input")
    path = _loc_to_path(loc)
    if kind == "value_error":
        problem = ctx.get("error")
        if isinstance(problem, FieldProblem):
            return _join(path, problem.field), problem.message
        text = str(problem) if problem is not None else str(error["msg"])
        return path, text.removeprefix("Value error, ")
    if kind == "missing":
        return path, "required field is missing"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        if model is None:
            return path, "unknown key"
        allowed = [f.alias or name for name, f in model.model_fields.items()]
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return path, f"unknown key{suggestion} (allowed: {', '.join(allowed)})"
    if kind == "greater_than":
        return path, f"must be > {ctx['gt']}, got {given!r}"
    if kind == "greater_than_equal":
        return path, f"must be >= {ctx['ge']}, got {given!r}"
    if kind == "less_than":
        return path, f"must be < {ctx['lt']}, got {given!r}"
    if kind == "less_than_equal":
        return path, f"must be <= {ctx['le']}, got {given!r}"
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return path, "must not be empty"
        return path, f"must have at least {ctx.get('min_length')} items"
    if kind == "too_long":
        return path, f"must have at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        return path, "must not be empty"
    if kind == "string_pattern_mismatch":
        return path, f"must match {ctx.get('pattern')}, got {describe(given)}"
    if kind in _TYPE_NAMES:
        return path, f"must be {_TYPE_NAMES[kind]}, got {describe(given)}"
    return path, str(error["msg"])
