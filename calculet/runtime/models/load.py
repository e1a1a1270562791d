"""§11 steps 5–11 of a load, on the engine's actor, one step per tick while the engine serves.

====  ====================================================================  ===========
step  what                                                                  state
====  ====================================================================  ===========
5     lifecycle lock; a replacement holds new requests (WaitingModel)       Configuring
6     drain and unload the old generation unless both contracts declare     Configuring
      co-residency (CalRT 0.7.6 cannot; configure is device-global)
7     CreateCalbin → configure → KvManager → pools                          Configuring
8     the device's calbin matches the verified manifest exactly             Warming
9     golden vectors + warm-up (submissions paused while they run)          Warming
10    publish: alias → new generation, atomically, the hold released        Ready
11    keep the previous signed artifact for rollback                        Ready
====  ====================================================================  ===========

A failure at steps 5–10 cleans the new generation up through Unloading (every resource it created
is destroyed and the device verified) and then: the old generation, if it is still resident, is
serving again (its held requests are pinned to it); if it had been drained and unloaded because
co-residency is impossible, it is **restored** — its retained package is verified again and loaded
as a new generation — and the report says so, with the downtime. A replacement on 0.7.6 is never
zero-downtime: the report carries the gap during which new requests were held (§11: zero downtime
needs blue-green on another instance/board, R11.16). Step 11 comes after the switch; if the old
artifact can no longer be retained the switch stands and the report says rollback is unavailable.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from calculet.adapters.calrt import rc_of
from calculet.errors import PackageError
from calculet.packages.manifest import MANIFEST_FILE
from calculet.packages.verify import PackageCheck
from calculet.runtime.execution.session import RuntimeSession
from calculet.runtime.models.availability import sync_availability
from calculet.runtime.models.capacity import coreside
from calculet.runtime.models.generations import Alias, Generation, Generations, Prepared, Retained
from calculet.runtime.models.operations import Body, LifecycleLock, Operation, Steps, Wait
from calculet.runtime.models.port import EnginePort
from calculet.runtime.models.prepare import Preparer
from calculet.runtime.models.reports import (GenerationIdentity, LifecycleTally, LoadFailed, LoadReport, LoadStep,
                                             StepTiming, UnloadReport)
from calculet.runtime.models.unload import Unloader
from calculet.runtime.scheduling.admission import ModelAvailability

log = logging.getLogger("calculet.runtime.models.load")

__all__ = ["Loader"]

Waits = Generator[Wait, bool | None, None]


@dataclass
class _LoadRun:
    """What one load found and did so far (its report's fields, and what a failure must undo)."""

    kind: str
    gen: Generation
    alias: Alias
    old: Generation | None
    started: float
    timings: list[StepTiming]
    step: LoadStep = LoadStep.LOCK
    coresident: bool = False
    paused_at: float | None = None
    old_unloaded: bool = False
    previous_unload: UnloadReport | None = None
    golden: str = "skipped (verify_golden off)"
    warnings: list[str] = field(default_factory=list)

    def progress(self, summary: str) -> None:
        """Step 9's summary so far (a failure report shows how far it got)."""
        self.golden = summary


class Loader:
    """Steps 5–11 of a load or rollback, a restore of the previous version after a failure, and
    the bring-up of a generation (create, inspect, golden/warm-up, publish) both share."""

    def __init__(self, engine: EnginePort, generations: Generations, lock: LifecycleLock, tally: LifecycleTally,
                 steps: Steps, preparer: Preparer, unloader: Unloader) -> None:
        self._engine = engine
        self._gens = generations
        self._lock = lock
        self._tally = tally
        self._steps = steps
        self._preparer = preparer
        self._unloader = unloader

    def queue(self, prepared: Prepared) -> Operation:
        """(actor) Steps 1–4 passed: Validating → Configuring; the operation waits for the lock."""
        gen = prepared.gen
        gen.facts, gen.plan = prepared.plan.facts, prepared.plan
        gen.verified, gen.package_path = prepared.verified, prepared.path
        gen.signed_by, gen.trusted = prepared.signed_by, prepared.trusted
        gen.fix_identity(GenerationIdentity(gen.id, gen.alias, gen.plan.facts.package_sha256, str(gen.source),
                                            gen.signed_by))
        gen.machine.fire("validated")
        op = Operation(prepared.kind, gen.alias, gen.id, self._engine.clock)
        op.start(self._body(op, prepared))
        self._lock.enqueue(op)
        return op

    def _body(self, op: Operation, prepared: Prepared) -> Body:
        gen = prepared.gen
        alias = self._gens.aliases[gen.alias]
        run = _LoadRun(prepared.kind, gen, alias, alias.current, self._engine.clock.now(), list(prepared.timings))
        try:
            downtime = yield from self._switch(op, run)
        except Exception as exc:
            failure = yield from self._failed(op, run, exc)
            raise failure from exc
        yield from self._after_switch(op, run)
        return self._published(run, downtime)

    def _drain_s(self) -> float:
        return self._engine.config.executor.drain_deadline_ms / 1000.0

    # ------------------------------------------------------------------ steps 5–10

    def _switch(self, op: Operation, run: _LoadRun) -> Generator[Wait, bool | None, float | None]:
        """Steps 5–10; returns the downtime of a replacement (None when nothing was replaced)."""
        engine, steps, gen, old = self._engine, self._steps, run.gen, run.old
        t0 = steps.step(op, run.step, gen.id)
        if old is not None:
            engine.scheduler.hold_new_requests(True)
            run.paused_at = engine.clock.now()
        run.timings.append(StepTiming(run.step.name.lower(), t0, 0.0))
        run.step = LoadStep.DRAIN_OLD
        t0 = steps.step(op, run.step, gen.id)
        if old is not None:
            assert old.facts is not None and gen.facts is not None
            run.coresident = coreside(old.facts.capabilities, gen.facts.capabilities) and old.machine.at("ready")
            if not run.coresident:
                run.previous_unload = yield from self._unloader.unload(op, old, deadline_s=self._drain_s(),
                                                                       replacement=True)
                run.old_unloaded = True
        steps.timed(run.timings, run.step, t0)
        run.step = LoadStep.CREATE
        t0 = steps.step(op, run.step, gen.id)
        session, epoch = yield from self.create_session(gen)
        self._tally.measured(gen.durations, "configure", steps.timed(run.timings, run.step, t0))
        run.step = LoadStep.INSPECT
        t0 = steps.step(op, run.step, gen.id)
        session.inspect()
        steps.timed(run.timings, run.step, t0)
        run.step = LoadStep.GOLDEN
        t0 = steps.step(op, run.step, gen.id)
        yield from self.golden_and_warmup(
            gen, session, epoch, idle=lambda: engine.inflight_jobs() == 0 and not engine.recovery_pending(),
            waiting_for="the device to fall idle for golden/warmup", progress=run.progress)
        self._tally.measured(gen.durations, "warmup", steps.timed(run.timings, run.step, t0))
        run.step = LoadStep.PUBLISH
        t0 = steps.step(op, run.step, gen.id)
        if old is not None and run.coresident:
            op.step = f"step 10: waiting for generation {old.id} to finish its requests"
            yield from self._unloader.quiesce(old, self._drain_s())
        self._gens.check_epoch(gen, epoch)
        self.publish(run.alias, gen)
        downtime = self._downtime(run.paused_at)
        steps.timed(run.timings, run.step, t0)
        return downtime

    def create_session(self, gen: Generation) -> Generator[Wait, bool | None, tuple[RuntimeSession, int]]:
        """§11 step 7 for ``gen`` once no device recovery is pending: CreateCalbin → configure →
        KvManager → pools (Configuring → Warming). Shared by a load and a restore, which must bring a
        generation up identically. Returns the session and the device epoch it was configured in
        (a reset or restart after that killed its configuration: :meth:`Generations.check_epoch`)."""
        engine = self._engine
        yield Wait(lambda: not engine.recovery_pending(), None, "device recovery to finish")
        epoch = gen.epoch = self._gens.epoch
        assert gen.plan is not None
        session = RuntimeSession(engine.device, gen.package_path, engine.config, generation=gen.id,
                                 verify_golden=engine.verify_golden, plan=gen.plan, warmup=engine.warmup)
        gen.session = session
        session.create_calbin()
        self._gens.note_calbin(session.calbin.calbin_id, gen.id)
        session.configure()
        session.create_kv_manager()
        session.create_pools()
        gen.machine.fire("configured")
        return session, epoch

    def golden_and_warmup(self, gen: Generation, session: RuntimeSession, epoch: int, *,
                          idle: Callable[[], bool], waiting_for: str,
                          progress: Callable[[str], None] = lambda summary: None) -> Waits:
        """§11 step 9 with the device to ourselves: golden vectors, then warm-up; then Ready.

        Planned work is held and the step waits until ``idle()``; the golden/warm-up jobs then run
        outside the executor with the completion thread paused (``exclusive_device``). They advance
        the device's per-engine ``engine_sequence`` counters, so the executor's expectation is
        resynchronised right after them (§14) — legal there, as the hold and ``idle()`` leave it
        nothing in flight. If the wait is abandoned instead (the operation aborted, the epoch
        changed), no such job ran and there is nothing to resynchronise. ``progress`` receives the
        load report's golden summary each time it grows, so a failure shows how far step 9 got.
        """
        engine = self._engine
        summary = "skipped (verify_golden off)"
        engine.hold_submissions(True)
        try:
            yield Wait(idle, None, waiting_for)
            self._gens.check_epoch(gen, epoch)
            with engine.exclusive_device():
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
                    engine.resync_engine_sequences()
        finally:
            engine.hold_submissions(False)
        session.mark_ready()
        gen.machine.fire("warmed")

    def publish(self, alias: Alias, gen: Generation) -> None:
        """Step 10: alias → gen, atomically on the actor (no reader sees a half-switched alias)."""
        engine = self._engine
        assert gen.session is not None and gen.plan is not None and gen.machine.at("ready")
        previous = alias.current
        if previous is not None:
            previous.published = False
        alias.current = gen
        gen.published = True
        self._gens.serving = gen
        engine.bind_session(gen.session)
        if self._gens.contract is None:
            self._gens.contract = gen.plan.contract()
        sync_availability(self._gens, engine.scheduler, profiles=gen.plan.profiles)  # READY: the machine is Ready
        engine.scheduler.hold_new_requests(False)

    def _downtime(self, paused_at: float | None) -> float | None:
        """How long new requests were held (from step 5), once a replacement ends; None if none were."""
        if paused_at is None:
            return None
        downtime: float = self._engine.clock.now() - paused_at
        self._tally.durations["downtime"].add(downtime)
        return downtime

    # ------------------------------------------------------------------ step 11 and the report

    def _after_switch(self, op: Operation, run: _LoadRun) -> Waits:
        """Step 11 (after the switch: a failure here never undoes it), then a co-resident old
        generation is unloaded."""
        old, alias, warnings = run.old, run.alias, run.warnings
        step = LoadStep.RETAIN
        t0 = self._steps.soft(op, step, run.gen.id, warnings)
        if old is not None:
            if t0 is None:
                alias.previous = None
                warnings.append("rollback unavailable: step 11 failed after the switch")
            else:
                try:
                    alias.previous = self.retain(old)
                except Exception as exc:  # noqa: BLE001 - reported; the switch stands
                    alias.previous = None
                    warnings.append(f"step 11 (retain the old signed artifact) failed: {exc}; rollback unavailable")
        run.timings.append(StepTiming(step.name.lower(), t0 or self._engine.clock.now(), 0.0))
        if old is not None and run.coresident:
            try:
                run.previous_unload = yield from self._unloader.unload(op, old, deadline_s=self._drain_s(),
                                                                       replacement=True)
            except Exception as exc:  # noqa: BLE001 - the new generation serves; the leak is reported
                warnings.append(f"unloading generation {old.id} after the switch: {exc}")

    def retain(self, old: Generation) -> Retained:
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
        return Retained(old.id, source, old.facts.package_sha256, old.signed_by, old.trusted)

    def _published(self, run: _LoadRun, downtime: float | None) -> LoadReport:
        gen, old, tally = run.gen, run.old, self._tally
        tally.measured(gen.durations, "load", self._engine.clock.now() - run.started)
        tally.loads += 1
        if run.kind == "rollback":
            tally.rollbacks += 1
        if old is not None:
            tally.replacements += 1
            tally.coresident += int(run.coresident)
        report = LoadReport(
            kind=run.kind, alias=gen.alias, generation=gen.id, calbin_sha256=gen.facts.package_sha256
            if gen.facts else "", ok=True, state=gen.state, replaced=old.id if old is not None else None,
            coresident=run.coresident, previous_drained=run.old_unloaded, downtime_s=downtime,
            rollback_available=run.alias.previous is not None, golden=run.golden, warnings=tuple(run.warnings),
            steps=tuple(run.timings), previous_unload=run.previous_unload)
        log.info("model generation published", extra={"alias": gen.alias, "generation": gen.id,
                                                       "replaced": report.replaced, "downtime_s": downtime})
        return report

    # ------------------------------------------------------------------ a failure at steps 5–10

    def _failed(self, op: Operation, run: _LoadRun, exc: Exception) -> Generator[Wait, bool | None, LoadFailed]:
        """Steps 5–10 failed: clean the new generation up, then give the alias back its old version."""
        engine, gen, step, old = self._engine, run.gen, run.step, run.old
        warnings: list[str] = []
        gen.error = f"step {int(step)} ({step.title}): {exc}"
        self._tally.load_failures[step.name.lower()] += 1
        log.warning("load failed; cleaning up", extra={"generation": gen.id, "step": int(step), "detail": str(exc)})
        engine.hold_submissions(False)
        rc = rc_of(exc)
        if step >= LoadStep.CREATE and rc.is_device_fault:
            # a golden/warm-up job left the device in doubt: the engine's recovery resets it (§12, §15)
            engine.report_device_fault(rc, f"§11 step {int(step)} of generation {gen.id}: {exc}")
        yield Wait(lambda: not engine.recovery_pending() or engine.recovery_failed(), None,
                   "device recovery to finish")
        cleanup = self._unloader.discard(gen)
        if cleanup:
            warnings.append(f"cleanup of generation {gen.id}: {'; '.join(cleanup)}")
        old_unloaded = old is not None and old.machine.at("unloaded")
        state, restored = yield from self._give_back(op, run, old_unloaded, warnings)
        downtime = self._downtime(run.paused_at)
        report = LoadReport(
            kind=run.kind, alias=gen.alias, generation=gen.id,
            calbin_sha256=gen.facts.package_sha256 if gen.facts else "", ok=False, state=state,
            replaced=old.id if old is not None else None, coresident=run.coresident, previous_drained=old_unloaded,
            downtime_s=downtime, restored_generation=restored, rollback_available=run.alias.previous is not None,
            failed_step=step.name.lower(), error=f"{type(exc).__name__}: {exc}", golden=run.golden,
            warnings=tuple(warnings), steps=tuple(run.timings), previous_unload=run.previous_unload)
        return LoadFailed(step, exc, report)

    def _give_back(self, op: Operation, run: _LoadRun, old_unloaded: bool, warnings: list[str]
                   ) -> Generator[Wait, bool | None, tuple[str, int | None]]:
        """The alias after a failed load: the old generation serving again, restored, or Failed.
        Returns the report's state and the restored generation's id."""
        gen, old, alias = run.gen, run.old, run.alias
        scheduler = self._engine.scheduler
        if old is not None and old.machine.at("ready") and alias.current is old:
            scheduler.hold_new_requests(False)
            return "old_serving", None
        if old is not None and old_unloaded:
            op.step = f"restoring generation {old.id}'s package"
            try:
                restored = yield from self._restore(alias, old)
            except Exception as restore_exc:  # noqa: BLE001 - reported; the alias has no model now
                warnings.append(f"restoring the previous version failed: {restore_exc}")
                self._fail_alias(f"model {gen.alias!r} unavailable: loading generation {gen.id} failed at step "
                                 f"{int(run.step)} and the previous version could not be restored ({restore_exc})")
                return "restore_failed", None
            self._tally.restores += 1
            return "restored", restored.id
        if old is not None:
            detail = (f"model {gen.alias!r} unavailable: loading generation {gen.id} failed at step {int(run.step)} "
                      f"and generation {old.id} is {old.state} ({old.error or 'not serving'})")
            warnings.append(detail)
            self._fail_alias(detail)
            return "restore_failed", None
        scheduler.hold_new_requests(False)
        sync_availability(self._gens, scheduler)  # a draining old generation is READY only while held
        return "failed", None

    def _fail_alias(self, detail: str) -> None:
        """No version of the model can serve: release the hold and fail what waits for it."""
        scheduler = self._engine.scheduler
        scheduler.hold_new_requests(False)
        self._gens.unserved = ModelAvailability.FAILED
        sync_availability(self._gens, scheduler, detail=detail)  # FAILED, or what a generation still serving is
        scheduler.reject_waiting_model(detail)

    def _restore(self, alias: Alias, old: Generation) -> Generator[Wait, bool | None, Generation]:
        """Bring the drained previous version back as a new generation (its package verified again)."""
        engine = self._engine
        gen = self._gens.new(alias.name, old.source, engine.clock.now())
        try:
            if old.trusted:
                verified = self._preparer.verify(old.source)
                manifest_bytes, sha, path = verified.manifest_bytes, verified.manifest_sha256, verified.path
                gen.verified = verified
            else:
                manifest_bytes = (old.source / MANIFEST_FILE).read_bytes()
                sha, path = hashlib.sha256(manifest_bytes).hexdigest(), old.source
            plan = self._preparer.validate(alias.name, manifest_bytes, sha)
        except Exception as exc:
            gen.machine.fire("load_failed")
            gen.error = f"restore: {exc}"
            self._gens.ended(gen)
            raise
        gen.facts, gen.plan, gen.package_path = plan.facts, plan, path
        gen.signed_by, gen.trusted = old.signed_by, old.trusted
        gen.fix_identity(GenerationIdentity(gen.id, gen.alias, plan.facts.package_sha256, str(gen.source),
                                            gen.signed_by))
        gen.machine.fire("validated")
        try:
            session, epoch = yield from self.create_session(gen)
            session.inspect()
            yield from self.golden_and_warmup(gen, session, epoch, idle=lambda: engine.inflight_jobs() == 0,
                                              waiting_for="the device to fall idle for golden")
            self.publish(alias, gen)
        except Exception as exc:
            gen.error = f"restore: {exc}"
            self._unloader.discard(gen)
            raise
        log.warning("previous model version restored", extra={"alias": alias.name, "generation": gen.id,
                                                               "restored_from": old.id})
        return gen
