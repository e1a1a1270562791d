"""KvLaneManager (§9): leases, transactions, quarantine, confirmed release, §9.3 gates, statistics."""

from __future__ import annotations

import pytest

from calculet.errors import NotSupported
from calculet.machines.monitor import MONITOR
from calculet.machines import TransitionNotAllowed
from calculet.clock import FakeClock
from calculet.runtime.scheduling.kv import (FreeSequence, KvCapabilities, KvLease, KvLaneManager, KvReservationFailure, NoCapacity,
                                 StaleLease)


def pool(lanes: int = 2, max_seq: int = 64, **caps: bool) -> KvLaneManager:
    return KvLaneManager(lanes, max_seq, capabilities=KvCapabilities(**caps), clock=FakeClock())


@pytest.mark.req("R9.2.5", "R9.3.1")
def test_append_is_a_transaction():
    kv = pool()
    lease = kv.reserve(1, 20)
    assert isinstance(lease, KvLease) and kv.state(lease) == "reserved"
    kv.submit(lease, 8)
    assert kv.state(lease) == "updating" and kv.committed_len(lease) == 0
    kv.commit(lease)
    assert kv.committed_len(lease) == 8
    kv.submit(lease, 1)
    kv.abort(lease)                      # a known failure keeps nothing
    assert kv.committed_len(lease) == 8 and kv.state(lease) == "active"
    kv.submit(lease, 1)
    kv.fault(lease)                      # timeout / CCU fault: unknown, committed_len unchanged
    assert kv.state(lease) == "unknown" and kv.committed_len(lease) == 8
    assert MONITOR.broken(kv.lane(lease.lane)) == []


def test_settle_refuses_an_event_that_is_not_a_settle_even_for_a_stale_lease():
    """A caller's mistake is an error wherever the lease stands. Mutant caught: the event checked only on an owned
    lane with an open step (before the second reading: a stale lease returned False for any event)."""
    kv = pool()
    lease = kv.reserve(1, 20)
    assert isinstance(lease, KvLease)
    assert kv.settle(lease, "commit") is False          # no open step: stale, nothing changes
    with pytest.raises(ValueError, match="commit, abort or fault"):
        kv.settle(lease, "release")
    kv.submit(lease, 2)
    with pytest.raises(ValueError, match="commit, abort or fault"):
        kv.settle(lease, "submit")
    assert kv.state(lease) == "updating" and kv.settle(lease, "commit") and kv.committed_len(lease) == 2


@pytest.mark.req("R9.2.2")
def test_a_lane_is_reused_only_after_the_runtime_confirms_its_release():
    kv = pool(lanes=1)
    lease = kv.reserve(1, 10)
    command = kv.release(lease)
    assert command == FreeSequence(lease.lane, lease.seq_id, 1)
    assert isinstance(kv.reserve(1, 10), NoCapacity)     # releasing: not free yet
    kv.confirm_release(command.lane, command.seq_id)
    again = kv.reserve(1, 10)
    assert isinstance(again, KvLease) and again.lane == lease.lane and again.lease_id != lease.lease_id


@pytest.mark.req("R9.2.6", "R17.3.5")
def test_unknown_is_quarantined_and_a_lease_is_never_freed_twice():
    kv = pool(lanes=2)
    a = kv.reserve(1, 10)
    b = kv.reserve(1, 10)
    kv.fault(a)
    assert kv.release(a) is None                 # owner gone; lane stays Unknown
    assert kv.release(a) is None                 # a second release is refused
    free = kv.release(b)
    assert kv.release(b) is None
    kv.confirm_release(free.lane, free.seq_id)
    lanes = set()
    for _ in range(3):
        lease = kv.reserve(1, 10)
        lanes.add(lease.lane)
        kv.confirm_release(*_confirm(kv.release(lease)))
    assert lanes == {b.lane}                     # the Unknown lane never came back
    stats = kv.statistics()
    assert stats.refused_double_releases == 2 and stats.unknown == 1
    command = kv.recover(a.lane)                 # recovery makes it safe
    kv.confirm_release(command.lane, command.seq_id)
    assert kv.free_lanes == 2


def _confirm(command: FreeSequence) -> tuple[int, int]:
    return command.lane, command.seq_id


@pytest.mark.req("R9.2.3")
def test_lengths_stay_ordered_and_reservations_beyond_max_seq_are_refused():
    kv = pool(max_seq=64)
    assert isinstance(kv.reserve(1, 65), NoCapacity)
    lease = kv.reserve(1, 10)
    with pytest.raises(TransitionNotAllowed):
        kv.submit(lease, 11)
    assert kv.state(lease) == "reserved"


@pytest.mark.req("R9.2.1")
def test_one_seq_one_lane_within_a_generation():
    kv = pool(lanes=3)
    kv.reserve(1, 10, seq_id=42)
    with pytest.raises(Exception, match="one seq, one lane"):
        kv.reserve(1, 10, seq_id=42)
    assert isinstance(kv.reserve(2, 10, seq_id=42), KvLease)  # another generation's seq 42


def test_stale_leases_are_refused_for_operations():
    kv = pool(lanes=1)
    lease = kv.reserve(1, 10)
    kv.confirm_release(*_confirm(kv.release(lease)))
    kv.reserve(1, 10)
    with pytest.raises(StaleLease):
        kv.submit(lease, 1)
    with pytest.raises(StaleLease):
        kv.confirm_release(0, 999)


@pytest.mark.req("R7.1.5")
def test_reserve_batch_checks_without_changing_state():
    kv = pool(lanes=3, max_seq=64)
    a, b, c = kv.reserve(1, 10), kv.reserve(1, 10), kv.reserve(1, 10)
    kv.submit(c, 10)
    kv.commit(c)                                  # c is full
    ok = kv.reserve_batch([a, b])
    assert not isinstance(ok, KvReservationFailure)
    bad = kv.reserve_batch([a, b, c, a])
    assert isinstance(bad, KvReservationFailure)
    assert [(lease.lane, why.split()[0]) for lease, why in bad.problems] == [(c.lane, "10+1"), (a.lane, "lane")]
    assert [kv.state(x) for x in (a, b, c)] == ["reserved", "reserved", "active"]
    kv.submit_batch(ok)
    assert kv.state(a) == kv.state(b) == "updating"


@pytest.mark.req("R7.1.5", "R9.2.5")
def test_a_reservation_is_used_as_recorded_only_while_no_lane_changed_owner():
    """submit_batch/commit_batch read the lanes the reservation recorded (issue #20) only while the pool's
    owners are as they were: a lease released meanwhile is still refused, a lane settled meanwhile skipped."""
    kv = pool(lanes=3, max_seq=64)
    a, b = kv.reserve(1, 10), kv.reserve(1, 10)
    stale = kv.reserve_batch([a, b])
    assert not isinstance(stale, KvReservationFailure)
    kv.release(b)                                 # b's lane changes owner after the check
    with pytest.raises(StaleLease):
        kv.submit_batch(stale)
    assert kv.state(a) == "reserved"              # nothing opened
    c = kv.reserve(1, 10)
    ok = kv.reserve_batch([a, c])
    kv.submit_batch(ok)
    kv.fault(a)                                   # a's transaction ended another way before the result
    kv.commit_batch(ok)
    assert (kv.state(a), kv.state(c), kv.committed_len(c)) == ("unknown", "active", 1)


@pytest.mark.req("R9.3.2", "R9.3.8")
def test_remove_tail_and_shift_are_gated_by_capability():
    kv = pool()
    lease = kv.reserve(1, 30)
    kv.submit(lease, 10)
    kv.commit(lease)
    with pytest.raises(NotSupported, match="RemoveTokensAtEnd"):
        kv.remove_tail(lease, 2)
    with pytest.raises(NotSupported, match="C1/C2"):
        kv.shift(lease, 2)
    enabled = pool(remove_tail=True, shift=True)
    lease = enabled.reserve(1, 30)
    enabled.submit(lease, 10)
    enabled.commit(lease)
    enabled.remove_tail(lease, 3)
    assert enabled.committed_len(lease) == 7
    command = enabled.shift(lease, 2)
    assert command.tokens == 2 and enabled.committed_len(lease) == 5


@pytest.mark.req("R9.3.4", "R9.3.5", "R9.3.6", "R9.3.7", "R9.3.9")
def test_empty_context_operations_raise_not_supported():
    kv = pool(remove_tail=True, shift=True)
    a, b = kv.reserve(1, 10), kv.reserve(1, 10)
    for call in (lambda: kv.copy_prefix(a, b, 4), lambda: kv.keep_one_sequence(a),
                 lambda: kv.position_add_div(a, 0, 4, 1, 2), lambda: kv.save_session(a),
                 lambda: kv.load_session(a, b"")):
        with pytest.raises(NotSupported) as info:
            call()
        assert info.value.http_status == 501 and "§9.3" in str(info.value)


@pytest.mark.req("R16.4")
def test_statistics_track_states_tokens_lane_wait_and_free_latency():
    clock = FakeClock()
    kv = KvLaneManager(2, 64, clock=clock)
    a = kv.reserve(1, 20)
    b = kv.reserve(1, 30)
    assert isinstance(kv.reserve(1, 5), NoCapacity)
    kv.submit(a, 12)
    kv.commit(a)
    kv.submit(b, 1)
    kv.fault(b)
    stats = kv.statistics()
    assert stats.by_state == {"free": 0, "reserved": 0, "active": 1, "updating": 0, "unknown": 1, "releasing": 0}
    assert (stats.tokens_used, stats.tokens_reserved, stats.lane_wait_refusals, stats.unknown) == (12, 50, 1, 1)
    command = kv.release(a)
    clock.advance(0.25)
    kv.confirm_release(command.lane, command.seq_id)
    stats = kv.statistics()
    assert stats.free_latency_max_s == pytest.approx(0.25) and stats.tokens_used == 0 and stats.tokens_reserved == 30


@pytest.mark.req("R9.1.1", "R9.1.2", "R9.2.5")
def test_kv_sequence_has_the_spec_fields_and_states():
    """R9.1.2: the KvSequence record has §9.1's fields, its state a KvSequenceState — Updating while the lane's
    step is open (R9.2.5), projected as ``state`` and ``statistics().by_state`` project it. Mutant caught: the
    record reading the machine's state (never Updating)."""
    from calculet.machines.kv_sequence import KvSequence, KvSequenceState
    kv = pool(lanes=2)
    lease = kv.reserve(3, 10, seq_id=77)
    assert KvSequence._fields == ("seq_id", "hardware_lane", "committed_len", "reserved_len", "generation", "state")
    assert kv.sequence(lease.lane) == (77, lease.lane, 0, 10, 3, "reserved")
    kv.submit(lease, 4)
    record = kv.sequence(lease.lane)
    assert record.state is KvSequenceState.UPDATING is kv.state(lease) and record.committed_len == 0
    assert list(kv.statistics().by_state) == [s.value for s in KvSequenceState]
    assert kv.statistics().by_state == {"free": 1, "reserved": 0, "active": 0, "updating": 1, "unknown": 0,
                                        "releasing": 0}


@pytest.mark.req("R7.1.5")
def test_a_lane_twice_in_one_batch_is_refused_and_one_lane_alone_is_not():
    """The batch-wide rule of a checked reservation (issue #20: no set built for a one-lane batch, every B1 step):
    a lease listed twice is refused as ``reserve_batch`` refuses it; one lane alone is reserved. Mutants caught:
    the duplicate check skipped for two lanes (``len(lanes) > 2``), or dropped."""
    kv = pool(lanes=2, max_seq=64)
    a = kv.reserve(1, 10)
    assert not isinstance(kv.reserve_batch([a]), KvReservationFailure)
    twice = kv.reserve_batch([a, a])
    assert isinstance(twice, KvReservationFailure)
    assert [(lease.lane, why) for lease, why in twice.problems] == [(a.lane, "lane appears twice in one batch")]
    assert kv.state(a) == "reserved"
