"""The generations' side of device recovery (§12, §14, §15, §18 "generation recovery").

The engine's :class:`~calculet.runtime.execution.recovery.HealthRecovery` decides *when* to reset
or restart the device and keeps the budget; these hooks do what that means for the model
generations: the serving one goes Recovering on a fault and Ready again afterwards (or Failed when
the budget is spent), a reset drops every other session's configuration, a restart brings the
serving generation up on a new device, and a cleanup that leaves the device unclean escalates to a
restart when nothing else lives on it (R12.8).
"""

from __future__ import annotations

import logging

from calculet.adapters.calrt import read_board_memory
from calculet.errors import CalculetError
from calculet.runtime.execution.session import RuntimeSession, SessionState
from calculet.runtime.models.availability import sync_availability
from calculet.runtime.models.generations import Generations, cancel_pinned
from calculet.runtime.models.operations import LifecycleLock
from calculet.runtime.models.port import EnginePort
from calculet.runtime.models.reports import LifecycleTally, UnloadFailed
from calculet.runtime.scheduling.admission import ModelAvailability

log = logging.getLogger("calculet.runtime.models.recovery")

__all__ = ["GenerationRecovery"]


class GenerationRecovery:
    """Engine recovery hooks for the generations, and the device restart they and cleanups share."""

    def __init__(self, engine: EnginePort, generations: Generations, lock: LifecycleLock,
                 tally: LifecycleTally) -> None:
        self._engine = engine
        self._gens = generations
        self._lock = lock
        self._tally = tally

    # ------------------------------------------------------------------ engine hooks (actor only)

    def on_fault(self) -> None:
        """A fault left the device in doubt: the serving generation goes Recovering (503)."""
        gen = self._gens.serving
        if gen is None:
            return
        if gen.machine.at("ready", "draining"):
            gen.machine.fire("fault")
        self.sync()

    def on_jobs_discarded(self) -> None:
        """A reset or restart ended every job on the device (the executor forgot them; the scheduler's jobs table
        ends them when the reset is done, ``Scheduler.device_reset``): a generation that had jobs on the device
        and was serving goes Recovering; it serves again (``recovered``) once the table holds none of them."""
        for gen in self._gens:
            m = gen.machine
            if gen.inflight() > 0 and not m.at("recovering", "failed"):
                m.fire("fault")
        self.sync()

    def reset_device(self) -> None:
        """Recovery's ResetConfiguration (device reset domain) for the serving session; every other
        session on the device lost its configuration with it."""
        gen = self._gens.serving
        if gen is None or gen.session is None or gen.session.state is not SessionState.READY:
            self.replace_device()  # nothing serves: the strongest reset costs nothing more
            return
        self._gens.new_device_epoch()
        for other in self._gens:
            if other is not gen and other.session is not None and other.session.state is not SessionState.ABANDONED:
                other.session.drop_configuration()
        with self._engine.exclusive_device():
            gen.session.reset()
        gen.epoch = self._gens.epoch

    def restart_device(self) -> None:
        """Recovery's restart: close the VirtualDevice and bring the serving generation up on a new one."""
        self.replace_device()
        gen = self._gens.serving
        if gen is None or gen.unload_requested or not gen.machine.at("ready", "recovering"):
            return
        assert gen.plan is not None
        engine = self._engine
        with engine.exclusive_device():
            session = RuntimeSession(engine.device, gen.package_path, engine.config, generation=gen.id,
                                     verify_golden=engine.verify_golden, plan=gen.plan).create()
        gen.session = session
        gen.epoch = self._gens.epoch
        self._gens.note_calbin(session.calbin.calbin_id, gen.id)
        engine.bind_session(session)

    def on_recovered(self) -> None:
        """The reset/restart succeeded: the serving generation is Ready again — or, if it was being
        unloaded, Draining again (``recovered`` with the unload pending) and what is left of its
        drain is cancelled so the unload can continue."""
        gen = self._gens.serving
        if gen is None:
            return
        m = gen.machine
        inflight = gen.inflight()
        if m.at("recovering") and m.can_fire("recovered", inflight=inflight):
            m.fire("recovered", inflight=inflight)  # → Ready, or → Draining when an unload is pending
        self.sync()
        if gen.unload_requested:
            cancel_pinned(self._engine, gen)

    def on_give_up(self, detail: str) -> None:
        """The reset budget is spent: the serving generation is Failed (503 from now on), at once,
        even with jobs still in flight (they stay in doubt, their buffers kept, until they end)."""
        gen = self._gens.serving
        if gen is None:
            self._gens.unserved = ModelAvailability.FAILED
        else:
            gen.error = detail
            m = gen.machine
            if m.at("ready", "draining"):
                m.fire("fault")  # the fault that exhausted the budget, if on_fault did not see it
            if m.at("recovering"):
                m.fire("give_up")
        self.sync(detail)

    def sync(self, detail: str = "") -> None:
        """The scheduler's availability after an event: the serving generation's machine says it."""
        sync_availability(self._gens, self._engine.scheduler, detail=detail)

    # ------------------------------------------------------------------ the device

    def replace_device(self) -> None:
        """Close the VirtualDevice (every handle and job dies with it) and create a new one."""
        for gen in self._gens:
            if gen.session is not None:
                gen.session.abandon()
        self._engine.replace_device()
        self._gens.new_device_epoch(device_replaced=True)
        active = self._lock.active
        for gen in self._gens:  # an unload left unverified is finished by the restart
            m = gen.machine
            if m.at("unloading") and gen.session is not None and (active is None or active.generation != gen.id):
                if m.can_fire("freed"):
                    m.fire("freed")
                m.fire("verified")
                gen.session = None
                gen.error += " (the device restart released everything it held)"
                self._gens.ended(gen)

    def escalate(self, what: str) -> str:
        """A cleanup left the device unclean and nothing else is on it: restart the device (the
        contract's strongest reset) and verify the new one is clean; if even that fails, raise."""
        self._tally.escalations += 1
        log.error("device unclean after cleanup; restarting it", extra={"what": what})
        self.replace_device()
        leftovers = self.health()
        used = sum(info.used_bytes for info in read_board_memory(self._engine.device))
        if used:
            leftovers.append(f"device memory {used} bytes in use on the restarted device")
        if leftovers:
            raise UnloadFailed(f"{what}: the device is not clean even after a restart: {'; '.join(leftovers)}",
                               rc=None)
        return "restart"

    def health(self) -> list[str]:
        """The device answers ReadMem (§12 step 7); the problems found, if any."""
        try:
            self._engine.device.read_mem(0)
        except CalculetError as exc:
            return [f"device health: ReadMem failed: {exc}"]
        return []
