"""What a request is at the core's boundary: the input, the terminal outcome, the sink (§2, §4).

The core never talks to a socket. An HTTP handler (or a test) hands it an
:class:`InferenceRequest` and a :class:`RequestSink`; the core delivers tokens and exactly one
:class:`RequestOutcome` to that sink (§4: "promise/stream close can be triggered only once").

``InferenceRequest`` deliberately has no weight, priority or tenant-limit field: weights and
limits come from the control-plane configuration only (§5.3, R5.3.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from calculet.machines.request import FinishReason

RequestId = int
GenerationId = int
JobId = int
SeqId = int


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One client request as the scheduler needs it (token counts, tenant, deadline).

    The prompt's token ids stay with the engine; the scheduler only needs their number.
    ``deadline_ms`` is relative to arrival on the monotonic clock; ``None`` takes
    ``admission.deadline_default_ms`` (§15, R15.5).
    """

    prompt_tokens: int
    max_new_tokens: int
    tenant: str = "default"
    deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """The single terminal result of a request, set once on its sink (§4).

    ``http_status`` is the status hint the service layer answers with: 200 for a completed
    request, 400/429/503 for admission rejections (§5.2), 499 for a client cancel, 504 for a
    deadline and 500 for a device or runtime error.
    """

    request_id: RequestId
    state: str
    finish_reason: FinishReason
    generated_tokens: int
    http_status: int
    detail: str = ""


class RequestSink(Protocol):
    """Where a request's output goes: its tokens in order, then one close (§4 promise/stream)."""

    def token(self, request_id: RequestId, token: int) -> None:
        """One generated token, in order; never called after ``close``."""
        ...

    def close(self, outcome: RequestOutcome) -> None:
        """The terminal outcome; called exactly once per request."""
        ...


class NullSink:
    """A sink that drops everything (benchmarks, fire-and-forget callers)."""

    def token(self, request_id: RequestId, token: int) -> None:
        return None

    def close(self, outcome: RequestOutcome) -> None:
        return None
