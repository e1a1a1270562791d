"""What every section of ``calculet-scheduler/v1`` stands on: strict scalars, the section base,
the schema id and the cross-field error.

Why a strict schema: §15 configures a scheduler whose wrong value can silently cost fairness
(§5.3), starve long prompts (§6) or ask the device for something it cannot do (§2, §14). So the
loader rejects unknown keys, wrong types and out-of-range values, and every error names the
field path (``queues.decode_weight: must be > 0``) so a person can fix the file without reading
the code. Scalars are *strict*: a quoted ``"8"`` is not an integer and ``1`` is not ``true``.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, Strict

__all__ = [
    "SCHEMA_ID",
    "unknown_schema",
    "UINT16_MAX",
    "UINT32_MAX",
    "UINT64_MAX",
    "FieldProblem",
    "LabelName",
    "NonNegInt",
    "PosFloat",
    "PosInt",
    "Section",
    "Sha256Hex",
    "StrictBool",
]

SCHEMA_ID: Final = "calculet-scheduler/v1"
"""The only schema id this loader reads (§15, R15.1)."""


def unknown_schema(value: object) -> str:
    """The message for a file written for another schema (R15.1)."""
    return f"unknown schema {value!r}; this calculet reads {SCHEMA_ID!r}"


UINT16_MAX: Final = 65_535
UINT32_MAX: Final = 4_294_967_295
UINT64_MAX: Final = 18_446_744_073_709_551_615

# Strict scalar types: YAML already gives typed values, so a quoted number or a 0/1 boolean is
# almost always a mistake worth reporting rather than coercing.
PosInt = Annotated[int, Strict(), Field(gt=0)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
StrictBool = Annotated[bool, Strict()]
PosFloat = Annotated[float, Strict(), Field(gt=0)]
Sha256Hex = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{64}$")]
# Tenant names and model aliases become metric label values (§16: bounded label sets), so
# they are short identifiers, never free text.
LabelName = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class FieldProblem(ValueError):
    """A cross-field check failed; ``field`` is the path below the validated model's location.

    Pydantic reports a model validator's error at the model's own location; raising this
    instead lets the error formatter name the exact field (``queues.medium_prefill_max_tokens``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Section(BaseModel):
    """Common settings: unknown keys are errors and a loaded config is immutable.

    Immutability matters because one config object is shared by the engine thread, the HTTP
    handlers and the metrics exporter (DESIGN principle 2).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
