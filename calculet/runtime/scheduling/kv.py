"""KvLaneManager (§9): a pool of KV sequences / hardware lanes, each a KvSequenceMachine.

The scheduler's own account of the lanes; the device's sequence store it is bound to (by the
executor) is the CalRT vendor protocol's ``KvManager`` (:mod:`calculet.adapters.calrt`), which
keeps the vendor's name.

The pool hands lanes to requests as *leases*. A lease names (lane, seq_id, generation,
lease_id); the lease id changes every time the lane is handed out, so a stale or repeated
release is recognised and refused instead of freeing someone else's lane (§17.3 "no lease
double free").

* ``reserve`` takes a lane from the free list and fires ``reserve`` only when the declared rules
  allow it: the lane's own guard and the pool's reserve guard of
  :class:`~calculet.machines.kv_pool.KvLanePool` (one owner per (seq, generation), the KV-token
  and sequence budgets) — the very predicate ``verify`` proves, not a hand-written copy (issue
  #17), compiled over the pool's budget totals so that it costs O(1), not O(lanes), per
  reservation (issue #20; :mod:`calculet.runtime.scheduling.kv_guard` says why that is the
  declared guard); running out is a value (:class:`NoCapacity`), not an exception (DESIGN
  principle 4).
* with monitors on, after every (sampled) operation the pool's invariants run over the live
  lanes and the indexes and totals kept beside the machines (free list, owners, (generation,
  seq) → lane, each budget's total) are checked against them; at a sampled reservation the
  declared guard is also evaluated on the whole pool and must agree with the compiled one
  (:mod:`calculet.runtime.scheduling.kv_checks`).
* append/decode is a transaction with one lane event per step (#20): ``submit`` opens the lane's
  step with no lane event (``_open``: JobLaneSystem's binding of the lane to the job writing it;
  reported Updating, :data:`~calculet.machines.kv_sequence.KV_SEQUENCE_STATE`) → ``commit`` fires
  the machine's ``commit(tokens)`` on success and closes it, ``abort`` closes it with no event on a
  known failure, ``fault`` on timeout/CCU/DMA-unknown makes the lane Unknown and keeps it open
  (quarantined: never handed out again, and not released, until ``recover``) (§9.2, §9.3).
* where the binding lives (#20): the lane machine refused two things the runtime relies on while it
  had Updating — ``release`` while a job writes the lane, and a stale settle. Without it both read
  the open step kept here (``_open``, one list entry per lane instead of two machine events per
  step), as JobLaneSystem's ``release`` guard (unbound) and commit/abort guards (bound to the job)
  say; ``InflightTable.binding`` stays the map "which job's batch last took the lane", and the
  job × lane monitor reads both (:mod:`calculet.runtime.scheduling.job_lane_monitor`).
* ``release`` moves the lane to Releasing and *returns a command*: the engine frees the
  sequence through the adapter and calls ``confirm_release``; only then is the lane Free and
  back on the free list (§9.2: reuse only after the runtime confirmed the release).
* §9.3: remove-tail only where the capability allows; shift behind its capability flag;
  copy prefix, keep one sequence, position add/div and save/load raise ``NotSupported``.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from calculet.clock import Clock
from calculet.errors import DefinitionError
from calculet.machines.errors import TransitionNotAllowed
from calculet.machines import KvSequenceMachine
from calculet.machines.kv_sequence import KV_SEQUENCE_STATE, KvSequence, KvSequenceState
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.machines.pool import PoolView
from calculet.runtime.scheduling.kv_checks import PoolMonitor, check_pool, check_reserve_decision
from calculet.runtime.scheduling.kv_batch import (  # the batch side (one decode step's lanes), re-exported
    KEEPS_TOTALS, OPEN_STATES, KvBatchOperations, KvBatchReservation, KvReservationFailure, StaleLease)
from calculet.runtime.scheduling.kv_context import KvContextOperations, ShiftSequence
from calculet.runtime.scheduling.kv_guard import compile_measures, compile_moves, compile_reserve_guard
from calculet.runtime.distribution import FREE_LATENCY_BOUNDS, Distribution, DistributionSnapshot


class KvLease(NamedTuple):
    """A request's hold on one lane; valid until released (or the lane is recovered). Immutable: a named
    tuple, built once per admission at a third of a frozen dataclass's cost (issue #20)."""

    lane: int
    seq_id: int
    generation: int
    lease_id: int
    tokens: int


@dataclass(frozen=True, slots=True)
class FreeSequence:
    """Command: free this sequence in the runtime, then call ``KvLaneManager.confirm_release``."""

    lane: int
    seq_id: int
    generation: int


@dataclass(frozen=True, slots=True)
class NoCapacity:
    """A reservation the pool cannot grant now (a value, not an error)."""

    reason: str


@dataclass(frozen=True, slots=True)
class KvCapabilities:
    """The §9.3 gates the adapter's capability contract decides (never a config flag alone).

    Copy prefix, keep one sequence, position add/div and save/load are empty implementations
    in CalRT 0.7.6, so they have no switch here at all.
    """

    remove_tail: bool = False
    shift: bool = False


@dataclass(frozen=True)
class KvLaneStatistics:
    """§16 KV metrics: sequences by state, tokens used/reserved, lane wait, unknown, free latency."""

    lanes: int
    by_state: dict[str, int]
    free_lanes: int
    unknown: int
    tokens_used: int
    tokens_reserved: int
    reservations: int
    lane_wait_refusals: int
    releases: int
    confirmed_releases: int
    refused_double_releases: int
    faults: int
    free_latency_avg_s: float
    free_latency_max_s: float
    free_latency: DistributionSnapshot | None = None
    """Every confirmed release's latency (§16 KV free latency as a histogram)."""


_new_tuple = tuple.__new__
POOL_CHECK_LANES = 64
"""Up to this many lanes (every device profile), a sampled operation checks the whole pool."""

_REPORTED = KV_SEQUENCE_STATE.table  # §9.1 KvSequenceState of (machine state, step open): Updating derived (R9.1.1, #20)
_POOL = KvLanePool.definition
_SETTLES = frozenset(("commit", "abort", "fault"))
"""The events that end (or, ``fault``, keep open) a lane's step in :meth:`KvLaneManager.settle`."""
_RESERVE_GUARD, RESERVE_GUARD_SOURCE = compile_reserve_guard(_POOL)
_MEASURES, MEASURES_SOURCE = compile_measures(_POOL)
_MOVES, MOVES_SOURCE = compile_moves(_POOL)
__all__ = ["FreeSequence", "KvBatchReservation", "KvCapabilities", "KvLaneManager", "KvLaneStatistics", "KvLease",
           "KvReservationFailure", "NoCapacity", "OPEN_STATES", "POOL_CHECK_LANES", "ShiftSequence",
           "StaleLease"]  # the batch side's names too (kv_batch), as before the split

class KvLaneManager(KvBatchOperations, KvContextOperations):
    """The KV lane pool of one model generation's runtime session (§9)."""

    def __init__(self, lanes: int, max_seq: int, *, capabilities: KvCapabilities = KvCapabilities(),
                 clock: Clock | None = None, max_kv_tokens: int | None = None,
                 max_sequences: int | None = None) -> None:
        if lanes < 1:
            raise ValueError("a KV pool needs at least one lane")
        self.max_seq = max_seq
        self.capabilities = capabilities
        self._clock = clock
        self._lanes = [KvSequenceMachine.create(max_seq=max_seq, lane=i) for i in range(lanes)]
        # The pool declaration's parameters and ghosts, and a view of the live lanes its guards
        # and invariants read (§5.1 budgets: by default every lane may hold a whole context).
        self.pool_params = {"max_kv_tokens": max_kv_tokens if max_kv_tokens is not None else lanes * max_seq,
                            "max_sequences": max_sequences if max_sequences is not None else lanes}
        self._ghosts = [{g: 0 for g in _POOL.ghosts} for _ in range(lanes)]
        self.view = PoolView(self._lanes, self.pool_params, self._ghosts)
        # The reduced view of the reserve guard (kv_guard): a lane in the initial state stands in
        # for "no lane holds this (seq, generation)", and each budget's use summed over the lanes.
        self._neutral = KvSequenceMachine.create(max_seq=max_seq, lane=lanes)
        self._budgets = tuple(self.pool_params[name] for name in _POOL.params)
        self._totals = [sum(_MEASURES(m)[k] for m in self._lanes) for k in range(len(self._budgets))]
        self.pool_monitor = PoolMonitor()
        """What the pool monitor's last check saw: a check evaluates the lanes that moved since (kv_checks)."""
        self._check_scale = lanes / POOL_CHECK_LANES
        self._scale_draw = random.Random(lanes).random
        self._owner = [0] * lanes
        self._open = [0] * lanes
        """Each lane's open step: the positions the device job it is bound to writes (0: none). The lane machine
        has no in-flight state (#20): the open transaction is JobLaneSystem's binding, kept here, where the
        runtime releases and settles lanes (``release`` refused, a stale settle ignored, while it is open)."""
        self.steps: Any = None
        """The job × lane monitor (set by ``job_lane_monitor.attach``): where a lane's step ends (``settle``,
        ``settle_batch``, ``commit_batch``, ``commit``, ``abort``, ``recover``), at the monitors' sampled rate, its
        ``before(lanes)`` and ``after(pre, event, job)`` evaluate JobLaneSystem's step properties on that step (#20:
        a lane committed by another job's end, or while its job is on the device, breaks no state invariant)."""
        self.owners_changed = 0
        """How many times a lane's owner has changed (read-only outside: a reservation made at the same count
        finds every lease still owning its lane)."""
        self._free: deque[int] = deque(range(lanes))
        self._by_seq: dict[tuple[int, int], int] = {}
        self._release_started: dict[int, float] = {}
        self._next_seq = 1
        self._next_lease = 1
        self._reservations = 0
        self._refusals = 0
        self._releases = 0
        self._confirms = 0
        self._double = 0
        self._faults = 0
        self._latency = Distribution(FREE_LATENCY_BOUNDS)

    # ------------------------------------------------------------------ reading

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    @property
    def free_lanes(self) -> int:
        return len(self._free)

    def lane(self, lane: int) -> Any:
        """The lane's machine instance (read-only use: monitors, tests, statistics)."""
        return self._lanes[lane]

    def lane_list(self) -> list[Any]:
        """Every lane's machine instance, in lane order (read-only use: the pool monitor)."""
        return self._lanes

    def open_list(self) -> list[int]:
        """Each lane's open step (its positions; 0: none) — JobLaneSystem's binding, read by its monitor."""
        return self._open

    def ghost_list(self) -> list[dict[str, int]]:
        """Every lane's pool ghosts (KvLanePool.ghosts), in lane order (read-only use: the pool monitor)."""
        return self._ghosts

    def owns(self, lease: KvLease) -> bool:
        return self._owner[lease.lane] == lease.lease_id

    def owned_position(self, lease: KvLease) -> int | None:
        """The lane's committed_len if ``lease`` still owns it, else None (one call per lane per tick)."""
        lane = lease.lane
        if self._owner[lane] != lease.lease_id:
            return None
        return self._lanes[lane].committed_len  # type: ignore[no-any-return]

    def lease_owners(self) -> tuple[list[int], list[Any]]:
        """The lease id owning each lane (0: none) and each lane's machine, for a read-only pass that
        inlines :meth:`owned_position` once per lane (the decode tick, issue #20); never written through."""
        return self._owner, self._lanes

    def committed_len(self, lease: KvLease) -> int:
        return self._lane(lease).committed_len  # type: ignore[no-any-return]

    def state(self, lease: KvLease) -> KvSequenceState:
        """The lease's lane in §9.1's KvSequenceState (Updating while its step is open, R9.2.5)."""
        lane = self._owned(lease)
        return _REPORTED[self._lanes[lane].state, self._open[lane] > 0]

    def sequence(self, lane: int) -> KvSequence:
        """R9.1.2: the lane's KV sequence as §9.1 lists it (a snapshot; its state reported as ``state`` does)."""
        return KvSequence.of(self._lanes[lane], self._open[lane] > 0)

    def lane_of(self, generation: int, seq_id: int) -> int | None:
        return self._by_seq.get((generation, seq_id))

    # ------------------------------------------------------------------ lifecycle

    def reserve(self, generation: int, tokens: int, seq_id: int | None = None) -> KvLease | NoCapacity:
        """A lane for a sequence that may hold ``tokens`` positions, or why not (§9.1).

        The decision is the declaration's: the pool's reserve guard (KvLanePool, compiled over
        the budget totals: O(1)) and the lane's own ``reserve`` guard."""
        if not self._free:
            self._refusals += 1
            return NoCapacity("no free KV lane")
        fresh = seq_id is None
        seq = self._next_seq if seq_id is None else seq_id
        lane = self._free[0]
        machine = self._lanes[lane]
        holder = self._by_seq.get((generation, seq))
        other = self._neutral if holder is None else self._lanes[holder]
        allowed = _RESERVE_GUARD(machine, other, self._totals, self._budgets, seq, generation, tokens)
        if MONITOR.enabled and next(MONITOR.draws) and self.whole_pool_drawn():
            check_reserve_decision(self, lane, {"seq": seq, "gen": generation, "tokens": tokens}, allowed)
        if not allowed:
            if holder is not None:  # a caller's fault, not a lack of capacity
                raise DefinitionError(f"seq {seq} of generation {generation} already holds lane "
                                      f"{holder} (§9.2: one seq, one lane)")
            self._refusals += 1
            return NoCapacity("the KV-token or sequence budget is spent (§5.1)")
        before = _MEASURES(machine)  # ``_fire`` inlined (once per admission): the totals follow the lane
        try:
            machine.fire("reserve", seq=seq, gen=generation, tokens=tokens)
        except TransitionNotAllowed:  # the lane's own guard: tokens <= max_seq; nothing changed
            return NoCapacity(f"{tokens} tokens exceed the sequence limit {self.max_seq}")
        _MOVES(self._totals, before, machine)
        if fresh:
            self._next_seq += 1
        self._free.popleft()
        lease_id = self._next_lease
        self._next_lease += 1
        self._owner[lane] = lease_id
        self.owners_changed += 1
        self._by_seq[(generation, seq)] = lane
        self._reservations += 1
        if MONITOR.enabled and next(MONITOR.draws) and self.whole_pool_drawn():  # _checked, drawn inline
            check_pool(self, "reserve")
        return _new_tuple(KvLease, (lane, seq, generation, lease_id, tokens))  # KvLease(...) without its __new__ frame

    def submit(self, lease: KvLease, tokens: int) -> None:
        """The device accepted a job writing ``tokens`` positions: the lane's step opens (no lane event, #20)."""
        self._submit(self._owned(lease), tokens)
        self._checked("submit")

    def commit(self, lease: KvLease, job: Any = None) -> None:
        """Device and output both succeeded (``job``'s end): the step's positions become committed (§9.2), the
        step closes."""
        lane = self._owned(lease)
        tokens = self._step_of(lane)
        pre = self._step_drawn((lane,))
        self._fire(lane, "commit", tokens=tokens)
        self._open[lane] = 0
        if pre is not None:
            self.steps.after(pre, "commit", job)
        self._checked("commit")

    def abort(self, lease: KvLease, job: Any = None) -> None:
        """A known failure (``job``'s end): nothing the job wrote is kept — the step closes, no lane event."""
        lane = self._owned(lease)
        self._step_of(lane)
        pre = self._step_drawn((lane,))
        self._open[lane] = 0
        if pre is not None:
            self.steps.after(pre, "abort", job)
        self._checked("abort")

    def _step_drawn(self, lanes: Any) -> Any:
        """The job × lane monitor's snapshot of ``lanes`` before their steps end, when one is attached and the
        monitors' draw picks this operation (:attr:`steps`); None otherwise."""
        steps = self.steps
        if steps is not None and MONITOR.enabled and next(MONITOR.draws):
            return steps.before(lanes)
        return None

    def fault(self, lease: KvLease) -> None:
        """Timeout / CCU fault / DMA unknown: the lane becomes Unknown and is quarantined (an open step stays
        open, naming the job recovery waits for, until ``recover``)."""
        lane = self._owned(lease)
        self._fire(lane, "fault")
        self._faults += 1
        self._checked("fault")

    def _step_of(self, lane: int) -> int:
        """The open step's positions; refused (TransitionNotAllowed, as the machine refused a settle outside
        Updating) when the lane has none or is not working."""
        tokens = self._open[lane]
        machine = self._lanes[lane]
        if not tokens or machine.state not in OPEN_STATES:
            raise TransitionNotAllowed(machine.definition.name, machine.state, "settle", "no open step on the lane")
        return tokens

    def release(self, lease: KvLease) -> FreeSequence | None:
        """The owner ended: start freeing the lane, or detach from a quarantined one.

        Returns the command to free the sequence, or None when nothing is to be freed now —
        the lane is Unknown (it waits for ``recover``) or the lease was already released
        (refused and counted: a lease is never freed twice).
        """
        lane = lease.lane
        if self._owner[lane] != lease.lease_id:
            self._double += 1
            return None
        machine = self._lanes[lane]
        if machine.state == "unknown":
            self._owner[lane] = 0
            self.owners_changed += 1
            self._checked("release (detach from Unknown)")
            return None
        if self._open[lane]:  # refused (and nothing changes) while a job is writing the lane (JobLaneSystem)
            raise TransitionNotAllowed(machine.definition.name, machine.state, "release", "its step is open")
        self._fire(lane, "release")
        self._owner[lane] = 0
        self.owners_changed += 1
        self._checked("release")
        return self._releasing(lane)

    def _submit(self, lane: int, tokens: int) -> None:
        """Open the lane's step (JobLaneSystem's ``enlist``: no lane event): refused as the machine refused a
        submit — the lane must be working, with no open step and room for ``tokens`` more positions."""
        machine = self._lanes[lane]
        if (self._open[lane] or machine.state not in OPEN_STATES
                or machine.committed_len + tokens > machine.reserved_len):
            raise TransitionNotAllowed(machine.definition.name, machine.state, "submit", "cannot open a step")
        self._open[lane] = tokens


    def recover(self, lane: int) -> FreeSequence:
        """Recovery made the Unknown lane safe again (reset, or the job provably finished)."""
        pre = self._step_drawn((lane,))
        self._owner[lane] = 0
        self._open[lane] = 0
        self.owners_changed += 1
        self._fire(lane, "recover")
        if pre is not None:
            self.steps.after(pre, "recover")
        self._checked("recover")
        return self._releasing(lane)

    def recover_unknown(self) -> list[FreeSequence]:
        """Recover every Unknown lane (after a device reset)."""
        return [self.recover(i) for i, m in enumerate(self._lanes) if m.state == "unknown"]

    def confirm_release(self, lane: int, seq_id: int) -> None:
        """The runtime confirmed the free: the lane is Free and may be handed out again."""
        machine = self._lanes[lane]
        if machine.state != "releasing" or machine.seq_id != seq_id:
            raise StaleLease(f"confirm_release(lane={lane}, seq={seq_id}) but the lane is {machine.state} "
                             f"with seq {machine.seq_id}")
        key = (machine.generation, seq_id)
        self._fire(lane, "confirm_release")
        del self._by_seq[key]
        self._free.append(lane)
        self._confirms += 1
        self._checked("confirm_release")
        started = self._release_started.pop(lane, None)
        if started is not None and self._clock is not None:
            self._latency.add(self._clock.now() - started)

    # ------------------------------------------------------------------ batches (§7.1)

    def settle(self, lease: KvLease, event: str, job: Any = None) -> bool:
        """End the lane's open transaction with ``commit``, ``abort`` or ``fault`` (``job``'s end: the job whose
        end settles it, for the job × lane monitor's step check, :attr:`steps`).

        Returns False — and changes nothing — when the lease no longer owns the lane or the
        lane has no open transaction (a stale completion): settling is then not its business.
        """
        if event not in _SETTLES:
            raise ValueError(f"settle with {event!r}: commit, abort or fault")
        lane = lease.lane
        if self._owner[lane] != lease.lease_id:
            return False
        machine = self._lanes[lane]
        tokens = self._open[lane]
        if not tokens or machine.state not in OPEN_STATES:
            return False
        pre = self._step_drawn((lane,))
        if event == "commit":
            self._fire(lane, "commit", tokens=tokens)
        elif event == "fault":
            self._fire(lane, "fault")
            self._faults += 1
        if event != "fault":
            self._open[lane] = 0
        if pre is not None:
            self.steps.after(pre, event, job)
        self._checked(event)
        return True

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> KvLaneStatistics:
        """Counts by state and token sums are read from the lanes (O(lanes), off the hot path)."""
        by_state: Counter[str] = Counter()
        used = reserved = 0
        for machine, opened in zip(self._lanes, self._open):
            by_state[_REPORTED[machine.state, opened > 0]] += 1
            used += machine.committed_len
            reserved += machine.reserved_len
        confirms = self._confirms
        return KvLaneStatistics(
            lanes=len(self._lanes), by_state={s: by_state.get(s, 0) for s in KV_SEQUENCE_STATE.states},
            free_lanes=len(self._free), unknown=by_state.get("unknown", 0),
            tokens_used=used, tokens_reserved=reserved, reservations=self._reservations,
            lane_wait_refusals=self._refusals, releases=self._releases, confirmed_releases=confirms,
            refused_double_releases=self._double, faults=self._faults,
            free_latency_avg_s=self._latency.avg, free_latency_max_s=self._latency.max,
            free_latency=self._latency.snapshot())

    # ------------------------------------------------------------------ internals

    def _lane(self, lease: KvLease) -> Any:
        return self._lanes[self._owned(lease)]

    def _owned(self, lease: KvLease) -> int:
        if self._owner[lease.lane] != lease.lease_id:
            raise StaleLease(f"lease {lease.lease_id} no longer owns lane {lease.lane}")
        return lease.lane

    def _releasing(self, lane: int) -> FreeSequence:
        machine = self._lanes[lane]
        self._releases += 1
        if self._clock is not None:
            self._release_started[lane] = self._clock.now()
        return FreeSequence(lane, machine.seq_id, machine.generation)

    def _fire(self, lane: int, event: str, **args: Any) -> None:
        """Fire ``event`` on the lane, keeping each budget's total (what the reserve guard reads)."""
        machine = self._lanes[lane]
        if event in KEEPS_TOTALS:
            machine.fire(event, **args)
            return
        before = _MEASURES(machine)
        machine.fire(event, **args)
        _MOVES(self._totals, before, machine)

    def _checked(self, operation: str) -> None:
        """With monitors on: the pool's invariants and this manager's indexes, after ``operation``
        (every operation in tests; sampled like every other monitor in production).

        A check evaluates the declared invariants on the lanes that moved since the last one
        (:mod:`~calculet.runtime.scheduling.kv_checks`, proved equal to the whole-pool verdict), but
        still compares every lane with its snapshot and walks the indexes: O(lanes) plain reads.
        When sampling, a pool of more than :data:`POOL_CHECK_LANES` lanes is checked that many
        times less often per operation, so that cost stays O(1) amortized; a broken pool state
        persists, so it is still found at a later check."""
        if MONITOR.enabled and next(MONITOR.draws) and self.whole_pool_drawn():
            check_pool(self, operation)

    def whole_pool_drawn(self) -> bool:
        """Whether a sampled operation runs its O(lanes) check: always in tests (every event checked),
        and for pools up to :data:`POOL_CHECK_LANES` lanes; a larger pool one time in lanes / that many,
        at random, so the amortized cost stays O(1) per operation — for this pool's own check, for the
        reserve decision, whose declared guard is evaluated on every lane (8-70 ms at 2 001 lanes), and
        for the other O(lanes) monitors of this pool (jobs × lanes)."""
        return self._check_scale <= 1 or MONITOR.sample_every <= 1 or self._scale_draw() * self._check_scale < 1.0

    def indexes(self) -> tuple[tuple[int, ...], tuple[int, ...], dict[tuple[int, int], int]]:
        """The indexes kept beside the lanes (free list, lease owner per lane, (generation, seq)
        → lane), for the monitor that checks them against the machines."""
        return tuple(self._free), tuple(self._owner), dict(self._by_seq)

    def budget_totals(self) -> list[int]:
        """Each pool budget's use summed over the lanes, as kept incrementally (``pool.params`` order)."""
        return list(self._totals)
