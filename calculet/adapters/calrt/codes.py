"""CalRT return codes and the error boundary: what a device outcome is, and who is at fault.

Every device outcome is one :class:`ReturnCode` (§16 "submit/Wait rc"; R19.2 "all error codes
visible"). :class:`VendorError` is what a vendor binding raises; :func:`map_exceptions` (and its
decorator form :func:`vendor_boundary`) turns it, and anything else escaping the vendor layer,
into a :class:`~calculet.errors.CalculetError` carrying the code (DESIGN principle 6: no vendor
exception crosses into the runtime). :func:`error_for` is the one table that decides who is at
fault for a code (DESIGN principle 5).
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import ParamSpec, TypeVar

from calculet.errors import (
    CalculetError,
    CapacityExhausted,
    DefinitionError,
    DeviceFault,
    NotSupported,
)


class ReturnCode(enum.IntEnum):
    """CalRT status codes (§16 executor metrics: submit/Wait rc).

    ``OK`` is 0 so that ``bool(rc)`` is true exactly for a failure, as in the C API.
    """

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    DEVICE_BUSY = 3
    TIMEOUT = 4
    CCU_FAULT = 5
    DMA_UNKNOWN = 6
    NOT_SUPPORTED = 7
    NOT_FOUND = 8
    ALREADY_EXISTS = 9
    INVALID_STATE = 10
    BUFFER_IN_USE = 11
    INTERNAL = 12

    @property
    def is_device_fault(self) -> bool:
        """Faults after which the device state of the job's lanes is unknown (§9.2 last rule)."""
        return self in (ReturnCode.TIMEOUT, ReturnCode.CCU_FAULT, ReturnCode.DMA_UNKNOWN)


class VendorError(Exception):
    """What a CalRT binding raises: a return code and the vendor's message.

    It must never reach the runtime: adapters wrap every vendor call in :func:`map_exceptions`.
    """

    def __init__(self, rc: ReturnCode, message: str) -> None:
        super().__init__(f"{rc.name}: {message}")
        self.rc = rc
        self.message = message


class _RcError:
    """Mixin: every device-boundary error carries its :class:`ReturnCode` as ``rc``."""

    rc: ReturnCode


class DeviceInvalidArgument(_RcError, DefinitionError):
    """The device refused a job or call as malformed (INVALID_ARGUMENT).

    Bad client input is intercepted before submit (§7.4, R7.4.4), so reaching the device with an
    invalid argument is a defect of the program, hence a :class:`DefinitionError`.
    """

    code = "device_invalid_argument"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.INVALID_ARGUMENT, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceNotFound(DeviceInvalidArgument):
    """A handle (sequence, buffer, calbin, job) the device does not know (NOT_FOUND)."""

    code = "device_not_found"


class DeviceAlreadyExists(_RcError, DefinitionError):
    """A second physical VirtualDevice in one process (§3, R3.4), or a duplicate handle."""

    code = "device_already_exists"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.ALREADY_EXISTS, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceOutOfMemory(_RcError, CapacityExhausted):
    """Device DRAM or KV slots are exhausted (§13.1: no room for a second large model)."""

    code = "device_out_of_memory"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.OUT_OF_MEMORY, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class OperationNotSupported(_RcError, NotSupported):
    """The contract does not offer this operation (§9.3 empty implementations, C3/C4 features)."""

    code = "device_not_supported"

    def __init__(self, message: str, rc: ReturnCode = ReturnCode.NOT_SUPPORTED, **context: object) -> None:
        super().__init__(message, rc=rc, **context)
        self.rc = rc


class DeviceBusy(DeviceFault):
    """Submit refused because the engine or the in-flight limit is occupied (§14 degrade input)."""

    code = "device_busy"


class DeviceTimeout(DeviceFault):
    """Wait expired before the job completed; the job's lanes are Unknown (§9.2, §12)."""

    code = "device_timeout"


class CcuFault(DeviceFault):
    """The compute unit faulted; the job's KV is Unknown until recovery (§9.2)."""

    code = "device_ccu_fault"


class DmaUnknown(DeviceFault):
    """A DMA ended in an unknown state (§15 ``recovery.restart_on_unknown_dma``)."""

    code = "device_dma_unknown"


class DeviceInvalidState(DeviceFault):
    """The call is not valid in the device's current state (e.g. submit after a CCU fault)."""

    code = "device_invalid_state"


class BufferInUse(DeviceFault):
    """A buffer is still bound to a job that has not completed (§12, §14: never reuse early)."""

    code = "device_buffer_in_use"


_ERROR_FOR_RC: Mapping[ReturnCode, Callable[..., CalculetError]] = {
    ReturnCode.INVALID_ARGUMENT: DeviceInvalidArgument,
    ReturnCode.NOT_FOUND: lambda m, rc, **c: DeviceNotFound(m, rc=rc, **c),
    ReturnCode.ALREADY_EXISTS: DeviceAlreadyExists,
    ReturnCode.OUT_OF_MEMORY: DeviceOutOfMemory,
    ReturnCode.NOT_SUPPORTED: OperationNotSupported,
    ReturnCode.DEVICE_BUSY: DeviceBusy,
    ReturnCode.TIMEOUT: DeviceTimeout,
    ReturnCode.CCU_FAULT: CcuFault,
    ReturnCode.DMA_UNKNOWN: DmaUnknown,
    ReturnCode.INVALID_STATE: DeviceInvalidState,
    ReturnCode.BUFFER_IN_USE: BufferInUse,
    ReturnCode.INTERNAL: DeviceFault,
}


def error_for(rc: ReturnCode, message: str, **context: object) -> CalculetError:
    """The :class:`CalculetError` for a failed CalRT call; ``rc`` is kept on the error.

    This table is the only place that decides who is at fault for a device return code
    (DESIGN principle 5: the error tree is split by fault owner).
    """
    if rc is ReturnCode.OK:
        raise DefinitionError("error_for(OK): a successful call has no error", rc=rc)
    factory = _ERROR_FOR_RC[rc]
    return factory(message, rc=rc, **context)


def rc_of(error: BaseException) -> ReturnCode:
    """The return code an error carries (INTERNAL for an error that carries none)."""
    rc = getattr(error, "rc", None)
    return rc if isinstance(rc, ReturnCode) else ReturnCode.INTERNAL


@contextlib.contextmanager
def map_exceptions(operation: str, **context: object) -> Iterator[None]:
    """Translate vendor failures into :class:`CalculetError`s at the adapter boundary.

    ``VendorError`` becomes the error :func:`error_for` names; a :class:`CalculetError` passes
    through untouched; anything else that escapes the vendor layer is a device fault with
    ``rc=INTERNAL`` (its cause chained), because the runtime must never see a vendor type
    (DESIGN principle 6, httpcore's ``map_exceptions``).
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
        mapped = _mapped(exc, operation, context)
        if mapped is exc:
            raise
        raise mapped from exc


def _mapped(exc: Exception, operation: str, context: dict[str, object]) -> Exception:
    """What :func:`map_exceptions` raises for ``exc``: a CalculetError as it is, the others translated."""
    if isinstance(exc, CalculetError):
        return exc
    if isinstance(exc, VendorError):
        return error_for(exc.rc, f"{operation}: {exc.message}", operation=operation, **context)
    return DeviceFault(f"{operation}: unexpected {type(exc).__name__} from the device layer: {exc}",
                       rc=ReturnCode.INTERNAL, operation=operation, **context)


def translated(exc: Exception, operation: str) -> Exception:
    """What the vendor boundary raises for ``exc`` escaping ``operation``: ``exc`` itself for a
    :class:`CalculetError` (re-raise it), else the error to raise from it. For an adapter method that has a try
    of its own on its path, which is then its boundary instead of a :func:`vendor_boundary` wrapper: a call per
    call fewer, where the call is made once per job (issue #20)."""
    return _mapped(exc, operation, {})


_P = ParamSpec("_P")
_R = TypeVar("_R")


def vendor_boundary(operation: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator form of :func:`map_exceptions` for adapter methods."""

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            # try/except, not ``with map_exceptions``: a generator context manager costs ~1.5 µs per call (issue #20;
            # the per-step calls, Submit and poll, are boundaries of their own: see translated); same translation
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
                mapped = _mapped(exc, operation, {})
                if mapped is exc:
                    raise
                raise mapped from exc

        return wrapper

    return decorate
