"""What a model lifecycle operation reports (§10, §11, §12, §16): the steps, their errors, the
reports and the status/statistics records the admin API and the metrics read.

Kept apart from the operations themselves so the server (admin API, error mapping, metrics) can
name these records without pulling in the load/unload machinery; every record is frozen
(DESIGN principle 7).
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calculet.errors import CalculetError, ConfigError, DeviceFault, NotFound, PackageError
from calculet.runtime.execution.session import RuntimeSession

__all__ = [
    "MEASURED", "DurationStatistics", "Durations", "GenerationIdentity", "LifecycleTally", "LoadFailed", "LoadReport",
    "LoadStep", "ModelGeneration", "ModelManagerStatistics", "ModelStatus", "StepHook", "StepTiming", "UnloadFailed",
    "UnloadReport", "UnloadStep",
]

class LoadStep(enum.IntEnum):
    """The 11 steps of §11 ``load(alias, package)``."""

    RESOLVE = 1
    VERIFY = 2
    VALIDATE = 3
    PLAN = 4
    LOCK = 5
    DRAIN_OLD = 6
    CREATE = 7
    INSPECT = 8
    GOLDEN = 9
    PUBLISH = 10
    RETAIN = 11

    @property
    def state(self) -> str:
        """The ModelMachine state of the new generation while this step runs."""
        if self <= LoadStep.PLAN:
            return "validating"
        if self <= LoadStep.CREATE:
            return "configuring"
        if self <= LoadStep.GOLDEN:
            return "warming"
        return "ready"

    @property
    def title(self) -> str:
        return _LOAD_TITLES[self]


_LOAD_TITLES = {
    LoadStep.RESOLVE: "resolve trusted package path", LoadStep.VERIFY: "verify signature + all hashes",
    LoadStep.VALIDATE: "static validator and compatibility", LoadStep.PLAN: "capacity plan (outside the lock)",
    LoadStep.LOCK: "lifecycle lock; stop new admission", LoadStep.DRAIN_OLD: "drain the old generation",
    LoadStep.CREATE: "CreateCalbin -> configure -> KvManager -> pools",
    LoadStep.INSPECT: "inspect exact tensors/profile",
    LoadStep.GOLDEN: "golden + warmup", LoadStep.PUBLISH: "publish alias -> new generation",
    LoadStep.RETAIN: "retain the old signed artifact",
}


class UnloadStep(enum.IntEnum):
    """The steps of §12 unload, in the spec's order."""

    DRAIN = 1
    WAIT = 2
    CANCEL = 3
    FREE_KV = 4
    DESTROY = 5
    RESET = 6
    VERIFY = 7

    @property
    def title(self) -> str:
        return _UNLOAD_TITLES[self]


_UNLOAD_TITLES = {
    UnloadStep.DRAIN: "Ready -> Draining; reject/route new requests",
    UnloadStep.WAIT: "wait active_requests and inflight_jobs to zero until the deadline",
    UnloadStep.CANCEL: "cancel what still waits; submitted jobs still drain",
    UnloadStep.FREE_KV: "free sequences/KV, destroy pools", UnloadStep.DESTROY: "destroy KvManager and calbin",
    UnloadStep.RESET: "ResetConfiguration only per the verified contract",
    UnloadStep.VERIFY: "verify device memory/health",
}

StepHook = Callable[[LoadStep | UnloadStep, int], None]
"""Called with (step, generation) as each step starts; raising fails that step (fault injection)."""


@dataclass(frozen=True)
class StepTiming:
    step: str
    started_at: float
    seconds: float


@dataclass(frozen=True)
class LoadReport:
    """What a load (or rollback, or restore) did, for the caller, the admin API and the logs.

    ``downtime_s`` is the time new requests for the alias were held (step 5 until the publish or
    the old generation's return); it is None when nothing was replaced. It is never reported as
    zero downtime: on CalRT 0.7.6 configure is device-global and the old model is drained first
    (§11, R11.14).
    """

    kind: str
    alias: str
    generation: int
    calbin_sha256: str
    ok: bool
    state: str
    replaced: int | None = None
    coresident: bool = False
    previous_drained: bool = False
    downtime_s: float | None = None
    restored_generation: int | None = None
    rollback_available: bool = False
    failed_step: str | None = None
    error: str = ""
    golden: str = ""
    warnings: tuple[str, ...] = ()
    steps: tuple[StepTiming, ...] = ()
    previous_unload: UnloadReport | None = None


@dataclass(frozen=True)
class UnloadReport:
    alias: str
    generation: int
    state: str
    drain_s: float
    deadline_passed: bool
    cancelled_requests: int
    went_recovering: bool
    reset_configuration: bool
    escalation: str
    problems: tuple[str, ...]
    steps: tuple[StepTiming, ...]


class LoadFailed(CalculetError):
    """A load failed at ``step``; ``cause`` is the underlying error, ``report`` what was done about it."""

    code = "load_failed"

    def __init__(self, step: LoadStep, cause: BaseException, report: LoadReport) -> None:
        what = f"{type(cause).__name__}: {cause}"
        extra = ""
        if report.restored_generation is not None:
            extra = f"; the previous version was restored as generation {report.restored_generation}"
        elif report.state == "old_serving":
            extra = f"; generation {report.replaced} is still serving"
        super().__init__(f"loading {report.alias!r} failed at §11 step {int(step)} ({step.title}): {what}{extra}",
                         step=int(step), alias=report.alias, generation=report.generation)
        self.step = step
        self.cause = cause
        self.report = report
        if isinstance(cause, (PackageError, ConfigError)):
            self.http_status = 400  # the caller named a package the checks refuse (§11 steps 1–3)
        else:
            self.http_status = cause.http_status if isinstance(cause, CalculetError) else 500


class UnloadFailed(DeviceFault):
    """An unload could not leave the device verified clean; the generation stays in Unloading."""

    code = "unload_failed"



# ---------------------------------------------------------------------------------------------
# Public records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationIdentity:
    """§10 ``ModelGeneration`` identity: fixed once steps 1–3 pass, never changed (R3.3)."""

    generation: int
    alias: str
    calbin_sha256: str
    package: str
    signed_by: str


@dataclass(frozen=True)
class ModelGeneration:
    """A snapshot of one generation (§10 ``ModelGeneration``), as ``status()`` lists it."""

    id: int
    alias: str
    calbin_sha256: str
    state: str
    runtime: RuntimeSession | None
    active_requests: int
    inflight_jobs: int
    published: bool
    package: str
    signed_by: str
    name: str
    exact_submodel: str
    max_seq: int
    profiles: tuple[int, ...]
    durations_s: dict[str, float]
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """The admin API's model entry (``calculet.server.schemas.ModelStatusResponse`` shape)."""
        return {"alias": self.alias, "generation": self.id, "state": self.state, "active": self.published,
                "calbin": self.name or None, "exact_submodel": self.exact_submodel or None,
                "package": self.package or None, "package_sha256": self.calbin_sha256 or None,
                "max_seq": self.max_seq or None, "profiles": list(self.profiles),
                "durations_s": dict(self.durations_s), "detail": self.detail,
                "active_requests": self.active_requests, "inflight_jobs": self.inflight_jobs,
                "signed_by": self.signed_by}


@dataclass(frozen=True)
class ModelStatus:
    """Every alias and generation the manager knows, read on the actor (a consistent snapshot)."""

    alias: str
    current: int | None
    rollback_available: bool
    previous_sha256: str | None
    previous_package: str | None
    operation: str | None
    queued_operations: int
    generations: tuple[ModelGeneration, ...]

    def generation(self, gen_id: int) -> ModelGeneration:
        for g in self.generations:
            if g.id == gen_id:
                return g
        raise NotFound(f"no generation {gen_id}")


@dataclass(frozen=True)
class DurationStatistics:
    count: int
    total_s: float
    max_s: float
    last_s: float


@dataclass(frozen=True)
class ModelManagerStatistics:
    """§16 model metrics: generation/state and load/configure/warmup/drain/unload durations."""

    alias: str
    current_generation: int
    generations_by_state: dict[str, int]
    loads: int
    load_failures: dict[str, int]
    replacements: int
    coresident_replacements: int
    restores: int
    rollbacks: int
    unloads: int
    unload_problems: int
    escalations: int
    lifecycle_busy: bool
    queued_operations: int
    load: DurationStatistics
    configure: DurationStatistics
    warmup: DurationStatistics
    drain: DurationStatistics
    unload: DurationStatistics
    downtime: DurationStatistics


MEASURED = ("load", "configure", "warmup", "drain", "unload", "downtime")
"""The durations the manager measures: one :class:`DurationStatistics` field each in
:class:`ModelManagerStatistics` (every one but ``downtime`` also a generation's ``durations``)."""


class Durations:
    """A running count, total, maximum and last value of one measured duration."""

    __slots__ = ("count", "total", "max", "last")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.last = 0.0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)
        self.last = seconds

    def freeze(self) -> DurationStatistics:
        return DurationStatistics(self.count, self.total, self.max, self.last)



class LifecycleTally:
    """The manager's running figures (§16): operation counts and the measured phase durations."""

    def __init__(self) -> None:
        self.loads = 0
        self.load_failures: collections.Counter[str] = collections.Counter()
        self.replacements = 0
        self.coresident = 0
        self.restores = 0
        self.rollbacks = 0
        self.unloads = 0
        self.unload_problems = 0
        self.escalations = 0
        self.durations = {name: Durations() for name in MEASURED}

    def measured(self, durations: dict[str, float], phase: str, seconds: float) -> None:
        """A §16 phase duration: a generation's last one (``durations``), and the running figures."""
        durations[phase] = seconds
        self.durations[phase].add(seconds)

    def freeze(self, *, alias: str, current_generation: int, generations_by_state: dict[str, int],
               lifecycle_busy: bool, queued_operations: int) -> ModelManagerStatistics:
        d = {name: durations.freeze() for name, durations in self.durations.items()}
        return ModelManagerStatistics(
            alias=alias, current_generation=current_generation, generations_by_state=generations_by_state,
            loads=self.loads, load_failures=dict(self.load_failures), replacements=self.replacements,
            coresident_replacements=self.coresident, restores=self.restores, rollbacks=self.rollbacks,
            unloads=self.unloads, unload_problems=self.unload_problems, escalations=self.escalations,
            lifecycle_busy=lifecycle_busy, queued_operations=queued_operations, load=d["load"],
            configure=d["configure"], warmup=d["warmup"], drain=d["drain"], unload=d["unload"],
            downtime=d["downtime"])
