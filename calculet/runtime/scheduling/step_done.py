"""A B1 decode step's completion with its three machine events fired as one generated composite (issue #20).

Why: at B1 (CalRT 0.7.6's only batch, spec §1, §8) every decode step is one token, and its completion fired three
events through three layers each — the jobs table's ``fire`` (the job's ``complete``), the KV manager's
``commit_batch`` (the lane's ``commit``, §9.2) and the registry's ``decode_done_each`` (the request's
``decode_done``, §7.4), each with its ``fire``/``fire_each`` frame and (state, event) function. Here the three
events are one call of the composite ``decode_step`` that ``python -m calculet.specgen`` prints from the three
declarations (:mod:`calculet.machines.codegen_composite`; written to ``calculet/machines/generated/decode_step.py``),
and the runtime's own work around them — the job leaving the table, the lane's step closing, the monitors, the
step timer, the requests' listeners and sinks — is done here in the order the layers did it, through the same
functions where a rule lives (:meth:`RequestRegistry.decode_told`, the jobs table's ``_end``, the KV manager's
``_checked``, the job × lane monitor's ``before``/``after``).

Equivalence with the layered path (what :meth:`CompletionApplier._decode_settled` still does for every other
step): taken only when each layer would have taken its usual case — the job submitted, the reservation's lane
unchanged with its step open (``commit_batch``'s condition), the request current (``decode_done_each``'s) — else
None is returned before anything changed and the caller takes the layered path. The monitors draw as many times
per step as before, for the same checks: the job × lane check before the job's event, the step properties around
the lane's commit, one draw per machine event inside the composite, the pool check after. Their order of draws
differs (both checks are drawn before the events fire); the step properties' snapshot, taken before the job's
event, has the job's state read again after it (:meth:`JobLaneMonitor.answered`), which is what the layered path
read (the job event moves no lane). ``tests/property/test_composite.py`` holds the composite to the three events in
sequence; the scheduling tests run both paths.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from calculet.machines.compiled import _fire_exact_or_checked
from calculet.machines.monitor import MONITOR
from calculet.machines.written import GENERATED_PACKAGE, import_written, shape
from calculet.runtime.scheduling.kv_batch import KEEPS_TOTALS, OPEN_STATES
from calculet.runtime.scheduling.plan import Applied

__all__ = ["COMPOSITE", "bind_composite", "decode_step_done"]

_ENDED = frozenset({"completed", "failed"})
_new_tuple = tuple.__new__


def _declaration(qualified: str) -> Any:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def bind_composite(name: str) -> ModuleType | None:
    """The written composite ``name`` bound to the shipped declarations (its rows and enums resolved, its exact path
    set), or None when it is missing or was printed for other shapes (a stale module is never run: the events are
    then fired one by one, and ``specgen --check`` says what to regenerate)."""
    module = import_written(f"{GENERATED_PACKAGE}.{name}", {}, f"the composite {name}")
    if module is None:
        return None
    machines = [_declaration(q) for q in module.MACHINES]
    if tuple(shape(m.definition) for m in machines) != module.SHAPES:
        return None
    for binding, recipe in module.BINDINGS.items():
        if recipe[0] == "row":
            setattr(module, binding, machines[recipe[1]].definition.transitions[recipe[2]])
        else:
            setattr(module, binding, _declaration(recipe[1]))
    module._exact = _fire_exact_or_checked  # type: ignore[attr-defined]
    return module


COMPOSITE = bind_composite("decode_step") if "commit" in KEEPS_TOTALS else None
"""The bound ``decode_step`` composite, or None (then every step takes the layered path)."""


def decode_step_done(applier: Any, job: Any, batch: Any, now: float, token: int, stop: bool) -> Applied | None:
    """A current B1 decode job (``job``, its one lane's ``token`` and ``stop``) applied with its three events fired
    as one composite; None, with nothing changed, when a layer would not take its usual case (module doc)."""
    rec = batch.records[0]
    reservation = batch.kv
    kv = applier.kv
    lane = reservation.lanes[0] if reservation.lanes else -1
    machine = reservation.machines[0] if reservation.machines else None
    request = rec.machine
    job_id = job.job_id
    if (COMPOSITE is None or machine is None or reservation.owners != kv.owners_changed
            or kv._open[lane] != reservation.tokens or machine.state not in OPEN_STATES
            or request.state != "decode_running" or request.job_id != job_id
            or request.generation != job.generation):
        return None
    jobs = applier.jobs
    pre = None
    if MONITOR.enabled:
        draws = MONITOR.draws
        check = jobs.check
        if check is not None and next(draws):  # the job × lane check before the job's event (InflightTable.fire)
            check(job, "complete")
        steps = kv.steps
        if steps is not None and next(draws):  # the step properties around the lane's commit (commit_batch)
            pre = steps.before(reservation.lanes)
        ended, _, target = COMPOSITE.fire_sampled(job, machine, request, reservation.tokens, job_id, stop, draws)
    else:
        ended, _, target = COMPOSITE.fire_plain(job, machine, request, reservation.tokens, job_id, stop)
    if ended in _ENDED:
        jobs._end(job)  # the job leaves the table, its engine and slot free (InflightTable.fire's end)
    applier.observe_step(job, batch, now)
    kv._open[lane] = 0  # the lane's step closed (commit_batch)
    if pre is not None:
        kv.steps.after(kv.steps.answered(pre), "commit", job)
    kv._checked("settle_batch")
    records = batch.records
    applier.registry.decode_told(records, (target,), (token,))
    return applier.after_decode(job, records, (target,), now, 1, 0)
