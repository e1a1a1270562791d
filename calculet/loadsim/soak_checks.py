"""Checks a soak runs beside the engine: a violation ledger and the device-level quarantine guard.

Why outside the run loop: each check is an observer with its own small state. The ledger
keeps the first violations verbatim and counts the rest by kind (a day of traffic must not
grow memory with its own findings). The guard watches the device's CalRT calls and flags a
device sequence used again after its job failed or its result did not check out
(:func:`~calculet.adapters.calrt.verify_result`) before it was freed or the device reset (§9.2
quarantine, §14). The reset window records when each reset and restart happened, so a report can
say how close the run came to the §15 budget (``recovery.max_resets_per_10min`` in any sliding
10 minutes): the peak count in any window, not only the totals.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Callable

from calculet.adapters.calrt import DecodeJob, JobResult, JobSpec, JobTicket, ReturnCode, verify_result
from calculet.adapters.sim import SimVirtualDevice
from calculet.adapters.observed import DeviceObserver

__all__ = ["QuarantineGuard", "ResetWindow", "Violations"]


class Violations:
    """Collects violations; keeps the first ``limit`` texts and counts the rest by kind."""

    def __init__(self, limit: int = 500) -> None:
        self.items: list[str] = []
        self.by_kind: Counter[str] = Counter()
        self.limit = limit

    def add(self, kind: str, detail: str) -> None:
        self.by_kind[kind] += 1
        if len(self.items) < self.limit:
            self.items.append(f"{kind}: {detail}")

    def all(self) -> tuple[str, ...]:
        extra = [f"{kind}: {n - shown} more" for kind, n in self.by_kind.items()
                 if (shown := sum(1 for i in self.items if i.startswith(kind + ":"))) < n]
        return tuple(self.items + extra)


class QuarantineGuard(DeviceObserver):
    """Device-level check: a sequence whose job failed is not used again until freed or reset."""

    def __init__(self, violations: Violations) -> None:
        self.violations = violations
        self.jobs: dict[int, tuple[JobSpec, JobTicket]] = {}
        self.quarantined: dict[int, str] = {}
        self.quarantines = 0

    @staticmethod
    def _seqs(job: JobSpec) -> tuple[int, ...]:
        if isinstance(job, DecodeJob):
            return tuple(int(job.seq_ids[i]) for i in job.active_lanes)
        return (int(job.seq_id),)

    def device_created(self, device: SimVirtualDevice, index: int) -> None:
        self.device_reset()

    def submitted(self, job: JobSpec, ticket: JobTicket) -> None:
        for seq in self._seqs(job):
            why = self.quarantined.get(seq)
            if why is not None:
                self.violations.add("quarantined_reuse", f"sequence {seq} used by job {int(ticket.job_id)} "
                                                         f"while quarantined ({why})")
        self.jobs[int(ticket.job_id)] = (job, ticket)

    def completed(self, result: JobResult) -> None:
        entry = self.jobs.pop(int(result.job_id), None)
        if entry is None:
            return
        job, ticket = entry
        check = verify_result(job, ticket, result)
        if result.rc is ReturnCode.OK and check.ok:
            return
        why = result.rc.name if result.rc is not ReturnCode.OK else check.anomalies[0][0].value
        for seq in self._seqs(job):
            self.quarantined[seq] = f"job {int(result.job_id)} {why}"
            self.quarantines += 1

    def sequence_allocated(self, seq: int) -> None:
        self.quarantined.pop(seq, None)

    def sequence_freed(self, seq: int) -> None:
        self.quarantined.pop(seq, None)

    def device_reset(self) -> None:
        self.jobs.clear()
        self.quarantined.clear()


class ResetWindow(DeviceObserver):
    """Device-level record of recoveries: the most resets + restarts in any sliding window.

    A reset is a ``reset_configuration`` call; a restart is a new device after the first. ``now``
    is the engine's clock (set once the driver exists); the window matches the recovery budget's
    (``runtime/execution/recovery.py``, 600 s). :meth:`stop` before the orderly stop, whose own
    ``reset_configuration`` is not a recovery.
    """

    def __init__(self, window_s: float = 600.0) -> None:
        self.window_s = window_s
        self.now: Callable[[], float] = lambda: 0.0
        self.times: deque[float] = deque()
        self.peak = 0
        self.peak_at = 0.0
        self.count = 0
        self.recording = True

    def stop(self) -> None:
        self.recording = False

    def _recovered(self) -> None:
        if not self.recording:
            return
        now = self.now()
        times = self.times
        times.append(now)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        self.count += 1
        if len(times) > self.peak:
            self.peak, self.peak_at = len(times), now

    def calling(self, call: str) -> None:
        if call == "reset_configuration":
            self._recovered()

    def device_created(self, device: SimVirtualDevice, index: int) -> None:
        if index > 0:
            self._recovered()
