"""The record of one job the device accepted (§3, §4, §12), from submit until its result is
dispatched or a reset discards it.

The executor creates and tracks these; the result checks (:mod:`.verification`) and the
completion dispatcher (:mod:`.dispatch`) read them. It lives apart so that those three import
this record, not one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from calculet.adapters.calrt import JobId, JobSpec, JobTicket
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.prefill import PrefillWork

Work = Union[PrefillWork, DecodeBatch]
"""What the scheduler planned for one job: a prefill (chunk) or a decode batch."""


@dataclass(eq=False, slots=True)
class InflightJob:
    """A job the device accepted, until its result is dispatched or a reset discards it. Slotted: one is made per
    job, and its fields are read by the result checks and the dispatcher (issue #20)."""

    job_id: int
    """The scheduler's job id (the DeviceJobMachine's)."""
    ticket: JobTicket
    work: Work
    spec: JobSpec
    deadline: float
    overlapped: bool
    """Another job was on the device when this one was submitted (ping/pong)."""
    timed_out: bool = False

    @property
    def device_job(self) -> JobId:
        return self.ticket.job_id

    @property
    def generation(self) -> int:
        return self.ticket.generation
