"""§12 unload, on the engine's actor: drain a generation and free everything it holds.

(1) Ready → Draining, new requests 503 and queued ones cancelled at once (R12.2, R12.4);
(2) wait until no request is pinned and no job is in flight, up to the drain deadline on the
injected clock; (3) at the deadline cancel what is left — running requests only get their cancel
flag, their jobs still drain — and if jobs are still submitted enter Recovering with every buffer
kept (R12.10, R12.11) until they complete or the device is reset per its contract; (4) free
sequences, destroy pools; (5) destroy the KvManager and the calbin; (6) ResetConfiguration only
where the contract verifies it and no other calbin shares the reset domain (R12.7); (7) verify the
device memory and health → Unloaded (R12.8). A cleanup that leaves the device unclean escalates to
a device restart when no other generation is on it.

The same path serves step 6 of a replacement load (new requests are held, not 503), the cleanup of
a generation that will never serve (:meth:`Unloader.discard`) and the engine's stop
(:meth:`Unloader.teardown`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, field

from calculet.errors import CalculetError, DeviceFault, Unavailable
from calculet.runtime.execution.session import SessionState
from calculet.runtime.models.availability import sync_availability
from calculet.runtime.models.generations import Alias, Generation, Generations, cancel_pinned
from calculet.runtime.models.operations import Body, LifecycleLock, Operation, Steps, Wait
from calculet.runtime.models.port import EnginePort
from calculet.runtime.models.recovery import GenerationRecovery
from calculet.runtime.models.reports import LifecycleTally, StepTiming, UnloadFailed, UnloadReport, UnloadStep
from calculet.runtime.scheduling.admission import ModelAvailability

log = logging.getLogger("calculet.runtime.models.unload")

__all__ = ["Unloader"]

Waits = Generator[Wait, bool | None, None]


@dataclass
class _UnloadRun:
    """What one unload found and did so far (its report's fields)."""

    started: float
    timings: list[StepTiming] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    deadline_passed: bool = False
    cancelled: int = 0
    went_recovering: bool = False
    reset_called: bool = False
    escalation: str = ""


class Unloader:
    """§12 for one generation at a time, run by the lifecycle lock."""

    def __init__(self, engine: EnginePort, generations: Generations, lock: LifecycleLock, tally: LifecycleTally,
                 steps: Steps, recovery: GenerationRecovery) -> None:
        self._engine = engine
        self._gens = generations
        self._lock = lock
        self._tally = tally
        self._steps = steps
        self._recovery = recovery

    def queue(self, alias_name: str, deadline_s: float) -> Operation:
        """(actor) Queue an unload of whatever the alias points at when the lock is granted."""
        alias = self._gens.aliases[alias_name]
        if alias.current is None and not self._lock.busy():
            raise Unavailable(f"alias {alias_name!r} has no generation to unload")
        op = Operation("unload", alias_name, alias.current.id if alias.current is not None else 0,
                       self._engine.clock)
        op.start(self._standalone(op, alias, deadline_s))
        self._lock.enqueue(op)
        return op

    def _standalone(self, op: Operation, alias: Alias, deadline_s: float) -> Body:
        """Unload whatever the alias points at when the lock is granted (not when it was asked)."""
        gen = alias.current
        if gen is None:
            raise Unavailable(f"alias {alias.name!r} has no generation to unload")
        op.generation = gen.id
        report = yield from self.unload(op, gen, deadline_s=deadline_s, replacement=False)
        return report

    # ------------------------------------------------------------------ §12 steps 1–7

    def unload(self, op: Operation, gen: Generation, *, deadline_s: float, replacement: bool
               ) -> Generator[Wait, bool | None, UnloadReport]:
        """§12 for one generation; ``replacement``: step 6 of a load (new requests are held, not 503)."""
        engine = self._engine
        run = _UnloadRun(engine.clock.now())
        self._begin_drain(op, gen, run, replacement)
        yield from self._wait_drained(op, gen, run, deadline_s)
        if self._gens.serving is gen:
            self._gens.serving = None
            engine.detach_session()
            self._gens.unserved = ModelAvailability.LOADING if replacement else ModelAvailability.UNLOADED
            sync_availability(self._gens, engine.scheduler)
        # a device recovery still pending must run first: the cleanup needs a device in a known state
        yield Wait(lambda: not engine.recovery_pending() or engine.recovery_failed(), None,
                   "device recovery to finish")
        self._free(op, gen, run)
        self._verify(op, gen, run)
        return self._finish(gen, run, replacement)

    def _begin_drain(self, op: Operation, gen: Generation, run: _UnloadRun, replacement: bool) -> None:
        """Step 1: Ready → Draining; new requests rejected (unload) or held (replacement)."""
        t0 = self._steps.step(op, UnloadStep.DRAIN, gen.id)
        gen.unload_requested = True
        m = gen.machine
        # Ready → Draining; Recovering, or Failed with work left, record the unload (the machine's
        # unload_pending: Draining again after a recovery, never Ready). An idle Failed generation
        # goes to Unloading at step 3 (unload_failed), not here, while it still serves.
        if m.at("ready", "recovering") or (m.at("failed") and not gen.idle()):
            m.fire("drain", replace=replacement, inflight=gen.inflight())
        alias = self._gens.aliases[gen.alias]
        if alias.current is gen:
            alias.current = None
            gen.published = False
        if self._gens.serving is gen:  # unload: 503 new, queued cancelled (R12.4); replacement: held
            sync_availability(self._gens, self._engine.scheduler)
        run.timings.append(StepTiming("drain", t0, 0.0))

    def _wait_drained(self, op: Operation, gen: Generation, run: _UnloadRun, deadline_s: float) -> Waits:
        """Steps 2–3: wait for pinned requests and in-flight jobs until the deadline, then cancel what
        is left; submitted jobs still drain (R12.10: never freed early)."""
        engine, clock, m = self._engine, self._engine.clock, gen.machine
        t_wait = clock.now()
        t0 = self._steps.soft(op, UnloadStep.WAIT, gen.id, run.problems)
        forced = t0 is None
        if t0 is not None:
            ready = yield Wait(lambda: gen.idle() or engine.recovery_failed(), t_wait + deadline_s,
                               f"generation {gen.id} to drain")
            run.deadline_passed = not ready
        run.timings.append(StepTiming("wait", t0 or t_wait, clock.now() - t_wait))
        t0 = self._steps.soft(op, UnloadStep.CANCEL, gen.id, run.problems) or clock.now()
        if not gen.idle():
            run.cancelled = cancel_pinned(engine, gen)
            inflight = gen.inflight()
            if inflight > 0 and m.at("draining") and (run.deadline_passed or forced):
                m.fire("drain_deadline", inflight=inflight)  # R12.10: Recovering, buffers kept
                run.went_recovering = True
                if self._gens.serving is gen:
                    sync_availability(self._gens, engine.scheduler)
            yield Wait(lambda: gen.idle() or engine.recovery_failed(), None,
                       f"generation {gen.id}'s submitted jobs to complete or the device to be reset")
            if not gen.idle():
                gen.error = "jobs stuck on the device and recovery gave up; buffers kept (§12)"
                raise UnloadFailed(f"generation {gen.id}: {gen.error}", rc=None)
        if m.at("failed") and m.can_fire("drain", replace=replacement, inflight=gen.inflight()):
            m.fire("drain", replace=replacement, inflight=gen.inflight())  # unload_failed: failed → unloading
        elif m.at("recovering"):
            # recovery ends in Draining (recovered with the unload pending), or the idle generation
            # goes on to Unloading before it (resume_unload)
            yield Wait(lambda: not m.at("recovering") or m.can_fire("resume_unload", inflight=gen.inflight())
                       or engine.recovery_failed(), None, f"generation {gen.id} to leave recovery")
            if m.at("recovering"):
                if not m.can_fire("resume_unload", inflight=gen.inflight()):
                    raise UnloadFailed(f"generation {gen.id} cannot leave Recovering (recovery gave up)", rc=None)
                m.fire("resume_unload", inflight=gen.inflight())
        if m.at("draining"):  # never left it, or back in it after a recovery
            if not gen.idle():
                yield Wait(lambda: gen.idle() or not m.at("draining") or engine.recovery_failed(), None,
                           f"generation {gen.id} to drain after recovery")
            if not m.can_fire("drained", inflight=gen.inflight()):
                raise UnloadFailed(f"generation {gen.id} could not finish draining ({gen.state})", rc=None)
            m.fire("drained", inflight=gen.inflight())
        run.drain_s = clock.now() - t_wait
        self._tally.measured(gen.durations, "drain", run.drain_s)
        run.timings.append(StepTiming("cancel", t0, clock.now() - t0))

    def _free(self, op: Operation, gen: Generation, run: _UnloadRun) -> None:
        """Steps 4–6: free sequences/KV and pools; KvManager and calbin; ResetConfiguration per contract."""
        session, clock, problems = gen.session, self._engine.clock, run.problems
        if session is not None and gen.epoch != self._gens.epoch and session.state is not SessionState.ABANDONED:
            session.drop_configuration()
        t0 = self._steps.soft(op, UnloadStep.FREE_KV, gen.id, problems)
        if t0 is not None and session is not None:
            problems += session.free_sequences()
            problems += session.destroy_pools()
        run.timings.append(StepTiming("free_kv", t0 or clock.now(), 0.0))
        t0 = self._steps.soft(op, UnloadStep.DESTROY, gen.id, problems)
        if t0 is not None and session is not None:
            problems += session.destroy_kv_manager()
            problems += session.destroy_calbin()
        run.timings.append(StepTiming("destroy", t0 or clock.now(), 0.0))
        t0 = self._steps.soft(op, UnloadStep.RESET, gen.id, problems)
        if t0 is not None and session is not None:
            run.reset_called, reset_problems = session.reset_configuration_after_unload(
                others_configured=self._gens.others_resident(gen))
            problems += reset_problems
            if run.reset_called:
                self._gens.new_device_epoch()
        run.timings.append(StepTiming("reset", t0 or clock.now(), 0.0))
        gen.machine.fire("freed")

    def _verify(self, op: Operation, gen: Generation, run: _UnloadRun) -> None:
        """Step 7: verify device memory and health → Unloaded; an unclean device escalates."""
        session, problems = gen.session, run.problems
        t0 = self._steps.soft(op, UnloadStep.VERIFY, gen.id, problems)
        unclean = t0 is None  # a verification that could not run proves nothing
        if t0 is not None and session is not None:
            leftovers = session.verify_released() + self._recovery.health()
            problems += leftovers
            unclean = bool(leftovers)
        if problems:
            self._tally.unload_problems += 1
        if unclean:
            if self._gens.others_resident(gen):
                gen.error = "; ".join(problems)
                raise UnloadFailed(f"generation {gen.id} left the device unclean and another generation is resident, "
                                   f"so the device cannot be reset for it: {gen.error}", rc=None)
            try:
                run.escalation = self._recovery.escalate(f"unload of generation {gen.id}")
            except UnloadFailed as exc:
                gen.error = str(exc)
                raise  # stays Unloading: never reported Unloaded on an unverified device (R12.8)
        if session is not None:
            session.finish_teardown()
        gen.machine.fire("verified")
        gen.session = None
        run.timings.append(StepTiming("verify", t0 or self._engine.clock.now(), 0.0))

    def _finish(self, gen: Generation, run: _UnloadRun, replacement: bool) -> UnloadReport:
        self._tally.measured(gen.durations, "unload", self._engine.clock.now() - run.started)
        self._tally.unloads += 1
        release_extraction(gen)
        self._gens.ended(gen)
        report = UnloadReport(alias=gen.alias, generation=gen.id, state=gen.state, drain_s=run.drain_s,
                              deadline_passed=run.deadline_passed, cancelled_requests=run.cancelled,
                              went_recovering=run.went_recovering, reset_configuration=run.reset_called,
                              escalation=run.escalation, problems=tuple(run.problems), steps=tuple(run.timings))
        if replacement and run.problems:
            raise UnloadFailed(f"unloading generation {gen.id} had problems ({'; '.join(run.problems)}); the device "
                               f"was made clean by {run.escalation or 'nothing'}", rc=None)
        log.info("model generation unloaded", extra={"generation": gen.id, "drain_s": run.drain_s,
                                                      "problems": len(run.problems)})
        return report

    # ------------------------------------------------------------------ the other ways out

    def quiesce(self, gen: Generation, deadline_s: float) -> Waits:
        """Co-resident switch: wait until the old generation's pinned requests ended (it stays Ready)."""
        engine = self._engine
        ready = yield Wait(lambda: gen.idle() or not gen.machine.at("ready"), engine.clock.now() + deadline_s,
                           f"generation {gen.id} to finish its requests")
        if not ready:
            cancel_pinned(engine, gen)
            yield Wait(lambda: gen.idle() or not gen.machine.at("ready") or engine.recovery_failed(), None,
                       f"generation {gen.id}'s submitted jobs to complete")
        if not gen.machine.at("ready") or not gen.idle():
            raise DeviceFault(f"generation {gen.id} left Ready while the switch waited for it "
                              f"({gen.state}); the switch is abandoned", rc=None)

    def discard(self, gen: Generation) -> list[str]:
        """Clean up a generation that will never serve (a failed load): through Unloading, verified."""
        m = gen.machine
        problems: list[str] = []
        if m.at("configuring", "warming"):
            m.fire("load_failed")
        elif m.at("ready"):
            m.fire("drain", replace=False, inflight=gen.inflight())
            m.fire("drained", inflight=gen.inflight())
        session = gen.session
        if session is not None:
            if gen.epoch != self._gens.epoch and session.state is not SessionState.ABANDONED:
                session.drop_configuration()
            problems = session.teardown(verify=False, others_configured=self._gens.others_resident(gen))
            problems += session.verify_released() if not problems else []
        if problems and self._gens.others_resident(gen):
            gen.error += f"; cleanup left the device unclean: {'; '.join(problems)}"
            return problems  # stays Unloading (buffers held) until the device can be reset
        if problems:
            try:
                problems.append(f"escalated: {self._recovery.escalate(f'generation {gen.id} cleanup')}")
            except UnloadFailed as exc:
                gen.error += f"; {exc}"
                problems.append(str(exc))
                return problems  # stays Unloading until the device is verified clean
        if m.at("unloading"):
            m.fire("freed")
            m.fire("verified")
        gen.session = None
        release_extraction(gen)
        self._gens.ended(gen)
        return problems

    def teardown(self) -> None:
        """The engine stopped: each idle generation is unloaded in §12 order where the device
        allows, the rest die with the device."""
        for gen in self._gens:
            session = gen.session
            if session is None:
                continue
            m = gen.machine
            clean = self._engine.inflight_jobs() == 0 and session.state is SessionState.READY and gen.idle()
            if not clean or not m.at("ready", "draining", "failed"):
                continue
            try:
                if m.at("ready"):
                    m.fire("drain", replace=False, inflight=gen.inflight())
                if m.at("draining"):
                    m.fire("drained", inflight=gen.inflight())
                else:
                    m.fire("drain", replace=False, inflight=gen.inflight())  # unload_failed: an idle Failed generation
                session.teardown(verify=True, others_configured=self._gens.others_resident(gen))
                m.fire("freed")
                m.fire("verified")
                gen.session = None
                gen.published = False
            except CalculetError as exc:
                log.error("unload at stop was not clean", extra={"generation": gen.id, "detail": str(exc)})


def release_extraction(gen: Generation) -> None:
    """An archive the package was verified from was extracted to a temporary directory: remove it."""
    if gen.verified is not None and gen.verified.extracted:
        gen.verified.cleanup()
