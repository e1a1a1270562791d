"""The engine's public records (§3, §16): how it runs, what a request looks like when the service
hands it over, what ``/models`` and the metrics read, and where a delivered token came from.

Shared by the actor core, the threaded engine, the virtual-time driver and their callers (the
server, the load simulator, the benchmarks), so none of them needs the others to name these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

from calculet.adapters.calrt import DeviceCapabilities
from calculet.runtime.actor import MailboxStatistics
from calculet.runtime.distribution import DistributionSnapshot
from calculet.runtime.engine.goodput import GoodputStatistics
from calculet.runtime.execution.dispatch import CompletionStatistics
from calculet.runtime.execution.executor import ExecutorStatistics
from calculet.runtime.execution.recovery import RecoveryStatistics
from calculet.runtime.execution.sampler import SamplerStatistics, SamplingParams
from calculet.runtime.execution.session import SessionStatistics
from calculet.runtime.models.reports import ModelManagerStatistics
from calculet.runtime.scheduling.plan import SchedulerStatistics

__all__ = ["EngineOptions", "EngineStatistics", "ExecutionMode", "GenerateRequest", "ModelInfo", "TokenProvenance"]


class ExecutionMode(str, enum.Enum):
    ASYNC = "async"
    """Submit, return to the loop, collect the completion later (the production path)."""
    SYNC = "sync"
    """Submit and Wait for each job (the M1 synchronous baseline; in-flight 1 only)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request as the service hands it to the engine.

    ``deadline_ms`` is relative to arrival on the monotonic clock; None takes
    ``admission.deadline_default_ms`` (§15). Tenant weights and limits come only from the
    configuration (§5.3, R5.3.7).
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    tenant: str = "default"
    deadline_ms: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(self.prompt))


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings that are not part of ``calculet-scheduler/v1`` (decisions where the spec is
    silent: see :mod:`calculet.runtime.engine.core`)."""

    mode: ExecutionMode = ExecutionMode.ASYNC
    generation: int = 1
    job_timeout_s: float = 30.0
    prefill_timeout_per_token_s: float = 1e-3
    busy_backoff_s: float = 1e-3
    verify_golden: bool = True
    """§11 step 9 at bring-up and after every reset; impossible with numerics off."""
    warmup: bool | None = None
    """§11 step 9 warm-up jobs (one prefill, one decode per profile) before a generation is
    published; None follows ``verify_golden`` (a numerics-off simulation keeps its clock at 0)."""
    check_output_buffers: bool = True
    """The data-channel crosstalk check (reads each job's OutputBuf once)."""
    sampler_seed: int = 0
    degrade_min_samples: int = 64
    monitor_mode: Literal["raise", "count"] | None = "count"
    """``ThreadedEngine.start`` applies ``monitoring.invariants`` with this mode; None leaves the global
    monitor as it is (tests keep it raising)."""
    trace_components: bool = False
    """Record (component, request id) as requests pass each §3 component (R3.1)."""
    actor_idle_s: float = 0.5
    """Longest the actor thread sleeps when nothing is due (it is woken by any message)."""
    wake_coalesce_s: float = 1e-3
    """Longest a stream's consumer loop (the HTTP server's event loop) waits to be woken for a token while the
    actor keeps finding work (issue #20). The actor wakes every waiting loop before it sleeps, so with a device
    step longer than its own turn (any real device) a token is handed over at once; only a device that completes
    steps back to back (the null device) sees its tokens handed over in groups, at most this late. 0: every
    turn."""


@dataclass(frozen=True)
class ModelInfo:
    """The served model generation and its capability contract (what ``/models`` shows)."""

    generation: int
    calbin: str
    exact_submodel: str
    package_sha256: str
    vocab_size: int
    bos_token: int
    eos_token: int
    max_seq: int
    profiles: tuple[int, ...]
    capabilities: DeviceCapabilities


@dataclass(frozen=True)
class EngineStatistics:
    """Every component's statistics in one frozen record, for the metrics layer (§16)."""

    state: str
    mode: str
    generation: int
    availability: str
    accepting: bool
    ticks: int
    host_time_per_tick_s: float
    host_time_max_s: float
    accepted: int
    rejected_before_admission: dict[str, int]
    finished: dict[str, int]
    live_requests: int
    pending_frees: int
    scheduler: SchedulerStatistics
    executor: ExecutorStatistics
    completion: CompletionStatistics
    sampler: SamplerStatistics
    recovery: RecoveryStatistics
    session: SessionStatistics
    mailbox: MailboxStatistics | None
    device: Any
    models: ModelManagerStatistics | None = None
    goodput: GoodputStatistics | None = None
    """On-time completions and wasted device work (issue #13), counted by the request desk."""
    host_tick: DistributionSnapshot | None = None
    """Host time of every tick (§16 executor: the host tick time as a histogram)."""


@dataclass(frozen=True)
class TokenProvenance:
    """Where a delivered token came from (generation isolation, §10, R19.16): the request's pinned
    generation, the generation of the job that produced it, the generation the device's result
    carried, and the generation whose calbin the result names."""

    request_id: int
    token: int
    request_generation: int
    job_generation: int
    result_generation: int
    calbin_generation: int

    @property
    def isolated(self) -> bool:
        return (self.request_generation == self.job_generation == self.result_generation
                == self.calbin_generation)
