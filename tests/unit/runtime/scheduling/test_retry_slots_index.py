"""Issue #13: ``RetrySlots.admitted`` finds a tenant's earliest due slot in a per-tenant heap, and past the limit the
oldest slots go in batches — the same slots taken as the walk over every ghost took, and a bounded number of lane
rebuilds once the limit is reached.

Mutants caught (each checked to fail here): the tenant heap ordered without arrival (ties to the later ghost), a
dropped ghost's entry taken again (``gone`` not skipped), the index kept across an expiry pass (a ghost gone by
expiry taken: ``list.remove`` fails), the limit's oldest dropped one per reservation again (a rebuild at every
refusal), the batch dropping down below the limit or not down to it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculet.runtime.scheduling.on_time_retry import RetrySlots


class _WalkingAdmission(RetrySlots):
    """The reference: a tenant's earliest due slot found by a walk over every ghost, as before the index."""

    def admitted(self, tenant: str, now: float) -> None:
        due = [g for g in self.ghosts if g.tenant == tenant and g.retry_at <= now + self.grace_s]
        if due:
            self.ghosts.remove(min(due, key=lambda g: g.retry_at))
            self._free = None


OPS = st.lists(st.tuples(st.sampled_from(["reserve", "reserve", "reserve", "admit", "admit", "wait"]),
                         st.integers(0, 40), st.sampled_from(["a", "b", "c"])), min_size=4, max_size=120)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, limit=st.sampled_from([3, 16, 64]), lanes=st.sampled_from([[0.0], [3.0, 5.0]]))
def test_the_tenant_index_takes_the_slot_the_walk_takes(ops: list[tuple[str, int, str]], limit: int,
                                                        lanes: list[float]) -> None:
    """Reservations (retry times often shared: time stands still between them), admissions and time passing (expiry
    passes), under and past the limit: the same ghosts held, in the same order, and the same retry times."""
    walk, index = _WalkingAdmission(limit=limit), RetrySlots(limit=limit)
    now = 0.0
    for op, x, tenant in ops:
        if op == "reserve":
            got = [s.reserve(list(lanes), tuple(lanes), now, 0.5 + x / 10, 4.0, now, tenant) for s in (walk, index)]
            assert got[0] == got[1]
        elif op == "admit":
            walk.admitted(tenant, now)
            index.admitted(tenant, now)
        else:
            now += x / 8
        assert [(g.retry_at, g.length, g.tenant, g.seq) for g in walk.ghosts] == [
            (g.retry_at, g.length, g.tenant, g.seq) for g in index.ghosts]


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
