"""What the model manager needs from the engine, and nothing more (§3 ModelManager; DESIGN principle 2).

The models side owns this port; the engine's actor core implements it. The manager never reaches
into the engine's components: it installs a generation's session on the executor or detaches it,
replaces the device on a restart, pauses planned submissions around golden/warm-up (§11 step 9),
asks whether the engine's device recovery is pending, and reads and steers the scheduler's model
availability and its live requests (§10, §12 R12.2/R12.4). Keeping the list here makes the layer
rule checkable: :mod:`calculet.runtime.models` imports nothing from :mod:`calculet.runtime.engine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ContextManager, Protocol

if TYPE_CHECKING:
    from calculet.adapters.calrt import ReturnCode, VirtualDevice
    from calculet.clock import Clock
    from calculet.config import SchedulerConfig
    from calculet.runtime.execution.session import RuntimeSession
    from calculet.runtime.scheduling.admission import ModelAvailability
    from calculet.runtime.scheduling.profiles import ProfileSet
    from calculet.runtime.scheduling.registry import Cancellation, RequestRegistry

__all__ = ["EnginePort", "SchedulerView"]


class SchedulerView(Protocol):
    """The scheduler as the manager steers it: the serving generation's availability, the hold of
    new requests during a replacement, and the live requests pinned to a generation."""

    @property
    def generation(self) -> int: ...

    @property
    def availability(self) -> ModelAvailability: ...

    @property
    def holding_new_requests(self) -> bool: ...

    @property
    def registry(self) -> RequestRegistry: ...

    @property
    def jobs(self) -> Iterable[Any]:
        """The planned jobs until they end (``InflightTable``: each with engine, state, generation)."""
        ...

    def set_model(self, generation: int, availability: ModelAvailability, profiles: ProfileSet | None = None,
                  detail: str = "") -> None: ...

    def hold_new_requests(self, hold: bool) -> None: ...

    def reject_waiting_model(self, detail: str) -> int: ...

    def cancel(self, request_id: int) -> Cancellation: ...


class EnginePort(Protocol):
    """The engine's actor, as the model manager uses it (every call on the actor thread)."""

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def device(self) -> VirtualDevice:
        """The device the sessions are created on (replaced by :meth:`replace_device`)."""
        ...

    @property
    def scheduler(self) -> SchedulerView: ...

    @property
    def verify_golden(self) -> bool:
        """§11 step 9 golden vectors at bring-up and after every reset."""
        ...

    @property
    def warmup(self) -> bool:
        """§11 step 9 warm-up jobs before a generation is published."""
        ...

    def bind_session(self, session: RuntimeSession) -> None:
        """Plan and submit jobs on ``session`` from now on (the serving generation's)."""
        ...

    def detach_session(self) -> None:
        """No generation serves: bind the executor to a detached session on the current device."""
        ...

    def replace_device(self) -> None:
        """Close the device (every handle and job dies with it), forget its jobs and open a new one,
        with the executor detached on it (a process restart, §15)."""
        ...

    def exclusive_device(self) -> ContextManager[None]:
        """Held around host-driven device work (golden, warm-up, a session reset)."""
        ...

    def inflight_jobs(self) -> int:
        """Jobs the executor has on the device."""
        ...

    def resync_engine_sequences(self) -> None:
        """After host-driven jobs: the executor's per-engine sequence expectation follows the device (§14)."""
        ...

    def hold_submissions(self, hold: bool) -> None:
        """Pause (or resume) submitting planned work (§11 step 9)."""
        ...

    def recovery_pending(self) -> bool:
        """A device reset or restart is due and has not run yet."""
        ...

    def recovery_failed(self) -> bool:
        """The recovery budget is spent (§15): nothing will reset the device any more."""
        ...

    def report_device_fault(self, rc: ReturnCode, detail: str) -> None:
        """A job outside the executor left the device in doubt: recover it (§12, §15)."""
        ...

    def run_commands(self) -> None:
        """Execute the machines' pending commands (FreeSequence, ...) through the adapter."""
        ...
