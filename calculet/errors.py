"""The one error tree (DESIGN principle 5).

Errors are split by who is at fault, so that a caller can decide what to do without parsing
messages: the client (``BadRequest``), the system's momentary capacity (``CapacityExhausted``),
availability (``Unavailable``), the device (``DeviceFault``) or the program itself
(``DefinitionError``). Each carries an HTTP status hint for the service layer.

Running out of capacity in the core is a *return value*, not an exception (DESIGN principle 4);
``CapacityExhausted`` exists for the boundaries (HTTP, CLI) that must turn it into an error.
"""

from __future__ import annotations


class CalculetError(Exception):
    """Root of every error calculet raises on purpose."""

    http_status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        return self.message


class BadRequest(CalculetError):
    """The caller sent something we will never accept (§5.2 RejectInvalid → 400)."""

    http_status = 400
    code = "invalid_request"


class NotFound(BadRequest):
    http_status = 404
    code = "not_found"


class Conflict(BadRequest):
    """The request contradicts the target's current state (unload what is already unloaded) → 409."""

    http_status = 409
    code = "conflict"


class NotSupported(BadRequest):
    """An operation the device contract does not offer (§9.3 empty adapter implementations)."""

    http_status = 501
    code = "not_supported"


class CapacityExhausted(CalculetError):
    """Budgets are full right now; retrying later may succeed (§5.2 RejectCapacity → 429)."""

    http_status = 429
    code = "over_capacity"


class Unavailable(CalculetError):
    """The model is draining, recovering, failed or absent (§5.2 RejectUnavailable → 503)."""

    http_status = 503
    code = "unavailable"


class DeviceFault(CalculetError):
    """The device (or its runtime) failed; carries the CalRT return code."""

    http_status = 502
    code = "device_fault"

    def __init__(self, message: str, rc: object = None, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DefinitionError(CalculetError):
    """The program or its configuration is wrong; fixing it needs a person, not a retry."""

    http_status = 500
    code = "definition_error"


class ConfigError(DefinitionError):
    """Configuration rejected at load (§15); the message names the field path."""

    code = "config_error"


class PackageError(DefinitionError):
    """A model package failed trust, integrity or compatibility checks (§11 steps 1–3)."""

    code = "package_error"
