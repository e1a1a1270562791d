"""Issue #13: ``RetrySlots`` indexes its ghosts (by arrival, by expiry, per tenant) so that no operation walks every
ghost: the same slots, retry times and lanes as the plain rules (:mod:`.retry_reference`), and indexes that stay
bounded by the slots held.

Mutants caught (each checked to fail here): the tenant heap ordered without arrival (ties to the later ghost), a
gone ghost's entry taken again (``gone`` not skipped in the tenant heap), an expired ghost's entry popped twice
(``gone`` not skipped in the expiry heap: the held count drifts), the oldest dropped past the limit counting gone
ghosts, the limit's oldest dropped one per reservation again (a rebuild at every refusal), the batch dropping down
below the limit or not down to it, the indexes never compacted (they grow with every ghost ever placed).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.on_time_retry import RetrySlots
from tests.unit.runtime.scheduling.retry_reference import PlainRetrySlots


OPS = st.lists(st.tuples(st.sampled_from(["reserve", "reserve", "reserve", "admit", "admit", "wait"]),
                         st.integers(0, 40), st.sampled_from(["a", "b", "c"])), min_size=4, max_size=120)


def _held(slots: RetrySlots | PlainRetrySlots) -> list[tuple[float, float, str, int]]:
    return [(g.retry_at, g.length, g.tenant, g.seq) for g in slots.ghosts]


@settings(max_examples=200, deadline=None)
@given(ops=OPS, limit=st.sampled_from([3, 16, 64]), lanes=st.sampled_from([[0.0], [3.0, 5.0]]))
def test_the_indexed_slots_hold_what_the_plain_rules_hold(ops: list[tuple[str, int, str]], limit: int,
                                                          lanes: list[float]) -> None:
    """Reservations (retry times often shared: time stands still between them), admissions and time passing (expiry),
    under and past the limit, against the plain rules (a walk over every ghost for each): the same ghosts held, in
    the same order, the same retry times, the same lanes, and ``len`` counting the held ones."""
    plain, index = PlainRetrySlots(limit=limit), RetrySlots(limit=limit)
    now = 0.0
    for op, x, tenant in ops:
        if op == "reserve":
            got = [s.reserve(list(lanes), tuple(lanes), now, 0.5 + x / 10, 4.0, now, tenant) for s in (plain, index)]
            assert got[0] == got[1] and sorted(plain.free or []) == sorted(index._free or [])
        elif op == "admit":
            plain.admitted(tenant, now)
            index.admitted(tenant, now)
        else:
            now += x / 8
        assert _held(plain) == _held(index) and len(index) == len(plain.ghosts)


def test_ties_go_to_the_slot_placed_first():
    """Two slots of a tenant with one retry time: the admission takes the first placed (the walk's ``min``)."""
    slots = RetrySlots()
    for length in (1.0, 2.0):
        slots.reserve([0.0], 0, 0.0, length, 100.0, 0.0, "a")
    assert slots.ghosts[0].retry_at == slots.ghosts[1].retry_at
    slots.admitted("a", 0.0)
    assert [g.length for g in slots.ghosts] == [2.0]


class _Counting(RetrySlots):
    rebuilds: int = 0

    def _rebuild(self, base: list[float], key: object, now: float) -> None:
        self.rebuilds += 1
        super()._rebuild(base, key, now)


def test_past_the_limit_the_oldest_go_in_batches_so_the_lanes_are_rebuilt_once_per_batch():
    """Issue #13: dropping the oldest slot changes the lanes (the next reservation rebuilds them from every slot);
    one dropped per refusal rebuilt at every refusal once the limit was reached. With ``limit // 8`` dropped at once,
    400 refusals past a limit of 64 rebuild 50 times, and the slots held stay between the limit and 9/8 of it, the
    newest kept."""
    slots = _Counting(limit=64)
    for k in range(64):
        slots.reserve([0.0], 0, 0.0, 1.0, 1e6, 0.0, "a")
    assert slots.rebuilds == 1 and len(slots.ghosts) == 64
    for k in range(400):
        slots.reserve([0.0], 0, 0.0, 1.0, 1e6, 0.0, "a")
        assert 64 <= len(slots.ghosts) <= 72
    assert slots.rebuilds <= 1 + 400 // 8
    assert [g.seq for g in slots.ghosts] == list(range(465 - len(slots.ghosts), 465))


def test_the_indexes_stay_bounded_by_the_slots_held():
    """Issue #13: a gone ghost stays in the indexes until it surfaces; a tenant never admitted again, slots dropped past
    the limit with far retry times (the front's pinned refusals: an hour ahead): 5 000 reservations over 500 s hold at
    most limit + limit // 8 slots, and no index holds more than twice that (compacted once the gone outnumber them)."""
    slots = RetrySlots(limit=64)
    for k in range(5000):
        now = k / 10
        slots.reserve([now + 3600.0 * (k % 2)], k % 7, now, 0.5, 1e4, now, "abcdefgh"[k % 8])
        if k % 5 == 0:
            slots.admitted("a", now)
        bound = 2 * (64 + 64 // 8) + 64
        assert len(slots) <= 72 and len(slots._order) <= bound and len(slots._expiring) <= bound
        assert sum(len(e) for e in slots._by_tenant.values()) <= bound
