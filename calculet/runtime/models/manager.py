"""ModelManager (§3, §10–§13): model generations and their load, unload, drain and rollback.

A **generation** is one immutable loaded instance of a signed package under an alias (§10):
its identity (id, alias, calbin sha256, package, signer) is fixed once steps 1–3 pass; its
lifecycle is a :class:`~calculet.machines.ModelMachine` instance and every change of its state
goes through that machine's ``fire`` — the manager keeps no second state field. The machine's
counter ``active_requests`` is fired by the engine as requests are pinned and end; its jobs on the
device are counted where they live, in the scheduler's jobs table (``Generation.inflight``), and
handed to the events whose guards read them, so "drained" is the declared guard, not a guess.

**Where things run** (DESIGN principle 2). All state changes happen on the engine's actor,
reached through the :class:`~calculet.runtime.models.port.EnginePort` this package owns (the
manager never touches the engine's components). An operation (load, unload, rollback) is a
generator the actor resumes every tick (:mod:`calculet.runtime.models.operations`); steps 1–4 of
a load run on the *calling* thread before the operation is queued
(:mod:`calculet.runtime.models.prepare`, R11.4); the lifecycle lock runs one operation at a time
(R11.5). The public methods are thread-safe and block with a timeout (an
:class:`~calculet.runtime.models.operations.ActorPort` posts to the actor); bound to the
virtual-time engine driver the same methods run in virtual time, the calling thread stepping the
engine from event to event until the operation ends. ``begin_*`` variants return an
:class:`OperationHandle` at once (Trio's ``op``/``op_nowait``).

The manager is a façade over its collaborators, one room each: :class:`Preparer` (§11 steps
1–4), :class:`Loader` (steps 5–11, restore), :class:`Unloader` (§12, cleanup, stop) and
:class:`GenerationRecovery` (the engine's reset/restart hooks), sharing one :class:`Generations`
table, one :class:`LifecycleLock` and one :class:`LifecycleTally`.

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
* a replacement must keep the engine contract (:class:`~calculet.runtime.execution.session_plan.EngineContract`:
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calculet.errors import NotFound, Unavailable
from calculet.machines import RequestMachine
from calculet.machines.model_couplings import PINNING_EVENTS, SERVING
from calculet.machines.request import TERMINAL
from calculet.runtime.execution.session_plan import EngineContract
from calculet.runtime.models.availability import availability_faults, job_faults
from calculet.runtime.models.capacity import CapacityPlanner
from calculet.runtime.models.generations import Generation, Generations, Prepared, jobs_on_device
from calculet.runtime.models.load import Loader
from calculet.runtime.models.operations import ActorPort, InlinePort, LifecycleLock, OperationHandle, Steps
from calculet.runtime.models.port import EnginePort
from calculet.runtime.models.prepare import ACTOR_CALL_TIMEOUT_S, Preparer
from calculet.runtime.models.recovery import GenerationRecovery
from calculet.runtime.models.reports import (LifecycleTally, LoadReport, ModelManagerStatistics, ModelStatus,
                                             StepHook, UnloadReport)
from calculet.runtime.models.unload import Unloader

if TYPE_CHECKING:
    from calculet.runtime.scheduling.registry import RequestRecord

__all__ = ["ModelManager"]

_TERMINAL = frozenset(TERMINAL)
_PINNING = frozenset((t.source, t.target) for t in RequestMachine.definition.transitions if t.event in PINNING_EVENTS)
"""(source, target) of the request rows that pin a request to a generation (``bind``, ``admit_now``)."""
REQUEST_TARGETS = _TERMINAL | {target for _, target in _PINNING}
"""The request states a move into may change a generation's counters (:meth:`ModelManager.on_request_transition`);
a move into any other state (every decode step's two) changes none, so a caller may skip the call (issue #20)."""
_SERVING_STATES = frozenset(SERVING)
"""The generation states that take a new job: GenerationJobSystem's ``submit`` guard, declared once there."""


def _awaiting_a_result(jobs: "list[Any]", gens: Generations) -> int:
    """The jobs the generations count on the device (:func:`jobs_on_device`) whose result the executor still waits
    for: all of them but those quarantined by a fault their own result reported (CCU fault, unknown DMA: the
    executor handed that result over, the table keeps the job on the device until a reset ends it)."""
    on_device = sum(jobs_on_device(jobs, gen.id) for gen in gens)
    reported = sum(1 for job in jobs if job.state == "quarantined" and job.last_transition.event == "fault")
    return on_device - reported


class ModelManager:
    """Generations, the alias, and their lifecycle operations (§3 ModelManager, §10–§13).

    Public methods are thread-safe (they post to the engine's actor) and block until the
    operation ends or ``timeout`` passes; bound to an ``EngineDriver`` they run in virtual
    time. ``step_hook`` is a test seam: called as each load/unload step starts, raising fails it.
    """

    def __init__(self, engine: EnginePort, *, planner: CapacityPlanner | None = None,
                 first_generation: int = 1) -> None:
        self.config = engine.config
        self.clock = engine.clock
        self._engine = engine
        self._gens = Generations(engine.config.model_alias, first_generation)
        self._gens.jobs = lambda: engine.scheduler.jobs  # the jobs table, their one owner (read when counted)
        self._by_id = self._gens.by_id
        self._lock = LifecycleLock(engine.run_commands)
        self.poll: Callable[[], None] = self._lock.poll
        """Resume the active operation, then the queued ones in order: the lifecycle lock's own ``poll``, bound
        here so the engine's call each turn costs no frame of the manager's (issue #20)."""
        self._tally = LifecycleTally()
        self._steps = Steps(engine.clock)
        self._port: ActorPort = InlinePort(self._lock.poll)
        self._recovery = GenerationRecovery(engine, self._gens, self._lock, self._tally)
        self._preparer = Preparer(engine, self._gens, self._tally, self._steps, planner or CapacityPlanner())
        self._unloader = Unloader(engine, self._gens, self._lock, self._tally, self._steps, self._recovery)
        self._loader = Loader(engine, self._gens, self._lock, self._tally, self._steps, self._preparer,
                              self._unloader)

    # ------------------------------------------------------------------ binding

    def bind_port(self, port: ActorPort) -> None:
        """The engine (real time) or the driver (virtual time) this manager posts to."""
        self._port = port

    @property
    def alias(self) -> str:
        return self.config.model_alias

    @property
    def planner(self) -> CapacityPlanner:
        return self._preparer.planner

    @property
    def step_hook(self) -> StepHook | None:
        """Called with (step, generation) as each load/unload step starts; raising fails it."""
        return self._steps.hook

    @step_hook.setter
    def step_hook(self, hook: StepHook | None) -> None:
        self._steps.hook = hook

    @property
    def contract(self) -> EngineContract | None:
        """What the engine was built on (the first generation's plan); replacements must keep it."""
        return self._gens.contract

    # ================================================================== public API (thread-safe)

    def load(self, alias: str, package: str | Path | None = None, *, timeout: float | None = None) -> LoadReport:
        """§11: verify, plan, configure, golden/warm up and publish ``package`` under ``alias``.

        ``package`` defaults to the alias's ``models[].package`` in the configuration. Raises
        :class:`LoadFailed` (``step``, ``cause``, ``report``) if any step fails."""
        return self.begin_load(alias, package).result(timeout)  # type: ignore[no-any-return]

    def begin_load(self, alias: str, package: str | Path | None = None) -> OperationHandle:
        """Steps 1–4 on the calling thread, then queue steps 5–11 on the actor; returns at once."""
        return self._begin_load(alias, self._preparer.package_for(alias, package), trusted=True, kind="load")

    def unload(self, alias: str, *, timeout: float | None = None, drain_deadline_ms: int | None = None
               ) -> UnloadReport:
        """§12: drain the alias's generation and free everything it holds (Unloaded)."""
        handle = self.begin_unload(alias, drain_deadline_ms=drain_deadline_ms)
        return handle.result(timeout)  # type: ignore[no-any-return]

    def begin_unload(self, alias: str, *, drain_deadline_ms: int | None = None) -> OperationHandle:
        self._check_alias(alias)
        deadline_ms = drain_deadline_ms if drain_deadline_ms is not None else self.config.executor.drain_deadline_ms
        op = self._port.call(lambda: self._unloader.queue(alias, deadline_ms / 1000.0), ACTOR_CALL_TIMEOUT_S)
        return OperationHandle(op, self._port)

    def rollback(self, alias: str, *, timeout: float | None = None) -> LoadReport:
        """One call back to the previous signed artifact (§11 step 11, R19.17): verified again, loaded,
        golden-checked and published like any load."""
        return self.begin_rollback(alias).result(timeout)  # type: ignore[no-any-return]

    def begin_rollback(self, alias: str) -> OperationHandle:
        self._check_alias(alias)
        retained = self._port.call(lambda: self._gens.aliases[alias].previous, ACTOR_CALL_TIMEOUT_S)
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
        return self._lock.held()

    def _check_alias(self, alias: str) -> None:
        if alias not in self._gens.aliases:
            raise NotFound(f"no model alias {alias!r}; this engine serves {self.alias!r}", field="alias")

    def _begin_load(self, alias: str, package: Path, *, trusted: bool, kind: str) -> OperationHandle:
        prepared = self._preparer.prepare(self._port, alias, package, trusted=trusted, kind=kind)
        op = self._port.call(lambda: self._loader.queue(prepared), ACTOR_CALL_TIMEOUT_S)
        return OperationHandle(op, self._port)

    # ================================================================== bring-up

    def prepare_initial(self, package: str | Path | None) -> Prepared:
        """Steps 1–4 of the engine's first generation (inline, before the engine components exist).

        ``package`` given: a caller-provided package directory (tests, simulation) loaded without
        steps 1–2 and reported as unverified. None: ``models[model_alias].package`` with full trust
        checks."""
        alias = self.alias
        if package is None:
            return self._preparer.prepare(self._port, alias, self._preparer.package_for(alias, None), trusted=True,
                                          kind="load")
        return self._preparer.prepare(self._port, alias, Path(package), trusted=False, kind="load")

    def finish_initial(self, prepared: Prepared) -> LoadReport:
        """Steps 5–11 of the first generation, inline (nothing serves yet, nothing waits)."""
        op = self._loader.queue(prepared)
        return self._port.run(op, None)  # type: ignore[no-any-return]

    # ================================================================== engine hooks (actor only)

    @property
    def serving(self) -> Generation | None:
        """The generation whose session the executor is bound to (jobs may be planned for it)."""
        return self._gens.serving

    def busy(self) -> bool:
        return self._lock.busy()

    def next_deadline(self) -> float | None:
        """The active operation's deadline (the lock's :meth:`~LifecycleLock.next_deadline`, read here without its
        frame: the actor asks twice a turn, issue #20), None when no operation holds the lock."""
        active = self._lock.active
        return active.deadline if active is not None else None

    def on_request_transition(self, rec: RequestRecord, source: str, target: str) -> None:
        """Counters of the ModelMachine: a request pinned (``acquire``) or ended (``release_request``).

        Only a move into :data:`REQUEST_TARGETS` can be either; the test comes first, before the request's
        generation is read (twice a token otherwise, issue #20)."""
        if target not in REQUEST_TARGETS or source == target:
            return
        gen_id = rec.machine.generation
        if not gen_id:
            return
        if target in _TERMINAL:
            gen = self._gens.get(gen_id)
            if gen is not None:
                gen.machine.fire("release_request")
        elif (source, target) in _PINNING:
            self._gens[gen_id].machine.fire("acquire")

    def counter_faults(self, live: "Iterable[RequestRecord]") -> list[tuple[str, str]]:
        """The ModelMachine's counter and the scheduler's availability checked against what they
        stand for (#17, R10.2, R12.3, R12.2): each generation's ``active_requests`` equals the live
        requests pinned to it; the jobs the jobs table has on the device (what the generations'
        ``inflight`` arguments count) are the jobs the executor has on the device; the availability
        the scheduler was given equals the one the serving
        generation's machine implies (``availability_of``: a stale copy is caught here), no two jobs
        share an engine and no job in doubt has a Ready generation
        (:mod:`calculet.runtime.models.availability`). The same equalities are
        proved on the declarations by ``GenerationRequestSystem`` and ``GenerationJobSystem``;
        reported by the engine's monitor like a broken invariant."""
        pinned: dict[int, int] = {}
        for rec in live:
            if rec.generation:
                pinned[rec.generation] = pinned.get(rec.generation, 0) + 1
        faults: list[tuple[str, str]] = []
        for gen in self._gens:
            if gen.machine.active_requests != pinned.get(gen.id, 0):
                faults.append((f"active_requests_of_generation_{gen.id}_is_its_pinned_requests", "R10.2"))
                break
        scheduler = self._engine.scheduler
        jobs = list(scheduler.jobs)
        engine = self._engine
        # a recovery that did not finish (pending, or given up) left the jobs the executor forgot in the table
        # until a reset ends them (the device may still write them): the executor's count says nothing then
        if not (engine.recovery_pending() or engine.recovery_failed()) \
                and _awaiting_a_result(jobs, self._gens) != engine.inflight_jobs():
            faults.append(("inflight_jobs_are_the_executors_jobs_on_the_device", "R10.2"))
        faults += availability_faults(self._gens, scheduler)
        faults += job_faults(self._gens, jobs)
        return faults

    def may_submit(self, gen_id: int) -> bool:
        """Whether ``gen_id`` takes a new job: Ready, or Draining what was pinned to it (§12; GenerationJobSystem's
        ``submit`` step guard). Once per job: the generation read from the table's dictionary directly."""
        gen = self._by_id.get(gen_id)
        return gen is not None and gen.machine.state in _SERVING_STATES  # ``at`` without its frame (once a job)

    def generation_of_calbin(self, calbin_id: int) -> int:
        return self._gens.generation_of_calbin(calbin_id)

    @property
    def recovery(self) -> GenerationRecovery:
        """The engine's reset/restart hooks for the generations (on_fault, reset_device, ...)."""
        return self._recovery

    def teardown(self) -> None:
        """The engine stopped: pending operations fail; each idle generation is unloaded in §12
        order where the device allows, the rest die with the device."""
        self._lock.abort_all(Unavailable("the engine has stopped"))
        self._unloader.teardown()

    # ================================================================== reading (actor)

    def status_now(self) -> ModelStatus:
        """(actor) :meth:`status` without posting: for the engine's own statistics and hooks."""
        alias = self._gens.aliases[self.alias]
        previous = alias.previous
        return ModelStatus(
            alias=alias.name, current=alias.current.id if alias.current is not None else None,
            rollback_available=previous is not None, previous_sha256=previous.sha256 if previous else None,
            previous_package=str(previous.source) if previous else None,
            operation=self._lock.describe(), queued_operations=self._lock.queued,
            generations=tuple(self._gens.snapshot(g) for g in sorted(self._gens, key=lambda g: g.id)))

    def statistics_now(self) -> ModelManagerStatistics:
        """(actor) :meth:`statistics` without posting (the engine's ``statistics()`` includes it)."""
        states: collections.Counter[str] = collections.Counter(g.state for g in self._gens)
        current = self._gens.aliases[self.alias].current
        return self._tally.freeze(alias=self.alias, current_generation=current.id if current is not None else 0,
                                  generations_by_state=dict(states), lifecycle_busy=self._lock.held(),
                                  queued_operations=self._lock.queued)

    def generations(self) -> Iterable[Generation]:
        """(actor) The generation records; for the engine and tests."""
        return tuple(self._gens)
