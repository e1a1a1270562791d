"""The scheduler's view of the model, derived from the ModelMachine it reflects (#17, §10–§12, §15).

The scheduler keeps the alias's availability (``Scheduler.set_model``) because scheduling sits
below the model manager and must not reach into its generations. That value is not chosen by
hand at each lifecycle step: it is a function of the serving generation's
:class:`~calculet.machines.model.ModelMachine` valuation, :func:`availability_of`, and the manager
hands the scheduler that function's value after every event it fires (:func:`sync_availability`).
The engine's tick monitor checks the equality on every tick (:func:`availability_faults`), so a
copy left stale — Ready while the generation is Recovering, new requests pinned to a generation
that is not Ready — is a broken invariant, like the counters (``ModelManager.counter_faults``).

**The function (R12.2, R10.4, R11.5, R15).** The machine records what it needs (``model.py``):
``unload_pending`` (an unload or a replacement asked to drain the generation, recorded in Ready,
Recovering or Failed and never undone — ``unload_is_never_undone``), ``replacing`` (that drain is a
replacement's, fixed for the whole drain — ``drain_cause_is_fixed``), ``recovered`` with an unload
pending returns to Draining (never Ready), and ``give_up`` moves to Failed at once, jobs still in
flight staying in doubt there. Then:

============  ==========================================================================
machine       availability
============  ==========================================================================
Ready         READY (R10.4: the alias serves only a generation past golden and warm-up)
Draining      READY while a replacement holds new requests (§11 step 5: pinned ones are
              served, new ones wait), DRAINING otherwise (§12, R12.2: new ones get 503)
Recovering    RECOVERING (§15) — but READY while a replacement holds new requests, as
              while Draining: the fault is the old generation's, not the alias's, so new
              requests wait for the new one (§11 step 5) instead of 503; nothing is
              submitted to a Recovering generation (``ModelManager.may_submit``)
Failed        DRAINING once a plain unload is pending, FAILED otherwise
other states  not serving: what the alias is without a generation (``unserved``)
============  ==========================================================================

Two inputs are not a generation's and come from the process: *shutdown* (SHUTDOWN over
everything; the engine's ``shutdown`` sets it on the scheduler and nothing leaves it) and, with no
generation serving, whether a load is replacing it (LOADING), it was unloaded (UNLOADED) or no
version is left (FAILED) — ``Generations.unserved``, set by the load/unload/recovery operations.
The replacement's *hold* of new requests (``Scheduler.hold_new_requests``, set at §11 step 5 and
released at step 10 or when the load fails) is the third: a Draining or Recovering generation is
READY only while it is both ``replacing`` and held, so a failed replacement that released the
hold leaves its old generation DRAINING or RECOVERING, never READY with new requests pinned to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from calculet.runtime.scheduling.admission import ModelAvailability as A

if TYPE_CHECKING:
    from calculet.machines.model import ModelMachine
    from calculet.runtime.models.generations import Generations
    from calculet.runtime.models.port import SchedulerView
    from calculet.runtime.scheduling.profiles import ProfileSet

__all__ = ["availability_faults", "availability_of", "expected_availability", "job_faults", "sync_availability"]

_IN_DOUBT = frozenset({"timed_out", "quarantined"})  # DeviceJobMachine: the device may still write it


def availability_of(machine: "ModelMachine | None", *, held: bool = False, unserved: A = A.UNLOADED,
                    shutdown: bool = False) -> A:
    """The availability the scheduler states for the serving generation whose machine is ``machine``
    (None: no generation serves), per the table in this module's docstring. ``held``: a replacement
    holds new requests; ``unserved``: the alias's availability with no generation serving;
    ``shutdown``: the process is shutting down (SHUTDOWN over everything)."""
    if shutdown:
        return A.SHUTDOWN
    if machine is None:
        return unserved
    state = machine.state
    if state == "ready":
        return A.READY
    if state == "draining":  # §11 step 5 holds new requests (pinned ones served); §12 rejects them
        return A.READY if machine.replacing and held else A.DRAINING
    if state == "recovering":  # the same hold: a replacement's new requests wait, not 503, while the old recovers
        return A.READY if machine.replacing and held else A.RECOVERING
    if state == "failed":
        return A.DRAINING if machine.unload_pending and not machine.replacing else A.FAILED
    return unserved  # validating/configuring/warming/unloading/unloaded: the generation does not serve


def expected_availability(gens: "Generations", scheduler: "SchedulerView") -> A:
    """:func:`availability_of` for the serving generation, the scheduler's hold and the process's
    shutdown (SHUTDOWN is the process's, set on the scheduler by the engine's ``shutdown`` only)."""
    serving = gens.serving
    return availability_of(serving.machine if serving is not None else None, held=scheduler.holding_new_requests,
                           unserved=gens.unserved, shutdown=scheduler.availability is A.SHUTDOWN)


def sync_availability(gens: "Generations", scheduler: "SchedulerView", *, profiles: "ProfileSet | None" = None,
                      detail: str = "") -> A:
    """Hand the scheduler the availability the serving generation's machine implies, after an event
    the manager fired (only when it changed: ``set_model`` acts on a change — it cancels, ends or
    binds requests — and a repeated value would repeat that). Returns the value."""
    serving = gens.serving
    generation = serving.id if serving is not None else scheduler.generation
    value = expected_availability(gens, scheduler)
    if value is not scheduler.availability or generation != scheduler.generation or profiles is not None:
        scheduler.set_model(generation, value, profiles, detail=detail)
    return value


def availability_faults(gens: "Generations", scheduler: "SchedulerView") -> list[tuple[str, str]]:
    """(invariant, R-id) for each way the scheduler's copy differs from what the machine implies."""
    serving = gens.serving
    faults: list[tuple[str, str]] = []
    if serving is not None and scheduler.generation != serving.id:
        faults.append(("scheduler_names_the_serving_generation", "R10.4"))
    if scheduler.availability is not expected_availability(gens, scheduler):
        faults.append(("scheduler_availability_is_the_model_machines", "R12.2"))
    return faults


def job_faults(gens: "Generations", jobs: "Iterable[Any]") -> list[tuple[str, str]]:
    """GenerationJobSystem's engine and doubt properties on the live jobs table (the scheduler's
    ``InflightTable``): jobs holding buffers never share an engine (R14.3: so at most two are in
    flight), and a job the device may still write after a timeout or fault never has a Ready
    generation (R12.10: Ready again only once no job is in doubt)."""
    faults: list[tuple[str, str]] = []
    engines = [job.engine for job in jobs]
    if len(set(engines)) != len(engines):
        faults.append(("one_engine_per_job_on_the_device", "R14.3"))
    for job in jobs:
        if job.state in _IN_DOUBT:
            gen = gens.get(job.generation)
            if gen is not None and gen.machine.at("ready"):
                faults.append(("job_in_doubt_only_while_recovering", "R12.10"))
                break
    return faults
