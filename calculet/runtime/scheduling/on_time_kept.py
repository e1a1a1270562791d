"""The ``on_time`` planner's kept set: the jobs its last plan keeps, and those admitted since (issues #13, #20).

Why this module exists: admission (§5.2) places most candidates at the tail of the cached EDF lane schedule
(:mod:`.on_time_cache`) and appends them to the kept set, and the next event replans from the live requests,
rebuilding that set. In between, the admitted jobs are read only where a submit takes the slow path (a
refusal, an earlier deadline), by the admission-order estimate, or when a request ends. So an admission
keeps its job's *values* — a tuple, what the request is to the estimator at its submit — and a
:class:`~.finish_estimate.PendingJob` is built from them only when the list is read (:meth:`KeptJobs.jobs`):
equal to the one built at submit, in the same order. Issue #20 measured building the job at each submit at
about a sixth of the on_time screen's CPU (a frozen dataclass with a ``__dict__``, two calls).

:func:`job_values` is the one statement of what a request is as a job; :func:`pending_job` builds it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, TypeAlias

from calculet.machines.request import DECODING, HOLDING, WAITING
from calculet.runtime.scheduling.finish_estimate import PendingJob
from calculet.runtime.scheduling.registry import RequestRecord

PLANNED_STATES: frozenset[str] = WAITING | HOLDING
"""States of a request that still needs device time: waiting, or holding a lane (the declaration's groups)."""
DECODING_STATES: frozenset[str] = DECODING & HOLDING
"""Those of them past the prefill: its remaining tokens are decode steps."""

JobValues: TypeAlias = tuple[int, int, int, "float | None", float]
"""``PendingJob.trusted``'s arguments: (id, prefill_tokens, decode_steps, deadline, weight)."""


def job_values(rec: RequestRecord, weight: float) -> JobValues | None:
    """The request as the estimator sees it, or None when it needs no more device time: a request not yet
    prefilled needs its prompt and ``max_new_tokens - 1`` steps (the prefill yields the first token), a decoding
    one its remaining tokens. ``trusted`` (#20): the values are the request machine's bounded variables and a
    configured weight, checked where they entered."""
    machine = rec.machine
    state = machine.state
    if state not in PLANNED_STATES:
        return None
    if state in DECODING_STATES:
        return rec.request_id, 0, machine.max_new_tokens - machine.generated_tokens, rec.deadline, weight
    return rec.request_id, machine.prompt_tokens, machine.max_new_tokens - 1, rec.deadline, weight


def pending_job(rec: RequestRecord, weight: float) -> PendingJob | None:
    """:func:`job_values` as the estimator's job (None: no more device time needed)."""
    values = job_values(rec, weight)
    return None if values is None else PendingJob.trusted(*values)


def planned_jobs(records: Iterable[RequestRecord],
                 weights: Mapping[str, float]) -> tuple[dict[int, RequestRecord], list[PendingJob]]:
    """The requests that still need device time, by id, and their jobs in the same order: what a replan plans.
    One pass, :func:`job_values` deciding who is planned (#20, session 26: the replan read each state twice)."""
    trusted = PendingJob.trusted
    live: dict[int, RequestRecord] = {}
    jobs: list[PendingJob] = []
    for rec in records:
        values = job_values(rec, weights.get(rec.tenant, 1.0))
        if values is not None:
            live[values[0]] = rec
            jobs.append(trusted(*values))
    return live, jobs


class KeptJobs:
    """The kept jobs of the last plan, then the jobs admitted since in admission order (held as values)."""

    __slots__ = ("_jobs", "_since", "admitted")

    def __init__(self, jobs: list[PendingJob] | None = None) -> None:
        self._jobs: list[PendingJob] = [] if jobs is None else jobs
        self._since: list[JobValues] = []
        self.admitted: Callable[[JobValues], None] = self._since.append
        """A job admitted at the tail of the schedule, as its values: built only if the list is read before the
        next plan. The list's own ``append`` (no Python frame per ``submit()``, #20); :meth:`jobs` empties that
        list in place, so it stays the one this appends to."""

    def jobs(self) -> list[PendingJob]:
        """Every kept job in order, the admitted ones built now (once): the list itself, so a caller that appends
        to it appends to the set, and jobs keep their identity from one read to the next."""
        since = self._since
        if since:
            trusted = PendingJob.trusted
            self._jobs.extend([trusted(*values) for values in since])
            since.clear()
        return self._jobs

    def holds(self, request_id: int) -> bool:
        """Whether the request's work is in the set (O(kept): read when a request ends)."""
        return (any(job.id == request_id for job in self._jobs)
                or any(values[0] == request_id for values in self._since))

    def __len__(self) -> int:
        return len(self._jobs) + len(self._since)
