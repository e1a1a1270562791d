"""In-flight jobs: each planned job is a DeviceJobMachine instance, keyed by its job id (§7.4, §14).

The table is how the scheduler knows which callbacks are current (§4: every callback carries
generation and job id) and how many device slots are held (§5.1 ``max_inflight_jobs``). A
slot stays held while the device may still write the job's buffers — submitted, timed out or
quarantined — and is released only by a completion, a late completion or a reset; a job's
lifecycle moves only through the machine's declared events. The same jobs are what a model
generation counts as its jobs on the device (``runtime/models/generations.py`` ``jobs_on_device``):
the ModelMachine keeps no copy of that count (issue #20).

Engines (§14): a job runs wholly on PING or PONG, chosen when it is planned: the first
engine no held job uses; with ``fixed_engine`` always PING (then only one job at a time).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from calculet.errors import DefinitionError
from calculet.machines import DeviceJobMachine
from calculet.machines.job import JobEngine
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.kv import KvBatchReservation

PREFILL = "prefill"
DECODE = "decode"
_ENDED = frozenset({"completed", "failed"})
_PING = JobEngine.PING
_PING_ONLY = (_PING,)
_BOTH = (JobEngine.PING, JobEngine.PONG)
_JOB = DeviceJobMachine.Instance


class JobRecord(_JOB):
    """A job the scheduler planned: its DeviceJobMachine instance itself, with its kind and what it carries.

    One object per job, not a record around a machine (issue #20: two creations per decode step): the
    declaration's parameters (``job_id``, ``generation``, ``engine``, ``lanes``) and variables are its slots,
    ``fire`` is the machine's generated one, and :meth:`InflightTable.plan` sets the three slots added here.
    ``machine`` names the record itself, for readers that ask for the machine of a job."""

    __slots__ = ("kind", "work", "submitted_at")

    kind: str
    work: Any
    submitted_at: float

    @property
    def machine(self) -> "JobRecord":
        return self


_new_job = JobRecord.__new__
_init_job = JobRecord.__init__
"""A job's allocation and its generated ``__init__`` (its parameters' checks), called as two functions: the class
call passed the keywords through a dict to ``__init__`` (~0.3 µs of a ~0.9 µs plan, issue #20)."""


@dataclass(frozen=True)
class JobStatistics:
    """§16 executor-side view: in flight, by engine and state, and how jobs ended."""

    inflight: int
    max_inflight: int
    by_state: dict[str, int]
    by_engine: dict[str, int]
    planned: int
    ended: dict[str, int]


class InflightTable:
    """Jobs from planning to the end of their device lifetime."""

    def __init__(self, *, max_inflight: int, fixed_engine: bool = False) -> None:
        if max_inflight not in (1, 2):
            raise ValueError("max_inflight must be 1 or 2 (§14: PING and PONG)")
        if fixed_engine and max_inflight != 1:
            raise ValueError("fixed_engine needs max_inflight 1")
        self.max_inflight = max_inflight
        self.fixed_engine = fixed_engine
        self._jobs: dict[int, JobRecord] = {}
        self.by_id: Mapping[int, JobRecord] = self._jobs
        """The table itself, read-only: the decode completion asks whether another job is in it without a
        ``__len__`` frame (once per step, issue #20)."""
        self._held: list[JobEngine] = []
        """The engines of the jobs in the table (one job per engine: ``plan`` takes a free one). A list of at
        most two: membership compares, where a set hashed the enum in Python (``Enum.__hash__``) on every
        plan, slot test and end — three calls per job (issue #20)."""
        self._planned = 0
        self._ended: Counter[str] = Counter()
        self.binding: dict[int, JobRecord] = {}
        """KV lane -> the job whose batch last opened a transaction on it (a ``submit``), kept while that job has
        ended until another job's batch takes the lane: JobLaneSystem's ``binding`` (#17), recorded where jobs
        are submitted (one dict update per job) while the monitor is attached (:attr:`check`), which reads it."""
        self.check: Callable[[JobRecord, str], None] | None = None
        """The JobLaneSystem monitor's check before a job event (#17), asked for the events the monitors' draw
        picks (``MONITOR.draws``, drawn here: a job event that is not checked costs no call, issue #20)."""

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(list(self._jobs.values()))

    def get(self, job_id: int) -> JobRecord | None:
        return self._jobs.get(job_id)

    def has_slot(self) -> bool:
        """Whether a job may be planned now.

        Fewer than ``max_inflight`` jobs in the table is enough: each holds a different engine
        (:meth:`plan` takes a free one), so with one job held and ``max_inflight`` 2 the other engine is
        free, and with ``max_inflight`` 1 an empty table leaves PING free. ``fixed_engine`` comes with
        ``max_inflight`` 1 (the constructor and the executor config refuse 2; the §14 degrade only lowers it).
        So :meth:`_free_engine` is not asked here, once a step (issue #20); :meth:`plan` asks it. The engine reads
        the answer after a planned job from its plan (``Plan.last_slot``), not by asking again."""
        return len(self._jobs) < self.max_inflight

    def plan(self, job_id: int, kind: str, generation: int, lanes: int, work: Any) -> JobRecord:
        held = self._held
        # an empty table: PING, the first engine of either order (the usual decode step, no _free_engine frame)
        engine = _PING if not held else self._free_engine()
        if engine is None or len(self._jobs) >= self.max_inflight:
            raise DefinitionError("no in-flight slot: plan() must follow has_slot()")
        job = _new_job(JobRecord)  # JobRecord(...) without the class call's kwargs dict (once per step, #20):
        _init_job(job, job_id=job_id, generation=generation, engine=engine, lanes=lanes)  # the generated __init__
        job.kind, job.work, job.submitted_at = kind, work, 0.0
        self._jobs[job_id] = job
        held.append(engine)
        self._planned += 1
        return job

    def fire(self, job: JobRecord, event: str, **args: Any) -> str:
        """Fire a job event; a job that reaches a terminal state leaves the table (slot free). The state before the
        event is a step boundary of the monitor's (checked when drawn); a ``submit`` is :meth:`submit`'s (it binds
        the batch's lanes)."""
        if event == "submit" and not args:
            return self.submit(job, lanes_of(job.work) if self.check is not None else ())  # bound only when read
        check = self.check
        if check is not None and MONITOR.enabled and next(MONITOR.draws):  # the monitor attached (every Scheduler's)
            check(job, event)
        target: str = job.fire(event, **args)
        if target in _ENDED:
            self.end(job)
        return target

    def submit(self, job: JobRecord, lanes: Iterable[int]) -> str:
        """The device accepted ``job``, whose batch is on ``lanes`` (:func:`lanes_of` its work, which the caller
        knows): its ``submit`` fired, the state before it a step boundary of the monitor's (checked when drawn), and
        the lanes bound to it (the model's ``enlist``) while the monitor is attached. One call per job from the
        scheduler, no lanes read back from the work (issue #20)."""
        check = self.check
        if check is not None:  # the monitor attached (every Scheduler's table)
            if MONITOR.enabled and next(MONITOR.draws):
                check(job, "submit")
            binding = self.binding
            for lane in lanes:  # no dict built per job to update from (B1: one lane)
                binding[lane] = job
        target: str = job.fire("submit")
        if target in _ENDED:  # no ``submit`` row ends a job (DeviceJobMachine), asked as for every event
            self.end(job)
        return target

    def end(self, job: JobRecord) -> None:
        """A job reached a terminal state: it leaves the table, its engine and slot free (also after a composite's
        events, :mod:`.step_done`)."""
        del self._jobs[job.job_id]
        engine = job.engine
        if engine in self._held:
            self._held.remove(engine)
        self._ended[job.last_transition.name] += 1

    def statistics(self) -> JobStatistics:
        states = Counter(j.state for j in self._jobs.values())
        engines = Counter(j.engine.name for j in self._jobs.values())
        return JobStatistics(len(self._jobs), self.max_inflight, dict(states), dict(engines), self._planned,
                             dict(self._ended))

    def _free_engine(self) -> JobEngine | None:
        """The first engine no held job uses (PING only when fixed or one job at a time, §14)."""
        held = self._held
        engines = _BOTH if self.max_inflight > 1 and not self.fixed_engine else _PING_ONLY
        for engine in engines:
            if engine not in held:
                return engine
        return None


def lanes_of(work: Any) -> Sequence[int]:
    """The KV lanes of a job's batch: a decode batch's reservation's (recorded by ``reserve_batch``), or a
    prefill's one lease's."""
    kv = getattr(work, "kv", None)
    if isinstance(kv, KvBatchReservation):
        return kv.lanes or [lease.lane for lease in kv.leases]
    return (work.lease.lane,)
