"""The scheduler's view of the model checked against the ModelMachine it reflects (#17, §10–§12, §15).

The scheduler keeps the alias's availability (``Scheduler.set_model``) because scheduling sits
below the model manager and must not reach into its generations; the manager sets it at each
lifecycle step. That is a second copy of what the serving generation's :class:`ModelMachine`
already says, so it is checked against the machine on every engine tick, like the counters
(``ModelManager.counter_faults``). A hand-set availability that drifts from the machine — Ready
while the generation is Recovering, new requests pinned to a generation that is not Ready — is a
broken invariant.

The derivation is a relation, not a function of the machine state alone, for two reasons the
runtime decided elsewhere (``runtime/models/unload.py``, ``recovery.py``): during a replacement
(new requests *held*, §11 step 5) the draining old generation stays READY to the scheduler so
what is pinned to it keeps being served while new requests wait, not 503; and a generation that
is Recovering while an unload is pending is 503 (DRAINING) or, once the reset ended its jobs and
a replacement holds new requests, READY for its pinned requests only. In every case:

* the scheduler pins new requests (READY and not held) only to a generation whose machine is
  Ready (R12.2, R10.4: the alias serves only a generation past golden and warm-up);
* RECOVERING is said only of a Recovering generation, DRAINING only of one being unloaded;
* while a generation serves, the scheduler names it (``scheduler.generation == serving.id``).

**Why it is not derived from the machine (#17, checked against the runtime on 2026-12-01).** A
function ``availability = f(machine state)`` needs every fact the runtime's choice depends on to be
in the :class:`~calculet.machines.model.ModelMachine` valuation. Five are not:

1. *Why the generation drains.* ``Draining`` is READY while a replacement holds new requests
   (``load.py`` ``_switch`` sets the hold at step 5 and keeps it until the old generation is
   unloaded) and DRAINING for a plain unload (``unload.py`` ``_begin_drain``). The machine's
   ``drain`` event has no argument, so both drains reach the same valuation. The cause is fixed
   for the whole drain (the load waits for the old unload before it can release the hold), so a
   ``drain(replace: Bool)`` argument stored in a variable would carry it.
2. *An unload requested while Recovering or Failed.* ``_begin_drain`` sets
   ``Generation.unload_requested`` and fires ``drain`` only from Ready: Recovering and Failed
   have no ``drain`` row (Failed's ``unload_failed`` row fires only once no request is pinned),
   so the machine cannot tell a Recovering generation with an unload pending (503 or held) from
   one that will serve again (RECOVERING).
3. *Device recovery finished, unload not yet resumed.* ``recovery.py`` ``on_recovered`` with an
   unload pending sets READY (held) or DRAINING and fires no event: the machine stays Recovering
   until ``resume_unload``, in the same valuation it had while recovery ran. Not even
   ``in_doubt == 0`` after ``reset`` separates them: a fault with no job in flight starts
   Recovering with ``in_doubt == 0`` too.
4. *Recovery gave up while jobs are still in flight.* ``on_give_up`` states FAILED at once;
   ``give_up``'s guard (``inflight_jobs == 0``) keeps the machine Recovering until the jobs drain.
5. *Shutdown* is the process's state (SHUTDOWN is allowed in every machine state), not a
   generation's.

Making it a function therefore means changing the ModelMachine declaration
(``calculet/machines/model.py``, outside this module's owner's brief): a ``replacing`` variable set
by ``drain(replace)``, an ``unload_pending`` variable with ``drain`` rows from Recovering and Failed,
a ``recovered_for_unload`` row (or state) for 3, ``give_up`` allowed with jobs in flight (the
generation Failed while they drain; ``no_free_with_inflight`` still holds) for 4 — and re-proving
the machine and both generation couplings, whose steps fire its rows. With those, ``f`` would be:
Ready → READY; Draining → READY if ``replacing`` else DRAINING; Recovering → RECOVERING unless
the device recovered with ``unload_pending`` (then READY if ``replacing`` else DRAINING); Failed →
FAILED (DRAINING once ``unload_pending`` without a replacement); other states → not serving;
SHUTDOWN over all of it from the process. Until then the scheduler's copy stays a relation,
checked here on every engine tick.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from calculet.runtime.scheduling.admission import ModelAvailability as A

if TYPE_CHECKING:
    from calculet.runtime.models.generations import Generation, Generations
    from calculet.runtime.models.port import SchedulerView

__all__ = ["allowed_availability", "availability_faults", "job_faults"]

_IN_DOUBT = frozenset({"timed_out", "quarantined"})  # DeviceJobMachine: the device may still write it
_NOT_SERVING = frozenset({A.UNLOADED, A.LOADING, A.FAILED, A.SHUTDOWN})


def allowed_availability(gen: "Generation | None", *, serving: bool, held: bool) -> frozenset[A]:
    """The availabilities the scheduler may state for the generation it names (``gen``), given
    whether that generation is the serving one and whether new requests are held."""
    if gen is None or not serving:
        return _NOT_SERVING
    m = gen.machine
    unloading = gen.unload_requested
    if m.at("ready"):
        return frozenset({A.READY, A.SHUTDOWN})
    if m.at("draining"):  # an unload (503 new) or a replacement (new requests held, pinned ones served)
        return frozenset({A.READY if held else A.DRAINING, A.SHUTDOWN})
    if m.at("recovering"):
        extra = {A.READY if held else A.DRAINING} if unloading else set()
        return frozenset({A.RECOVERING, A.FAILED, A.SHUTDOWN, *extra})  # FAILED: recovery gave up
    if m.at("failed"):
        return frozenset({A.FAILED, A.SHUTDOWN, *({A.DRAINING} if unloading and not held else ())})
    return _NOT_SERVING  # unloading/unloaded: the unload stops serving it in the same actor step


def availability_faults(gens: "Generations", scheduler: "SchedulerView") -> list[tuple[str, str]]:
    """(invariant, R-id) for each way the scheduler's availability disagrees with the machine."""
    serving = gens.serving
    faults: list[tuple[str, str]] = []
    if serving is not None and scheduler.generation != serving.id:
        faults.append(("scheduler_names_the_serving_generation", "R10.4"))
    gen = gens.get(scheduler.generation) if scheduler.generation else None
    allowed = allowed_availability(gen, serving=gen is not None and gen is serving,
                                   held=scheduler.holding_new_requests)
    if scheduler.availability not in allowed:
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
