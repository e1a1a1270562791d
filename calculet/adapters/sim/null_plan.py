"""The null device's plan for a decode step: what its configuration makes constant, decided once (issue #20).

The null device (:attr:`SimConfig.completes_inline <calculet.adapters.sim.config.SimConfig.completes_inline>`:
real time, numerics off, no device time) measures the host alone, so what the simulated device does per step
should be what the vendor runtime would do in C, not Python deciding the same things again every token. Of a
decode step's submit, most verdicts are fixed by the configuration and the device's state, not by the step:

* the job's calbin, profile and buffer pair: the full checks passed them when the step's route
  (:class:`~calculet.adapters.sim.submit_checks.DecodeRoute`) opened, and every configuration change or poison
  forgets the routes;
* the fault to inject: none, as long as the injector has nothing :attr:`~.faults.FaultInjector.armed` (asked per
  step: a rule or rate set from another thread applies from the next submit);
* the engine, the in-flight limit, the buffers' and sequences' binding: with no job on the device
  (``timeline.pending`` empty, asked per step) no engine is busy, the limit is not reached, and nothing is
  bound (a buffer or sequence is bound only while its job is pending, or inside a submit that completes it);
* the completion instant: the submit instant (no device time), so the step is committed and published inside
  its submit, as the general path does for such a job (``compute`` → ``commit`` → ``completion_record``).

What changes from step to step is checked as :func:`~calculet.adapters.sim.submit_checks.check_decode` checks it
— every lane valid, each lane's sequence live, its token in the vocabulary, its position the sequence's
committed length and below ``max_seq``, no sequence in two lanes — and the step's record is built in the same
pass over its lanes. The plan's :meth:`~NullDecodePlan.submit` is the null device's Submit (one frame from the host
to the committed step); anything it does not accept goes to the device's full path, which gives the verdict and
the refusal of every check in their order (counted and translated by the device's one boundary rule,
:func:`~calculet.adapters.sim.device.submit_refusal`); a refused step changes nothing here.
``tests/unit/adapters/sim/test_null_decode_step.py`` holds results, KV and counts to the general path's.

Session 26 (#20): B1's one lane is checked and committed without a list per step (several lanes:
:func:`_lanes_committed`, the same checks); the records are named tuples built with ``tuple.__new__``
(``docs/devices.md`` §3); a routed step is counted once, as :attr:`NullDecodePlan.submitted` — the device's
completions by rc add it when read, and its completions per engine are its engines' ``engine_sequence``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from calculet.adapters.calrt import NO_SEQUENCE, DecodeJob, JobId, JobKind, JobResult, JobSpec, JobTicket, LaneResult, \
    ReturnCode, StatusCounters
from calculet.adapters.sim.faults import FaultInjector
from calculet.adapters.sim.kv import SimKvManager, _Sequence
from calculet.adapters.sim.model import pseudo_next_token
from calculet.adapters.sim.submit_checks import DecodeRoute
from calculet.adapters.sim.timeline import CompletionTimeline
from calculet.clock import Clock
from calculet.machines.job import JobEngine

__all__ = ["NullDecodePlan"]

_DECODE = JobKind.DECODE
_OK = ReturnCode.OK
_new_tuple = tuple.__new__
"""The result records are named tuples (``docs/devices.md`` §3): built here without their ``__new__``'s frame."""


def _unbound(*_: Any) -> Any:
    raise RuntimeError("NullDecodePlan.bind was not called: the plan has no device to submit to")


class NullDecodePlan:
    """A null device's decode steps, taken at submit (device lock held) on the device's own tables and counts.

    One per device, built at its creation when every job completes at submit: its :meth:`submit` is the device's
    Submit (a decode step of a known route taken there, any other job handed to the device's full path), and the
    full path has :meth:`commit` complete a decode job its checks accepted."""

    __slots__ = ("_timeline", "_clock", "_ids", "_engine_seq", "_completed", "_faults", "_cond",
                 "submitted", "_lock", "_routes", "_full", "_refusal")

    def __init__(self, timeline: CompletionTimeline, clock: Clock, ids: Iterator[int],
                 engine_seq: MutableMapping[JobEngine, int], completed: Counter[ReturnCode], faults: FaultInjector,
                 cond: threading.Condition) -> None:
        self._timeline = timeline
        self._clock = clock
        self._ids = ids
        """The device's id counter (jobs, buffers, calbins share it): a job id is taken only for an accepted step."""
        self._engine_seq = engine_seq
        self._completed = completed
        """The device's completions by rc, for the jobs :meth:`commit` completes; the steps :meth:`submit` takes are
        :attr:`submitted` (all OK), added when the device's statistics are read (issue #20: one count per step)."""
        self._faults = faults
        self._cond = cond
        self.submitted = 0
        """Steps accepted here, each completed OK at once (the device's ``submitted`` and ``completed`` add them)."""
        self._lock: Any = None
        self._routes: Mapping[int, DecodeRoute] = {}
        self._full: Callable[[JobSpec], JobTicket] = _unbound
        self._refusal: Callable[[Exception], Exception] = _unbound

    def bind(self, lock: Any, routes: Mapping[int, DecodeRoute], full: Callable[[JobSpec], JobTicket],
             refusal: Callable[[Exception], Exception]) -> None:
        """The device's parts :meth:`submit` stands on: its lock (entered without the Condition's Python-level
        ``__enter__``), its decode routes by ``id`` of their buffer pair (the submit checks' table, forgotten in
        place), its full path under the lock, and its boundary's translation."""
        self._lock, self._routes, self._full, self._refusal = lock, routes, full, refusal

    def submit(self, job: JobSpec) -> JobTicket:
        """The null device's Submit (its ``submit``): a decode step of a known route checked, committed and published
        here, its ticket returned; anything the plan does not take (see the module docstring) the device's full
        path, which gives every verdict and refusal. One frame from the host to the committed step (issue #20:
        the device's Submit and the plan's step were two). Its try is the vendor boundary, as the device's."""
        with self._lock:
            try:
                route = self._routes.get(id(job.buffers))
                timeline = self._timeline
                if (route is not None and not self._faults.armed and not timeline.pending and job.kind is _DECODE
                        and job.buffers is route.buffers and job.calbin_id == route.calbin_id
                        and job.engine is route.engine and job.compiled_batch == route.compiled_batch):
                    tokens, positions, valid, seq_ids, active = job.lanes  # type: ignore[union-attr]
                    results: tuple[LaneResult, ...] | None = None
                    if valid != route.all_valid:  # an inactive lane: the full path
                        pass
                    elif len(active) == 1:  # B1, 0.7.6's only batch: its one lane checked here, no lists (#20)
                        sid, token, pos = seq_ids[0], tokens[0], positions[0]
                        seq = route.kv.find(sid)  # NO_SEQUENCE finds None
                        if seq is not None and 0 <= token < route.vocab and pos == seq.committed_len < route.max_seq:
                            seq.committed_len += 1  # SimKvManager.commit of one token without rows
                            results = (_new_tuple(LaneResult, (0, sid, True, _OK, pos, pos + 1, None,
                                                               pseudo_next_token(token, pos))),)
                    else:
                        results = _lanes_committed(route, tokens, positions, seq_ids, active)
                    if results is not None:
                        n, ok = len(results), _OK
                        now = self._clock.now()
                        job_id = JobId(next(self._ids))
                        route.in_buf.pending = job  # the DMA: its bytes written when read (SimBuffer.pending)
                        engine, calbin_id, generation = route.engine, route.calbin_id, job.generation
                        sequence = self._engine_seq[engine] = self._engine_seq[engine] + 1
                        timeline.done[job_id] = _new_tuple(JobResult, (
                            job_id, generation, _DECODE, engine, calbin_id, route.compiled_batch, ok,
                            results, _new_tuple(StatusCounters, (sequence, n, n, n)), now, now,
                            route.buffers.output, ""))
                        self.submitted += 1  # also the device's OK completions (read when counted, #20)
                        self._faults.passed += 1
                        if timeline.sleepers:  # a Wait/WaitAny caller: the result may be what it waits for
                            self._cond.notify_all()
                        return _new_tuple(JobTicket, (job_id, generation, _DECODE, engine, calbin_id, now))
                return self._full(job)
            except Exception as exc:  # noqa: BLE001 - the boundary must catch everything the vendor raises
                mapped = self._refusal(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

    def commit(self, ticket: JobTicket, spec: DecodeJob, kv: SimKvManager, held: tuple[_Sequence, ...]) -> JobTicket:
        """A decode job off a route (an inactive lane, or a fault armed that spared it) which the device's full
        checks accepted: committed and published at its submit instant (lock held) with the record :meth:`submit`
        builds, for any lanes; its ticket returned. ``held`` are the valid lanes' sequences in lane order, as the
        checks found them; they are never bound to the job, which is done before the lock is released."""
        tokens, positions, valid, seq_ids, _active = spec.lanes
        ok = ReturnCode.OK
        lanes: list[LaneResult] = []
        append = lanes.append
        n_valid = 0
        for i, sid in enumerate(seq_ids):
            pos = positions[i]
            if valid[i]:
                seq = held[n_valid]
                n_valid += 1
                seq.committed_len += 1  # SimKvManager.commit of one token without rows
                append(LaneResult(i, sid, True, ok, pos, seq.committed_len, None, pseudo_next_token(tokens[i], pos)))
            else:
                named = kv.find(sid) if sid != NO_SEQUENCE else None  # an invalid lane may name no sequence
                append(LaneResult(i, sid, False, ok, pos, named.committed_len if named else 0, None, None))
        engine, timeline, now = spec.engine, self._timeline, ticket.submitted_at
        sequence = self._engine_seq[engine] = self._engine_seq[engine] + 1
        timeline.done[ticket.job_id] = JobResult(ticket.job_id, spec.generation, spec.kind, engine, ticket.calbin_id,
                                                 spec.compiled_batch, ok, tuple(lanes),
                                                 StatusCounters(sequence, n_valid, n_valid, n_valid), now, now,
                                                 spec.buffers.output, "")
        self._completed[ok] += 1
        if timeline.sleepers:  # a Wait/WaitAny caller: the result may be what it waits for
            self._cond.notify_all()
        return ticket


def _lanes_committed(route: DecodeRoute, tokens: tuple[int, ...], positions: tuple[int, ...],
                     seq_ids: tuple[int, ...], active: tuple[int, ...]) -> tuple[LaneResult, ...] | None:
    """A routed step of several lanes, every one valid: each lane checked as :meth:`NullDecodePlan.submit` checks
    B1's one lane — its sequence live, its token in the vocabulary, its position the committed length and below
    ``max_seq`` — and no sequence in two lanes; then every lane committed (one token each) and its results
    returned, or None and nothing changed when any check fails (the full path then gives the refusal)."""
    find, vocab, max_seq, ok = route.kv.find, route.vocab, route.max_seq, _OK
    held, lanes = [], []
    for i in active:
        seq, token, pos = find(seq_ids[i]), tokens[i], positions[i]  # NO_SEQUENCE finds None
        if seq is None or not 0 <= token < vocab or pos != seq.committed_len or pos >= max_seq:
            return None
        held.append(seq)
        lanes.append(_new_tuple(LaneResult, (i, seq_ids[i], True, ok, pos, pos + 1, None,
                                             pseudo_next_token(token, pos))))
    if not held or len(set(seq_ids)) != len(held):  # no sequence in two lanes
        return None
    for seq in held:
        seq.committed_len += 1  # SimKvManager.commit of one token without rows
    return tuple(lanes)
