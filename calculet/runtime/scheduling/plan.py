"""What the scheduler and the engine's actor say to each other (§3–§9, §16).

The scheduler (:mod:`calculet.runtime.scheduling.scheduler`) is sans-io: it answers with values
and never performs the work. These are those values — the answer to ``submit``
(:class:`Submission`), one tick's plan (:class:`Plan`), what a completion did (:class:`Applied`),
the KV commands the engine executes through the adapter (:data:`Command`, §9.2), the capability
facts scheduling depends on (:class:`SchedulingCapabilities`, DESIGN principle 8) and the §16
statistics. They live apart from the scheduler so that both sides, and the parts of the
scheduler (completions, generations), share them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

from calculet.machines.job import JobEngine
from calculet.runtime.scheduling.admission import AdmissionOutcome, AdmissionStatistics
from calculet.runtime.scheduling.decode import DecodeBatch, DecodeStatistics
from calculet.runtime.scheduling.estimates import StepTimeStatistics
from calculet.runtime.scheduling.on_time_planner import OnTimeStatistics
from calculet.runtime.scheduling.jobs import JobStatistics
from calculet.runtime.scheduling.kv import FreeSequence, KvLaneStatistics, ShiftSequence
from calculet.runtime.scheduling.prefill import PrefillStatistics, PrefillWork
from calculet.runtime.scheduling.registry import RegistryStatistics

Command = Union[FreeSequence, ShiftSequence]
"""A KV command for the engine to execute through the adapter, then confirm (§9.2)."""


@dataclass(frozen=True, slots=True)
class SchedulingCapabilities:
    """Facts of the runtime's capability contract that scheduling depends on (DESIGN principle 8)."""

    incremental_prefill: bool = False
    """The compiler/runtime explicitly supports incremental prefill (§6); chunking needs it."""
    lane_failure_isolation: bool = False
    """A failed batch job may still carry good lanes (§7.4, R7.4.6)."""
    vocab_size: int | None = None
    """Tokens at or above it are unusable output."""


class Submission(NamedTuple):
    """What ``submit`` answers: the request id (0 if none could be created) and the outcome (immutable; a
    named tuple, built once per request at a third of a frozen dataclass's cost, issue #20)."""

    request_id: int
    outcome: AdmissionOutcome


class Plan(NamedTuple):
    """One scheduler step: the job to submit (if any), its engine, and when to step again (immutable; a named
    tuple, built once per step at a fraction of a frozen dataclass's cost, issue #20)."""

    work: PrefillWork | DecodeBatch | None
    engine: JobEngine | None = None
    wake_at: float | None = None
    reason: str = ""
    last_slot: bool = False
    """The job takes the last in-flight slot: until a job ends, another step finds none (the engine stops planning
    once it is submitted; the slots are the jobs table's, counted when the job was planned, issue #20)."""


class Applied(NamedTuple):
    """What a completion did: applied to its lanes, or dropped as stale (resources reclaimed). Immutable; a
    named tuple, built once per completion at a third of a frozen dataclass's cost (issue #20)."""

    job_id: int
    stale: bool
    lanes_ok: int = 0
    lanes_failed: int = 0


@dataclass(frozen=True)
class SchedulerStatistics:
    generation: int
    availability: str
    registry: RegistryStatistics
    admission: AdmissionStatistics
    prefill: PrefillStatistics
    decode: DecodeStatistics
    kv: KvLaneStatistics
    jobs: JobStatistics
    wrr_picks: dict[str, int]
    stale_completions: int
    anomalies: int
    pending_commands: int
    step_times: StepTimeStatistics
    on_time: OnTimeStatistics | None = None
    """The ``on_time`` policy's counters (issue #13); None under another deadline order."""
