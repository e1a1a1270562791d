"""A B1 decode step's completion and submission, each with its machine events fired as one generated composite (#20).

The submission (:func:`decode_step_submitted`) is the same idea on the other side of the device: the job's
``submit`` and the request's ``submit_decode`` as the composite ``decode_submit``, the lane's step opened here as
the KV manager's ``submit_batch`` opens it in its usual case (the lane has no event there; its conditions are
checked before anything changes, as the completion closes the step here: session 26, #20).

The completion:

Why: at B1 (CalRT 0.7.6's only batch, spec §1, §8) every decode step is one token, and its completion fired three
events through three layers each — the jobs table's ``fire`` (the job's ``complete``), the KV manager's
``commit_batch`` (the lane's ``commit``, §9.2) and the registry's ``decode_done_each`` (the request's
``decode_done``, §7.4), each with its ``fire``/``fire_each`` frame and (state, event) function. Here the three
events are one call of the composite ``decode_step`` that ``python -m calculet.specgen`` prints from the three
declarations (:mod:`calculet.machines.codegen_composite`; written to ``calculet/machines/generated/decode_step.py``),
and the runtime's own work around them — the job leaving the table, the lane's step closing, the monitors, the
step timer, the requests' listeners and sinks — is done here in the order the layers did it, through the same
functions where a rule lives (:meth:`RequestRegistry.decode_told`, the jobs table's ``end``, the KV manager's
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
from calculet.runtime.scheduling.decode import DecodeBatch
from calculet.runtime.scheduling.jobs import lanes_of
from calculet.runtime.scheduling.kv_batch import KEEPS_TOTALS, OPEN_STATES
from calculet.runtime.scheduling.plan import Applied

__all__ = ["COMPOSITE", "SUBMIT", "bind_composite", "decode_step_done", "decode_step_submitted", "job_submitted"]

_ENDED = frozenset({"completed", "failed"})


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
SUBMIT = bind_composite("decode_submit")
"""The bound ``decode_submit`` composite (the job's ``submit``, the request's ``submit_decode``), or None."""


def job_submitted(scheduler: Any, job: Any) -> None:
    """:meth:`Scheduler.submitted` once the planned job is taken, for every job :func:`decode_step_submitted` did not
    take (the scheduler asks it first for a B1 decode step, a frame a token fewer): jobs, KV lanes and requests fire
    ``submit`` event by event."""
    work = job.work
    if work.__class__ is DecodeBatch:
        scheduler.jobs.submit(job, work.kv.lanes or lanes_of(work))  # a batch's lanes as its reservation recorded
        job.submitted_at = scheduler._clock.now()
        scheduler.decode.submitted(work)
        scheduler.kv.submit_batch(work.kv)
        scheduler.registry.fire_all(work.records, "submit_decode", job=job.job_id)
        return
    scheduler.jobs.submit(job, lanes_of(work))
    job.submitted_at = scheduler._clock.now()
    scheduler.kv.submit(work.lease, work.tokens)
    rec = work.record
    if rec.state == "prefill_ready":
        scheduler.registry.fire(rec, "submit_prefill", job=job.job_id)


def decode_step_submitted(scheduler: Any, job: Any, batch: Any) -> bool:
    """The device accepted ``job``, a B1 decode batch: its job's and its request's events fired as one composite, the
    lane's step opened, the moves told — :meth:`Scheduler.submitted`'s decode path in the same order of rules (the
    job × lane check and the binding before the job's event, ``submitted_at``, the batch counted, the lane opened
    with the pool check, the request's quiet move told). False, with nothing changed, when a layer would not take its
    usual case: the reservation's lane changed owner or has a step open (``submit_batch`` would raise), the request
    is not Ready (``fire_all`` would refuse)."""
    records = batch.records
    if SUBMIT is None or len(records) != 1:
        return False
    reservation = batch.kv
    kv = scheduler.kv
    request = records[0].machine
    lanes = reservation.lanes
    if (not reservation.machines or reservation.owners != kv.owners_changed or kv._open[lanes[0]]
            or request.state != "decode_ready"):
        return False
    jobs = scheduler.jobs
    check = jobs.check
    job_id = job.job_id
    if MONITOR.enabled:
        draws = MONITOR.draws
        if check is not None:  # InflightTable.submit: the check when drawn, then the binding (the model's enlist)
            if next(draws):
                check(job, "submit")
            jobs.binding[lanes[0]] = job
        ended, target = SUBMIT.fire_sampled(job, request, job_id, draws)
    else:
        if check is not None:
            jobs.binding[lanes[0]] = job
        ended, target = SUBMIT.fire_plain(job, request, job_id)
    if ended in _ENDED:  # no ``submit`` row ends a job, asked as InflightTable.submit asks it
        jobs.end(job)
    job.submitted_at = scheduler._clock.now()
    scheduler.decode.submitted(batch)
    kv._open[lanes[0]] = reservation.tokens  # the lane's step opened: ``submit_batch``'s usual case, checked above
    kv._checked("submit_batch")
    scheduler.registry.tell(records[0], "decode_ready", target)
    return True


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
        jobs.end(job)  # the job leaves the table, its engine and slot free (InflightTable.fire's end)
    applier.observe_step(job, batch, now)
    kv._open[lane] = 0  # the lane's step closed (commit_batch)
    if pre is not None:
        kv.steps.after(kv.steps.answered(pre), "commit", job)
    kv._checked("settle_batch")
    records = batch.records
    applier.registry.decode_told(records, (target,), (token,))
    return applier.after_decode(job, records, (target,), now, 1, 0)
