"""When the simulated NPU's jobs complete, and how a host waits for them (§12, DESIGN principle 3).

Submit prices a job with the cost model and records its completion instant here. In
``TimeMode.VIRTUAL`` nothing happens until someone looks: ``poll``/``wait``/``wait_any`` complete
every job whose instant has passed on the injected clock, in instant order, and ``wait`` consumes
virtual time by advancing a :class:`~calculet.clock.FakeClock`; :meth:`CompletionTimeline.next_instant`
tells a simulator how far to advance. In ``TimeMode.REAL`` the device's worker thread
(:meth:`CompletionTimeline.work`) completes jobs at their instants on the monotonic clock.

A job with no instant (an injected TIMEOUT) never completes: ``wait`` times out and the job stays
in flight until a reset discards it; a discarded job's id answers INVALID_STATE for ever after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from calculet.adapters.calrt import JobId, JobResult, ReturnCode, VendorError
from calculet.adapters.sim.execution import Computed, SimJob
from calculet.adapters.sim.faults import FaultDecision, InjectedFault
from calculet.clock import Clock, FakeClock


class JobRunner(Protocol):
    """The device side of completion: numerics outside the lock, the commit under it."""

    def compute(self, job: SimJob) -> Computed | None: ...
    def finalize(self, job: SimJob, computed: Computed | None, now: float) -> None: ...


class CompletionTimeline:
    """The device's in-flight jobs by completion instant, its uncollected results, and Wait."""

    def __init__(self, clock: Clock, cond: threading.Condition, runner: JobRunner, *, virtual: bool,
                 wait_advances_clock: bool, worker_cond: threading.Condition | None = None) -> None:
        self._clock = clock
        self._cond = cond
        self.worker_cond = worker_cond if worker_cond is not None else cond
        """What the real-time worker sleeps on (over the device lock): told of new pending jobs, resets and
        close, but not of every result — a Wait/WaitAny caller is woken by ``cond`` without waking it."""
        self._runner = runner
        self._virtual = virtual
        self._wait_advances_clock = wait_advances_clock
        self.pending: dict[int, SimJob] = {}
        self.done: dict[int, JobResult] = {}
        self._discarded: set[int] = set()
        self.discarded_count = 0
        self.wait_timeouts = 0
        self.sleepers = 0
        """Threads waiting in Wait/WaitAny on ``cond`` now (changed with the device lock held)."""

    # --- bookkeeping (device lock held) ------------------------------------------------------

    def add(self, job: SimJob) -> None:
        self.pending[job.ticket.job_id] = job

    def remove(self, job_id: int) -> bool:
        """Take a completing job off the timeline; False if a reset discarded it meanwhile."""
        return self.pending.pop(job_id, None) is not None

    def discard_all(self) -> None:
        """A reset: every in-flight job is discarded and will never complete."""
        for job_id in self.pending:
            self._discarded.add(job_id)
            self.discarded_count += 1
        self.pending.clear()

    def next_instant(self) -> float | None:
        times = [j.finish for j in self.pending.values() if j.finish is not None and not j.executing]
        return min(times) if times else None

    def _due(self, now: float) -> SimJob | None:
        due = [j for j in self.pending.values() if not j.executing and j.finish is not None and j.finish <= now]
        return min(due, key=lambda j: (j.finish, j.ticket.job_id)) if due else None

    def drain(self) -> list[JobResult]:
        out = list(self.done.values())
        self.done.clear()
        return out

    def take(self, job_id: int) -> JobResult | None:
        """Pop a job's result; raise if the job is unknown or was discarded (lock held)."""
        if job_id in self.done:
            return self.done.pop(job_id)
        if job_id in self.pending:
            return None
        if job_id in self._discarded:
            raise VendorError(ReturnCode.INVALID_STATE,
                              f"job {job_id} was discarded by a reset; it will never complete")
        raise VendorError(ReturnCode.NOT_FOUND, f"job {job_id} is unknown or its result was already collected")

    # --- completing jobs ---------------------------------------------------------------------

    def advance_virtual(self) -> None:
        """Virtual time: complete every job whose instant has passed, in instant order."""
        if not self._virtual:
            return
        with self._cond:
            now = self._clock.now()
            while (job := self._due(now)) is not None:
                job.executing = True
                assert job.finish is not None
                self._runner.finalize(job, self._runner.compute(job), job.finish)
            self._cond.notify_all()

    def work(self, closed: Callable[[], bool]) -> None:
        """Real time: the device's own worker completes jobs at their instants."""
        while True:
            with self._cond:
                while True:
                    if closed():
                        return
                    now = self._clock.now()
                    job = self._due(now)
                    if job is not None:
                        job.executing = True
                        break
                    nxt = self.next_instant()
                    self.worker_cond.wait(None if nxt is None else max(0.0, nxt - now))
            try:
                computed = self._runner.compute(job)
            except Exception:  # noqa: BLE001 - a numerics failure is a device fault, not a crash
                computed = None
                job.fault = FaultDecision(InjectedFault.CCU_FAULT, (), "simulator numerics raised")
            with self._cond:
                self._runner.finalize(job, computed, self._clock.now())
                self._cond.notify_all()

    # --- waiting -----------------------------------------------------------------------------

    def _fake_clock(self) -> FakeClock | None:
        clock = self._clock
        if self._virtual and self._wait_advances_clock and isinstance(clock, FakeClock):
            return clock
        return None

    def wait(self, job_id: JobId, timeout_s: float) -> JobResult:
        """Wait for one job; VendorError TIMEOUT if it is not done in ``timeout_s`` (it stays in flight)."""
        if timeout_s < 0:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"timeout {timeout_s} < 0")
        if self._virtual:
            return self._wait_virtual(job_id, timeout_s)
        deadline = self._clock.now() + timeout_s
        with self._cond:
            while True:
                result = self.take(job_id)
                if result is not None:
                    return result
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    self.wait_timeouts += 1
                    raise VendorError(ReturnCode.TIMEOUT, f"job {job_id} not complete after {timeout_s} s")
                self._sleep(remaining)

    def _wait_virtual(self, job_id: JobId, timeout_s: float) -> JobResult:
        """The FakeClock is advanced to the completion instant, or by ``timeout_s`` on a timeout."""
        self.advance_virtual()
        with self._cond:
            result = self.take(job_id)
            if result is not None:
                return result
            job = self.pending[job_id]
            fake = self._fake_clock()
            now = self._clock.now()
            if fake is not None and job.finish is not None and job.finish <= now + timeout_s:
                fake.set(max(job.finish, now))
                self.advance_virtual()
                result = self.take(job_id)
                assert result is not None
                return result
            if fake is not None and timeout_s > 0:
                fake.set(now + timeout_s)
                self.advance_virtual()
                result = self.take(job_id)
                if result is not None:
                    return result
            self.wait_timeouts += 1
            raise VendorError(ReturnCode.TIMEOUT, f"job {job_id} not complete after {timeout_s} s")

    def _sleep(self, seconds: float) -> None:
        """Wait on the device condition (lock held), counted in :attr:`sleepers` so that a submit that finds
        nobody waiting skips the notify (a few Python calls per B1 token on the null device, issue #20)."""
        self.sleepers += 1
        try:
            self._cond.wait(seconds)
        finally:
            self.sleepers -= 1

    def wait_any(self, timeout_s: float) -> list[JobResult]:
        """Every completed result, waiting up to ``timeout_s`` for at least one ([] on timeout)."""
        if timeout_s < 0:
            raise VendorError(ReturnCode.INVALID_ARGUMENT, f"timeout {timeout_s} < 0")
        if self._virtual:
            self.advance_virtual()
            with self._cond:
                if self.done:
                    return self.drain()
                fake = self._fake_clock()
                now = self._clock.now()
                nxt = self.next_instant()
                if fake is not None:
                    fake.set(nxt if nxt is not None and nxt <= now + timeout_s else now + timeout_s)
                    self.advance_virtual()
                return self.drain()
        deadline = self._clock.now() + timeout_s
        with self._cond:
            while not self.done:
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    return []
                self._sleep(remaining)
            return self.drain()
