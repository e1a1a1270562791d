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

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from calculet.errors import DefinitionError
from calculet.machines import KvSequenceMachine
from calculet.machines.kv_pool import KvLanePool
from calculet.machines.monitor import MONITOR
from calculet.runtime.scheduling.kv_guard import events_keeping_measures

KvLease = Any
"""A :class:`~calculet.runtime.scheduling.kv.KvLease` (not imported: ``kv`` imports this module)."""

_POOL = KvLanePool.definition
_INSTANCE = KvSequenceMachine.Instance
"""Its ``fire_each`` is read per call: the monitor installs the variant its configuration needs."""
OPEN_STATES = frozenset(t.source for t in KvSequenceMachine.definition.transitions if t.event == "commit")
"""The states a lane's step may be open in, and end by a commit from (``commit``'s sources, from the declaration)."""
KEEPS_TOTALS = events_keeping_measures(_POOL)
"""Events that provably leave every budget total as it was: the batch paths fire them without bookkeeping."""
_new_tuple = tuple.__new__


class KvBatchReservation(NamedTuple):
    """§7.1 ``KvBatchReservation``: every lane of a batch checked for ``tokens`` more positions.

    Made by :meth:`KvLaneManager.reserve_batch`, which also records what its check read — each lease's
    lane and lane machine, in lease order, and the pool's owner-change count — so that opening the
    transactions (``submit_batch``), committing them (``commit_batch``) and the job × lane monitor's
    binding use them instead of looking every lane up again while no lane has changed owner (issue #20:
    three per-lane passes per decode step). Built without them (a test's hand-made reservation), those
    paths look the lanes up as before. A named tuple, built once per decode step (issue #20: a third of the
    frozen dataclass's cost), compared and hashed by identity as that dataclass (``eq=False``) was."""

    leases: tuple[KvLease, ...]
    tokens: int = 1
    lanes: tuple[int, ...] = ()
    """Each lease's lane (empty: not recorded)."""
    machines: tuple[Any, ...] = ()
    """Each lane's KvSequenceMachine instance (the manager's own: read, never replaced)."""
    owners: int = -1
    """The pool's owner-change count when checked (:attr:`KvLaneManager.owners_changed`; -1: not recorded)."""

    __eq__ = object.__eq__  # identity, not the fields' values (a tuple's)
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __repr__(self) -> str:  # as the dataclass's was: the machines left out
        return f"KvBatchReservation(leases={self.leases!r}, tokens={self.tokens!r}, lanes={self.lanes!r}, " \
               f"owners={self.owners!r})"


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
    _open: list[int]
    _lanes: list[Any]
    _ghosts: list[dict[str, int]]
    view: Any
    _faults: int
    owners_changed: int
    _checked: Callable[[str], None]
    _fire: Callable[..., None]
    _owned: Callable[[KvLease], int]
    _step_drawn: Callable[[Any], Any]
    steps: Any

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
            if (owner[lane] != lease.lease_id or machine.state not in OPEN_STATES or self._open[lane]
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
        return _new_tuple(KvBatchReservation, (leases, tokens, lanes, machines, self.owners_changed))

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
            elif self._open[lane]:
                problems.append((lease, "lane has a step open"))
            elif machine.committed_len + tokens > machine.reserved_len:
                problems.append((lease, f"{machine.committed_len}+{tokens} exceeds the reservation "
                                        f"{machine.reserved_len}"))
            seen.add(lane)
        return KvReservationFailure(tuple(problems))

    def submit_batch(self, reservation: KvBatchReservation) -> None:
        """The device accepted the batch: every lane's step opens (JobLaneSystem's ``enlist``, no lane event, #20).

        One call per job, not per lane (issue #20): on the lanes the reservation recorded when no lane changed
        owner since it was made (:attr:`owners_changed`), else after every lease is seen to own its lane still."""
        tokens = reservation.tokens
        opened = self._open
        if reservation.owners == self.owners_changed and reservation.machines:
            indices: Sequence[int] = reservation.lanes
        else:
            owner = self._owner
            at: list[int] = []
            for lease in reservation.leases:
                lane = lease.lane
                if owner[lane] != lease.lease_id:
                    raise StaleLease(f"lease {lease.lease_id} no longer owns lane {lease.lane}")
                at.append(lane)
            indices = at
        for lane in indices:
            if opened[lane]:
                raise StaleLease(f"lane {lane} already has a step open")
            opened[lane] = tokens
        self._checked("submit_batch")

    def commit_batch(self, reservation: KvBatchReservation, job: Any = None) -> None:
        """``settle_batch(reservation.leases, ["commit"] * lanes, job)``, a decode step whose every lane succeeded
        (``job``'s end, for the job × lane monitor's step check): when no lane changed owner since the reservation
        (:attr:`owners_changed`) and every lane's step is open, the machines it recorded commit in one generated
        loop; otherwise ``settle_batch`` decides lane by lane (a stale lease or a settled lane skipped)."""
        machines = reservation.machines
        if reservation.owners == self.owners_changed and machines and "commit" in KEEPS_TOTALS:
            opened, tokens = self._open, reservation.tokens
            for lane, machine in zip(reservation.lanes, machines):  # a loop, not a comprehension: no frame (#20)
                if opened[lane] != tokens or machine.state not in OPEN_STATES:  # open, and not faulted meanwhile
                    break
            else:
                steps = self.steps  # the step properties, drawn inline (_step_drawn without its frame, #20)
                pre = steps.before(reservation.lanes) if (
                    steps is not None and MONITOR.enabled and next(MONITOR.draws)) else None
                _INSTANCE.fire_each(machines, "commit", tokens=[tokens] * len(machines))
                for lane in reservation.lanes:
                    opened[lane] = 0
                if pre is not None:
                    steps.after(pre, "commit", job)
                self._checked("settle_batch")
                return
        self.settle_batch(reservation.leases, ["commit"] * len(reservation.leases), job)

    def settle_batch(self, leases: Sequence[KvLease], events: list[str], job: Any = None) -> None:
        """:meth:`settle` for every lane of one job (``job``, whose end settles them: the job × lane monitor's step
        check), ``events[i]`` ending ``leases[i]``'s step: one call and one pool check per job rather than per lane
        (issue #20). A stale lease or a lane without an open step is skipped, as :meth:`settle` would refuse it;
        ``abort`` fires no lane event (the step closes). The step check sees the whole batch as one step (the
        runtime's), with one key per lane and event."""
        owner, lanes, opened = self._owner, self._lanes, self._open
        pre = self._step_drawn([lease.lane for lease in leases])
        faults = 0
        for lease, event in zip(leases, events):
            lane = lease.lane
            if owner[lane] != lease.lease_id:
                continue
            machine = lanes[lane]
            tokens = opened[lane]
            if not tokens or machine.state not in OPEN_STATES:
                continue
            if event == "commit":
                machine.fire("commit", tokens=tokens)
            elif event == "fault":
                machine.fire("fault")
                faults += 1
                continue  # the step stays open (bound) until recover
            opened[lane] = 0
        self._faults += faults
        if pre is not None:
            for event in dict.fromkeys(events):  # each event's lanes, keyed by that event
                self.steps.after([p for p, e in zip(pre, events) if e == event], event, job)
        self._checked("settle_batch")
