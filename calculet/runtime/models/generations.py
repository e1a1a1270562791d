"""The manager's records of model generations (§10) and the table that holds them.

A generation's state lives only in its :class:`~calculet.machines.ModelMachine`; the record adds
what the lifecycle needs around it (package, plan, session, the device epoch it was configured
in). :class:`Generations` is the one table the loader, the unloader and the recovery hooks share:
the alias, the serving generation, the device epoch and which calbin belongs to whom — all read
and written on the engine's actor only (DESIGN principle 2).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calculet.adapters.calrt import MemoryFootprint
from calculet.errors import DefinitionError, DeviceFault
from calculet.machines import ModelMachine
from calculet.machines.model_couplings import ON_DEVICE
from calculet.packages import VerifiedPackage
from calculet.runtime.execution.model_facts import ModelFacts
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.execution.session_plan import EngineContract, SessionPlan
from calculet.runtime.models.capacity import CapacityPlan, ChipMemory
from calculet.runtime.models.reports import GenerationIdentity, ModelGeneration, StepTiming
from calculet.runtime.scheduling.admission import ModelAvailability

if TYPE_CHECKING:
    from calculet.runtime.models.port import EnginePort

__all__ = ["HISTORY", "Alias", "Generation", "Generations", "Prepared", "Retained", "Snapshot", "cancel_pinned",
           "jobs_on_device"]

_ON_DEVICE = frozenset(ON_DEVICE)

HISTORY = 32
"""Ended generations kept in :meth:`ModelManager.status` (bounded, like every label set)."""


def jobs_on_device(jobs: Iterable[Any], gen_id: int) -> int:
    """How many of ``jobs`` (the scheduler's jobs table, their one owner) are of generation ``gen_id`` and on the
    device — submitted, timed out or quarantined: the ``inflight`` argument of the ModelMachine events whose guards
    need it (``drained``, ``drain_deadline``, ``recovered``, ...). The machine keeps no copy of the count (issue
    #20); GenerationJobSystem proves the properties with this count wired in."""
    return sum(1 for job in jobs if job.generation == gen_id and job.state in _ON_DEVICE)


class Generation:
    """The manager's record of one generation; its state lives only in ``machine``, its jobs in the jobs table."""

    __slots__ = ("id", "alias", "machine", "_identity", "facts", "plan", "verified", "package_path", "source",
                 "signed_by", "trusted", "session", "published", "unload_requested", "error", "epoch",
                 "durations", "created_at", "_jobs")

    def __init__(self, gen_id: int, alias: str, source: Path, created_at: float,
                 jobs: Callable[[], Iterable[Any]] = tuple) -> None:
        self._jobs = jobs
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

    def inflight(self) -> int:
        """Its jobs on the device, counted in the jobs table (:func:`jobs_on_device`): the ``inflight`` argument."""
        return jobs_on_device(self._jobs(), self.id)

    def idle(self) -> bool:
        return self.machine.active_requests == 0 and self.inflight() == 0


@dataclass
class Alias:
    name: str
    current: Generation | None = None
    previous: Retained | None = None


@dataclass(frozen=True)
class Retained:
    """§11 step 11: the artifact a rollback goes back to."""

    generation: int
    source: Path
    sha256: str
    signed_by: str
    trusted: bool


@dataclass
class Prepared:
    """Steps 1–4 passed: what the calling thread found, handed to the actor with the operation."""

    gen: Generation
    kind: str
    plan: SessionPlan
    capacity: CapacityPlan | None
    timings: list[StepTiming]
    verified: VerifiedPackage | None
    path: Path
    signed_by: str
    trusted: bool


@dataclass(frozen=True)
class Snapshot:
    """What steps 3–4 need from the actor, read in one message."""

    generation: int
    chips: tuple[ChipMemory, ...]
    resident: tuple[tuple[int, MemoryFootprint, Any], ...]



class Generations:
    """Every generation the manager knows, by id; the alias table; the serving generation; and
    the device epoch (bumped by every reset or restart: a configuration made before it is dead)."""

    def __init__(self, alias: str, first_generation: int) -> None:
        self._ids = itertools.count(first_generation)
        self._gens: dict[int, Generation] = {}
        self.by_id = self._gens
        """The same table, read-only to others: the engine's per-job hooks read a generation with one
        dictionary lookup instead of a call to :meth:`get` (issue #20). Never rebound."""
        self._ended: collections.deque[int] = collections.deque()
        self._calbin_gen: dict[int, int] = {}
        self.aliases: dict[str, Alias] = {alias: Alias(alias)}
        self.serving: Generation | None = None
        """The generation whose session the executor is bound to (jobs may be planned for it)."""
        self.epoch = 0
        self.contract: EngineContract | None = None
        """What the engine was built on (the first generation's plan); replacements must keep it."""
        self.jobs: Callable[[], Iterable[Any]] = tuple
        """The jobs table (the scheduler's ``InflightTable``), read when a generation counts its jobs on the device;
        the manager sets it (none until then)."""
        self.unserved = ModelAvailability.UNLOADED
        """What the alias is while no generation serves — a load replacing the unloaded one (LOADING),
        an unload done (UNLOADED), no version left (FAILED): the lifecycle's, not a generation's, so
        ``availability_of`` takes it as an input (#17)."""

    def new(self, alias: str, source: Path, created_at: float) -> Generation:
        """A new generation enters Validating."""
        gen = Generation(next(self._ids), alias, source, created_at, lambda: self.jobs())
        self._gens[gen.id] = gen
        gen.machine.fire("load")
        return gen

    def get(self, gen_id: int) -> Generation | None:
        return self._gens.get(gen_id)

    def __getitem__(self, gen_id: int) -> Generation:
        return self._gens[gen_id]

    def __iter__(self) -> Iterator[Generation]:
        return iter(tuple(self._gens.values()))

    def ended(self, gen: Generation) -> None:
        """``gen`` reached Unloaded: keep it in the history, forget the oldest beyond :data:`HISTORY`."""
        self._ended.append(gen.id)
        while len(self._ended) > HISTORY:
            old_id = self._ended.popleft()
            old = self._gens.get(old_id)
            if old is not None and old.machine.at("unloaded") and old.session is None:
                del self._gens[old_id]

    def others_resident(self, gen: Generation) -> bool:
        """Whether another generation holds a calbin on the device (its reset domain is shared)."""
        return any(g is not gen and g.session is not None and g.session.has_calbin for g in self._gens.values())

    def resident(self) -> tuple[tuple[int, MemoryFootprint, Any], ...]:
        """(id, footprint, capabilities) of every generation holding a calbin (§11 step 4)."""
        return tuple((g.id, g.facts.memory, g.facts.capabilities) for g in self._gens.values()
                     if g.session is not None and g.session.has_calbin and g.facts is not None)

    def note_calbin(self, calbin_id: int, gen_id: int) -> None:
        self._calbin_gen[calbin_id] = gen_id

    def generation_of_calbin(self, calbin_id: int) -> int:
        return self._calbin_gen.get(calbin_id, 0)

    def new_device_epoch(self, *, device_replaced: bool = False) -> None:
        """A reset or restart killed every configuration; a restart also every calbin id."""
        self.epoch += 1
        if device_replaced:
            self._calbin_gen.clear()

    def check_epoch(self, gen: Generation, epoch: int) -> None:
        if self.epoch != epoch:
            raise DeviceFault(f"the device was reset or restarted while generation {gen.id} was loading; its "
                              "configuration died with the reset domain", rc=None)

    def snapshot(self, gen: Generation) -> ModelGeneration:
        m = gen.machine
        facts, plan = gen.facts, gen.plan
        return ModelGeneration(
            id=gen.id, alias=gen.alias, calbin_sha256=facts.package_sha256 if facts else "", state=m.state,
            runtime=gen.session, active_requests=m.active_requests, inflight_jobs=gen.inflight(),
            published=gen.published, package=str(gen.source), signed_by=gen.signed_by,
            name=facts.name if facts else "", exact_submodel=facts.exact_submodel if facts else "",
            max_seq=plan.max_seq if plan else 0, profiles=plan.profiles.sizes if plan else (),
            durations_s=dict(gen.durations), detail=gen.error)


def cancel_pinned(engine: EnginePort, gen: Generation) -> int:
    """Cancel every live request pinned to ``gen`` (running ones drain their job, §4)."""
    scheduler = engine.scheduler
    count = 0
    for rec in scheduler.registry.live():
        if rec.generation == gen.id:
            scheduler.cancel(rec.request_id)
            count += 1
    engine.run_commands()
    return count
