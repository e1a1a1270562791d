"""The scheduler's tick (§6–§8): ``Scheduler.step`` and the plan-side pieces it calls, split from :mod:`.scheduler`.

Why its own module (issue #20): the scheduler object is the intake, the reclaim path and the device's results; the
step — expire deadlines, the admission pass, the arbiter's choice (§6), the decode batch (§7.1) or the prefill job,
the job's record — is the plan side of every token (B1, CalRT 0.7.6's only batch, makes every decode step one token),
and it changes on its own. :class:`Stepping` is a mixin of :class:`~.scheduler.Scheduler`: the step reads the
scheduler's state with no frame added per step. The decision rules it applies stay where they are: the arbiter's
(:class:`.prefill.SmoothWrr`, §6), the decode order and batch (:mod:`.decode`, :mod:`.decode_build`, §7, §7.1),
on_time's (:mod:`.on_time`), the admission pass's (:meth:`~.scheduler.Scheduler._pump`, §5).

What a decode step reads per token and not per change (issue #20): the calm admission pass (:class:`.Changes`), the
jobs table's slot rule (``InflightTable.has_slot``, read without its call, as the plan's ``last_slot`` reads it), and
the B1 batch (:meth:`.decode_build.BatchBuilder.build_decode_batch`'s trivial case).
"""

from __future__ import annotations

from typing import Any, Callable

from calculet.clock import Clock
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.admission import AdmissionController, ModelAvailability
from calculet.runtime.scheduling.apply import DeadlineQueue
from calculet.runtime.scheduling.budget_monitor import check_counts_drawn
from calculet.runtime.scheduling.changes import Changes
from calculet.runtime.scheduling.decode import DecodeBatch, DecodeScheduler, NoBatch, NoBatchReason
from calculet.runtime.scheduling.generations import GenerationBinding
from calculet.runtime.scheduling.jobs import DECODE, PREFILL, InflightTable, JobRecord
from calculet.runtime.scheduling.kv import KvLaneManager, KvReservationFailure
from calculet.runtime.scheduling.on_time import OnTimePolicy
from calculet.runtime.scheduling.plan import Plan
from calculet.runtime.scheduling.prefill import PrefillScheduler, PrefillWork, SmoothWrr
from calculet.runtime.scheduling.registry import RequestRegistry

_READY, _DRAINING = ModelAvailability.READY, ModelAvailability.DRAINING
"""The availabilities that serve (new jobs go out), compared by identity in :meth:`Stepping.step`."""
_new_tuple = tuple.__new__


class Stepping:
    """``Scheduler.step`` (see the module doc): a mixin of :class:`~.scheduler.Scheduler`, whose state it reads."""

    _pending: JobRecord | None
    _clock: Clock
    _deadlines: DeadlineQueue
    _next_job: int
    admission: AdmissionController
    arbiter: SmoothWrr
    changes: Changes
    decode: DecodeScheduler
    generations: GenerationBinding
    job_lanes: Any
    jobs: InflightTable
    kv: KvLaneManager
    on_time: OnTimePolicy | None
    prefill: PrefillScheduler
    registry: RequestRegistry
    _no_pending: Callable[[], None]
    _pump: Callable[[float], None]

    def step(self) -> Plan:
        """Expire deadlines, admit what fits, and plan at most one job (one service opportunity)."""
        if self._pending is not None:  # _no_pending without its call (once per decode step)
            self._no_pending()
        if MONITOR.enabled and next(MONITOR.draws):  # a step boundary (sampled, #17), one draw for its two checks:
            self.job_lanes.drawn("scheduler step")  # JobLaneSystem's invariants
            check_counts_drawn(self.admission, self.registry, "scheduler step")  # the budget's counters (#20)
        now = self._clock.now()
        deadlines, prefill, changes = self._deadlines, self.prefill, self.changes
        if now >= deadlines.soonest:  # a deadline passed: sweep (only then, issue #20)
            changes.count += 1  # the sweep pops deadlines, those of ended requests too (no transition tells)
            deadlines.expire_due(now, self.registry, prefill, self.admission.timed_out)
        if self.on_time is not None:
            self.on_time.tick(now)
        wake = changes.wake if changes.calm == changes.count else self._pass(now)  # a calm count: the last pass stands
        jobs = self.jobs
        if len(jobs.by_id) >= jobs.max_inflight:  # InflightTable.has_slot's rule, read without its call (#20)
            return Plan(None, wake_at=wake, reason="no in-flight slot")
        generations = self.generations
        gen = generations.generation
        profiles = generations.profiles
        availability = generations.availability
        if gen == 0 or profiles is None or (availability is not _READY and availability is not _DRAINING):
            # identity, not a frozenset's ``in``: that hashes the enum in Python (Enum.__hash__), twice a step
            return Plan(None, wake_at=wake, reason=f"model {availability.value}")
        for _attempt in range(4):
            eligible = prefill.eligible(now) if prefill.depth else None  # none queued: no class to ask (#20)
            profile, fire_at = self.decode.due(gen, profiles, now)  # the profile if a batch goes now
            if profile is None and fire_at is not None:
                wake = fire_at if wake is None else min(wake, fire_at)
            if eligible is None:  # decode alone, or nothing (a decode rotation's steps): no set built (issue #20)
                choice = self.arbiter.alone("decode") if profile is not None else self.arbiter.choose(())
            else:  # prefill queued: the arbiter weighs its eligible classes and decode, if due
                eligible |= {"decode"} if profile is not None else set()
                choice = prefill.deadline_first(eligible, self.decode, gen) or self.arbiter.choose(eligible)
            if choice is None:
                return Plan(None, wake_at=wake, reason="nothing ready")
            job_id = self._next_job
            if choice == "decode":
                assert profile is not None
                built = self.decode.build_decode_batch(profile, gen, now, job_id)
                if built.__class__ is not DecodeBatch or built.expired or built.invalid:
                    built = intercepted(self.registry, built)  # candidates the build turned away end here
                    if built is None:
                        continue
                self._next_job += 1
                job = jobs.plan(job_id, DECODE, gen, profile.compiled_batch, built)
            else:
                work = build_prefill(self.prefill, self.kv, self.registry, choice, job_id)
                if work is None:
                    continue
                self._next_job += 1
                job = jobs.plan(job_id, PREFILL, work.generation, 1, work)
            self._pending = job  # the last slot: has_slot's rule, read here once the job holds its slot
            return _new_tuple(Plan, (job.work, job.engine, wake, "", len(jobs.by_id) >= jobs.max_inflight))
        return Plan(None, wake_at=wake, reason="no eligible work")

    def _pass(self, now: float) -> float | None:
        """The step's admission pass and wake-up (the next due deadline), kept while the count is calm (:class:`.Changes`)."""
        self._pump(now)
        return self.changes.settle(not self.admission.waiting, self._deadlines.next_due())


def intercepted(registry: RequestRegistry, result: DecodeBatch | NoBatch) -> DecodeBatch | None:
    """A decode build's outcome with candidates it turned away (or no batch): those end here, before anything
    is submitted — expired ones expire, invalid ones and those whose KV lane cannot take the step fail
    (R7.4.4) — and the batch, if there is one, goes on. A build that turned none away skips this call (the
    usual decode step, issue #20)."""
    for rec in result.expired:
        if rec.state == "decode_ready":
            registry.fire(rec, "expire")
    for rec, _problem in result.invalid:
        if rec.state == "decode_ready":  # R7.4.4: intercepted before submit
            registry.fire(rec, "fail")
    if isinstance(result, NoBatch):
        if result.reason is NoBatchReason.KV_RESERVATION:
            for rec in result.refused:
                if rec.state == "decode_ready":
                    registry.fire(rec, "fail")
        return None
    return result


def build_prefill(prefill: PrefillScheduler, kv: KvLaneManager, registry: RequestRegistry, queue: str,
                  job_id: int) -> PrefillWork | None:
    """The next prefill job of ``queue`` (the whole prompt or its next chunk) for job ``job_id``, or None: a
    request whose KV lane cannot take it fails here, before anything is submitted (R7.4.4)."""
    rec = prefill.take(queue)
    lease = rec.lease
    done = kv.committed_len(lease)
    tokens = prefill.next_chunk(rec.prompt_tokens - done)
    check = kv.reserve_batch((lease,), tokens)
    if isinstance(check, KvReservationFailure):  # R7.4.4: never submitted
        if rec.state == "prefill_ready":
            registry.fire(rec, "fail")
        else:
            registry.fire(rec, "prefill_done", job=rec.job_id, ok=False, stop=False)
        return None
    request_job = job_id if rec.state == "prefill_ready" else rec.job_id
    if tokens < rec.prompt_tokens:
        prefill.count_chunk()
    return PrefillWork(job_id, rec.generation, rec.request_id, lease.seq_id, lease.lane, done, tokens,
                       rec.prompt_tokens, done + tokens == rec.prompt_tokens, queue, request_job, lease, rec)
