"""OpenAI-style error bodies for every failure the service answers (§5.2, DESIGN principle 5).

Every error leaves the service as ``{"error": {"message", "type", "code", "param"}}`` with the
HTTP status the spec assigns:

======  ==============================  ===============================================
status  type                            when
======  ==============================  ===============================================
400     ``invalid_request_error``       RejectInvalid (§5.2): a malformed body, an
                                        unsupported feature (``n > 1``, ``best_of``,
                                        ``logprobs``, ``echo`` …, §9.3), a prompt or
                                        prompt + max_tokens beyond the context
401     ``authentication_error``        unknown API key / admin token
403     ``permission_error``            the admin API is disabled (no admin token set)
404     ``invalid_request_error``       unknown model alias or route
408     ``invalid_request_error``       request headers or a body pause past
                                        ``server.header_timeout_s`` / ``body_timeout_s``
409     ``invalid_request_error``       an admin operation conflicting with the
                                        model's state
413     ``invalid_request_error``       a request body larger than 8 MiB
431     ``invalid_request_error``       request headers past ``server.max_header_bytes``
429     ``rate_limit_error``            RejectCapacity (§5.2), with ``Retry-After``
499     ``invalid_request_error``       the client closed the connection first (logged
                                        and counted only: nobody reads the answer)
501     ``not_implemented_error``       what CalRT 0.7.6 cannot do (e.g. a second model
                                        alias in one process, §13.1)
503     ``service_unavailable_error``   RejectUnavailable (§5.2): model draining,
                                        recovering, failed or not loaded; shutting down
504     ``timeout_error``               the request's deadline passed (§15)
5xx     ``server_error``                a device or runtime failure
======  ==============================  ===============================================

:class:`APIError` is what route code raises; :func:`from_calculet` translates the runtime's one
error tree (``calculet.errors``) at the boundary, so no runtime exception reaches a client raw.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi.responses import JSONResponse

from calculet.errors import CalculetError, CapacityExhausted, ConfigError, PackageError
from calculet.runtime.models.reports import LoadFailed, LoadStep
from calculet.server.jsonenc import JSONBody, dumps, send_json

RETRY_AFTER_S = 1
"""``Retry-After`` of a 429: capacity frees as fast as requests finish, so retry soon (§5.2)."""

_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def _encodable(text: str) -> str:
    """``text`` with any lone UTF-16 surrogate written as its escape (``\\ud800``): a message or param that
    names what the client wrote (a JSON key ``"\\ud800"``) must still encode as UTF-8 — it did not, and the
    error about the client's surrogate became a 500 (issue #14)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class APIError(Exception):
    """An error answer: HTTP status, OpenAI error type and code, the offending field."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:  # noqa: A002
        message, param = _encodable(message), None if param is None else _encodable(param)
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "server_error")
        self.headers = dict(headers or {})
        if status == 429:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_S))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def json_bytes(self) -> bytes:
        """The answer's body as the service encodes it (:func:`~calculet.server.jsonenc.dumps` of :meth:`body`)."""
        return dumps(self.body())

    def response(self) -> JSONResponse:
        """The answer (encoded by :mod:`calculet.server.jsonenc`: a 429 under a burst is encoded on the event loop)."""
        return JSONBody(self.body(), status_code=self.status, headers=self.headers)

    async def send(self, send: Any) -> None:
        """The answer of :meth:`response`, byte for byte, sent through ASGI ``send`` without a response object."""
        await send_json(send, self.status, self.body(), self.headers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Answer as an ASGI app (for middleware that refuses before routing)."""
        await self.send(send)


def invalid(message: str, *, param: str | None = None, code: str = "invalid_value") -> APIError:
    """400 RejectInvalid (§5.2)."""
    return APIError(400, message, code=code, param=param)


def unsupported(param: str, message: str) -> APIError:
    """400 for a feature the service refuses rather than silently ignores (§9.3, R9.3.9)."""
    return APIError(400, message, code="unsupported_parameter", param=param)


_ADMISSION_CODES = {400: "invalid_request", 429: "over_capacity", 503: "model_unavailable"}


def admission_error(status: int, reason: str, *, param: str | None = None,
                    retry_after_s: float | None = None) -> APIError:
    """The §5.2 rejection the engine answered with (400 / 429 / 503).

    ``retry_after_s``: the engine's estimate of when a retry could be served (a 429 for want of
    a prospect before the deadline); ``Retry-After`` is it rounded up, else the default.
    """
    code = _ADMISSION_CODES.get(status, "request_failed")
    if status == 400 and "context" in reason:
        code = "context_length_exceeded"
    headers = None
    if status == 429 and retry_after_s is not None:
        headers = {"Retry-After": str(max(RETRY_AFTER_S, math.ceil(retry_after_s)))}
    return APIError(status, reason or "request rejected", code=code, param=param, headers=headers)


def from_calculet(exc: CalculetError, *, admin: bool = False) -> APIError:
    """Translate the runtime's error tree at the HTTP boundary (DESIGN principles 5, 6).

    ``admin``: a package or config the operator handed to the admin API that fails its checks
    is the caller's input, so it is a 400 there (the tree's hint, 500, is for start-up). A
    :class:`~calculet.runtime.models.reports.LoadFailed` keeps the status its cause implies (400 for a
    package the §11 checks refuse) with ``code`` ``load_failed``, the step in the message and the
    offending field (``package`` at steps 1–3) in ``param``.
    """
    status = exc.http_status
    code = exc.code
    field = exc.context.get("field")
    if isinstance(exc, LoadFailed):
        # the message names the §11 step; the step's own error says which field, else steps 1–3 are the package's
        cause = exc.cause
        cause_field = cause.context.get("field") if isinstance(cause, CalculetError) else None
        field = cause_field if cause_field is not None else ("package" if exc.step <= LoadStep.VALIDATE else None)
        if admin and isinstance(cause, CapacityExhausted):
            status = 400  # §11 step 4: a package the board can never hold is no "retry later" (429)
    if admin and isinstance(exc, (PackageError, ConfigError)):
        status = 400
    if status == 503:
        code = "model_unavailable"
    return APIError(status, exc.message, code=code, param=str(field) if field is not None else None)


def internal(message: str = "internal error; the request id is in the service log") -> APIError:
    return APIError(500, message, code="internal_error")
