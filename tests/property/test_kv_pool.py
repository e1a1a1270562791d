"""§17.2: KvLaneManager against a pure in-memory reference model, driven by random operation sequences.

Hypothesis generates reserve / append (submit → commit | abort) / remove / free / confirm /
cancel / fault / recover / double-free sequences. After every step the implementation and the
reference — plain dicts, written from §9 and the KvSequence document, not from the machines —
must agree lane by lane, and the pool properties must hold: lane uniqueness (R9.2.1), length
ranges (R9.2.3), resources reclaimed at terminal states (R9.2.2), Unknown never reused
(R9.2.6), every lane's declared invariants (``MONITOR.broken(lane) == []``). A failure prints
the replayable step sequence (Hypothesis, ``print_blob`` in the ``ci`` profile).
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from collections import Counter

from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from calculet.errors import NotSupported
from calculet.machines.monitor import MONITOR
from calculet.machines import TransitionNotAllowed
from calculet.clock import FakeClock
from calculet.runtime.scheduling.kv import FreeSequence, KvCapabilities, KvLease, KvLaneManager, NoCapacity, StaleLease

MAX_SEQ = 24
COVERED: Counter[str] = Counter()
DRAWN: Counter[tuple[str, str]] = Counter()
"""(lane state, event) of every KV operation the run drew — "committed" marks a lane that already
held committed tokens, so abort-after-commit is counted apart from abort of a first chunk."""
FIELDS = ("state", "seq", "gen", "committed", "reserved", "pending")


class ReferencePool:
    """The §9 lane pool as plain data: what each lane should look like, and who owns it."""

    def __init__(self, lanes: int, remove_tail: bool) -> None:
        self.remove_tail = remove_tail
        self.lanes = {i: self._empty() for i in range(lanes)}
        self.owner: dict[int, int | None] = {i: None for i in range(lanes)}   # lane -> lease id
        self.quarantined: set[int] = set()

    @staticmethod
    def _empty() -> dict[str, object]:
        return {"state": "free", "seq": 0, "gen": 0, "committed": 0, "reserved": 0, "pending": 0}

    def free_lanes(self) -> set[int]:
        return {i for i, lane in self.lanes.items() if lane["state"] == "free"}

    def owned(self, lease: KvLease) -> dict[str, object] | None:
        return self.lanes[lease.lane] if self.owner[lease.lane] == lease.lease_id else None

    def draw(self, lease: KvLease, event: str) -> None:
        """Record the (state, event) pair an operation is about to apply to the lease's lane."""
        lane = self.owned(lease)
        state = "stale" if lane is None else str(lane["state"])
        if lane is not None and int(lane["committed"]) >= 1 and state in ("active", "updating"):
            state += " committed"
        DRAWN[(state, event)] += 1

    def reserve(self, lane: int, lease: KvLease, tokens: int) -> None:
        assert self.lanes[lane]["state"] == "free"
        self.lanes[lane] = {"state": "reserved", "seq": lease.seq_id, "gen": lease.generation,
                            "committed": 0, "reserved": tokens, "pending": 0}
        self.owner[lane] = lease.lease_id

    def can_submit(self, lease: KvLease, tokens: int) -> bool:
        lane = self.owned(lease)
        return (lane is not None and lane["state"] in ("reserved", "active")
                and lane["committed"] + tokens <= lane["reserved"])

    def submit(self, lease: KvLease, tokens: int) -> None:
        lane = self.lanes[lease.lane]
        lane["state"], lane["pending"] = "updating", tokens

    def commit(self, lease: KvLease) -> None:
        lane = self.lanes[lease.lane]
        lane["committed"] += lane["pending"]
        lane["state"], lane["pending"] = "active", 0

    def abort(self, lease: KvLease) -> None:
        lane = self.lanes[lease.lane]
        lane["state"] = "active" if lane["committed"] else "reserved"
        lane["pending"] = 0

    def fault(self, lease: KvLease) -> None:
        lane = self.lanes[lease.lane]
        lane["state"], lane["pending"] = "unknown", 0
        self.quarantined.add(lease.lane)

    def release(self, lease: KvLease) -> bool:
        """True when the lane goes to Releasing (a free command is due)."""
        lane = self.owned(lease)
        if lane is None:
            return False
        self.owner[lease.lane] = None
        if lane["state"] == "unknown":
            return False
        lane["state"] = "releasing"
        return True

    def recover(self, index: int) -> None:
        self.lanes[index]["state"] = "releasing"
        self.owner[index] = None
        self.quarantined.discard(index)

    def confirm(self, index: int) -> None:
        self.lanes[index] = self._empty()


def _as_reference(kv: KvLaneManager, index: int) -> tuple[str, int]:
    """The lane's state and pending positions as the reference shows them: the reference keeps the §9.2 abstract
    lane, whose Updating is a working lane with its step open (#20: the machine has no such state; the manager
    keeps the open step, ``open_list``)."""
    opened, state = kv.open_list()[index], kv.lane(index).state
    return ("updating", opened) if opened and state in ("reserved", "active") else (state, 0)


class KvPoolMachine(RuleBasedStateMachine):
    @initialize(lanes=st.integers(1, 5), remove_tail=st.booleans())
    def setup(self, lanes: int, remove_tail: bool) -> None:
        self.kv = KvLaneManager(lanes, MAX_SEQ, capabilities=KvCapabilities(remove_tail=remove_tail), clock=FakeClock())
        self.ref = ReferencePool(lanes, remove_tail)
        self.leases: list[KvLease] = []
        self.commands: list[FreeSequence] = []
        self.freed: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ operations

    @rule(gen=st.integers(1, 2), tokens=st.integers(1, MAX_SEQ + 2))
    def reserve(self, gen: int, tokens: int) -> None:
        expect = tokens <= MAX_SEQ and bool(self.ref.free_lanes())
        result = self.kv.reserve(gen, tokens)
        if not expect:
            assert isinstance(result, NoCapacity)
            COVERED["reserve refused"] += 1
            return
        assert isinstance(result, KvLease)
        assert result.lane in self.ref.free_lanes(), "handed out a lane that is not Free"
        assert result.lane not in self.ref.quarantined, "an Unknown lane was reused"
        self.ref.reserve(result.lane, result, tokens)
        self.leases.append(result)
        COVERED["reserve"] += 1

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), tokens=st.integers(1, 6), outcome=st.sampled_from(["commit", "abort", "fault", "hold"]))
    def append(self, data: st.DataObject, tokens: int, outcome: str) -> None:
        able = [x for x in self.leases if self.ref.can_submit(x, tokens)]
        lease = data.draw(st.sampled_from(able or self.leases))
        self.ref.draw(lease, "submit")
        if not self.ref.can_submit(lease, tokens):
            with pytest.raises((TransitionNotAllowed, StaleLease)):
                self.kv.submit(lease, tokens)
            COVERED["append refused"] += 1
            return
        self.kv.submit(lease, tokens)
        self.ref.submit(lease, tokens)
        COVERED[f"append {outcome}"] += 1
        if outcome == "hold":
            return
        self.ref.draw(lease, outcome)
        getattr(self.kv, outcome)(lease)
        getattr(self.ref, outcome)(lease)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), outcome=st.sampled_from(["commit", "abort", "fault"]))
    def finish_update(self, data: st.DataObject, outcome: str) -> None:
        updating = [x for x in self.leases if (self.ref.owned(x) or {}).get("state") == "updating"]
        lease = data.draw(st.sampled_from(updating or self.leases))
        lane = self.ref.owned(lease)
        if outcome == "fault":
            allowed = lane is not None and lane["state"] in ("reserved", "active", "updating")
        else:
            allowed = lane is not None and lane["state"] == "updating"
        self.ref.draw(lease, outcome)
        if not allowed:
            with pytest.raises((TransitionNotAllowed, StaleLease)):
                getattr(self.kv, outcome)(lease)
            return
        getattr(self.kv, outcome)(lease)
        getattr(self.ref, outcome)(lease)
        COVERED[outcome] += 1

    @precondition(lambda self: any((self.ref.owned(x) or {}).get("state") == "updating" for x in self.leases))
    @rule(data=st.data(), outcome=st.sampled_from(["commit", "abort", "fault"]))
    def finish_held_update(self, data: st.DataObject, outcome: str) -> None:
        """A job left in flight (``append`` … ``hold``) completes: without this rule only
        ``finish_update`` reaches an Updating lane, and a seed may never commit one."""
        self.finish_update(data, outcome)

    @precondition(lambda self: any(self.ref.can_submit(x, 1) for x in self.leases))
    @rule(data=st.data(), outcome=st.sampled_from(["abort", "commit", "fault"]))
    def decode_step(self, data: st.DataObject, outcome: str) -> None:
        """§17.2: a one-token decode step on a lane that already holds committed tokens (after a
        committed prefill chunk, taken first if the lane has none) — where an abort that commits
        would show (issue #17: the ``ci`` profile drew no abort on such a lane before this rule)."""
        lease = data.draw(st.sampled_from([x for x in self.leases if self.ref.can_submit(x, 1)]))
        if int((self.ref.owned(lease) or {}).get("committed", 0)) == 0:
            self.append(_Script(lease), 1, "commit")
        if self.ref.can_submit(lease, 1):
            self.append(_Script(lease), 1, outcome)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), tokens=st.integers(1, 4))
    def remove(self, data: st.DataObject, tokens: int) -> None:
        active = [x for x in self.leases if (self.ref.owned(x) or {}).get("state") == "active"]
        lease = data.draw(st.sampled_from(active or self.leases))
        if not self.ref.remove_tail:
            with pytest.raises(NotSupported):
                self.kv.remove_tail(lease, tokens)
            COVERED["remove not supported"] += 1
            return
        lane = self.ref.owned(lease)
        if lane is None or lane["state"] != "active" or tokens >= lane["committed"]:
            with pytest.raises((TransitionNotAllowed, StaleLease)):
                self.kv.remove_tail(lease, tokens)
            return
        self.kv.remove_tail(lease, tokens)
        lane["committed"] -= tokens
        COVERED["remove"] += 1

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """The owner ended: release (twice sometimes — the second must free nothing)."""
        lease = data.draw(st.sampled_from(self.leases))
        lane = self.ref.owned(lease)
        if lane is not None and lane["state"] == "updating":
            with pytest.raises(TransitionNotAllowed):
                self.kv.release(lease)   # a job is writing it: the owner must wait for the drain
            return
        expect_command = self.ref.release(lease)
        command = self.kv.release(lease)
        assert (command is not None) == expect_command
        if command is not None:
            assert (command.lane, command.seq_id) == (lease.lane, lease.seq_id)
            self.commands.append(command)
        COVERED["free" if command is not None else "free refused or quarantined"] += 1

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel: a running job drains (known failure → abort) before the lane is released."""
        lease = data.draw(st.sampled_from(self.leases))
        lane = self.ref.owned(lease)
        if lane is not None and lane["state"] == "updating":
            self.ref.draw(lease, "abort")
            self.kv.abort(lease)
            self.ref.abort(lease)
            COVERED["cancel drains"] += 1
        expect_command = self.ref.release(lease)
        command = self.kv.release(lease)
        assert (command is not None) == expect_command
        if command is not None:
            self.commands.append(command)

    @precondition(lambda self: self.commands)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        """The runtime confirms a free, in any order."""
        command = data.draw(st.sampled_from(self.commands))
        self.commands.remove(command)
        self.kv.confirm_release(command.lane, command.seq_id)
        self.ref.confirm(command.lane)
        self.freed.append((command.lane, command.seq_id))
        COVERED["confirm"] += 1

    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        unknown = sorted(i for i, lane in self.ref.lanes.items() if lane["state"] == "unknown")
        if not unknown:
            return
        index = data.draw(st.sampled_from(unknown))
        self.commands.append(self.kv.recover(index))
        self.ref.recover(index)
        COVERED["recover"] += 1

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_reference(self) -> None:
        for index, expected in self.ref.lanes.items():
            machine = self.kv.lane(index)
            state, pending = _as_reference(self.kv, index)
            actual = dict(zip(FIELDS, (state, machine.seq_id, machine.generation, machine.committed_len,
                                       machine.reserved_len, pending)))
            assert actual == expected, (index, actual, expected)
            assert MONITOR.broken(machine) == []

    @invariant()
    def lanes_are_unique(self) -> None:
        held = [(lane["gen"], lane["seq"]) for lane in self.ref.lanes.values() if lane["state"] != "free"]
        assert len(held) == len(set(held))
        owners = [o for o in self.ref.owner.values() if o is not None]
        assert len(owners) == len(set(owners))

    @invariant()
    def lengths_in_range(self) -> None:
        for index in self.ref.lanes:
            m = self.kv.lane(index)
            assert 0 <= m.committed_len and m.committed_len + _as_reference(self.kv, index)[1] <= m.reserved_len <= MAX_SEQ

    @invariant()
    def terminal_lanes_hold_nothing(self) -> None:
        stats = self.kv.statistics()
        free = self.ref.free_lanes()
        assert stats.free_lanes == len(free) == stats.by_state["free"]
        for index in free:
            assert self.ref.owner[index] is None
        used = sum(int(lane["committed"]) for lane in self.ref.lanes.values())
        reserved = sum(int(lane["reserved"]) for lane in self.ref.lanes.values())
        assert (stats.tokens_used, stats.tokens_reserved) == (used, reserved)
        assert stats.unknown == sum(lane["state"] == "unknown" for lane in self.ref.lanes.values())
        assert len(self.freed) == len(set(self.freed)), "a sequence was freed twice"
        assert stats.confirmed_releases == len(self.freed)

    @invariant()
    def unknown_is_quarantined(self) -> None:
        for index in self.ref.quarantined:
            assert self.kv.lane(index).state == "unknown"


EVERY_PATH = {"reserve", "reserve refused", "append commit", "append abort", "append fault", "append hold",
              "append refused", "commit", "abort", "fault", "remove", "remove not supported", "free",
              "free refused or quarantined", "cancel drains", "confirm", "recover"}


class _Script:
    """Stands in for Hypothesis's ``data`` in the directed run: each draw takes the next value."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object, label: object = None) -> object:
        return self.values.pop(0)


def _checked(machine: KvPoolMachine) -> KvPoolMachine:
    for check in (machine.matches_reference, machine.lanes_are_unique, machine.lengths_in_range,
                  machine.terminal_lanes_hold_nothing, machine.unknown_is_quarantined):
        check()
    return machine


def test_every_path_matches_the_reference_model_directed():
    """Every path the random run must reach, taken once in a fixed order, compared with the
    reference after each step: the random run's coverage no longer rests on one seed's luck."""
    COVERED.clear()
    m = KvPoolMachine()
    m.setup(lanes=2, remove_tail=True)
    m.reserve(gen=1, tokens=4)
    lease = m.leases[0]
    m.reserve(gen=1, tokens=MAX_SEQ + 1)
    steps = [("append", _Script(lease), 2, "commit"), ("append", _Script(lease), 1, "abort"),
             ("append", _Script(lease), 6, "hold"), ("append", _Script(lease), 1, "hold"),
             ("finish_update", _Script(lease), "commit"), ("append", _Script(lease), 1, "hold"),
             ("finish_update", _Script(lease), "abort"), ("remove", _Script(lease), 1),
             ("append", _Script(lease), 1, "hold"), ("cancel", _Script(lease))]
    for name, *args in steps:
        getattr(_checked(m), name)(*args)
    m.confirm(_Script(m.commands[0]))
    m.reserve(gen=2, tokens=3)
    m.free(_Script(m.leases[-1]))
    m.free(_Script(m.leases[-1]))
    m.reserve(gen=2, tokens=3)
    m.append(_Script(m.leases[-1]), 1, "fault")
    m.recover(_Script(m.leases[-1].lane))
    for command in list(m.commands):
        _checked(m).confirm(_Script(command))
    m.reserve(gen=1, tokens=2)
    m.finish_update(_Script(m.leases[-1]), "fault")
    _checked(m)
    other = KvPoolMachine()
    other.setup(lanes=1, remove_tail=False)
    other.reserve(gen=1, tokens=2)
    other.remove(_Script(other.leases[0]), 1)
    _checked(other)
    assert EVERY_PATH <= set(COVERED), sorted(EVERY_PATH - set(COVERED))


# The (lane state, event) pairs the random run must draw: every transaction outcome on a first
# chunk and on a lane that already holds committed tokens (abort-after-commit included).
REQUIRED_PAIRS = {("reserved", "submit"), ("active committed", "submit"), ("updating", "commit"),
                  ("updating", "abort"), ("updating", "fault"), ("updating committed", "commit"),
                  ("updating committed", "abort"), ("updating committed", "fault")}


@pytest.mark.req("R17.2.1", "R17.2.2", "R17.2.3", "R17.2.4", "R17.2.5", "R17.2.6",
                 "R9.2.1", "R9.2.2", "R9.2.3", "R9.2.5", "R9.2.6", "R9.3.1", "R9.3.2")
def test_kv_pool_matches_the_reference_model():
    """The pool's declared invariants and the manager's indexes are monitored after every
    operation (conftest turns monitors on; kv_checks raises), and the run must draw every pair
    of REQUIRED_PAIRS — abort on a lane with committed tokens among them (R9.2.5)."""
    COVERED.clear()
    DRAWN.clear()
    run_state_machine_as_test(KvPoolMachine)
    assert REQUIRED_PAIRS <= set(DRAWN), sorted(REQUIRED_PAIRS - set(DRAWN))
    assert DRAWN[("updating committed", "abort")] >= 1  # abort after commit (issue #17: 0 before)
    # The directed test takes every path; random sequences must still reach most of them (which
    # few a seed misses shifts with any edit of the machine class, which seeds the ci profile).
    reached = EVERY_PATH & set(COVERED)
    assert len(reached) >= 0.75 * len(EVERY_PATH), sorted(EVERY_PATH - reached)
