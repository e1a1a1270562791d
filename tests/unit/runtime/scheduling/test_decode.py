"""DecodeScheduler (§7.1–7.3) and the §17.1 pure scheduling unit tests, on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.errors import DefinitionError
from calculet.runtime.scheduling.admission import ModelAvailability
from calculet.runtime.scheduling.decode import DecodeBatch, NoBatch, NoBatchReason
from calculet.runtime.scheduling.profiles import ProfileSpec
from tests.unit.runtime.runtime_support import FILL_TOKEN, Harness, default_token, profile


def ready_harness(count: int, size: int, **kwargs) -> Harness:
    h = Harness.build(sizes=(size,), lanes=max(count, 1) + 4, **kwargs)
    for i in range(count):
        h.submit(prompt=10 + i, new=50)
    h.prefill_all()
    assert h.scheduler.decode.ready_count(1) == count
    return h


@pytest.mark.req("R17.1.1", "R7.1.1", "R7.1.2", "R7.1.3", "R7.1.4", "R9.2.4", "R7.3.1")
@pytest.mark.parametrize("size", [1, 4, 8, 16])
def test_lane_selection_with_0_to_B_plus_1_ready(size):
    for ready in range(size + 2):
        h = ready_harness(ready, size)
        plan = h.step()
        if ready == 0:
            assert plan.work is None
            continue
        batch = plan.work
        assert isinstance(batch, DecodeBatch)
        active = min(ready, size)
        assert len(batch.active) == active
        for array, dtype in ((batch.token_ids, np.int32), (batch.positions, np.int32), (batch.lane_valid, np.uint8)):
            assert array.shape == (size,) and array.dtype == dtype
        assert batch.lane_valid.tolist() == [1] * active + [0] * (size - active)
        for lane in batch.active:
            rec = h.rec(lane.request_id)
            assert batch.positions[lane.lane] == h.kv.committed_len(rec.lease) == rec.machine.kv_length
            assert batch.token_ids[lane.lane] == rec.last_token
        # inactive lanes carry the profile's fill token, never a default 0
        assert all(t == FILL_TOKEN for t in batch.token_ids[active:])
        assert 0 not in batch.token_ids[active:].tolist()
        # the same lanes as plain ints (issue #20: for the device job, no conversion back per step)
        assert (batch.lane_tokens, batch.lane_positions, batch.lane_flags) == (
            tuple(batch.token_ids.tolist()), tuple(batch.positions.tolist()), tuple(batch.lane_valid.tolist()))
        h.scheduler.submit_failed(batch.job_id)
        assert h.scheduler.decode.ready_count(1) == ready


@pytest.mark.req("R17.1.2", "R7.2.1")
def test_cancelled_expired_and_generation_mismatched_are_skipped():
    h = Harness.build(sizes=(4,), lanes=12)
    ids = [h.submit(prompt=10, new=20, deadline_ms=60_000 if i == 1 else None).request_id for i in range(4)]
    h.prefill_all()
    h.scheduler.cancel(ids[0])                     # cancelled while ready
    h.clock.advance(61)                            # ids[1] passes its deadline
    batch = h.next_decode()
    assert {b.request_id for b in batch.active} == {ids[2], ids[3]}
    assert h.state(ids[0]) == "cancelled" and h.sinks[ids[0]].outcome.http_status == 499
    assert h.state(ids[1]) == "failed" and h.sinks[ids[1]].outcome.http_status == 504
    h.scheduler.submit_failed(batch.job_id)

    # the decode scheduler alone: a batch for generation 2 never takes generation-1 sequences
    d = h.scheduler.decode
    assert d.ready_count(1) == 2
    result = d.build_decode_batch(profile(4), 2, h.clock.now(), job_id=999)
    assert isinstance(result, NoBatch) and result.reason is NoBatchReason.EMPTY
    assert d.ready_count(1) == 2


@pytest.mark.req("R17.1.2", "R7.2.1")
def test_expired_candidate_found_at_build_time_is_reported_not_batched():
    h = Harness.build(sizes=(4,), lanes=8)
    a = h.submit(prompt=10, new=20, deadline_ms=5_000).request_id
    b = h.submit(prompt=10, new=20).request_id
    h.prefill_all()
    h.clock.advance(6)
    result = h.scheduler.decode.build_decode_batch(profile(4), 1, h.clock.now(), job_id=500)
    assert isinstance(result, DecodeBatch)
    assert [x.request_id for x in result.active] == [b]
    assert [r.request_id for r in result.expired] == [a]


@pytest.mark.req("R7.2.2")
def test_earliest_deadline_first():
    h = Harness.build(sizes=(4,), lanes=12, batch={"deadline_order": "strict"})
    deadlines = [90_000, 30_000, 70_000, 10_000, 50_000, 20_000]
    ids = [h.submit(prompt=8, new=20, deadline_ms=d).request_id for d in deadlines]
    h.prefill_all()
    batch = h.next_decode()
    chosen = {b.request_id for b in batch.active}
    by_deadline = [rid for _, rid in sorted(zip(deadlines, ids))]
    assert chosen == set(by_deadline[:4])


def _timed_step(h: Harness, seconds: float = 0.1) -> DecodeBatch:
    """One decode job that takes ``seconds`` on the fake clock (so the measured step time is it)."""
    plan = h.step()
    batch = plan.work
    assert isinstance(batch, DecodeBatch)
    h.scheduler.submitted(batch.job_id)
    h.clock.advance(seconds)
    h.complete(batch)
    return batch


@pytest.mark.req("R7.2.2")
def test_at_risk_deadlines_go_first_by_deadline():
    """'at_risk' order: candidates whose deadline is within 2 x their remaining decode time lead, by deadline."""
    h = Harness.build(sizes=(4,), lanes=12, step_estimate_s=0.1, batch={"deadline_order": "at_risk"})
    # 20 tokens at 0.1 s/step: at risk when the deadline is within 4 s
    deadlines = [90_000, 3_000, 70_000, 2_000, 50_000, 3_500]
    ids = [h.submit(prompt=8, new=20, deadline_ms=d).request_id for d in deadlines]
    h.prefill_all()
    batch = h.next_decode()
    at_risk = {ids[1], ids[3], ids[5]}
    chosen = {b.request_id for b in batch.active}
    assert at_risk <= chosen


def _four_streams(**sections: object) -> tuple[Harness, list[int]]:
    """B1, four streams with the default 120 s deadline arriving 1 s apart, all prefilled."""
    h = Harness.build(sizes=(1,), lanes=8, step_estimate_s=0.1, **sections)
    ids = []
    for _ in range(4):
        ids.append(h.submit(prompt=8, new=100).request_id)
        h.clock.advance(1.0)
    h.prefill_all()
    return h, ids


@pytest.mark.req("R7.2.2", "R7.2.3")
@pytest.mark.parametrize("sections", [{"batch": {"deadline_order": "at_risk"}},
                                      {"admission": {"itl_target_ms": 5_000}}], ids=["at_risk", "on_time-itl"])
def test_streams_not_at_risk_rotate_under_at_risk_and_under_a_latency_target(sections):
    """Round robin, not serial: ``at_risk`` rotates whoever is not at risk; ``on_time`` with an ITL
    target rotates the decode set its cap sized for a rotation."""
    h, ids = _four_streams(**sections)
    served = [_timed_step(h).active[0].request_id for _ in range(40)]
    assert {i: served.count(i) for i in ids} == {i: 10 for i in ids}


@pytest.mark.req("R7.2.2")
@pytest.mark.parametrize("order", ["strict", "on_time"])
def test_without_a_latency_target_the_earliest_deadline_decodes_first(order):
    """``strict``, and the default ``on_time`` with no ITL target: by deadline (§7.2 item 2) — the order
    the on_time planner's EDF schedule proved feasible at admission, so its finish estimates hold."""
    h, ids = _four_streams(batch={"deadline_order": order})
    assert {_timed_step(h).active[0].request_id for _ in range(40)} == {ids[0]}


@pytest.mark.req("R7.2.2")
def test_a_stream_is_promoted_when_its_deadline_comes_at_risk():
    h = Harness.build(sizes=(1,), lanes=8, step_estimate_s=0.1, batch={"deadline_order": "at_risk"})
    urgent = h.submit(prompt=8, new=100, deadline_ms=100_000).request_id
    relaxed = h.submit(prompt=8, new=100, deadline_ms=200_000).request_id
    h.prefill_all()
    early = [_timed_step(h).active[0].request_id for _ in range(10)]
    assert early.count(urgent) == early.count(relaxed) == 5
    # 94 tokens left at 0.1 s: at risk from 100 - 2 * 9.4 = 81.2 s
    h.clock.advance(81.0 - h.clock.now())
    assert [_timed_step(h).active[0].request_id for _ in range(2)] == [urgent, relaxed]
    h.clock.advance(1.0)
    late = [_timed_step(h).active[0].request_id for _ in range(10)]
    assert late == [urgent] * 10
    assert h.scheduler.statistics().step_times.decode_step_s == pytest.approx(0.1)


@pytest.mark.req("R7.2.3", "R17.1.3")
def test_equal_deadlines_ordered_by_virtual_finish_and_rotate_by_weight():
    tenants = [{"name": "heavy", "weight": 3.0, "api_key_sha256": "a" * 64}, {"name": "light", "weight": 1.0}]
    h = Harness.build(sizes=(1,), lanes=8, tenants=tenants, batch={"max_tenant_lane_share": 1.0})
    heavy = [h.submit(prompt=8, new=200, tenant="heavy").request_id for _ in range(2)]
    light = [h.submit(prompt=8, new=200, tenant="light").request_id for _ in range(2)]
    h.prefill_all()
    served = {"heavy": 0, "light": 0}
    for _ in range(80):
        plan = h.step()
        batch = plan.work
        assert isinstance(batch, DecodeBatch)
        served[batch.active[0].tenant] += 1
        h.run(plan)
    # all deadlines are equal (same arrival); service follows the 3:1 weights
    assert served["heavy"] == 60 and served["light"] == 20
    # within a tenant, equal tags rotate: both heavy sequences advanced alike
    lengths = [h.rec(r).machine.generated_tokens for r in heavy]
    assert abs(lengths[0] - lengths[1]) <= 1
    lengths = [h.rec(r).machine.generated_tokens for r in light]
    assert abs(lengths[0] - lengths[1]) <= 1


@pytest.mark.req("R17.1.3", "R7.2.4")
def test_tenant_lane_share_cap_unless_no_one_else_waits():
    tenants = [{"name": "big", "api_key_sha256": "b" * 64}, {"name": "small"}]
    h = Harness.build(sizes=(8,), lanes=20, tenants=tenants, batch={"max_tenant_lane_share": 0.5})
    for _ in range(10):
        h.submit(prompt=8, new=50, tenant="big")
    for _ in range(2):
        h.submit(prompt=8, new=50, tenant="small")
    h.prefill_all()
    batch = h.next_decode()
    by_tenant = {t: sum(1 for b in batch.active if b.tenant == t) for t in ("big", "small")}
    # cap 4 of 8 lanes for 'big' while 'small' has candidates; 'small' has only 2, so big may
    # then exceed the cap to fill the batch (no one else is waiting)
    assert by_tenant["small"] == 2
    assert by_tenant["big"] == 6
    h.scheduler.submit_failed(batch.job_id)

    h2 = Harness.build(sizes=(8,), lanes=24, tenants=tenants, batch={"max_tenant_lane_share": 0.5})
    for _ in range(10):
        h2.submit(prompt=8, new=50, tenant="big")
        h2.submit(prompt=8, new=50, tenant="small")
    h2.prefill_all()
    batch = h2.next_decode()
    assert sum(1 for b in batch.active if b.tenant == "big") == 4
    assert sum(1 for b in batch.active if b.tenant == "small") == 4

    h3 = Harness.build(sizes=(8,), lanes=20, tenants=tenants, batch={"max_tenant_lane_share": 0.5})
    for _ in range(10):
        h3.submit(prompt=8, new=50, tenant="big")
    h3.prefill_all()
    assert len(h3.next_decode().active) == 8  # only one tenant: the cap does not apply


@pytest.mark.req("R17.1.4", "R7.2.5", "R7.2.6", "R17.1.7")
def test_batching_window_always_fires():
    h = Harness.build(sizes=(16,), lanes=20, batch={"batching_window_us": 5_000})
    rid = h.submit(prompt=8, new=50).request_id
    h.prefill_all()
    start = h.rec(rid).ready_since
    plan = h.step()
    assert plan.work is None and plan.wake_at == pytest.approx(start + 0.005)
    h.clock.set(plan.wake_at - 0.0001)
    assert h.step().work is None
    h.clock.set(plan.wake_at)
    batch = h.next_decode()
    assert len(batch.active) == 1 and batch.wait_s == pytest.approx(0.005)


@pytest.mark.req("R7.2.5")
def test_batching_window_never_waits_past_the_earliest_deadline():
    h = Harness.build(sizes=(16,), lanes=20, batch={"batching_window_us": 2_000_000}, step_estimate_s=0.01)
    rid = h.submit(prompt=8, new=50, deadline_ms=500).request_id
    h.prefill_all()
    plan = h.step()
    deadline = h.rec(rid).deadline
    assert plan.work is None and plan.wake_at == pytest.approx(deadline - 0.01)
    h.clock.set(plan.wake_at)
    batch = h.next_decode()
    assert [b.request_id for b in batch.active] == [rid]


@pytest.mark.req("R7.2.6", "R15.13")
def test_default_window_sends_a_partial_batch_at_the_first_tick():
    h = Harness.build(sizes=(16,), lanes=20)
    h.submit(prompt=8, new=50)
    h.prefill_all()
    batch = h.next_decode()
    assert len(batch.active) == 1 and batch.profile.compiled_batch == 16


@pytest.mark.req("R7.2.5")
def test_a_full_batch_does_not_wait_for_the_window():
    h = Harness.build(sizes=(4,), lanes=8, batch={"batching_window_us": 1_000_000})
    for _ in range(4):
        h.submit(prompt=8, new=50)
    h.prefill_all()
    assert len(h.next_decode().active) == 4


@pytest.mark.req("R7.1.5", "R7.4.4")
def test_kv_reservation_failure_is_a_value_and_produces_no_batch():
    h = Harness.build(sizes=(4,), lanes=8)
    ids = [h.submit(prompt=8, new=50).request_id for _ in range(3)]
    h.prefill_all()
    bad = h.rec(ids[1])
    h.kv.submit(bad.lease, 1)  # a step of the lane's last job (its prefill's) left open ...
    h.kv.fault(bad.lease)  # ... and faulted, e.g. a recovery fenced this lane: its input cannot be submitted
    d = h.scheduler.decode
    result = d.build_decode_batch(profile(4), 1, h.clock.now(), job_id=77)
    assert isinstance(result, NoBatch) and result.reason is NoBatchReason.KV_RESERVATION
    assert [r.request_id for r in result.refused] == [ids[1]]
    assert d.ready_count(1) == 3  # nothing was consumed
    # through the scheduler: the bad lane's request fails before any submit, and the step
    # builds the batch again without it
    batch = h.next_decode()
    assert h.state(ids[1]) == "failed"
    assert {b.request_id for b in batch.active} == {ids[0], ids[2]}
    assert h.kv.statistics().by_state["unknown"] == 1  # the fenced lane stays quarantined


@pytest.mark.req("R7.3.1")
def test_partial_batch_without_inactive_policy_is_refused_not_zero_padded():
    h = Harness.build(sizes=(1,), lanes=4)
    h.submit(prompt=8, new=50)
    h.prefill_all()
    no_policy = ProfileSpec(4, 8192, None, True)
    with pytest.raises(DefinitionError, match="token 0"):
        h.scheduler.decode.build_decode_batch(no_policy, 1, h.clock.now(), job_id=5)
    assert h.scheduler.decode.ready_count(1) == 1


@pytest.mark.req("R7.1.3")
def test_context_full_sequence_is_not_bound():
    h = Harness.build(sizes=(4,), lanes=4, max_seq=64)
    rid = h.submit(prompt=30, new=30).request_id
    h.prefill_all()
    small = profile(4, max_seq=30)
    result = h.scheduler.decode.build_decode_batch(small, 1, h.clock.now(), job_id=9)
    assert isinstance(result, NoBatch)
    assert [r.request_id for r, _ in result.invalid] == [rid]


def test_decode_statistics_report_fill_and_waste():
    h = Harness.build(sizes=(4,), lanes=8)
    for _ in range(3):
        h.submit(prompt=8, new=50)
    h.prefill_all()
    plan = h.step()
    h.run(plan)
    stats = h.scheduler.decode.statistics()
    assert (stats.last_compiled_batch, stats.last_active_lanes) == (4, 3)
    assert stats.lane_waste == 1 and stats.fill_ratio == pytest.approx(0.75)


def test_generation_switch_ends_requests_of_the_old_generation():
    h = Harness.build(sizes=(1,), lanes=4)
    rid = h.submit(prompt=8, new=50).request_id
    h.prefill_all()
    h.scheduler.set_model(2, ModelAvailability.READY)
    assert h.state(rid) == "failed"
    assert h.confirm_all() == 1


def test_tokens_follow_the_positions():
    h = Harness.build(sizes=(4,), lanes=4)
    rid = h.submit(prompt=8, new=4).request_id
    h.drive()
    assert h.sinks[rid].tokens == [default_token(rid, p) for p in (8, 9, 10, 11)]
    assert h.scheduler.idle()


@pytest.mark.req("R2.6", "R2.4")
def test_decode_batch_carries_the_spec_fields():
    names = set(DecodeBatch._fields)
    assert {"generation", "profile", "active", "lane_tokens", "lane_positions", "lane_flags", "kv"} <= names
    h = ready_harness(2, 4)
    batch = h.next_decode()
    # the host tensors of §2, as arrays (built from the lanes' ints when read)
    assert [len(a) for a in (batch.token_ids, batch.positions, batch.lane_valid)] == [4, 4, 4]
    lane = batch.active[0]
    rec = h.rec(lane.request_id)
    # each active lane names the SequenceState facts: request, seq, generation, lane, deadline
    assert (lane.request_id, lane.seq_id, lane.generation, lane.kv_lane, lane.deadline) == (
        rec.request_id, rec.lease.seq_id, rec.generation, rec.lease.lane, rec.deadline)
    assert batch.kv.leases == tuple(h.rec(b.request_id).lease for b in batch.active)


@pytest.mark.req("R8.1")
@pytest.mark.parametrize("window_us", [0, 10_000_000])
def test_oldest_wait_is_the_oldest_ready_sequence_age_with_or_without_a_batching_window(window_us):
    """select_profile's ``oldest_wait`` (§8) was ``now`` itself when no window was configured (the
    Ready-time heap was kept only for the window); it is the oldest Ready sequence's age. Without a
    window it is read from the Ready entries, with one from the arrivals the window keeps (issue #20):
    the same ages either way."""
    h = Harness.build(sizes=(1,), lanes=4, batch={"batching_window_us": window_us})
    decode = h.scheduler.decode
    assert decode.window_s == window_us / 1e6
    h.clock.advance(100)
    h.submit(prompt=8, new=50)
    h.prefill_all()
    h.clock.advance(2)
    h.submit(prompt=8, new=50)
    h.prefill_all()
    h.clock.advance(3)
    now = h.clock.now()
    assert decode.oldest_wait(1, now) == pytest.approx(5)
    batch = h.next_decode()  # B1: the oldest goes to the device
    assert decode.oldest_wait(1, h.clock.now()) == pytest.approx(3)
    h.scheduler.submit_failed(batch.job_id)  # back to Ready with its own ready time
    assert decode.oldest_wait(1, h.clock.now()) == pytest.approx(5)


def test_a_batch_is_a_named_tuple_with_every_field_compared_by_identity():
    """DecodeBatch is a named tuple (issue #20: built once per token on B1, a third of the frozen dataclass's cost):
    every field in declaration order, the two defaults, immutable, and compared and hashed by identity as the
    dataclass (``eq=False``) was."""
    import numpy as np

    from calculet.runtime.scheduling.decode import DecodeBatch

    values = (3, 1, object(), (), (5, -1), (7, 0), (1, 0), object(), 1.5, 0.25,
              (object(),), (object(),), ((object(), "why"),))
    batch = DecodeBatch(*values)
    names = list(DecodeBatch._fields)
    assert names[:4] == ["job_id", "generation", "profile", "active"] and len(names) == len(values)
    assert all(getattr(batch, n) is v for n, v in zip(names, values))
    assert DecodeBatch(*values[:11]).expired == () == DecodeBatch(*values[:11]).invalid
    with pytest.raises(AttributeError):
        batch.job_id = 4  # type: ignore[misc]
    twin = DecodeBatch(*values)
    assert batch != twin and batch == batch and hash(batch) != hash(twin)  # two jobs, whatever they carry
    assert "records" not in repr(batch)
    # the host tensors are the lanes' ints as arrays, built when read (issue #20: not per step)
    assert batch.token_ids.tolist() == [5, -1] and batch.token_ids.dtype == np.int32
    assert batch.positions.tolist() == [7, 0] and batch.positions.dtype == np.int32
    assert batch.lane_valid.tolist() == [1, 0] and batch.lane_valid.dtype == np.uint8
