"""What the engine core reports: the serving model's facts and every component's statistics (§16), read on the
actor. Apart from :mod:`calculet.runtime.engine.core`, which keeps the tick (and its size limit); ``core`` is an
:class:`~calculet.runtime.engine.core.EngineCore` (not imported: that module imports this one)."""

from __future__ import annotations

from typing import Any

from calculet.errors import Unavailable
from calculet.runtime.actor import MailboxStatistics
from calculet.runtime.engine.types import EngineStatistics, ModelInfo

__all__ = ["engine_statistics", "model_info"]


def model_info(core: Any) -> ModelInfo:
    """The serving generation's model facts; :class:`Unavailable` while none serves."""
    gen = core.models.serving
    session = gen.session if gen is not None else None
    if gen is None or session is None or not session.has_calbin:
        raise Unavailable(f"no model generation of {core.config.model_alias!r} is serving")
    calbin = session.calbin
    return ModelInfo(gen.id, calbin.name, calbin.exact_submodel, calbin.package_sha256,
                     calbin.vocab_size, calbin.bos_token, calbin.eos_token, session.max_seq,
                     session.profiles.sizes, calbin.capabilities)


def engine_statistics(core: Any, mailbox: MailboxStatistics | None) -> EngineStatistics:
    """Every component's statistics in one record (on the actor: a consistent snapshot)."""
    scheduler = core.scheduler
    try:
        device = core._device.statistics()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - statistics of a closed device are not essential
        device = None
    state = "stopped" if core._stopped else "running" if core._accepting else "stopping"
    return EngineStatistics(
        state=state, mode=core.options.mode.value, generation=core.generation,
        availability=scheduler.availability.value, accepting=core._accepting, ticks=core._ticks,
        host_time_per_tick_s=core._host.avg, host_time_max_s=core._host.max, accepted=core.requests.accepted,
        rejected_before_admission=dict(core.requests.rejected),
        finished=dict(core.requests.finished), live_requests=len(scheduler.registry),
        pending_frees=core.jobs.pending_frees, scheduler=scheduler.statistics(),
        executor=core.executor.statistics(), completion=core.dispatcher.statistics(),
        sampler=core.sampler.statistics(), recovery=core.recovery.statistics(),
        session=core.session.statistics(), mailbox=mailbox, device=device,
        models=core.models.statistics_now(), goodput=core.requests.goodput.statistics(),
        host_tick=core._host.snapshot())
