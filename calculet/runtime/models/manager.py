"""ModelManager (§3, §10–§13): model generations and their load, unload, drain and rollback.

A **generation** is one immutable loaded instance of a signed package under an alias (§10):
its identity (id, alias, calbin sha256, package, signer) is fixed once steps 1–3 pass; its
lifecycle is a :class:`~calculet.machines.ModelMachine` instance and every change of its state
goes through that machine's ``fire`` — the manager keeps no second state field. The machine's
counters (``active_requests``, ``inflight_jobs``) are fired by the engine as requests are pinned
and end and as jobs are submitted and drain, so "drained" is the declared guard, not a guess.

**Where things run** (DESIGN principle 2). All state changes happen on the engine's actor. An
operation (load, unload, rollback) is a generator the actor resumes every tick: it runs a step,
then yields what it waits for (a drain, the device falling idle for golden) with an optional
deadline, and the engine keeps serving in between. Steps 1–4 of a load — reading and hashing
the package, parsing the manifest, the capacity plan — are pure and run on the *calling*
thread before the operation is queued, so a slow hash or plan never holds the lifecycle lock
(§11 step 4, R11.4). The lifecycle lock is the actor's operation queue: one operation at a time
runs steps 5 and later, the others wait in order (R11.5). The public methods are thread-safe and
block with a timeout (:class:`ActorPort` posts to the actor); bound to an
:class:`~calculet.runtime.engine.core.EngineDriver` the same methods run in virtual time, the calling
thread stepping the engine from event to event until the operation ends. ``begin_*`` variants
return an :class:`OperationHandle` at once (Trio's ``op``/``op_nowait``).

**load(alias, package)** — §11, step → :class:`~calculet.machines.ModelMachine` state:

====  ====================================================================  ===========
step  what                                                                  state
====  ====================================================================  ===========
1     resolve the package path under ``trust.trusted_roots`` (no escape)    Validating
2     Ed25519 signature over manifest.json + every file's size and sha256   Validating
3     manifest schema, profiles vs config and contract (R15.19), engine     Validating
      contract, alias
4     capacity plan (board memory vs the manifest's §13.1 figures)          Validating
5     lifecycle lock; a replacement holds new requests (WaitingModel)       Configuring
6     drain and unload the old generation unless both contracts declare     Configuring
      co-residency (CalRT 0.7.6 cannot; configure is device-global)
7     CreateCalbin → configure → KvManager → pools                          Configuring
8     the device's calbin matches the verified manifest exactly             Warming
9     golden vectors + warm-up (submissions paused while they run)          Warming
10    publish: alias → new generation, atomically, the hold released        Ready
11    keep the previous signed artifact for rollback                        Ready
====  ====================================================================  ===========

A failure at steps 1–4 changes nothing (the generation returns to Unloaded). A failure at
steps 5–10 cleans the new generation up through Unloading (every resource it created is
destroyed and the device verified) and then: the old generation, if it is still resident, is
serving again (its held requests are pinned to it); if it had been drained and unloaded because
co-residency is impossible, it is **restored** — its retained package is verified again and
loaded as a new generation — and the report says so, with the downtime. A replacement on 0.7.6
is never zero-downtime: the report carries the gap during which new requests were held (§11:
zero downtime needs blue-green on another instance/board, R11.16). Step 11 comes after the
switch; if the old artifact can no longer be retained the switch stands and the report says
rollback is unavailable.

**unload(alias)** — §12: (1) Ready → Draining, new requests 503 and queued ones cancelled at
once (R12.2, R12.4); (2) wait until no request is pinned and no job is in flight, up to
``executor.drain_deadline_ms`` on the injected clock; (3) at the deadline cancel what is left —
running requests only get their cancel flag, their jobs still drain — and if jobs are still
submitted enter Recovering with every buffer kept (R12.10, R12.11) until they complete or the
device is reset per its contract; (4) free sequences, destroy pools; (5) destroy the KvManager and
the calbin; (6) ResetConfiguration only where the contract verifies it and no other calbin shares
the reset domain (R12.7); (7) verify the device memory and health → Unloaded (R12.8). A cleanup
that leaves the device unclean escalates to a device restart when no other generation is on it.

Decisions where the spec is silent (requirements.md ambiguities 5, 14, 15):

* one alias per engine (``model_alias``): loading a second alias beside it would need a
  multi-model runtime contract (§13.2) and multi-generation scheduling; it is refused at step 3,
  and more models scale out as more processes (§13.1);
* during a replacement drain (step 6) the old generation keeps serving what was already pinned
  to it — queued requests included — until the drain deadline; only an explicit unload cancels
  queued requests at once (R12.4). Nothing accepted is lost to a model switch;
* with a co-residency contract (simulated only), the old generation serves during steps 7–9 and
  the switch at step 10 waits until its pinned requests have ended (one generation is scheduled
  at a time, see :mod:`calculet.runtime.scheduling.scheduler`); then the old one is unloaded;
* a replacement must keep the engine contract (:class:`~calculet.runtime.execution.session.EngineContract`:
  tokenizer, context, KV geometry, scheduling capabilities); anything else needs a new engine;
* step 11 keeps the previous artifact by reference (its path, signer and manifest hash; a
  cheap presence check); rollback verifies it fully again (steps 1–2) before loading it;
* a device reset or restart while a load is at steps 7–10 fails that load (its configuration
  died with the device's reset domain); a device fault in a golden/warm-up job is handed to the
  engine's recovery before the old version serves again;
* an engine built on a package directory its caller vouches for (tests, simulation, a server
  that verified it itself) loads that first generation without steps 1–2 and says so in the
  generation's ``signed_by``; a rollback to it keeps that trust, every other load is verified.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import itertools
import logging
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from calculet.adapters.calrt import MemoryFootprint, rc_of, read_board_memory
from calculet.packages.manifest import MANIFEST_FILE, CalbinManifest
from calculet.packages import PackageCheck, VerifiedPackage, verify_package
from calculet.errors import (
    BadRequest,
    CalculetError,
    CapacityExhausted,
    ConfigError,
    DefinitionError,
    DeviceFault,
    NotFound,
    NotSupported,
    PackageError,
    Unavailable,
)
from calculet.machines import ModelMachine
from calculet.machines.request import TERMINAL
from calculet.runtime.actor import Reply
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.execution.session import (EngineContract, ModelFacts, RuntimeSession, SessionPlan, SessionState,
                                      plan_session)

if TYPE_CHECKING:
    from calculet.runtime.engine.core import EngineCore
    from calculet.runtime.scheduling.registry import RequestRecord

log = logging.getLogger("calculet.runtime.models.manager")

T = TypeVar("T")

__all__ = [
    "ActorPort", "CapacityPlan", "CapacityPlanner", "ChipMemory", "DurationStatistics", "GenerationIdentity",
    "InlinePort", "LoadFailed", "LoadReport", "LoadStep", "ModelGeneration", "ModelManager",
    "ModelManagerStatistics", "ModelStatus", "Operation", "OperationHandle", "ResidentModel", "StepTiming",
    "UnloadFailed", "UnloadReport", "UnloadStep",
]

_TERMINAL = frozenset(TERMINAL)
_PATH_CHECKS = frozenset({PackageCheck.UNTRUSTED_PATH, PackageCheck.NOT_FOUND, PackageCheck.NOT_A_PACKAGE,
                          PackageCheck.SYMLINK, PackageCheck.SPECIAL_FILE, PackageCheck.UNSAFE_PATH,
                          PackageCheck.UNSAFE_ARCHIVE})
HISTORY = 32
"""Ended generations kept in :meth:`ModelManager.status` (bounded, like every label set)."""
ACTOR_CALL_TIMEOUT_S = 60.0
"""Bound on the short actor messages a public method posts (opening a generation, queueing an
operation): an engine stopping meanwhile must not leave a caller blocked for ever."""


# ---------------------------------------------------------------------------------------------
# Steps, errors, reports
# ---------------------------------------------------------------------------------------------


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
        """The admin API's model entry (``calculet.server.schemas.ModelStatus`` shape)."""
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


_MEASURED = ("load", "configure", "warmup", "drain", "unload", "downtime")
"""The durations the manager measures: one :class:`DurationStatistics` field each in
:class:`ModelManagerStatistics` (every one but ``downtime`` also a generation's ``durations``)."""


class _Durations:
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


# ---------------------------------------------------------------------------------------------
# Capacity plan (§11 step 4, §13.1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChipMemory:
    """One chiplet's DRAM as ReadMem reports it."""

    chip: int
    total_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class ResidentModel:
    """A generation holding device memory; ``stays`` when it remains resident during the load."""

    generation: int
    footprint: MemoryFootprint
    stays: bool


@dataclass(frozen=True)
class CapacityPlan:
    feasible: bool
    detail: str
    need_bytes: tuple[int, ...]
    free_bytes: tuple[int, ...]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3f} GiB"


class CapacityPlanner:
    """§11 step 4: will the new calbin fit, given what stays resident? A pure function of figures.

    The calbin's ``reserved_bytes`` (parameters + KV + runtime, §13.1) is spread evenly over its
    chiplets, as the device reserves it; the job pools go to the chiplet with the most room. A
    generation that will be drained first (no co-residency) gives its reservation back. Nothing
    assumes room for a second large model (R13.1.5): the figures decide. The device's own
    reservation at CreateCalbin stays the final word (the plan is made outside the lock).
    """

    def plan(self, footprint: MemoryFootprint, pool_bytes: int, chips: Sequence[ChipMemory],
             resident: Sequence[ResidentModel]) -> CapacityPlan:
        free = [c.total_bytes - c.used_bytes for c in chips]
        freed_by = []
        for r in resident:
            if r.stays:
                continue
            share = -(-r.footprint.reserved_bytes // len(r.footprint.chiplets))
            for c in r.footprint.chiplets:
                if c < len(free):
                    free[c] += share
            freed_by.append(f"generation {r.generation} ({_gib(r.footprint.reserved_bytes)}, drained first)")
        need = [0] * len(free)
        missing = [c for c in footprint.chiplets if not 0 <= c < len(free)]
        if missing:
            return CapacityPlan(False, f"chiplet(s) {missing} do not exist on this board ({len(free)} chiplets)",
                                tuple(need), tuple(free))
        share = -(-footprint.reserved_bytes // len(footprint.chiplets))
        for c in footprint.chiplets:
            need[c] += share
        left = [f - n for f, n in zip(free, need)]
        best = max(range(len(left)), key=lambda c: left[c]) if left else 0
        if left:
            need[best] += pool_bytes
        short = [c for c in range(len(free)) if need[c] > free[c]]
        staying = [f"generation {r.generation} ({_gib(r.footprint.reserved_bytes)})" for r in resident if r.stays]
        detail = (f"needs {_gib(footprint.reserved_bytes)} (parameters {_gib(footprint.parameter_bytes)} + "
                  f"{footprint.kv_dtype.upper()} KV {_gib(footprint.kv_bytes)} + runtime "
                  f"{_gib(footprint.runtime_bytes)}), {_gib(share)} on each of chiplets {list(footprint.chiplets)}, "
                  f"plus {pool_bytes} bytes of job pools; board {_gib(sum(c.total_bytes for c in chips))}, free "
                  f"{[_gib(f) for f in free]}"
                  + (f" after {', '.join(freed_by)}" if freed_by else "")
                  + (f"; staying resident: {', '.join(staying)}" if staying else ""))
        if short:
            return CapacityPlan(False, f"{detail}; short on chiplet(s) {short} (§13.1: no room is assumed for a "
                                       "second large model)", tuple(need), tuple(free))
        return CapacityPlan(True, detail, tuple(need), tuple(free))


# ---------------------------------------------------------------------------------------------
# Operations on the actor
# ---------------------------------------------------------------------------------------------


@dataclass
class _Wait:
    """What an operation waits for: ``ready()`` on the actor, or ``deadline`` on the engine clock."""

    ready: Callable[[], bool]
    deadline: float | None
    what: str


Body = Generator[_Wait, bool | None, Any]


class Operation:
    """A lifecycle operation the actor resumes tick after tick until it returns or raises."""

    def __init__(self, kind: str, alias: str, generation: int, clock: Any) -> None:
        self.kind = kind
        self.alias = alias
        self.generation = generation
        self.reply: Reply[Any] = Reply()
        self.step = "waiting for the lifecycle lock"
        self._body: Body | None = None
        self._wait: _Wait | None = None
        self._clock = clock

    def start(self, body: Body) -> Operation:
        self._body = body
        return self

    @property
    def done(self) -> bool:
        return self.reply.done()

    @property
    def waiting_for(self) -> str:
        return self._wait.what if self._wait is not None else ""

    @property
    def deadline(self) -> float | None:
        return self._wait.deadline if self._wait is not None else None

    def advance(self) -> bool:
        """Run until the operation waits for something not yet true, or ends. True when it ended."""
        while True:
            send: bool | None = None
            wait = self._wait
            if wait is not None:
                ready = wait.ready()
                if not ready and (wait.deadline is None or self._clock.now() < wait.deadline):
                    return False
                send = ready
            assert self._body is not None
            try:
                self._wait = self._body.send(send)
            except StopIteration as stop:
                self._wait = None
                self.reply.set(stop.value)
                return True
            except Exception as exc:  # noqa: BLE001 - delivered to the caller through the reply
                self._wait = None
                self.reply.fail(exc)
                return True

    def abort(self, error: BaseException) -> None:
        """The engine stopped: the operation will never resume."""
        try:
            if self._body is not None:
                self._body.close()
        finally:
            if not self.reply.done():
                self.reply.fail(error)

    def describe(self) -> str:
        wait = f", waiting for {self.waiting_for}" if self._wait is not None else ""
        return f"{self.kind} {self.alias!r} generation {self.generation}: {self.step}{wait}"


class ActorPort(Protocol):
    """How the manager reaches the engine's actor (the engine and the driver provide one each)."""

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        """Run ``fn`` on the actor and return its result."""
        ...

    def run(self, op: Operation, timeout: float | None) -> Any:
        """Wait for a queued operation to end (real time, or virtual time stepped by the caller)."""
        ...


class InlinePort:
    """The port while the engine is being built: the calling thread is the actor, nothing ticks."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    def call(self, fn: Callable[[], T], timeout: float | None) -> T:
        return fn()

    def run(self, op: Operation, timeout: float | None) -> Any:
        self._manager.poll()
        if not op.done:
            raise DefinitionError(f"bring-up cannot wait: {op.describe()}")
        return op.reply.wait(0)


class OperationHandle:
    """A queued load/unload/rollback: ``done()`` and ``result(timeout)`` from any thread."""

    def __init__(self, op: Operation, port: ActorPort) -> None:
        self._op = op
        self._port = port

    @property
    def kind(self) -> str:
        return self._op.kind

    @property
    def alias(self) -> str:
        return self._op.alias

    @property
    def generation(self) -> int:
        return self._op.generation

    @property
    def step(self) -> str:
        return self._op.step

    def done(self) -> bool:
        return self._op.done

    def result(self, timeout: float | None = None) -> Any:
        """The operation's report; raises its error (e.g. :class:`LoadFailed`) or ``TimeoutError``.

        A timeout does not stop the operation: it keeps running on the actor (``status()`` shows it)."""
        return self._port.run(self._op, timeout)


# ---------------------------------------------------------------------------------------------
# Internal records
# ---------------------------------------------------------------------------------------------


class _Generation:
    """The manager's record of one generation; its state lives only in ``machine``."""

    __slots__ = ("id", "alias", "machine", "_identity", "facts", "plan", "verified", "package_path", "source",
                 "signed_by", "trusted", "session", "published", "unload_requested", "error", "epoch",
                 "durations", "created_at")

    def __init__(self, gen_id: int, alias: str, source: Path, created_at: float) -> None:
        self.id = gen_id
        self.alias = alias
        self.machine = ModelMachine.create(generation=gen_id)
        self._identity: GenerationIdentity | None = None
        self.facts: ModelFacts | None = None
        self.plan: SessionPlan | None = None
        self.verified: VerifiedPackage | None = None
        self.package_path = source
        self.source = source
        self.signed_by = ""
        self.trusted = True
        self.session: RuntimeSession | None = None
        self.published = False
        self.unload_requested = False
        self.error = ""
        self.epoch = -1
        self.durations: dict[str, float] = {}
        self.created_at = created_at

    @property
    def identity(self) -> GenerationIdentity | None:
        return self._identity

    def fix_identity(self, identity: GenerationIdentity) -> None:
        """Set once, after step 3 (R3.3: identity is immutable once known)."""
        if self._identity is not None:
            raise DefinitionError(f"generation {self.id}: identity is already fixed")
        self._identity = identity

    @property
    def state(self) -> str:
        return self.machine.state  # type: ignore[no-any-return]

    def idle(self) -> bool:
        m = self.machine
        return m.active_requests == 0 and m.inflight_jobs == 0


@dataclass
class _Alias:
    name: str
    current: _Generation | None = None
    previous: _Retained | None = None


@dataclass(frozen=True)
class _Retained:
    """§11 step 11: the artifact a rollback goes back to."""

    generation: int
    source: Path
    sha256: str
    signed_by: str
    trusted: bool


@dataclass
class _Prepared:
    """Steps 1–4 passed: what the calling thread found, handed to the actor with the operation."""

    gen: _Generation
    kind: str
    plan: SessionPlan
    capacity: CapacityPlan | None
    timings: list[StepTiming]
    verified: VerifiedPackage | None
    path: Path
    signed_by: str
    trusted: bool


@dataclass(frozen=True)
class _Snapshot:
    """What steps 3–4 need from the actor, read in one message."""

    generation: int
    chips: tuple[ChipMemory, ...]
    resident: tuple[tuple[int, MemoryFootprint, Any], ...]


# ---------------------------------------------------------------------------------------------
# The manager
# ---------------------------------------------------------------------------------------------


class ModelManager:
    """Generations, the alias, and their lifecycle operations (§3 ModelManager, §10–§13).

    Public methods are thread-safe (they post to the engine's actor) and block until the
    operation ends or ``timeout`` passes; bound to an ``EngineDriver`` they run in virtual
    time. ``step_hook`` is a test seam: called as each load/unload step starts, raising fails it.
    """

    def __init__(self, core: EngineCore, *, planner: CapacityPlanner | None = None,
                 first_generation: int = 1) -> None:
        self._core = core
        self.config = core.config
        self.clock = core.clock
        self.planner = planner or CapacityPlanner()
        self.step_hook: StepHook | None = None
        self._port: ActorPort = InlinePort(self)
        self._ids = itertools.count(first_generation)
        self._gens: dict[int, _Generation] = {}
        self._ended: collections.deque[int] = collections.deque()
        self._aliases: dict[str, _Alias] = {core.config.model_alias: _Alias(core.config.model_alias)}
        self._serving: _Generation | None = None
        self._active: Operation | None = None
        self._queue: collections.deque[Operation] = collections.deque()
        self._epoch = 0
        self._calbin_gen: dict[int, int] = {}
        self.contract: EngineContract | None = None
        """What the engine was built on (the first generation's plan); replacements must keep it."""
        self._loads = 0
        self._load_failures: collections.Counter[str] = collections.Counter()
        self._replacements = 0
        self._coresident = 0
        self._restores = 0
        self._rollbacks = 0
        self._unloads = 0
        self._unload_problems = 0
        self._escalations = 0
        self._durations = {name: _Durations() for name in _MEASURED}

    # ------------------------------------------------------------------ binding

    def bind_port(self, port: ActorPort) -> None:
        """The engine (real time) or the driver (virtual time) this manager posts to."""
        self._port = port

    @property
    def alias(self) -> str:
        return self.config.model_alias

    # ================================================================== public API (thread-safe)

    def load(self, alias: str, package: str | Path | None = None, *, timeout: float | None = None) -> LoadReport:
        """§11: verify, plan, configure, golden/warm up and publish ``package`` under ``alias``.

        ``package`` defaults to the alias's ``models[].package`` in the configuration. Raises
        :class:`LoadFailed` (``step``, ``cause``, ``report``) if any step fails."""
        return self.begin_load(alias, package).result(timeout)  # type: ignore[no-any-return]

    def begin_load(self, alias: str, package: str | Path | None = None) -> OperationHandle:
        """Steps 1–4 on the calling thread, then queue steps 5–11 on the actor; returns at once."""
        return self._begin_load(alias, self._package_for(alias, package), trusted=True, kind="load")

    def unload(self, alias: str, *, timeout: float | None = None, drain_deadline_ms: int | None = None
               ) -> UnloadReport:
        """§12: drain the alias's generation and free everything it holds (Unloaded)."""
        handle = self.begin_unload(alias, drain_deadline_ms=drain_deadline_ms)
        return handle.result(timeout)  # type: ignore[no-any-return]

    def begin_unload(self, alias: str, *, drain_deadline_ms: int | None = None) -> OperationHandle:
        self._check_alias(alias)
        deadline_ms = drain_deadline_ms if drain_deadline_ms is not None else self.config.executor.drain_deadline_ms
        op = self._port.call(lambda: self._queue_unload(alias, deadline_ms / 1000.0), ACTOR_CALL_TIMEOUT_S)
        return OperationHandle(op, self._port)

    def rollback(self, alias: str, *, timeout: float | None = None) -> LoadReport:
        """One call back to the previous signed artifact (§11 step 11, R19.17): verified again, loaded,
        golden-checked and published like any load."""
        return self.begin_rollback(alias).result(timeout)  # type: ignore[no-any-return]

    def begin_rollback(self, alias: str) -> OperationHandle:
        self._check_alias(alias)
        retained = self._port.call(lambda: self._aliases[alias].previous, ACTOR_CALL_TIMEOUT_S)
        if retained is None:
            raise NotFound(f"alias {alias!r} has no previous artifact to roll back to (§11 step 11)", field="alias")
        return self._begin_load(alias, retained.source, trusted=retained.trusted, kind="rollback")

    def status(self, timeout: float | None = 30.0) -> ModelStatus:
        """Every generation with its §10 state, sha256, active requests and in-flight jobs."""
        return self._port.call(self.status_now, timeout)

    def statistics(self, timeout: float | None = 30.0) -> ModelManagerStatistics:
        return self._port.call(self.statistics_now, timeout)

    def lifecycle_busy(self) -> bool:
        """Whether the lifecycle lock is held (an operation is at step 5 or later, or unloading)."""
        return self._active is not None

    # ================================================================== engine hooks (actor only)

    @property
    def serving(self) -> _Generation | None:
        """The generation whose session the executor is bound to (jobs may be planned for it)."""
        return self._serving

    @property
    def device_epoch(self) -> int:
        return self._epoch

    def busy(self) -> bool:
        return self._active is not None or bool(self._queue)

    def next_deadline(self) -> float | None:
        return self._active.deadline if self._active is not None else None

    def poll(self) -> None:
        """Resume the active operation, then the queued ones in order (the lifecycle lock)."""
        while True:
            op = self._active
            if op is None:
                if not self._queue:
                    return
                op = self._active = self._queue.popleft()
            ended = op.advance()
            self._core.run_commands()
            if not ended:
                return
            self._active = None

    def on_request_transition(self, rec: RequestRecord, source: str, target: str) -> None:
        """Counters of the ModelMachine: a request pinned (``acquire``) or ended (``release_request``)."""
        if source == target:
            return
        gen_id = rec.generation
        if not gen_id:
            return
        if target in _TERMINAL:
            gen = self._gens.get(gen_id)
            if gen is not None:
                gen.machine.fire("release_request")
        elif target == "waiting_admission" and source in ("new", "waiting_model"):
            self._gens[gen_id].machine.fire("acquire")

    def may_submit(self, gen_id: int) -> bool:
        gen = self._gens.get(gen_id)
        return gen is not None and gen.machine.at("ready", "draining")

    def on_job_submitted(self, gen_id: int) -> None:
        self._gens[gen_id].machine.fire("job_submitted")

    def on_job_finished(self, gen_id: int) -> None:
        gen = self._gens.get(gen_id)
        if gen is not None and gen.machine.inflight_jobs > 0:
            gen.machine.fire("job_finished")

    def on_fault(self) -> None:
        """A fault left the device in doubt: the serving generation goes Recovering (503)."""
        gen = self._serving
        if gen is None:
            return
        if gen.machine.at("ready", "draining"):
            gen.machine.fire("fault")
        scheduler = self._core.scheduler
        if scheduler.availability is ModelAvailability.READY:
            scheduler.set_model(gen.id, ModelAvailability.RECOVERING)

    def on_jobs_discarded(self) -> None:
        """A reset or restart ended every job on the device (the executor forgot them)."""
        for gen in self._gens.values():
            m = gen.machine
            if m.inflight_jobs > 0:
                if not m.at("recovering"):
                    m.fire("fault")
                m.fire("reset")

    def reset_device(self) -> None:
        """Recovery's ResetConfiguration (device reset domain) for the serving session; every other
        session on the device lost its configuration with it."""
        gen = self._serving
        if gen is None or gen.session is None or gen.session.state is not SessionState.READY:
            self._replace_device()  # nothing serves: the strongest reset costs nothing more
            return
        self._epoch += 1
        for other in self._gens.values():
            if other is not gen and other.session is not None and other.session.state is not SessionState.ABANDONED:
                other.session.drop_configuration()
        with self._core.exclusive_device():
            gen.session.reset()
        gen.epoch = self._epoch

    def restart_device(self) -> None:
        """Recovery's restart: close the VirtualDevice and bring the serving generation up on a new one."""
        self._replace_device()
        gen = self._serving
        if gen is None or gen.unload_requested or not gen.machine.at("ready", "recovering"):
            return
        assert gen.plan is not None
        with self._core.exclusive_device():
            session = RuntimeSession(self._core.device, gen.package_path, self.config, generation=gen.id,
                                     verify_golden=self._core.options.verify_golden, plan=gen.plan).create()
        gen.session = session
        gen.epoch = self._epoch
        self._calbin_gen[session.calbin.calbin_id] = gen.id
        self._core.executor.rebind(session)

    def on_recovered(self) -> None:
        """The reset/restart succeeded: the serving generation is Ready again — or, if it was being
        unloaded, what is left of its drain is cancelled so the unload can continue."""
        gen = self._serving
        if gen is None:
            return
        m = gen.machine
        scheduler = self._core.scheduler
        if gen.unload_requested:
            if scheduler.availability is ModelAvailability.RECOVERING:
                held = scheduler.holding_new_requests  # a replacement holds new requests; an unload 503s them
                scheduler.set_model(gen.id, ModelAvailability.READY if held else ModelAvailability.DRAINING)
            self._cancel_pinned(gen)
            return
        if m.at("recovering") and m.can_fire("recovered"):
            m.fire("recovered")
        if scheduler.availability is ModelAvailability.RECOVERING and m.at("ready"):
            scheduler.set_model(gen.id, ModelAvailability.READY)

    def on_give_up(self, detail: str) -> None:
        """The reset budget is spent: the serving generation is Failed (503 from now on)."""
        gen = self._serving
        generation = gen.id if gen is not None else self._core.scheduler.generation
        if gen is not None:
            gen.error = detail
            if gen.machine.at("recovering") and gen.machine.can_fire("give_up"):
                gen.machine.fire("give_up")
        self._core.scheduler.set_model(generation, ModelAvailability.FAILED, detail=detail)

    def generation_of_calbin(self, calbin_id: int) -> int:
        return self._calbin_gen.get(calbin_id, 0)

    def teardown(self) -> None:
        """The engine stopped: pending operations fail; each idle generation is unloaded in §12
        order where the device allows, the rest die with the device."""
        stopped = Unavailable("the engine has stopped")
        for op in ([self._active] if self._active is not None else []) + list(self._queue):
            op.abort(stopped)
        self._active = None
        self._queue.clear()
        core = self._core
        for gen in list(self._gens.values()):
            session = gen.session
            if session is None:
                continue
            m = gen.machine
            clean = core.executor.inflight() == 0 and session.state is SessionState.READY and gen.idle()
            if not clean or not m.at("ready", "draining", "failed"):
                continue
            try:
                if m.at("ready"):
                    m.fire("drain")
                m.fire("drained" if m.at("draining") else "drain")
                session.teardown(verify=True, others_configured=self._others_configured(gen))
                m.fire("freed")
                m.fire("verified")
                gen.session = None
                gen.published = False
            except CalculetError as exc:
                log.error("unload at stop was not clean", extra={"generation": gen.id, "detail": str(exc)})

    # ================================================================== bring-up

    def prepare_initial(self, package: str | Path | None) -> _Prepared:
        """Steps 1–4 of the engine's first generation (inline, before the engine components exist).

        ``package`` given: a caller-provided package directory (tests, simulation) loaded without
        steps 1–2 and reported as unverified. None: ``models[model_alias].package`` with full trust
        checks."""
        alias = self.alias
        if package is None:
            return self._prepare(alias, self._package_for(alias, None), trusted=True, kind="load")
        return self._prepare(alias, Path(package), trusted=False, kind="load")

    def finish_initial(self, prepared: _Prepared) -> LoadReport:
        """Steps 5–11 of the first generation, inline (nothing serves yet, nothing waits)."""
        op = self._queue_load(prepared)
        return self._port.run(op, None)  # type: ignore[no-any-return]

    # ================================================================== load: steps 1–4

    def _package_for(self, alias: str, package: str | Path | None) -> Path:
        if package is not None:
            return Path(package)
        for entry in self.config.models:
            if entry.alias == alias:
                return entry.package
        raise NotFound(f"no package given and no models[] entry for alias {alias!r}", field="package")

    def _check_alias(self, alias: str) -> None:
        if alias not in self._aliases:
            raise NotFound(f"no model alias {alias!r}; this engine serves {self.alias!r}", field="alias")

    def _begin_load(self, alias: str, package: Path, *, trusted: bool, kind: str) -> OperationHandle:
        prepared = self._prepare(alias, package, trusted=trusted, kind=kind)
        op = self._port.call(lambda: self._queue_load(prepared), ACTOR_CALL_TIMEOUT_S)
        return OperationHandle(op, self._port)

    def _prepare(self, alias: str, package: Path, *, trusted: bool, kind: str) -> _Prepared:
        """Steps 1–4 on the calling thread (pure reads and computation, no lock held)."""
        gen, snapshot = self._port.call(lambda: self._open_generation(alias, package), ACTOR_CALL_TIMEOUT_S)
        timings: list[StepTiming] = []
        step = LoadStep.RESOLVE
        try:
            if trusted:
                step = LoadStep.RESOLVE
                t0 = self._step_start(step, gen)
                self._resolve(package)
                self._timed(timings, step, t0)
                step = LoadStep.VERIFY
                t0 = self._step_start(step, gen)
                try:
                    verified = self._verify(package)
                except PackageError as exc:
                    if exc.context.get("reason") in _PATH_CHECKS:
                        step = LoadStep.RESOLVE
                    raise
                self._timed(timings, step, t0)
                manifest_bytes = verified.manifest_bytes
                sha = verified.manifest_sha256
                path, signed_by = verified.path, f"{verified.key_name} ({verified.key_id})"
            else:
                verified = None
                try:
                    manifest_bytes = (package / MANIFEST_FILE).read_bytes()
                except OSError as exc:
                    raise PackageError(f"package {package}: cannot read {MANIFEST_FILE}: {exc.strerror or exc}",
                                       reason=PackageCheck.NOT_FOUND.value) from exc
                sha = hashlib.sha256(manifest_bytes).hexdigest()
                path, signed_by = package, "caller-provided (unverified: §11 steps 1-2 skipped)"
            step = LoadStep.VALIDATE
            t0 = self._step_start(step, gen)
            plan = self._validate(alias, manifest_bytes, sha)
            self._timed(timings, step, t0)
            step = LoadStep.PLAN
            t0 = self._step_start(step, gen)
            capacity = self._capacity(plan, snapshot)
            self._timed(timings, step, t0)
        except Exception as exc:
            report = LoadReport(kind=kind, alias=alias, generation=gen.id, calbin_sha256="", ok=False,
                                state="unloaded", failed_step=step.name.lower(), error=str(exc),
                                steps=tuple(timings))
            failed_step, error = step, exc
            self._port.call(lambda: self._abort_validation(gen, failed_step, error), ACTOR_CALL_TIMEOUT_S)
            raise LoadFailed(step, exc, report) from exc
        return _Prepared(gen, kind, plan, capacity, timings, verified, path, signed_by, trusted)

    def _open_generation(self, alias: str, package: Path) -> tuple[_Generation, _Snapshot]:
        """(actor) A new generation enters Validating; the board and residents are read for step 4."""
        gen = _Generation(next(self._ids), alias, package, self.clock.now())
        gen.machine.fire("load")
        self._gens[gen.id] = gen
        chips = tuple(ChipMemory(chip, info.total_bytes, info.used_bytes)
                      for chip, info in enumerate(read_board_memory(self._core.device)))
        resident = tuple((g.id, g.facts.memory, g.facts.capabilities) for g in self._gens.values()
                         if g.session is not None and g.session.has_calbin and g.facts is not None)
        return gen, _Snapshot(gen.id, chips, resident)

    def _abort_validation(self, gen: _Generation, step: LoadStep, exc: BaseException) -> None:
        """(actor) Steps 1–4 failed: nothing was created; the generation is Unloaded."""
        gen.error = f"step {int(step)} ({step.title}): {exc}"
        if gen.machine.at("validating"):
            gen.machine.fire("load_failed")
        self._load_failures[step.name.lower()] += 1
        self._ended_generation(gen)
        log.warning("load refused", extra={"generation": gen.id, "step": int(step), "detail": str(exc)})

    def _verify(self, package: Path) -> VerifiedPackage:
        """Step 2 (R11.2) under the configured trust: for a load, and again for a restore."""
        trust = self.config.trust
        return verify_package(package, trust.trusted_roots, trust.trusted_keys_dir, max_file_bytes=trust.max_file_bytes)

    def _resolve(self, package: Path) -> None:
        """Step 1 (R11.1): the path, after following every symlink, lies under a trusted root."""
        roots = [Path(r).resolve() for r in self.config.trust.trusted_roots]
        if not roots:
            raise PackageError(f"package {package}: no trust.trusted_roots configured (§11 step 1)",
                               reason=PackageCheck.UNTRUSTED_PATH.value, package=str(package))
        try:
            resolved = package.resolve()
        except (OSError, RuntimeError) as exc:
            raise PackageError(f"package {package}: cannot resolve the path: {exc}",
                               reason=PackageCheck.NOT_FOUND.value, package=str(package)) from exc
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            via = f" (it resolves to {resolved})" if resolved != package.absolute() else ""
            raise PackageError(f"package {package}: path is outside the trusted roots "
                               f"[{', '.join(map(str, roots))}]{via} (§11 step 1)",
                               reason=PackageCheck.UNTRUSTED_PATH.value, package=str(package))

    def _validate(self, alias: str, manifest_bytes: bytes, sha: str) -> SessionPlan:
        """Step 3: manifest schema, config vs manifest and contract (R15.19), alias, engine contract."""
        if alias != self.alias:
            raise NotSupported(
                f"this engine serves alias {self.alias!r}; serving {alias!r} beside it needs a multi-model runtime "
                "contract (model handle, quotas, reset domain: §13.2), which CalRT 0.7.6 does not offer — run one "
                "process per model (§13.1)", field="alias")
        manifest = CalbinManifest.parse(manifest_bytes)
        facts = ModelFacts.from_manifest(manifest, sha)
        plan = plan_session(facts, self.config)
        contract = self.contract
        if contract is not None:
            problems = contract.differences(plan.contract())
            if problems:
                raise BadRequest(f"package {facts.name!r} does not keep the running engine's contract (tokenizer, "
                                 f"context, KV geometry, scheduling capabilities): {'; '.join(problems)}; a "
                                 "different contract needs a new engine", field="package")
        return plan

    def _capacity(self, plan: SessionPlan, snap: _Snapshot) -> CapacityPlan:
        """Step 4 (outside the lifecycle lock): the capacity plan against the board (§13.1)."""
        caps = plan.facts.capabilities
        resident = []
        for gen_id, footprint, other_caps in snap.resident:
            stays = _coreside(other_caps, caps)
            resident.append(ResidentModel(gen_id, footprint, stays))
        result = self.planner.plan(plan.facts.memory, plan.pool_bytes(), snap.chips, resident)
        if not result.feasible:
            raise CapacityExhausted(f"capacity plan for {plan.facts.name!r}: {result.detail}")
        return result

    # ================================================================== load: steps 5–11 (actor)

    def _queue_load(self, prepared: _Prepared) -> Operation:
        """(actor) Steps 1–4 passed: Validating → Configuring; the operation waits for the lock."""
        gen = prepared.gen
        gen.facts, gen.plan = prepared.plan.facts, prepared.plan
        gen.verified, gen.package_path = prepared.verified, prepared.path
        gen.signed_by, gen.trusted = prepared.signed_by, prepared.trusted
        gen.fix_identity(GenerationIdentity(gen.id, gen.alias, gen.plan.facts.package_sha256, str(gen.source),
                                            gen.signed_by))
        gen.machine.fire("validated")
        op = Operation(prepared.kind, gen.alias, gen.id, self.clock)
        op.start(self._load_body(op, prepared))
        self._queue.append(op)
        self.poll()
        return op

    def _load_body(self, op: Operation, prepared: _Prepared) -> Body:
        gen = prepared.gen
        alias = self._aliases[gen.alias]
        timings = list(prepared.timings)
        started = self.clock.now()
        core = self._core
        warnings: list[str] = []
        old = alias.current
        replacement = old is not None
        coresident = False
        paused_at: float | None = None
        old_unloaded = False
        previous_unload: UnloadReport | None = None
        step = LoadStep.LOCK
        golden = "skipped (verify_golden off)"

        def progress(summary: str) -> None:
            nonlocal golden  # the failure report shows how far step 9 got
            golden = summary

        try:
            t0 = self._step(op, step, gen)
            if replacement:
                core.scheduler.hold_new_requests(True)
                paused_at = self.clock.now()
            timings.append(StepTiming(step.name.lower(), t0, 0.0))
            step = LoadStep.DRAIN_OLD
            t0 = self._step(op, step, gen)
            if old is not None:
                assert old.facts is not None and gen.facts is not None
                coresident = _coreside(old.facts.capabilities, gen.facts.capabilities) and old.machine.at("ready")
                if not coresident:
                    previous_unload = yield from self._unload_body(op, old, deadline_s=self._drain_s(),
                                                                   replacement=True)
                    old_unloaded = True
            self._timed(timings, step, t0)
            step = LoadStep.CREATE
            t0 = self._step(op, step, gen)
            session, epoch = yield from self._create_session(gen)
            self._measured(gen, "configure", self._timed(timings, step, t0))
            step = LoadStep.INSPECT
            t0 = self._step(op, step, gen)
            session.inspect()
            self._timed(timings, step, t0)
            step = LoadStep.GOLDEN
            t0 = self._step(op, step, gen)
            yield from self._golden_and_warmup(
                gen, session, epoch, idle=lambda: core.executor.inflight() == 0 and core.recovery.pending is None,
                waiting_for="the device to fall idle for golden/warmup", progress=progress)
            self._measured(gen, "warmup", self._timed(timings, step, t0))
            step = LoadStep.PUBLISH
            t0 = self._step(op, step, gen)
            if old is not None and coresident:
                op.step = f"step 10: waiting for generation {old.id} to finish its requests"
                yield from self._quiesce(old, self._drain_s())
            self._check_epoch(gen, epoch)
            self._publish(alias, gen)
            downtime = self._downtime(paused_at)
            self._timed(timings, step, t0)
        except Exception as exc:
            failure = yield from self._load_failed(op, prepared, step, exc, old, paused_at, timings, golden,
                                                   previous_unload, coresident)
            raise failure from exc
        # step 11 (after the switch: a failure here never undoes it)
        step = LoadStep.RETAIN
        t0 = self._step_soft(op, step, gen, warnings)
        if old is not None:
            if t0 is None:
                alias.previous = None
                warnings.append("rollback unavailable: step 11 failed after the switch")
            else:
                try:
                    alias.previous = self._retain(old)
                except Exception as exc:  # noqa: BLE001 - reported; the switch stands
                    alias.previous = None
                    warnings.append(f"step 11 (retain the old signed artifact) failed: {exc}; rollback unavailable")
        timings.append(StepTiming(step.name.lower(), t0 or self.clock.now(), 0.0))
        if old is not None and coresident:
            try:
                previous_unload = yield from self._unload_body(op, old, deadline_s=self._drain_s(), replacement=True)
            except Exception as exc:  # noqa: BLE001 - the new generation serves; the leak is reported
                warnings.append(f"unloading generation {old.id} after the switch: {exc}")
        took = self.clock.now() - started
        self._measured(gen, "load", took)
        self._loads += 1
        if prepared.kind == "rollback":
            self._rollbacks += 1
        if replacement:
            self._replacements += 1
            self._coresident += int(coresident)
        report = LoadReport(
            kind=prepared.kind, alias=gen.alias, generation=gen.id, calbin_sha256=gen.facts.package_sha256
            if gen.facts else "", ok=True, state=gen.state, replaced=old.id if old is not None else None,
            coresident=coresident, previous_drained=old_unloaded, downtime_s=downtime,
            rollback_available=alias.previous is not None, golden=golden, warnings=tuple(warnings),
            steps=tuple(timings), previous_unload=previous_unload)
        log.info("model generation published", extra={"alias": gen.alias, "generation": gen.id,
                                                       "replaced": report.replaced, "downtime_s": downtime})
        return report

    def _load_failed(self, op: Operation, prepared: _Prepared, step: LoadStep, exc: Exception,
                     old: _Generation | None, paused_at: float | None, timings: list[StepTiming], golden: str,
                     previous_unload: UnloadReport | None, coresident: bool
                     ) -> Generator[_Wait, bool | None, LoadFailed]:
        """Steps 5–10 failed: clean the new generation up, then give the alias back its old version."""
        gen = prepared.gen
        alias = self._aliases[gen.alias]
        core = self._core
        warnings: list[str] = []
        gen.error = f"step {int(step)} ({step.title}): {exc}"
        self._load_failures[step.name.lower()] += 1
        log.warning("load failed; cleaning up", extra={"generation": gen.id, "step": int(step), "detail": str(exc)})
        core.hold_submissions(False)
        rc = rc_of(exc)
        if step >= LoadStep.CREATE and rc.is_device_fault:
            # a golden/warm-up job left the device in doubt: the engine's recovery resets it (§12, §15)
            core.report_device_fault(rc, f"§11 step {int(step)} of generation {gen.id}: {exc}")
        yield _Wait(lambda: core.recovery.pending is None or core.recovery.failed, None, "device recovery to finish")
        cleanup = self._discard(gen)
        if cleanup:
            warnings.append(f"cleanup of generation {gen.id}: {'; '.join(cleanup)}")
        restored: int | None = None
        state = "failed"
        old_unloaded = old is not None and old.machine.at("unloaded")
        if old is not None and old.machine.at("ready") and alias.current is old:
            core.scheduler.hold_new_requests(False)
            state = "old_serving"
        elif old is not None and old_unloaded:
            op.step = f"restoring generation {old.id}'s package"
            try:
                restored_gen = yield from self._restore(op, alias, old)
                restored = restored_gen.id
                state = "restored"
                self._restores += 1
            except Exception as restore_exc:  # noqa: BLE001 - reported; the alias has no model now
                warnings.append(f"restoring the previous version failed: {restore_exc}")
                state = "restore_failed"
                detail = (f"model {gen.alias!r} unavailable: loading generation {gen.id} failed at step {int(step)} "
                          f"and the previous version could not be restored ({restore_exc})")
                core.scheduler.hold_new_requests(False)
                core.scheduler.set_model(core.scheduler.generation, ModelAvailability.FAILED, detail=detail)
                core.scheduler.reject_waiting_model(detail)
        elif old is not None:
            detail = (f"model {gen.alias!r} unavailable: loading generation {gen.id} failed at step {int(step)} and "
                      f"generation {old.id} is {old.state} ({old.error or 'not serving'})")
            warnings.append(detail)
            state = "restore_failed"
            core.scheduler.hold_new_requests(False)
            core.scheduler.set_model(core.scheduler.generation, ModelAvailability.FAILED, detail=detail)
            core.scheduler.reject_waiting_model(detail)
        else:
            core.scheduler.hold_new_requests(False)
        downtime = self._downtime(paused_at)
        report = LoadReport(
            kind=prepared.kind, alias=gen.alias, generation=gen.id,
            calbin_sha256=gen.facts.package_sha256 if gen.facts else "", ok=False, state=state,
            replaced=old.id if old is not None else None, coresident=coresident, previous_drained=old_unloaded,
            downtime_s=downtime, restored_generation=restored, rollback_available=alias.previous is not None,
            failed_step=step.name.lower(), error=f"{type(exc).__name__}: {exc}", golden=golden,
            warnings=tuple(warnings), steps=tuple(timings), previous_unload=previous_unload)
        return LoadFailed(step, exc, report)

    def _restore(self, op: Operation, alias: _Alias, old: _Generation) -> Generator[_Wait, bool | None, _Generation]:
        """Bring the drained previous version back as a new generation (its package verified again)."""
        gen = _Generation(next(self._ids), alias.name, old.source, self.clock.now())
        self._gens[gen.id] = gen
        gen.machine.fire("load")
        try:
            if old.trusted:
                verified = self._verify(old.source)
                manifest_bytes, sha, path = verified.manifest_bytes, verified.manifest_sha256, verified.path
                gen.verified = verified
            else:
                manifest_bytes = (old.source / MANIFEST_FILE).read_bytes()
                sha, path = hashlib.sha256(manifest_bytes).hexdigest(), old.source
            plan = self._validate(alias.name, manifest_bytes, sha)
        except Exception as exc:
            gen.machine.fire("load_failed")
            gen.error = f"restore: {exc}"
            self._ended_generation(gen)
            raise
        gen.facts, gen.plan, gen.package_path = plan.facts, plan, path
        gen.signed_by, gen.trusted = old.signed_by, old.trusted
        gen.fix_identity(GenerationIdentity(gen.id, gen.alias, plan.facts.package_sha256, str(gen.source),
                                            gen.signed_by))
        gen.machine.fire("validated")
        core = self._core
        try:
            session, epoch = yield from self._create_session(gen)
            session.inspect()
            yield from self._golden_and_warmup(gen, session, epoch, idle=lambda: core.executor.inflight() == 0,
                                               waiting_for="the device to fall idle for golden")
            self._publish(alias, gen)
        except Exception as exc:
            gen.error = f"restore: {exc}"
            self._discard(gen)
            raise
        log.warning("previous model version restored", extra={"alias": alias.name, "generation": gen.id,
                                                               "restored_from": old.id})
        return gen

    def _create_session(self, gen: _Generation) -> Generator[_Wait, bool | None, tuple[RuntimeSession, int]]:
        """§11 step 7 for ``gen`` once no device recovery is pending: CreateCalbin → configure →
        KvManager → pools (Configuring → Warming). Shared by a load and a restore, which must bring a
        generation up identically. Returns the session and the device epoch it was configured in
        (a reset or restart after that killed its configuration: :meth:`_check_epoch`)."""
        core = self._core
        yield _Wait(lambda: core.recovery.pending is None, None, "device recovery to finish")
        epoch = gen.epoch = self._epoch
        assert gen.plan is not None
        session = RuntimeSession(core.device, gen.package_path, self.config, generation=gen.id,
                                 verify_golden=core.options.verify_golden, plan=gen.plan,
                                 warmup=self._warmup_enabled())
        gen.session = session
        session.create_calbin()
        self._calbin_gen[session.calbin.calbin_id] = gen.id
        session.configure()
        session.create_kv_manager()
        session.create_pools()
        gen.machine.fire("configured")
        return session, epoch

    def _golden_and_warmup(self, gen: _Generation, session: RuntimeSession, epoch: int, *,
                           idle: Callable[[], bool], waiting_for: str,
                           progress: Callable[[str], None] = lambda summary: None
                           ) -> Generator[_Wait, bool | None, None]:
        """§11 step 9 with the device to ourselves: golden vectors, then warm-up; then Ready.

        Planned work is held and the step waits until ``idle()``; the golden/warm-up jobs then run
        outside the executor with the completion thread paused (``exclusive_device``). They advance
        the device's per-engine ``engine_sequence`` counters, so the executor's expectation is
        resynchronised right after them (§14) — legal there, as the hold and ``idle()`` leave it
        nothing in flight. If the wait is abandoned instead (the operation aborted, the epoch
        changed), no such job ran and there is nothing to resynchronise. ``progress`` receives the
        load report's golden summary each time it grows, so a failure shows how far step 9 got.
        """
        core = self._core
        summary = "skipped (verify_golden off)"
        core.hold_submissions(True)
        try:
            yield _Wait(idle, None, waiting_for)
            self._check_epoch(gen, epoch)
            with core.exclusive_device():
                try:
                    if session.verify_golden:
                        session.check_golden()
                        summary = f"passed ({len(session.golden_outcomes)} vectors)"
                        progress(summary)
                    if session.run_warmup:
                        session.warmup()
                        summary += "; warmup passed"
                    else:
                        summary += "; warmup skipped"
                    progress(summary)
                finally:
                    core.executor.resync_engine_sequences()
        finally:
            core.hold_submissions(False)
        session.mark_ready()
        gen.machine.fire("warmed")

    def _publish(self, alias: _Alias, gen: _Generation) -> None:
        """Step 10: alias → gen, atomically on the actor (no reader sees a half-switched alias)."""
        core = self._core
        assert gen.session is not None and gen.plan is not None and gen.machine.at("ready")
        previous = alias.current
        if previous is not None:
            previous.published = False
        alias.current = gen
        gen.published = True
        self._serving = gen
        core.executor.rebind(gen.session)
        if self.contract is None:
            self.contract = gen.plan.contract()
        core.scheduler.set_model(gen.id, ModelAvailability.READY, gen.plan.profiles)
        core.scheduler.hold_new_requests(False)

    def _retain(self, old: _Generation) -> _Retained:
        """Step 11: keep the old signed artifact (its manifest must still be the one it was loaded from)."""
        assert old.facts is not None
        source = old.source
        manifest = source / MANIFEST_FILE if source.is_dir() else None
        if manifest is not None:
            sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
            if sha != old.facts.package_sha256:
                raise PackageError(f"package {source}: manifest.json changed since it was loaded",
                                   reason=PackageCheck.HASH_MISMATCH.value)
        elif not source.is_file():
            raise PackageError(f"package {source}: no longer exists", reason=PackageCheck.NOT_FOUND.value)
        return _Retained(old.id, source, old.facts.package_sha256, old.signed_by, old.trusted)

    def _discard(self, gen: _Generation) -> list[str]:
        """Clean up a generation that will never serve (a failed load): through Unloading, verified."""
        m = gen.machine
        problems: list[str] = []
        if m.at("configuring", "warming"):
            m.fire("load_failed")
        elif m.at("ready"):
            m.fire("drain")
            m.fire("drained")
        session = gen.session
        if session is not None:
            if gen.epoch != self._epoch and session.state is not SessionState.ABANDONED:
                session.drop_configuration()
            problems = session.teardown(verify=False, others_configured=self._others_configured(gen))
            problems += session.verify_released() if not problems else []
        if problems and self._others_resident(gen):
            gen.error += f"; cleanup left the device unclean: {'; '.join(problems)}"
            return problems  # stays Unloading (buffers held) until the device can be reset
        if problems:
            try:
                problems.append(f"escalated: {self._escalate(f'generation {gen.id} cleanup')}")
            except UnloadFailed as exc:
                gen.error += f"; {exc}"
                problems.append(str(exc))
                return problems  # stays Unloading until the device is verified clean
        if m.at("unloading"):
            m.fire("freed")
            m.fire("verified")
        gen.session = None
        self._release_extraction(gen)
        self._ended_generation(gen)
        return problems

    # ================================================================== unload (§12)

    def _queue_unload(self, alias_name: str, deadline_s: float) -> Operation:
        alias = self._aliases[alias_name]
        if alias.current is None and not self.busy():
            raise Unavailable(f"alias {alias_name!r} has no generation to unload")
        op = Operation("unload", alias_name, alias.current.id if alias.current is not None else 0, self.clock)
        op.start(self._standalone_unload(op, alias, deadline_s))
        self._queue.append(op)
        self.poll()
        return op

    def _standalone_unload(self, op: Operation, alias: _Alias, deadline_s: float) -> Body:
        """Unload whatever the alias points at when the lock is granted (not when it was asked)."""
        gen = alias.current
        if gen is None:
            raise Unavailable(f"alias {alias.name!r} has no generation to unload")
        op.generation = gen.id
        report = yield from self._unload_body(op, gen, deadline_s=deadline_s, replacement=False)
        return report

    def _unload_body(self, op: Operation, gen: _Generation, *, deadline_s: float, replacement: bool
                     ) -> Generator[_Wait, bool | None, UnloadReport]:
        """§12 for one generation; ``replacement``: step 6 of a load (new requests are held, not 503)."""
        core = self._core
        scheduler = core.scheduler
        alias = self._aliases[gen.alias]
        m = gen.machine
        timings: list[StepTiming] = []
        problems: list[str] = []
        started = self.clock.now()
        # 1. Ready → Draining; new requests rejected (unload) or held (replacement)
        t0 = self._step(op, UnloadStep.DRAIN, gen)
        gen.unload_requested = True
        if m.at("ready"):
            m.fire("drain")
        if alias.current is gen:
            alias.current = None
            gen.published = False
        if self._serving is gen and not replacement:
            scheduler.set_model(gen.id, ModelAvailability.DRAINING)  # 503 for new; queued cancelled (R12.4)
        timings.append(StepTiming("drain", t0, 0.0))
        # 2. wait for active requests and in-flight jobs, until the deadline
        t_wait = self.clock.now()
        deadline_passed = False
        forced = False
        t0 = self._step_soft(op, UnloadStep.WAIT, gen, problems)
        if t0 is None:
            forced = True
        else:
            ready = yield _Wait(lambda: gen.idle() or core.recovery.failed, t_wait + deadline_s,
                                f"generation {gen.id} to drain")
            deadline_passed = not ready
        timings.append(StepTiming("wait", t0 or t_wait, self.clock.now() - t_wait))
        # 3. cancel what is left; submitted jobs still drain (R12.10: never freed early)
        t0 = self._step_soft(op, UnloadStep.CANCEL, gen, problems) or self.clock.now()
        cancelled = 0
        went_recovering = False
        if not gen.idle():
            cancelled = self._cancel_pinned(gen)
            if m.inflight_jobs > 0 and m.at("draining") and (deadline_passed or forced):
                m.fire("drain_deadline")  # R12.10: Recovering, buffers kept
                went_recovering = True
            yield _Wait(lambda: gen.idle() or core.recovery.failed, None,
                        f"generation {gen.id}'s submitted jobs to complete or the device to be reset")
            if not gen.idle():
                gen.error = "jobs stuck on the device and recovery gave up; buffers kept (§12)"
                raise UnloadFailed(f"generation {gen.id}: {gen.error}", rc=None)
        if m.at("failed") and m.can_fire("drain"):
            m.fire("drain")  # failed → unloading
        elif m.at("recovering"):
            yield _Wait(lambda: m.can_fire("resume_unload") or core.recovery.failed, None,
                        f"generation {gen.id} to leave recovery")
            if not m.can_fire("resume_unload"):
                raise UnloadFailed(f"generation {gen.id} cannot leave Recovering (recovery gave up)", rc=None)
            m.fire("resume_unload")
        elif m.at("draining"):
            m.fire("drained")
        drain_s = self.clock.now() - t_wait
        self._measured(gen, "drain", drain_s)
        timings.append(StepTiming("cancel", t0, self.clock.now() - t0))
        if self._serving is gen:
            self._serving = None
            core.executor.rebind(RuntimeSession.detached(core.device, self.config))
            scheduler.set_model(gen.id, ModelAvailability.LOADING if replacement else ModelAvailability.UNLOADED)
        # a device recovery still pending must run first: the cleanup needs a device in a known state
        yield _Wait(lambda: core.recovery.pending is None or core.recovery.failed, None, "device recovery to finish")
        # 4.–6. free sequences/KV and pools; KvManager and calbin; ResetConfiguration per contract
        session = gen.session
        reset_called = False
        if session is not None and gen.epoch != self._epoch and session.state is not SessionState.ABANDONED:
            session.drop_configuration()
        t0 = self._step_soft(op, UnloadStep.FREE_KV, gen, problems)
        if t0 is not None and session is not None:
            problems += session.free_sequences()
            problems += session.destroy_pools()
        timings.append(StepTiming("free_kv", t0 or self.clock.now(), 0.0))
        t0 = self._step_soft(op, UnloadStep.DESTROY, gen, problems)
        if t0 is not None and session is not None:
            problems += session.destroy_kv_manager()
            problems += session.destroy_calbin()
        timings.append(StepTiming("destroy", t0 or self.clock.now(), 0.0))
        t0 = self._step_soft(op, UnloadStep.RESET, gen, problems)
        if t0 is not None and session is not None:
            reset_called, reset_problems = session.reset_configuration_after_unload(
                others_configured=self._others_configured(gen))
            problems += reset_problems
            if reset_called:
                self._epoch += 1
        timings.append(StepTiming("reset", t0 or self.clock.now(), 0.0))
        m.fire("freed")
        # 7. verify device memory and health → Unloaded
        t0 = self._step_soft(op, UnloadStep.VERIFY, gen, problems)
        unclean = t0 is None  # a verification that could not run proves nothing
        if t0 is not None and session is not None:
            leftovers = session.verify_released() + self._health()
            problems += leftovers
            unclean = bool(leftovers)
        escalation = ""
        if problems:
            self._unload_problems += 1
        if unclean:
            if self._others_resident(gen):
                gen.error = "; ".join(problems)
                raise UnloadFailed(f"generation {gen.id} left the device unclean and another generation is resident, "
                                   f"so the device cannot be reset for it: {gen.error}", rc=None)
            try:
                escalation = self._escalate(f"unload of generation {gen.id}")
            except UnloadFailed as exc:
                gen.error = str(exc)
                raise  # stays Unloading: never reported Unloaded on an unverified device (R12.8)
        if session is not None:
            session.finish_teardown()
        m.fire("verified")
        gen.session = None
        timings.append(StepTiming("verify", t0 or self.clock.now(), 0.0))
        took = self.clock.now() - started
        self._measured(gen, "unload", took)
        self._unloads += 1
        self._release_extraction(gen)
        self._ended_generation(gen)
        report = UnloadReport(alias=gen.alias, generation=gen.id, state=gen.state, drain_s=drain_s,
                              deadline_passed=deadline_passed, cancelled_requests=cancelled,
                              went_recovering=went_recovering, reset_configuration=reset_called,
                              escalation=escalation, problems=tuple(problems), steps=tuple(timings))
        if replacement and problems:
            raise UnloadFailed(f"unloading generation {gen.id} had problems ({'; '.join(problems)}); the device was "
                               f"made clean by {escalation or 'nothing'}", rc=None)
        log.info("model generation unloaded", extra={"generation": gen.id, "drain_s": drain_s,
                                                      "problems": len(problems)})
        return report

    def _quiesce(self, gen: _Generation, deadline_s: float) -> Generator[_Wait, bool | None, None]:
        """Co-resident switch: wait until the old generation's pinned requests ended (it stays Ready)."""
        core = self._core
        ready = yield _Wait(lambda: gen.idle() or not gen.machine.at("ready"), self.clock.now() + deadline_s,
                            f"generation {gen.id} to finish its requests")
        if not ready:
            self._cancel_pinned(gen)
            yield _Wait(lambda: gen.idle() or not gen.machine.at("ready") or core.recovery.failed, None,
                        f"generation {gen.id}'s submitted jobs to complete")
        if not gen.machine.at("ready") or not gen.idle():
            raise DeviceFault(f"generation {gen.id} left Ready while the switch waited for it "
                              f"({gen.state}); the switch is abandoned", rc=None)

    def _cancel_pinned(self, gen: _Generation) -> int:
        """Cancel every live request pinned to ``gen`` (running ones drain their job, §4)."""
        scheduler = self._core.scheduler
        count = 0
        for rec in scheduler.registry.live():
            if rec.generation == gen.id:
                scheduler.cancel(rec.request_id)
                count += 1
        self._core.run_commands()
        return count

    # ================================================================== device

    def _replace_device(self) -> None:
        """Close the VirtualDevice (every handle and job dies with it) and create a new one."""
        core = self._core
        old = core.device
        for gen in self._gens.values():
            if gen.session is not None:
                gen.session.abandon()
        try:
            old.close()
        except CalculetError as exc:
            log.error("closing the device failed", extra={"detail": str(exc)})
        core.executor.forget_all()
        core.device = core.runtime.create_virtual_device()
        self._epoch += 1
        self._calbin_gen.clear()
        core.executor.rebind(RuntimeSession.detached(core.device, self.config))
        for gen in self._gens.values():  # an unload left unverified is finished by the restart
            m = gen.machine
            if m.at("unloading") and gen.session is not None and (self._active is None
                                                                   or self._active.generation != gen.id):
                if m.can_fire("freed"):
                    m.fire("freed")
                m.fire("verified")
                gen.session = None
                gen.error += " (the device restart released everything it held)"
                self._ended_generation(gen)

    def _escalate(self, what: str) -> str:
        """A cleanup left the device unclean and nothing else is on it: restart the device (the
        contract's strongest reset) and verify the new one is clean; if even that fails, raise."""
        self._escalations += 1
        log.error("device unclean after cleanup; restarting it", extra={"what": what})
        self._replace_device()
        leftovers = self._health()
        used = sum(info.used_bytes for info in read_board_memory(self._core.device))
        if used:
            leftovers.append(f"device memory {used} bytes in use on the restarted device")
        if leftovers:
            raise UnloadFailed(f"{what}: the device is not clean even after a restart: {'; '.join(leftovers)}",
                               rc=None)
        return "restart"

    def _health(self) -> list[str]:
        device = self._core.device
        try:
            device.read_mem(0)
        except CalculetError as exc:
            return [f"device health: ReadMem failed: {exc}"]
        return []

    def _others_resident(self, gen: _Generation) -> bool:
        return any(g is not gen and g.session is not None and g.session.has_calbin for g in self._gens.values())

    def _others_configured(self, gen: _Generation) -> bool:
        return self._others_resident(gen)

    def _check_epoch(self, gen: _Generation, epoch: int) -> None:
        if self._epoch != epoch:
            raise DeviceFault(f"the device was reset or restarted while generation {gen.id} was loading; its "
                              "configuration died with the reset domain", rc=None)

    # ================================================================== helpers

    def _step(self, op: Operation, step: LoadStep | UnloadStep, gen: _Generation) -> float:
        kind = "load" if isinstance(step, LoadStep) else "unload"
        op.step = f"{kind} step {int(step)}: {step.title}"
        if self.step_hook is not None:
            self.step_hook(step, gen.id)
        return self.clock.now()

    def _step_start(self, step: LoadStep, gen: _Generation) -> float:
        """Steps 1–4 (calling thread): the hook only; the operation does not exist yet."""
        if self.step_hook is not None:
            self.step_hook(step, gen.id)
        return self.clock.now()

    def _step_soft(self, op: Operation, step: LoadStep | UnloadStep, gen: _Generation,
                   problems: list[str]) -> float | None:
        """A step whose failure is recorded and does not stop the sequence; None if it failed."""
        try:
            return self._step(op, step, gen)
        except Exception as exc:  # noqa: BLE001 - recorded as a problem of this step
            problems.append(f"step {int(step)} ({step.title}): {exc}")
            return None

    def _timed(self, timings: list[StepTiming], step: LoadStep, t0: float) -> float:
        """Record that ``step`` ran from ``t0`` until now (the report's ``steps``); its duration."""
        took = self.clock.now() - t0
        timings.append(StepTiming(step.name.lower(), t0, took))
        return took

    def _measured(self, gen: _Generation, phase: str, seconds: float) -> None:
        """A §16 phase duration: the generation's last one, and the manager's running figures."""
        gen.durations[phase] = seconds
        self._durations[phase].add(seconds)

    def _downtime(self, paused_at: float | None) -> float | None:
        """How long new requests were held (from step 5), once a replacement ends; None if none were."""
        if paused_at is None:
            return None
        downtime = self.clock.now() - paused_at
        self._durations["downtime"].add(downtime)
        return downtime

    def _drain_s(self) -> float:
        return self.config.executor.drain_deadline_ms / 1000.0

    def _warmup_enabled(self) -> bool:
        option = self._core.options.warmup
        return self._core.options.verify_golden if option is None else option

    def _release_extraction(self, gen: _Generation) -> None:
        if gen.verified is not None and gen.verified.extracted:
            gen.verified.cleanup()

    def _ended_generation(self, gen: _Generation) -> None:
        self._ended.append(gen.id)
        while len(self._ended) > HISTORY:
            old_id = self._ended.popleft()
            old = self._gens.get(old_id)
            if old is not None and old.machine.at("unloaded") and old.session is None:
                del self._gens[old_id]

    # ================================================================== reading (actor)

    def _snapshot(self, gen: _Generation) -> ModelGeneration:
        m = gen.machine
        facts, plan = gen.facts, gen.plan
        return ModelGeneration(
            id=gen.id, alias=gen.alias, calbin_sha256=facts.package_sha256 if facts else "", state=m.state,
            runtime=gen.session, active_requests=m.active_requests, inflight_jobs=m.inflight_jobs,
            published=gen.published, package=str(gen.source), signed_by=gen.signed_by,
            name=facts.name if facts else "", exact_submodel=facts.exact_submodel if facts else "",
            max_seq=plan.max_seq if plan else 0, profiles=plan.profiles.sizes if plan else (),
            durations_s=dict(gen.durations), detail=gen.error)

    def status_now(self) -> ModelStatus:
        """(actor) :meth:`status` without posting: for the engine's own statistics and hooks."""
        alias = self._aliases[self.alias]
        previous = alias.previous
        return ModelStatus(
            alias=alias.name, current=alias.current.id if alias.current is not None else None,
            rollback_available=previous is not None, previous_sha256=previous.sha256 if previous else None,
            previous_package=str(previous.source) if previous else None,
            operation=self._active.describe() if self._active is not None else None,
            queued_operations=len(self._queue),
            generations=tuple(self._snapshot(g) for g in sorted(self._gens.values(), key=lambda g: g.id)))

    def statistics_now(self) -> ModelManagerStatistics:
        """(actor) :meth:`statistics` without posting (the engine's ``statistics()`` includes it)."""
        states: collections.Counter[str] = collections.Counter(g.state for g in self._gens.values())
        current = self._aliases[self.alias].current
        d = {name: durations.freeze() for name, durations in self._durations.items()}
        return ModelManagerStatistics(
            alias=self.alias, current_generation=current.id if current is not None else 0,
            generations_by_state=dict(states), loads=self._loads, load_failures=dict(self._load_failures),
            replacements=self._replacements, coresident_replacements=self._coresident, restores=self._restores,
            rollbacks=self._rollbacks, unloads=self._unloads, unload_problems=self._unload_problems,
            escalations=self._escalations, lifecycle_busy=self._active is not None,
            queued_operations=len(self._queue), load=d["load"], configure=d["configure"], warmup=d["warmup"],
            drain=d["drain"], unload=d["unload"], downtime=d["downtime"])

    def generations(self) -> Iterable[_Generation]:
        """(actor) The generation records; for the engine and tests."""
        return tuple(self._gens.values())


def _coreside(a: Any, b: Any) -> bool:
    """Two calbins may be resident and configured together only if both contracts say so (§13.2)."""
    if a is None or b is None:
        return False
    return bool(a.model_coresidency.value and b.model_coresidency.value
                and not a.configure_device_global.value and not b.configure_device_global.value)

