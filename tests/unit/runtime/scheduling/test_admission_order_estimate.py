"""Issue #13: on one KV lane the finish estimate follows the §5.3 queue's own order (FakeClock, device by hand)."""

from __future__ import annotations

import pytest

from tests.unit.runtime.runtime_support import Harness
from tests.unit.runtime.scheduling.test_on_time import STEP, drive

TENANTS = [{"name": "a", "weight": 1.0, "api_key_sha256": "a" * 64}, {"name": "b", "weight": 1.0}]


@pytest.mark.req("R5.3.2", "R5.3.3")
def test_an_old_head_of_the_other_tenant_is_estimated_ahead_of_a_newcomer_that_the_queue_serves_after_it():
    """b's long request is tagged when it reaches its flow's head (96 + 256 = 352) and keeps that tag while
    seven short requests of a (cost 32 each) go before it and move global virtual time to 320. A new request
    of a costing 96 is then tagged 416: the queue admits b's request first. Re-tagging b's head from today's
    global time (576) put the newcomer first, and so did reading the newcomer's cost before the queue set it
    (0): its estimate was 3 s early."""
    h = Harness.build(sizes=(1,), lanes=1, step_estimate_s=STEP, admission={"max_sequences": 1}, tenants=TENANTS)
    first = h.submit(prompt=8, new=11, tenant="b").request_id            # on the lane: cost 96
    old = h.submit(prompt=8, new=31, tenant="b").request_id              # cost 256: 3 s of decode
    shorts = [h.submit(prompt=8, new=3, tenant="a").request_id for _ in range(7)]
    drive(h, until=3.0)
    assert h.state(shorts[-1]).startswith("decode") and h.state(old) == "waiting_admission"
    late = h.submit(prompt=8, new=11, tenant="a").request_id             # cost 96, 1 s of decode
    estimate = h.rec(late).estimated_finish
    closed = drive(h)
    assert closed[old] < closed[late]
    # behind a's last short one (done by 3.2) and b's old one (31 steps, its prefill unmeasured): >= 6.2 s
    assert estimate == pytest.approx(closed[late], abs=0.35)
    assert estimate >= 3.2 + 3.0 + 1.0
