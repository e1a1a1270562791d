"""The batch side of :class:`~calculet.runtime.scheduling.kv.KvLaneManager` (§7.1, §9.2): one decode step's lanes at once.

Why a module of its own (issue #20, size limits): a decode step checks, opens and settles the
transactions of all its lanes together — ``reserve_batch`` (a check that changes nothing, R7.1.5),
``submit_batch`` when the device accepted the job, ``commit_batch``/``settle_batch`` with its result —
each one call and one pool check per job, the lanes firing in one generated loop (``fire_each``) where
the event provably keeps every budget total. :class:`KvBatchReservation` records what the check read
(each lane and its machine, and the pool's owner-change count), so the later calls of the same step
reuse it instead of looking every lane up again. This mixin joins the manager, as
:mod:`.kv_context` does, and goes through the manager's own ``_owner``/``_lanes``/``_checked``/``_fire``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from calculet.errors import DefinitionError
from calculet.machines import KvSequenceMachine
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.records import quick_init
from calculet.runtime.scheduling.kv_guard import compile_ghost_updates, events_keeping_measures

KvLease = Any
"""A :class:`~calculet.runtime.scheduling.kv.KvLease` (not imported: ``kv`` imports this module)."""

_POOL = KvLanePool.definition
_SUBMIT_GHOSTS, SUBMIT_GHOSTS_SOURCE = compile_ghost_updates(_POOL, "submit")
"""The pool's declared ``submit`` ghosts, generated (None: evaluated from the declaration lane by lane)."""
_INSTANCE = KvSequenceMachine.Instance
"""Its ``fire_each`` is read per call: the monitor installs the variant its configuration needs."""
OPEN_STATES = frozenset(t.source for t in KvSequenceMachine.definition.transitions if t.event == "submit")
"""The states a lane may open a transaction from (``submit``'s sources, from the declaration)."""
KEEPS_TOTALS = events_keeping_measures(_POOL)
"""Events that provably leave every budget total as it was: the batch paths fire them without bookkeeping."""


@quick_init
@dataclass(frozen=True, eq=False)
class KvBatchReservation:
    """§7.1 ``KvBatchReservation``: every lane of a batch checked for ``tokens`` more positions.

    Made by :meth:`KvLaneManager.reserve_batch`, which also records what its check read — each lease's
    lane and lane machine, in lease order, and the pool's owner-change count — so that opening the
    transactions (``submit_batch``), committing them (``commit_batch``) and the job × lane monitor's
    binding use them instead of looking every lane up again while no lane has changed owner (issue #20:
    three per-lane passes per decode step). Built without them (a test's hand-made reservation), those
    paths look the lanes up as before."""

    leases: tuple[KvLease, ...]
    tokens: int = 1
    lanes: tuple[int, ...] = ()
    """Each lease's lane (empty: not recorded)."""
    machines: tuple[Any, ...] = field(default=(), repr=False)
    """Each lane's KvSequenceMachine instance (the manager's own: read, never replaced)."""
    owners: int = -1
    """The pool's owner-change count when checked (:attr:`KvLaneManager.owners_changed`; -1: not recorded)."""


@dataclass(frozen=True, slots=True)
class KvReservationFailure:
    """Why ``reserve_batch`` refused: (lease, reason) for each lane that cannot take the step."""

    problems: tuple[tuple[KvLease, str], ...]


class StaleLease(DefinitionError):
    """A lease that no longer owns its lane was used for a KV operation (a program error)."""

    code = "stale_lease"


class KvBatchOperations:
    """The batch operations of :class:`~calculet.runtime.scheduling.kv.KvLaneManager` (one decode step's lanes)."""

    # the manager's own state and methods, which these operations go through (declared here, defined there)
    _owner: list[int]
    _lanes: list[Any]
    _ghosts: list[dict[str, int]]
    view: Any
    _faults: int
    owners_changed: int
    _checked: Callable[[str], None]
    _fire: Callable[..., None]
    _owned: Callable[[KvLease], int]
    _submit: Callable[[int, int], None]

    def reserve_batch(self, leases: Sequence[KvLease], tokens: int = 1) -> KvBatchReservation | KvReservationFailure:
        """Check that every lane can take ``tokens`` more positions; nothing changes state.

        The transactions open (``submit_batch``) only when the device accepted the job, so a
        refused submit leaves every lane as it was.
        """
        owner, lanes = self._owner, self._lanes
        machines, indices = [], []
        for lease in leases:  # the accepting case first, in one pass (one per decode step, issue #20)
            lane = lease.lane
            machine = lanes[lane]
            if (owner[lane] != lease.lease_id or machine.state not in OPEN_STATES
                    or machine.committed_len + tokens > machine.reserved_len):
                break
            machines.append(machine)
            indices.append(lane)
        else:
            return self.checked_reservation(tuple(leases), tuple(machines), tuple(indices), tokens)
        return self._refusal(leases, tokens)

    def checked_reservation(self, leases: tuple[KvLease, ...], machines: tuple[Any, ...], lanes: tuple[int, ...],
                            tokens: int = 1) -> KvBatchReservation | KvReservationFailure:
        """:meth:`reserve_batch`'s accepting case for leases already checked one by one as it checks them —
        each owns its lane (``lanes[i]``, whose machine is ``machines[i]``, read from :meth:`lease_owners`),
        which is in ``OPEN_STATES`` with room for ``tokens`` more — by the caller's own pass over them (the
        decode tick's selection, issue #20: no second pass per step). What is left is the batch-wide rule, each
        lane once; a lane that appears twice is refused as :meth:`reserve_batch` refuses it."""
        if len(lanes) > 1 and len(set(lanes)) != len(lanes):  # one lane (B1) cannot appear twice: no set built
            return self._refusal(leases, tokens)
        return KvBatchReservation(leases, tokens, lanes, machines, self.owners_changed)

    def _refusal(self, leases: Sequence[KvLease], tokens: int) -> KvReservationFailure:
        """Why :meth:`reserve_batch` refuses ``leases`` (some lane fails its check): each problem, lane by lane."""
        problems: list[tuple[KvLease, str]] = []
        seen: set[int] = set()
        for lease in leases:
            lane = lease.lane
            machine = self._lanes[lane]
            if self._owner[lane] != lease.lease_id:
                problems.append((lease, "stale lease"))
            elif lane in seen:
                problems.append((lease, "lane appears twice in one batch"))
            elif machine.state not in OPEN_STATES:
                problems.append((lease, f"lane is {machine.state}"))
            elif machine.committed_len + tokens > machine.reserved_len:
                problems.append((lease, f"{machine.committed_len}+{tokens} exceeds the reservation "
                                        f"{machine.reserved_len}"))
            seen.add(lane)
        return KvReservationFailure(tuple(problems))

    def submit_batch(self, reservation: KvBatchReservation) -> None:
        """The device accepted the batch: every lane's transaction opens (→ Updating).

        One call per job, not per lane (issue #20): ``submit`` provably keeps every budget total
        (``KEEPS_TOTALS``), so the lanes fire in one generated loop (``fire_each``) on the machines the
        reservation recorded — when no lane changed owner since it was made (:attr:`owners_changed`),
        else after every lease is seen to own its lane still; with monitors on, the declared ghost (the
        bound position) is recorded first, as :meth:`_submit` does."""
        tokens = reservation.tokens
        if "submit" not in KEEPS_TOTALS:
            for lease in reservation.leases:
                self._owned(lease)
                self._submit(lease.lane, tokens)
            self._checked("submit_batch")
            return
        machines: Sequence[Any]  # the reservation's tuples, or lists looked up again
        indices: Sequence[int]
        if reservation.owners == self.owners_changed and reservation.machines:
            machines, indices = reservation.machines, reservation.lanes
        else:
            owner, lanes = self._owner, self._lanes
            found: list[Any] = []
            at: list[int] = []
            for lease in reservation.leases:
                lane = lease.lane
                if owner[lane] != lease.lease_id:
                    raise StaleLease(f"lease {lease.lease_id} no longer owns lane {lane}")
                found.append(lanes[lane])
                at.append(lane)
            machines, indices = found, at
        if MONITOR.enabled:
            record_submit_ghosts(self._ghosts, self.view, indices, tokens)
        _INSTANCE.fire_each(machines, "submit", tokens=[tokens] * len(machines))
        self._checked("submit_batch")

    def commit_batch(self, reservation: KvBatchReservation) -> None:
        """``settle_batch(reservation.leases, ["commit"] * lanes)``, a decode step whose every lane succeeded:
        when no lane changed owner since the reservation (:attr:`owners_changed`) and every lane is
        Updating, the machines it recorded commit in one generated loop; otherwise ``settle_batch``
        decides lane by lane (a stale lease or a settled lane skipped)."""
        machines = reservation.machines
        if reservation.owners == self.owners_changed and machines and "commit" in KEEPS_TOTALS:
            for machine in machines:  # a loop, not a list comprehension: that is a frame of its own on 3.11 (#20)
                if machine.state != "updating":
                    break
            else:
                _INSTANCE.fire_each(machines, "commit")
                self._checked("settle_batch")
                return
        self.settle_batch(reservation.leases, ["commit"] * len(reservation.leases))

    def settle_batch(self, leases: Sequence[KvLease], events: list[str]) -> None:
        """:meth:`settle` for every lane of one job, ``events[i]`` ending ``leases[i]``'s transaction:
        one call and one pool check per job rather than per lane (issue #20). A stale lease or a lane
        without an open transaction is skipped, as :meth:`settle` would refuse it."""
        owner, lanes = self._owner, self._lanes
        first = events[0] if events else ""
        if first in KEEPS_TOTALS and events.count(first) == len(events):  # one event for every lane: one loop
            machines = [lanes[lease.lane] for lease in leases
                        if owner[lease.lane] == lease.lease_id and lanes[lease.lane].state == "updating"]
            _INSTANCE.fire_each(machines, first)
            if first == "fault":
                self._faults += len(machines)
            self._checked("settle_batch")
            return
        faults = 0
        for lease, event in zip(leases, events):
            lane = lease.lane
            if owner[lane] != lease.lease_id:
                continue
            machine = lanes[lane]
            if machine.state != "updating":
                continue
            if event in KEEPS_TOTALS:  # commit/abort/fault: provably no budget total moves
                machine.fire(event)
            else:
                self._fire(lane, event)
            if event == "fault":
                faults += 1
        self._faults += faults
        self._checked("settle_batch")


def record_submit_ghosts(ghosts: list[dict[str, int]], view: Any, lanes: Sequence[int], tokens: int) -> None:
    """The declared ``submit`` ghosts of ``lanes`` (the position each job binds), recorded for the pool monitor:
    ``ghosts`` is every lane's (``KvLaneManager.ghost_list``) and ``view`` the pool's (``KvLaneManager.view``), both
    passed by the manager itself (once per decode step: no two reads through its methods, #20)."""
    if _SUBMIT_GHOSTS is not None:
        _SUBMIT_GHOSTS(ghosts, view.lanes, lanes, tokens)
        return
    ghost = _POOL.ops["submit"].ghost
    for lane in lanes:
        ghosts[lane].update(ghost(view, lane, tokens=tokens))  # type: ignore[misc]
