"""Fairness (§5.3): the WFQ formulas, exact virtual time, per-flow queueing and weighted shares."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from calculet.runtime.scheduling.fairness import (FairQueue, TokenBucket, WeightedFairClock, exact, virtual_finish, wfq_cost)
from calculet.runtime.request import InferenceRequest
from tests.unit.runtime.runtime_support import Harness


@pytest.mark.req("R5.3.2")
def test_cost_formula():
    assert wfq_cost(100, 10, 8) == 180
    clock = WeightedFairClock({"t": Fraction(1)}, decode_weight=8)
    assert clock.cost(100, 10) == 180


@pytest.mark.req("R5.3.3")
@pytest.mark.parametrize("tenant_vt,global_vt,cost,weight,expected", [
    (0, 0, 180, 1, 180),                            # fresh system
    (500, 100, 180, 1, 680),                        # tenant ahead of global: its own time counts
    (100, 500, 180, 1, 680),                        # idle tenant: restarts from global, no credit
    (100, 500, 180, 2, 590),                        # weight halves the advance
    (Fraction(1, 3), 0, 1, 3, Fraction(2, 3)),      # exact thirds, no rounding
    (0, 0, 10, 0.1, 100),                           # 0.1 is the decimal 1/10, not a binary float
])
def test_virtual_finish_formula(tenant_vt, global_vt, cost, weight, expected):
    assert virtual_finish(tenant_vt, global_vt, cost, weight) == expected


@pytest.mark.req("R5.3.3")
def test_wfq_clock_idle_tenant_gains_no_credit_and_is_exact():
    clock = WeightedFairClock({"a": exact(2.0), "b": exact(1.0), "c": exact(0.1)}, decode_weight=8)
    tag_a = clock.tag("a", 180)
    assert clock.to_fraction(tag_a) == 90
    clock.served("a", tag_a, 180)
    tag_a2 = clock.tag("a", 180)
    assert clock.to_fraction(tag_a2) == 180
    clock.served("a", tag_a2, 180)
    assert clock.global_virtual_time() == 180 and clock.tenant_virtual_time("a") == 180
    # b was idle: it starts at global virtual time (180), not at its own 0
    assert clock.to_fraction(clock.tag("b", 180)) == 360
    assert clock.to_fraction(clock.tag("c", 1)) == 190
    assert clock.to_fraction(clock.step_tag("a")) == 4 and clock.to_fraction(clock.step_tag("c")) == 80


@pytest.mark.req("R5.3.3")
def test_a_tag_is_charged_only_when_its_request_is_served():
    clock = WeightedFairClock({"a": exact(1.0), "b": exact(1.0)}, decode_weight=8)
    first = clock.tag("a", 100)
    assert clock.tag("a", 100) == first           # asking twice charges nothing
    assert clock.tenant_virtual_time("a") == 0 and clock.service() == {}
    clock.served("a", first, 100)
    assert clock.tenant_virtual_time("a") == 100 and clock.service() == {"a": 100}
    # an older, smaller tag served late never moves a tenant's time backwards
    clock.served("a", first - 50 * clock.scale, 10)
    assert clock.tenant_virtual_time("a") == 100


def _serve_all(h: Harness) -> list[str]:
    """Run one-token requests on the single lane until nothing is left; the tenants in service order."""
    order = []
    for _ in range(10_000):
        plan = h.step()
        if plan.work is None:
            break
        order.append(plan.work.record.tenant)
        h.run(plan)
        h.confirm_all()
    return order


@pytest.mark.req("R5.3.1", "R5.3.3")
def test_expired_requests_do_not_charge_their_tenant():
    """Queued requests that expire cost their tenant nothing: it is served at its share at once.

    Regression for the stall the load simulation found: with tags charged on arrival, a tenant
    whose queued requests expired had pushed its virtual time far ahead and then waited for
    the other tenant's whole backlog before its next request was served.
    """
    h = Harness.build(sizes=(1,), lanes=1, admission={"max_sequences": 1, "max_waiting_requests": 1000},
                      tenants=[{"name": "a", "weight": 1.0, "api_key_sha256": "a" * 64}, {"name": "b", "weight": 1.0}])
    blocker = h.submit(prompt=20, new=1, tenant="b")           # holds the only lane
    doomed = [h.submit(prompt=20, new=1, tenant="a", deadline_ms=10) for _ in range(50)]
    h.clock.advance(1.0)
    plan = h.step()                                             # the deadlines pass in the queue
    assert all(h.state(d.request_id) == "failed" for d in doomed)
    assert plan.work is not None and plan.work.record.request_id == blocker.request_id
    h.scheduler.submitted(plan.work.job_id)
    for _ in range(10):
        h.submit(prompt=20, new=1, tenant="b")
    for _ in range(10):
        h.submit(prompt=20, new=1, tenant="a")
    h.complete(plan.work)
    h.confirm_all()
    order = _serve_all(h)
    assert h.sinks[blocker.request_id].outcome.state == "completed"
    # after the blocker, a and b alternate: a's expired requests are not charged to it
    after = order[:10]
    assert after.count("a") == 5 and after.count("b") == 5, order


@pytest.mark.req("R5.3.1", "R5.3.3")
def test_two_saturating_tenants_share_service_by_weight():
    tenants = [{"name": "gold", "weight": 2.0, "api_key_sha256": "a" * 64}, {"name": "bronze", "weight": 1.0}]
    h = Harness.build(sizes=(1,), lanes=1, admission={"max_sequences": 1, "max_waiting_requests": 1000},
                      tenants=tenants)
    for _ in range(60):
        h.submit(prompt=20, new=1, tenant="gold")
        h.submit(prompt=20, new=1, tenant="bronze")
    order = _serve_all(h)
    first = order[:60]
    served = {t: first.count(t) for t in ("gold", "bronze")}
    assert served == {"gold": 40, "bronze": 20}      # cost 28 each: 2:1 service while both saturate
    service = h.scheduler.admission.statistics().tenants
    assert service["gold"].service_tokens == service["bronze"].service_tokens == 60 * 28


@pytest.mark.req("R5.3.7")
def test_weights_never_come_from_the_request():
    names = {f.name for f in dataclasses.fields(InferenceRequest)}
    assert names == {"prompt_tokens", "max_new_tokens", "tenant", "deadline_ms"}
    with pytest.raises(TypeError):
        InferenceRequest(10, 10, weight=100.0)  # type: ignore[call-arg]
    h = Harness.build(sizes=(1,), lanes=4)
    a = h.rec(h.submit(prompt=10, new=10).request_id)
    h2 = Harness.build(sizes=(1,), lanes=4)
    b = h2.rec(h2.submit(prompt=10, new=10).request_id)
    assert a.virtual_finish == b.virtual_finish


@pytest.mark.req("R5.3.4")
def test_a_large_request_is_never_overtaken_forever():
    h = Harness.build(sizes=(1,), lanes=4, kv_tokens=1000, admission={"max_waiting_requests": 1000})
    h.submit(prompt=300, new=10)
    h.submit(prompt=300, new=10)
    big = h.submit(prompt=600, new=10)          # does not fit until the first two end
    smalls = [h.submit(prompt=10, new=2) for _ in range(50)]
    assert h.state(big.request_id) == "waiting_admission"
    # the small ones (later tags) wait behind the big head instead of starving it
    assert all(h.state(s.request_id) == "waiting_admission" for s in smalls)
    h.drive()
    assert h.sinks[big.request_id].outcome.state == "completed"
    assert all(h.sinks[s.request_id].outcome.state == "completed" for s in smalls)


def test_fair_queue_orders_by_tag_with_fifo_flows_parking_and_lazy_removal():
    tags = {"a1": 10, "a2": 30, "b1": 20, "b2": 25}
    q: FairQueue[str] = FairQueue(lambda flow, item: tags[item])
    q.push("a", "a1")
    q.push("a", "a2")
    e = q.push("b", "b1")
    q.push("b", "b2")
    assert q.peek() == ("a", 10, "a1") and q.pop() == "a1"
    assert q.discard(e) and not q.discard(e)
    assert q.peek() == ("b", 25, "b2")
    q.park("b")
    assert q.peek() == ("a", 30, "a2")
    q.unpark(["b"])
    assert q.peek() == ("b", 25, "b2") and q.pop() == "b2"
    assert q.pop() == "a2" and q.peek() is None and len(q) == 0


def test_fair_queue_tags_an_item_when_it_becomes_head_and_keeps_that_tag():
    """Head-of-flow tagging: the tag is computed once, when the item is first seen at the head."""
    tags = {"a1": 10, "a2": 15, "b1": 20}
    q: FairQueue[str] = FairQueue(lambda flow, item: tags[item])
    q.push("a", "a1")
    q.push("a", "a2")
    q.push("b", "b1")
    assert q.peek() == ("a", 10, "a1")
    tags["a1"] = 99                     # a head's tag is fixed once computed
    assert q.peek() == ("a", 10, "a1") and q.pop() == "a1"
    tags["a2"] = 30                     # a2 was not a head yet: it is tagged now
    assert q.peek() == ("b", 20, "b1") and q.pop() == "b1"
    assert q.peek() == ("a", 30, "a2")


def test_token_bucket_is_exact():
    bucket = TokenBucket(Fraction(3), Fraction(3), now=0.0)
    assert [bucket.try_take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.try_take(0.333333)   # time is read in whole microseconds
    assert bucket.try_take(0.333334)
    with pytest.raises(ValueError):
        TokenBucket(Fraction(0), Fraction(1), 0.0)
