"""The caller-stepped engine driver (§3): the engine's actor code in **virtual time**, for tests
and simulation (DESIGN principle 3).

The device runs on a :class:`~calculet.clock.FakeClock` and :meth:`EngineDriver.run_until_idle`
advances it straight to the next event — the next device completion, the next Wait deadline, the
scheduler's next wake-up (a request deadline, the batching window) or a DeviceBusy back-off — so
thousands of requests simulate in seconds. **Sync baseline** (§19 M1, R19.3):
``ExecutionMode.SYNC`` submits one job and *waits* for it (CalRT ``Wait``) inside ``schedule`` —
the serial runner the async path must equal.
"""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

from calculet.adapters.calrt import CalRT, DeviceCapabilities, VirtualDevice
from calculet.clock import FakeClock
from calculet.config import SchedulerConfig
from calculet.errors import DefinitionError
from calculet.runtime.actor import Mailbox
from calculet.runtime.engine.core import EngineCore
from calculet.runtime.engine.types import EngineOptions, EngineStatistics, GenerateRequest, ModelInfo, TokenProvenance
from calculet.runtime.models.capacity import CapacityPlanner
from calculet.runtime.models.manager import ModelManager
from calculet.runtime.models.operations import Operation
from calculet.runtime.request import RequestSink
from calculet.runtime.scheduling.jobs import JobRecord
from calculet.runtime.scheduling.registry import Cancellation, RequestRecord
from calculet.runtime.scheduling.plan import Submission

__all__ = ["EngineDriver"]

T = TypeVar("T")


class EngineDriver:
    """The engine's actor code, stepped by the calling thread — for tests and simulation.

    With a virtual-time device (``SimConfig(time_mode=VIRTUAL, clock=fake)``) and the same
    :class:`FakeClock`, :meth:`run_until_idle` jumps the clock from event to event; with
    ``options.mode=SYNC`` every job is submitted and waited for (the M1 baseline).
    """

    def __init__(self, config: SchedulerConfig, runtime: CalRT, package_dir: str | os.PathLike[str] | None = None, *,
                 clock: FakeClock, options: EngineOptions = EngineOptions(),
                 observer: Callable[[RequestRecord, str, str], None] | None = None,
                 device: VirtualDevice | None = None, planner: CapacityPlanner | None = None,
                 provenance: Callable[[TokenProvenance], None] | None = None) -> None:
        self.clock = clock
        self.core = EngineCore(config, runtime, package_dir, clock=clock, options=options, observer=observer,
                               device=device, planner=planner, provenance=provenance)
        self.models: ModelManager = self.core.models
        """The same ModelManager API, run in virtual time: a blocking call steps this driver."""
        self.models.bind_port(_VirtualPort(self))
        self._mailbox = Mailbox()
        self.tokenizer = self.core.tokenizer

    # ------------------------------------------------------------------ the same API, inline

    def submit(self, request: GenerateRequest, sink: RequestSink) -> Submission:
        return self._run(lambda: self.core.submit(request, sink))

    def cancel(self, request_id: int) -> Cancellation:
        return self._run(lambda: self.core.cancel(request_id))

    def statistics(self) -> EngineStatistics:
        return self.core.statistics(self._mailbox.statistics())

    def job(self, job_id: int) -> JobRecord | None:
        """The scheduler's record of a planned job (as ``ThreadedEngine.job``)."""
        return self.core.scheduler.jobs.get(job_id)

    def capabilities(self) -> DeviceCapabilities:
        return self.core.capabilities

    def model_info(self) -> ModelInfo:
        return self.core.model_info()

    def stop(self, drain_timeout_s: float = 30.0) -> EngineStatistics:
        """As :meth:`~calculet.runtime.engine.threaded.ThreadedEngine.stop`, in virtual time."""
        core = self.core
        core.begin_stop()
        self.run_until_idle(max_time_s=drain_timeout_s)
        if not core.idle():
            core.shutdown()
            self.run_until_idle(max_time_s=max(core.options.job_timeout_s, 1.0) * 4)
        core.teardown()
        return self.statistics()

    # ------------------------------------------------------------------ stepping

    def dispatch(self) -> None:
        self._mailbox.run_pending()
        self.core.dispatch()

    def schedule(self) -> int:
        return self.core.schedule()

    def step(self) -> None:
        """One tick at the current instant."""
        self.dispatch()
        self.schedule()
        self.core.end_tick()

    def next_event_time(self) -> float | None:
        return self.core.next_event_time()

    def run_until(self, when: float) -> None:
        """Process every event up to ``when``; the clock ends at ``when``."""
        stalls = 0
        while True:
            self.step()
            nxt = self.next_event_time()
            if nxt is None or nxt > when:
                break
            stalls = self._jump(nxt, stalls)
        if when > self.clock.now():
            self.clock.set(when)
            self.step()

    def advance(self, seconds: float) -> None:
        self.run_until(self.clock.now() + seconds)

    def run_until_idle(self, max_time_s: float | None = None) -> float:
        """Step from event to event until nothing is left to do (or ``max_time_s`` of virtual time)."""
        limit = None if max_time_s is None else self.clock.now() + max_time_s
        stalls = 0
        while True:
            self.step()
            if self.core.idle():
                return self.clock.now()
            nxt = self.next_event_time()
            if nxt is None:
                raise DefinitionError("work remains but no event is due: nothing will ever progress "
                                      f"(live={len(self.core.scheduler.registry)}, "
                                      f"inflight={self.core.executor.inflight()})")
            if limit is not None and nxt > limit:
                self.clock.set(max(limit, self.clock.now()))
                self.step()
                return self.clock.now()
            stalls = self._jump(nxt, stalls)

    def _jump(self, nxt: float, stalls: int) -> int:
        """Move the clock to the next event; count ticks that found it already due (a livelock guard)."""
        now = self.clock.now()
        if nxt <= now:
            if stalls + 1 > 10_000:
                raise DefinitionError(f"no progress at t={now}: the next event stays at {nxt}")
            return stalls + 1
        self.clock.set(nxt)
        return 0

    def _run(self, message: Callable[[], T]) -> T:
        reply = self._mailbox.post(message)
        self._mailbox.run_pending()
        return reply.wait(0)


class _VirtualPort:
    """The model manager's way to the driver: the caller is the actor; waiting steps virtual time.

    ``timeout`` is in virtual seconds."""

    def __init__(self, driver: EngineDriver) -> None:
        self._driver = driver

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        return fn()

    def run(self, op: Operation, timeout: float | None) -> Any:
        driver = self._driver
        clock = driver.clock
        limit = None if timeout is None else clock.now() + timeout
        guard = 0
        while not op.done:
            driver.step()
            if op.done:
                break
            nxt = driver.next_event_time()
            now = clock.now()
            if nxt is None:
                raise DefinitionError(f"no progress in virtual time: {op.describe()}, and nothing is scheduled")
            if limit is not None and nxt > limit:
                clock.set(max(limit, now))
                driver.step()
                if not op.done:
                    raise TimeoutError(f"{op.describe()} after {timeout} virtual seconds")
                break
            if nxt <= now:
                guard += 1
                if guard > 10_000:
                    raise DefinitionError(f"no progress at t={now}: {op.describe()}")
                continue
            guard = 0
            clock.set(nxt)
        return op.reply.wait(0)
