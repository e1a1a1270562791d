"""The decode ready set indexes only tenants with work (issue #20, §7.2 item 3, R7.2.3).

A tick merges the heads of the tenants that have ready sequences; a tenant whose sequences all
ended must leave that index, or every later tick walks it (the tick's cost would grow with every
tenant that ever had work). What is chosen must not change.
"""

from __future__ import annotations

import sys

import pytest

from calculet.runtime.scheduling.decode import DecodeBatch
from tests.unit.runtime.runtime_support import Harness

_HELD_64 = sys.getsizeof(dict.fromkeys(f"t{i}" for i in range(64)))
"""The size of a dict that has held 64 tenants: an index with fewer than 64 departed tenants' slots is no larger."""

TENANTS = [{"name": f"t{i}", "weight": 1.0, **({"api_key_sha256": f"{i:064x}"} if i else {})} for i in range(6)]


def _tenants_indexed(h: Harness) -> set[str]:
    return set(h.scheduler.decode._buckets[1].tenants)


@pytest.mark.req("R7.2.3", "R7.1.1")
def test_a_tenant_whose_sequences_ended_leaves_the_index_and_the_rest_are_still_served():
    h = Harness.build(sizes=(4,), lanes=16, tenants=TENANTS)
    long = [h.submit(prompt=8, new=40, tenant="t0").request_id for _ in range(3)]
    short = [h.submit(prompt=8, new=2, tenant=f"t{i}").request_id for i in range(1, 6)]
    h.prefill_all()
    assert _tenants_indexed(h) == {f"t{i}" for i in range(6)}
    served: set[int] = set()
    for _ in range(8):  # every short request gets its one decode step; t0 keeps decoding
        plan = h.step()
        assert isinstance(plan.work, DecodeBatch)
        served |= {lane.request_id for lane in plan.work.active}
        h.run(plan)
        h.confirm_all()
    assert set(short) <= served
    assert all(h.state(r) == "completed" for r in short)
    assert _tenants_indexed(h) == {"t0"}
    batch = h.next_decode()
    assert {lane.request_id for lane in batch.active} == set(long)


@pytest.mark.req("R7.2.3")
def test_a_tenant_comes_back_into_the_index_with_new_work():
    h = Harness.build(sizes=(1,), lanes=8, tenants=TENANTS)
    first = h.submit(prompt=8, new=2, tenant="t1").request_id
    h.prefill_all()
    h.run(h.step())
    h.confirm_all()
    assert h.state(first) == "completed"
    h.step()  # a tick over an empty ready set finds nothing
    assert _tenants_indexed(h) <= {"t1"}
    again = h.submit(prompt=8, new=3, tenant="t1").request_id
    h.prefill_all()
    assert _tenants_indexed(h) == {"t1"}
    assert [lane.request_id for lane in h.next_decode().active] == [again]


@pytest.mark.req("R7.2.3")
def test_the_index_is_rebuilt_once_as_many_tenants_left_as_remain():
    """A dict keeps the slot of a deleted key until it next grows, and iterating it walks those slots: a
    tenant that left the index by deletion alone would still be walked by every tick (3.4 µs a tick with
    4 000 such tenants, a timeit of the walk). Once as many tenants have left as remain (64 at least), the
    next tick rebuilds the index; before that it is kept (amortized O(1) per departure). Mutants: never
    rebuilt (the 99 slots kept) and departures not counted fail the size check; rebuilt at every departure
    rebuilds it at every tick that sees one leave. What is chosen is unchanged (the long requests are served)."""
    tenants = [{"name": f"t{i}", "weight": 1.0, **({"api_key_sha256": f"{i:064x}"} if i else {})}
               for i in range(100)]
    h = Harness.build(sizes=(16,), lanes=128, tenants=tenants)
    long = [h.submit(prompt=8, new=400, tenant="t0").request_id for _ in range(2)]
    short = [h.submit(prompt=8, new=2, tenant=f"t{i}").request_id for i in range(1, 100)]
    h.prefill_all()
    bucket = h.scheduler.decode._buckets[1]
    assert len(bucket.tenants) == 100
    indexes = [bucket.tenants]  # each index the bucket has had (kept alive: identities stay distinct)
    for _ in range(20):  # 16 lanes a tick: 99 short tenants served and gone in 7 ticks
        h.run(h.step())
        h.confirm_all()
        if bucket.tenants is not indexes[-1]:
            indexes.append(bucket.tenants)
    assert len(indexes) <= 3, f"rebuilt {len(indexes) - 1} times for 99 departures"
    assert all(h.state(r) == "completed" for r in short)
    assert set(bucket.tenants) == {"t0"}
    assert sys.getsizeof(bucket.tenants) <= _HELD_64, "the departed tenants' slots are still walked"
    assert {lane.request_id for lane in h.next_decode().active} == set(long)
